"""Watch your own training job with commtop: a few lines stream its collectives and copies.

::

    from workers import monitor

    mon = monitor.start()            # $COMMTOP_CONNECTION_FILE (set by `commtop run -- ...`), or args
    monitor.patch_distributed()      # time every torch.distributed collective
    offload = mon.knob("offload", ["none", "overlap"])   # a live knob the TUI/ctl can flip
    for step, batch in enumerate(loader):
        with mon.step(step):         # knob changes apply here, at the same step on every rank
            ...
            with mon.copy("offload", stream=d2h_stream, nbytes=t.nbytes):
                cpu_buf.copy_(t, non_blocking=True)
            if mon.setting("offload") == "overlap":
                ...

The records are the synthetic loop's COLL/COPY batches (``iteration`` = index of the
collective on this rank, ``step`` = the user's step), sent with the same never-blocking
publisher and the same heartbeat, so `commtop watch`, recordings and reports work as is.

Guarantees: the job is never slowed by a missing or slow collector (non-blocking sends,
bounded queues, drops counted), and commtop never raises into it: an internal failure is
logged once and turns the monitor off (collectives then run unwrapped-fast). Knob
changes use ``workers.rank.live_control``'s agreement, so every rank switches at the same step.
Without a collector the monitor is off and every knob keeps its default.

This module holds the process-wide entry points; the object :func:`start` returns is
:class:`workers.monitor.monitor.Monitor`.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading

from workers.monitor import patch as monitor_patch
from workers.monitor.monitor import Monitor
from workers.monitor.rank_info import env_int
from workers.wire.connection import CONNECTION_FILE_ENV, Connection, ConnectionError_, find_by_endpoint, load

log = logging.getLogger("commtop.monitor")

_active: Monitor | None = None
_lock = threading.Lock()


def start(
    connection_file: str | None = None,
    *,
    connect: str | None = None,
    batch_ms: float = 50.0,
    wait_s: float = 0.0,
    sampler: bool = True,
) -> Monitor:
    """The process's monitor (created on the first call; later calls return it).

    The collector is named by ``connection_file``, else $COMMTOP_CONNECTION_FILE, else the
    connection file of this user whose data endpoint is ``connect`` (``--connect``-style).
    ``connect`` with a file sends data there instead (other nodes of a multi-node run).
    Nothing named, or a bad file: the monitor is off (one line on stderr) and knobs keep
    their defaults. ``wait_s`` waits (bounded) for the collector's handshake at start-up.
    Never raises.
    """
    global _active
    with _lock:
        if _active is not None:
            return _active
        conn = None
        try:
            conn = resolve_connection(connection_file, connect)
        except Exception as exc:  # noqa: BLE001 - bad files, bad endpoints: off, never raised
            log.warning("commtop monitor: off (%s)", exc)
        if conn is None and connection_file is None and connect is None and env_int("RANK", 0) == 0:
            log.warning("commtop monitor: off (no $%s; start the job with `commtop run -- ...`)", CONNECTION_FILE_ENV)
        try:
            _active = Monitor(conn, batch_ms=batch_ms, sampler=sampler)
        except Exception as exc:  # noqa: BLE001
            log.warning("commtop monitor: off (could not start: %r)", exc)
            _active = Monitor(None, batch_ms=batch_ms, sampler=False)
        if wait_s > 0:
            _active.wait_connected(wait_s)
        monitor_patch.set_target(_active)
        atexit.register(_active.close)
        return _active


def patch_distributed() -> list[str]:
    """Time every torch.distributed collective (all_reduce, all_gather[_into_tensor],
    reduce_scatter[_tensor], broadcast, reduce, all_to_all[_single], barrier, gather,
    scatter; async_op=True included) and blocking send/recv into the active monitor. Returns
    the names patched."""
    try:
        was = monitor_patch.patched()
        names = monitor_patch.patch()
        if _active is not None and not was:
            _active.hooks_in()
        return names
    except Exception as exc:  # noqa: BLE001
        log.warning("commtop monitor: collectives not patched (%r)", exc)
        return []


def unpatch_distributed() -> None:
    monitor_patch.unpatch()


def active() -> Monitor | None:
    return _active


def stop() -> None:
    """Close the process's monitor (also done at exit); a later start() makes a new one."""
    global _active
    with _lock:
        mon, _active = _active, None
    monitor_patch.set_target(None)
    if mon is not None:
        mon.close()


def forget_inherited() -> None:
    """In a forked child: the monitor it inherited is its parent's. Dropped without a word (closing
    it would send the parent's Bye through the parent's sockets); a later start() makes its own."""
    global _active
    with _lock:
        _active = None
    monitor_patch.set_target(None)


def resolve_connection(connection_file: str | None, connect: str | None) -> Connection | None:
    """The run to report to, as the workers resolve it (no "newest run" guess: a user's
    script must not attach to some older run by accident)."""
    path = connection_file or os.environ.get(CONNECTION_FILE_ENV)
    if path:
        conn = load(path)
        return conn.for_connect(connect) if connect else conn
    if connect:
        found = find_by_endpoint(connect)
        if found is None:
            raise ConnectionError_(f"no connection file of yours has data endpoint {connect}")
        return found
    return None
