"""When and how the capture reads torch's Flight Recorder ring, and what it says about it.

**How.** ``_dump_nccl_trace`` builds the whole dump with the GIL held (H200, torch 2.11: 30 ms for
a ring of 2000, 316 ms for 20000), so each rank starts torch's worker server
(``_WorkerServer``, a C++ httplib thread) on a unix socket in the run's folder and POSTs
``dump_nccl_trace_pickle`` to it: the dump is built with no GIL held (61 ms wall for 2000, GIL
share 0.0), and only the unpickle (~3.5 us an entry) and the decode of the new entries run
under the GIL, on the capture thread. Where the server is missing or fails, the in-process dump
serves instead (said at start, or once when it happens).

**When: by fill level.** Every read copies the whole ring, so a read costs the ring's size, not
what is new; reading when ~60 % of the ring is new keeps up whatever the size (the cost per
second is the issue rate times the cost per entry) and leaves 40 % of it as slack for the read
itself. How full it is comes from torch's status dump
(``_dump_nccl_trace_json(includeCollectives=False)``: 0.03 ms, ``pg_status[name]
["last_enqueued_collective"]`` = collectives issued on the group so far), polled more often as
the trigger nears. A slow job is read at least every few seconds, at most ``FR_DUTY`` of the
time (``$COMMTOP_FR_IDLE_S`` sets the period instead). Each read costs the job ~1 us per entry
held (H200, torch 2.11: the step that enqueues while torch copies the ring under its lock waits
that long), but reading a full ring of 8192 every second or every 10 s made no difference to the
DDP job's mean step time (1.0295 +- 0.006 against 1.0293 +- 0.013 x bare, 5 pairs each), so
the default stays fresh. At the end the same status says what was issued and never read
(counted as lost).

**Ring size.** torch reads ``TORCH_FR_BUFFER_SIZE``, then the deprecated
``TORCH_NCCL_TRACE_BUFFER_SIZE``, once per process (default 2000). When the user set neither and
the worker server exists, the bootstrap asks for :data:`RING_DEFAULT` (see there why).
"""

from __future__ import annotations

import gc
import http.client
import json
import logging
import math
import os
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

from workers.capture.flight_recorder import FrCursor, issued_by_group, load_dump
from workers.capture.fr_batch import FrBatch, batch_of
from workers.wire.config import seconds_in_range

log = logging.getLogger("commtop.capture")

#: torch's names for the ring size, in the order it reads them; its default.
RING_ENV = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
TORCH_RING_DEFAULT = 2000
#: The ring asked for when the user set none and the worker server reads it off the GIL: at 5,000
#: collectives/s it holds 1.6 s, so the 60 % trigger leaves ~0.65 s for a status poll and the
#: read (~0.25 s through the server); a read's GIL share (the unpickle, ~30 ms) and its memory
#: grow with the ring, the cost per second does not (fill-level reads: rate x cost per entry).
#: Without the server a read holds the GIL for ~18 us an entry, so torch's 2000 is kept.
RING_DEFAULT = 8192
#: Read when this share of the ring is new since the last read.
FILL_TRIGGER = 0.6
#: When the ring fills slowly: read at least every IDLE_MAX_S, at most FR_DUTY of the time.
FR_DUTY = 0.005
IDLE_MIN_S = 1.0
IDLE_MAX_S = 10.0
#: ``COMMTOP_FR_IDLE_S``: the time between two reads when the ring fills slowly (0.2-10 s).
IDLE_ENV = "COMMTOP_FR_IDLE_S"
#: Status polls: at least every POLL_MAX_S, at most every POLL_MIN_S (near the trigger).
POLL_MIN_S = 0.02
POLL_MAX_S = 0.5
#: A read through the worker server that takes longer than this fails (and the in-process dump serves).
SERVER_TIMEOUT_S = 30.0
#: Longest unix socket path (sun_path is 108 bytes).
MAX_SOCKET_PATH = 100

_QUERY = "/handler/{}?includecollectives=true&includestacktraces=false&onlyactive=false"

Dump = Mapping[str, Any]


def ring_size(environ: Mapping[str, str]) -> int:
    """The ring torch will use, read as torch reads it (0: the Flight Recorder is off)."""
    for name in RING_ENV:
        value = environ.get(name, "").strip()
        if value:
            try:
                return max(0, int(value))
            except ValueError:
                return TORCH_RING_DEFAULT
    return TORCH_RING_DEFAULT


def choose_ring(environ: MutableMapping[str, str], server: bool) -> str:
    """Before the script: ask torch for RING_DEFAULT entries when the user set no size and the
    worker server can read it off the GIL. Returns what was done, for the start line."""
    for name in RING_ENV:
        if environ.get(name, "").strip():
            return f"ring {ring_size(environ)} (${name})"
    if not server:
        return f"ring {TORCH_RING_DEFAULT} (torch's default)"
    environ[RING_ENV[0]] = str(RING_DEFAULT)
    return f"ring {RING_DEFAULT}"


class DumpReader(Protocol):
    """One way to read the whole ring: ``fetch`` the bytes, ``decode`` them (the capture runs the
    decode with the garbage collector paused); ``how`` names it in the start line."""

    how: str

    def fetch(self) -> bytes: ...

    def decode(self, raw: bytes) -> Dump: ...


class InProcessDump:
    """torch's dump function, called on the capture thread: holds the GIL for the whole dump."""

    how = "torch's dump (holds the GIL while it runs)"

    def __init__(self, dump_fn: Callable[..., bytes]) -> None:
        self.dump_fn = dump_fn

    def fetch(self) -> bytes:
        return self.dump_fn(includeCollectives=True, includeStackTraces=False, onlyActive=False)

    def decode(self, raw: bytes) -> Dump:
        return load_dump(raw)


class _UnixHTTP(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self.path)
        self.sock = sock


def post(path: str, query: str, timeout: float = SERVER_TIMEOUT_S) -> bytes:
    """POST ``query`` to torch's worker server on the unix socket ``path``; the body, or OSError."""
    conn = _UnixHTTP(path, timeout)
    try:
        conn.request("POST", query)
        resp = conn.getresponse()
        data = resp.read()
    except (OSError, http.client.HTTPException) as exc:
        raise OSError(f"worker server: {exc}") from exc
    finally:
        conn.close()
    if resp.status != 200:
        raise OSError(f"worker server: HTTP {resp.status}: {data[:120]!r}")
    return data


class ServerDump:
    """The ring through torch's worker server: built off the GIL by its C++ thread."""

    how = "torch's worker server (off the GIL)"

    def __init__(
        self, path: str, handler: str = "dump_nccl_trace_pickle", decode: Callable[[bytes], Dump] = load_dump
    ) -> None:
        self.path = path
        self.query = _QUERY.format(handler)
        self._decode = decode

    def fetch(self) -> bytes:
        return post(self.path, self.query)

    def decode(self, raw: bytes) -> Dump:
        return self._decode(raw)


class WorkerServer:
    """torch's ``_WorkerServer`` on a socket of its own; :meth:`shutdown` at the end."""

    def __init__(self, folder: str, name: str) -> None:
        from torch._C._distributed_c10d import _WorkerServer  # type: ignore[attr-defined]

        path = os.path.join(folder, name)
        if len(path) > MAX_SOCKET_PATH:  # a deep run folder: a private one in /tmp instead
            path = os.path.join(tempfile.mkdtemp(prefix="commtop-fr-"), name)
        if os.path.exists(path):
            os.unlink(path)
        self.path = path
        self._server: Any = _WorkerServer(path)

    def shutdown(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            try:
                server.shutdown()
            except Exception:  # noqa: BLE001 - at exit, best effort
                pass
        try:
            os.unlink(self.path)
        except OSError:
            pass


def nccl_status() -> Callable[[], Dump] | None:
    """torch's cheap status dump of the NCCL groups (no entries), or None on a torch without it."""
    import torch

    fn = getattr(getattr(torch._C, "_distributed_c10d", None), "_dump_nccl_trace_json", None)
    if fn is None:
        return None

    def status() -> Dump:
        data = json.loads(fn(includeCollectives=False, onlyActive=False))
        return data if isinstance(data, dict) else {}

    return status


@dataclass
class FillSchedule:
    """When to read a ring of ``ring`` entries: once ``trigger`` of it is new, or after the idle
    period: ``idle_set_s`` where the user set one, else IDLE_MIN_S, longer when a read costs
    more (at most FR_DUTY of the time)."""

    ring: int
    trigger: float = FILL_TRIGGER
    last_read: float = -math.inf
    idle_set_s: float | None = None
    idle_s: float = field(init=False)

    def __post_init__(self) -> None:
        self.idle_s = self._floor_s

    @property
    def _floor_s(self) -> float:
        return self.idle_set_s if self.idle_set_s is not None else IDLE_MIN_S

    def due(self, now: float, new_entries: float) -> bool:
        return new_entries >= self.trigger * self.ring or now - self.last_read >= self.idle_s

    def read_done(self, now: float, cost_s: float) -> None:
        self.last_read = now
        self.idle_s = min(IDLE_MAX_S, max(self._floor_s, cost_s / FR_DUTY))

    def next_poll(self, now: float, new_entries: float, rate: float) -> float:
        """When to look at the status next: half the time the trigger is away at ``rate``."""
        left = self.trigger * self.ring - new_entries
        wait = left / rate / 2 if rate > 0 else POLL_MAX_S
        idle = max(0.0, self.last_read + self.idle_s - now)
        return now + min(POLL_MAX_S, max(POLL_MIN_S, wait), idle)


def idle_setting(environ: Mapping[str, str]) -> float | None:
    """``$COMMTOP_FR_IDLE_S`` within 0.2-10 s; None where unset or out of range (said once)."""
    raw = environ.get(IDLE_ENV, "").strip()
    if not raw:
        return None
    value = seconds_in_range(raw, 0.2, IDLE_MAX_S)
    if value is None:
        log.warning(
            "commtop capture: %s=%r is not 0.2-%g s; reading as the ring's fill says", IDLE_ENV, raw, IDLE_MAX_S
        )
        return None
    return value


def ring_advice(ring: int, rate: float, read_s_per_entry: float) -> str:
    """What to set when reads did not keep up at ``rate`` collectives/s."""
    slack = (1 - FILL_TRIGGER) / max(rate, 1e-9) - read_s_per_entry  # seconds per entry left for a poll
    if slack <= 0:
        return f"a read costs {read_s_per_entry * 1e6:.0f} us an entry: too slow for this rate at any ring size"
    need = max(2 * ring, POLL_MAX_S / slack)
    return f"set {RING_ENV[0]}={1 << math.ceil(math.log2(need))}"


class LocalDecoder:
    """Decodes the ring in this process: fetch, unpickle, cursor. The rank's fallback, and what
    the child decoder (:mod:`workers.capture.fr_child`) runs on its side."""

    def __init__(self, dump: DumpReader, cursor: FrCursor | None = None) -> None:
        self.dump = dump
        self.how = dump.how
        self.cursor = cursor if cursor is not None else FrCursor()

    def read_batch(self) -> FrBatch:
        raw = self.dump.fetch()
        # Unpickling builds ~10 containers an entry that live until the decode is done: with the
        # collector running they would be traversed, promoted, and push the job's heap towards a
        # full collection. They hold no cycles, so refcounting frees them: pause the collector.
        collecting = gc.isenabled()
        gc.disable()
        try:
            dump = self.dump.decode(raw)
            del raw
            held = len(dump.get("entries") or ())
            rows = self.cursor.read(dump)
            del dump
        finally:
            if collecting:
                gc.enable()
        return batch_of(rows, self.cursor, held)

    def finish(self, issued: dict[str, int] | None) -> int:
        return self.cursor.finish(issued)

    def start_after(self, record_id: int, gone_pg_ids: Sequence[str] = ()) -> None:
        self.cursor.start_after(record_id, gone_pg_ids)

    def close(self) -> None:
        pass


class RingDecoder(Protocol):
    """Reads the whole ring and decodes what is new: in this process (LocalDecoder) or in a
    child (fr_child.ChildDecoder). ``cursor`` is the cursor after the last answer."""

    how: str
    cursor: FrCursor

    def read_batch(self) -> FrBatch: ...

    def finish(self, issued: dict[str, int] | None) -> int: ...

    def start_after(self, record_id: int, gone_pg_ids: Sequence[str] = ()) -> None: ...

    def close(self) -> None: ...


class FlightRecorderSource:
    """Reads one rank's ring when it is due and keeps the count of what it lost."""

    def __init__(
        self,
        reader: RingDecoder | DumpReader,
        status: Callable[[], Dump] | None,
        ring: int,
        *,
        fallbacks: Sequence[DumpReader] = (),
        rank: int = 0,
        warn: Callable[[str], None] | None = None,
    ) -> None:
        self.decoder: RingDecoder = (
            cast(RingDecoder, reader) if hasattr(reader, "read_batch") else LocalDecoder(cast(DumpReader, reader))
        )
        self.status = status
        self.fallbacks = list(fallbacks)
        self.ring = max(1, ring)
        self.rank = rank
        self.warn = warn or (lambda line: print(line, file=sys.stderr, flush=True))
        self.schedule = FillSchedule(self.ring, idle_set_s=idle_setting(os.environ))
        self.reads = 0
        self.last_cost_s = 0.0  # capture-thread CPU of the last read (the job's share of it)
        self.last_wall_s = 0.0
        self.rate = 0.0  # collectives issued per second, from the status
        self.per_seq = 1.0  # ring entries per collective (coalesced blocks and p2p take more)
        self.next_poll_at = 0.0
        self._issued: tuple[float, int] | None = None
        self._warned = False

    @property
    def cursor(self) -> FrCursor:
        return self.decoder.cursor

    @property
    def how(self) -> str:
        return self.decoder.how

    @property
    def lost(self) -> int:
        return self.cursor.lost

    def poll(self, now: float) -> bool:
        """Whether a read is due; looks at torch's status (cheap) to know how full the ring is."""
        new = 0.0
        if self.status is not None:
            try:
                issued = issued_by_group(self.status())
            except Exception as exc:  # noqa: BLE001 - no status: reads by time only
                log.warning("commtop capture: Flight Recorder status unreadable (%r); reading by time", exc)
                self.status = None
            else:
                new = self._new_entries(issued)
                total = sum(issued.values())
                if self._issued is not None and now > self._issued[0]:
                    r = (total - self._issued[1]) / (now - self._issued[0])
                    self.rate = r if self.rate == 0 else 0.7 * self.rate + 0.3 * r
                self._issued = (now, total)
        self.next_poll_at = self.schedule.next_poll(now, new, self.rate)
        return self.schedule.due(now, new)

    def read(self, now: float) -> FrBatch:
        """New finished collectives (``now``: time.monotonic(), as for :meth:`poll`); says once
        if the ring wrapped before it was read."""
        t0, c0 = time.perf_counter(), time.thread_time()
        seqs0 = sum(g.last_seq for g in self.cursor.groups.values())
        rec0, lost0 = self.cursor.last_record, self.cursor.overwritten
        batch = self._read_batch()
        if batch.held > self.ring:  # torch's ring is larger than the environment said
            self.ring = self.schedule.ring = batch.held
        self.last_wall_s = time.perf_counter() - t0
        self.last_cost_s = time.thread_time() - c0
        self.reads += 1
        cursor = self.cursor
        d_seq = sum(g.last_seq for g in cursor.groups.values()) - seqs0
        if d_seq > 0 and cursor.last_record > rec0:
            self.per_seq = min(64.0, max(1.0, (cursor.last_record - rec0) / d_seq))
        self.schedule.read_done(now, self.last_cost_s)
        if cursor.overwritten > lost0 and not self._warned:
            self._warned = True
            per_entry = self.last_wall_s / self.ring
            self.warn(
                f"commtop rank {self.rank}: the Flight Recorder ring ({self.ring} entries) wrapped before it was "
                f"read: {cursor.overwritten} collectives lost so far at ~{self.rate:,.0f} collectives/s; "
                + ring_advice(self.ring, self.rate, per_entry)
            )
        return batch

    def finish(self) -> int:
        """After the last read: count what torch says was issued and never read. Returns it."""
        issued = None
        if self.status is not None:
            try:
                issued = issued_by_group(self.status())
            except Exception:  # noqa: BLE001 - then only what is still pending counts
                issued = None
        try:
            return self.decoder.finish(issued)
        except Exception as exc:  # noqa: BLE001 - a dead child: its last state counts here
            self._fall_back(exc)
            return self.decoder.finish(issued)

    def start_after(self, record_id: int, gone_pg_ids: Sequence[str] = ()) -> None:
        """Read only entries after ``record_id``, none of the groups ``gone_pg_ids``
        (:meth:`FrCursor.start_after`)."""
        try:
            self.decoder.start_after(record_id, gone_pg_ids)
        except Exception as exc:  # noqa: BLE001 - a dead child: the next reader starts there
            self._fall_back(exc)
            self.decoder.start_after(record_id, gone_pg_ids)

    def close(self) -> None:
        self.decoder.close()

    def _read_batch(self) -> FrBatch:
        while True:
            try:
                return self.decoder.read_batch()
            except Exception as exc:
                if not self.fallbacks:
                    raise
                self._fall_back(exc)

    def _fall_back(self, exc: BaseException) -> None:
        """The next reader takes over, in this process, from the cursor the failed one left."""
        if not self.fallbacks:
            raise exc
        failed = self.decoder
        failed.close()
        self.decoder = LocalDecoder(self.fallbacks.pop(0), failed.cursor)
        log.warning("commtop capture: %s failed (%s); reading with %s", failed.how, exc, self.decoder.how)

    def _new_entries(self, issued: Mapping[str, int]) -> float:
        """Ring entries recorded since the last read (torch counts collectives per group)."""
        groups = self.cursor.groups
        new = 0
        for name, n in self.cursor.by_name(issued).items():
            g = groups.get(name)
            new += max(0, n - (g.last_seq if g is not None else 0))
        return new * self.per_seq
