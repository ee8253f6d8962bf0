"""Sends a rank's record batches to the collector without ever stalling the loop.

Torch-free. One PUSH socket, used only by the loop thread: bounded send queue (SNDHWM),
ZMQ_IMMEDIATE so nothing queues while no collector is connected, and non-blocking sends.
A batch that cannot be queued right now is dropped and its records counted in ``dropped``:
losing telemetry is acceptable, slowing the workload is not.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import zmq

from workers.wire import protocol
from workers.wire.busbw import algbw_gbps
from workers.wire.protocol import COLL, COLL_COLUMNS, COPY, COPY_COLUMNS, WORLD_GROUP, Batch, Bye, row_dtype

DEFAULT_HWM = 64
#: Batches a rank holds for its node exporter (--prometheus) while the node sampler is still
#: starting (about 13 s of 50 ms batches); bounded, then dropped and counted in ``tap_dropped``.
TAP_HWM = 256
MAX_RECORDS = 4096

#: What the timers hand over per collective: (iteration, step, epoch, mode, host_ns, start_ns, dur_us).
COLL_ROW = row_dtype(COLL_COLUMNS, ("iteration", "step", "epoch", "mode", "host_ns", "start_ns", "dur_us"))
#: Per copy: (step, epoch, nbytes, direction, pinned, start_ns, dur_us).
COPY_ROW = row_dtype(COPY_COLUMNS, ("step", "epoch", "nbytes", "direction", "pinned", "start_ns", "dur_us"))

Status = tuple[int, int, int]  # (epoch in force, pending epoch, apply at), from Control.status()


class RecordPublisher:
    """A rank's PUSH socket to the collector's ``data`` endpoint; never blocks, never raises."""

    def __init__(
        self,
        endpoint: str,
        key: bytes,
        session: str,
        rank: int,
        *,
        ctx: zmq.Context | None = None,
        hwm: int = DEFAULT_HWM,
        tap: str | None = None,
    ) -> None:
        """``tap``: the node exporter's ipc endpoint (``--prometheus``): every sealed message
        goes there too, NOBLOCK, the same frames (no second packing or signing)."""
        self.key = key
        self.session = session
        self.rank = rank
        self.seq = {COLL: 0, COPY: 0}
        self.dropped = 0  # records that could not be queued (cumulative)
        self.sent = 0  # records queued for sending
        self.stuck = False  # the last send found the queue full (or no collector at all)
        self._ctx = ctx or zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.PUSH)
        self._sock.setsockopt(zmq.SNDHWM, hwm)
        self._sock.setsockopt(zmq.IMMEDIATE, 1)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.connect(endpoint)
        self.tap_dropped = 0  # records the node exporter's queue could not take
        self._tap: zmq.Socket[Any] | None = None
        if tap:
            # no ZMQ_IMMEDIATE: the pipe exists from connect() on, so the batches sent before the
            # node sampler has bound its socket wait in the bounded queue instead of being lost
            self._tap = self._ctx.socket(zmq.PUSH)
            self._tap.setsockopt(zmq.SNDHWM, max(hwm, TAP_HWM))
            self._tap.setsockopt(zmq.LINGER, 0)
            self._tap.connect(tap)

    def wait_connected(self, timeout_s: float) -> bool:
        """At start-up only: wait (bounded) until a collector is connected, so the first
        batches are not dropped just because the handshake is still under way."""
        try:
            return bool(self._sock.poll(int(timeout_s * 1000), zmq.POLLOUT))
        except zmq.ZMQError:
            return False

    def publish(self, kind: str, columns: dict[str, np.ndarray], n: int, status: Status) -> bool:
        """Queue one batch of ``n`` records; on a full queue or any error drop it and count."""
        seq = self.seq[kind]
        self.seq[kind] = seq + 1  # gaps in seq tell the receiver a batch was lost
        try:
            batch = Batch(kind, self.rank, seq, self.dropped, columns, status[0], status[1], status[2], time.time_ns())
            frames = protocol.seal(self.key, protocol.batch_body(kind, self.session, batch))
            if self._tap is not None:
                self._tap_send(frames, n)
            self._sock.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
        except Exception:  # zmq.Again, a closed context, anything: telemetry never breaks the loop
            self.dropped += n
            self.stuck = True
            return False
        self.sent += n
        self.stuck = False
        return True

    def send_bye(self, bye: Bye) -> bool:
        return self.send_body(protocol.bye_body(self.session, bye))

    def send_body(self, body: dict[str, Any]) -> bool:
        try:
            frames = protocol.seal(self.key, body)
            if self._tap is not None:
                self._tap_send(frames, 0)
            self._sock.send_multipart(frames, flags=zmq.NOBLOCK)
        except Exception:
            self.stuck = True
            return False
        self.stuck = False
        return True

    def _tap_send(self, frames: list[bytes], n: int) -> None:
        try:
            self._tap.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)  # type: ignore[union-attr]
        except Exception:  # full or closed: the exporter sees the gap in seq; the loop goes on
            self.tap_dropped += n

    def close(self, linger_ms: int = 0) -> None:
        """``linger_ms`` > 0 at a clean exit lets the queued tail go out, bounded in time;
        not when the last send found the queue full: a frozen collector takes nothing more."""
        if self._tap is not None:
            try:
                self._tap.close(linger=linger_ms)
            except zmq.ZMQError:
                pass
        try:
            self._sock.close(linger=0 if self.stuck else linger_ms)
        except zmq.ZMQError:
            pass


class NullPublisher:
    """No collector configured: records are discarded (and not counted as dropped)."""

    def __init__(self) -> None:
        self.rank = -1
        self.seq = {COLL: 0, COPY: 0}
        self.dropped = 0
        self.sent = 0

    def wait_connected(self, timeout_s: float) -> bool:
        return False

    def publish(self, kind: str, columns: dict[str, np.ndarray], n: int, status: Status) -> bool:
        return False

    def send_bye(self, bye: Bye) -> bool:
        return False

    def send_body(self, body: dict[str, Any]) -> bool:
        return False

    def close(self, linger_ms: int = 0) -> None:
        pass


class RecordBatcher:
    """Collects raw row tuples from the timers and turns them into columnar batches.

    The hot path is one ``list.append`` per record; the numpy work (structured array,
    bandwidth columns) happens once per batch, at most every ``batch_ms`` or every
    ``max_records`` records, so memory stays bounded whatever the collector does.
    """

    def __init__(
        self,
        publisher: RecordPublisher | NullPublisher,
        status: Callable[[], Status],
        *,
        op_index: int,
        coll_nbytes: int,
        dtype_code: int = 0,
        bus_factor: float,
        batch_ms: float,
        max_records: int = MAX_RECORDS,
    ) -> None:
        self.publisher = publisher
        self.status = status
        self.op_index = op_index
        self.coll_nbytes = coll_nbytes
        self.dtype_code = dtype_code
        self.bus_factor = bus_factor
        self.batch_ns = int(batch_ms * 1e6)
        self.max_records = max_records
        self.coll_rows: list[tuple[Any, ...]] = []
        self.copy_rows: list[tuple[Any, ...]] = []
        self._last_flush = time.perf_counter_ns()

    def full(self) -> bool:
        return len(self.coll_rows) >= self.max_records or len(self.copy_rows) >= self.max_records

    def due(self) -> bool:
        return self.full() or time.perf_counter_ns() - self._last_flush >= self.batch_ns

    def flush(self) -> None:
        self._last_flush = time.perf_counter_ns()
        if self.coll_rows:
            rows, self.coll_rows = self.coll_rows, []
            self.publisher.publish(COLL, self.coll_columns(rows), len(rows), self.status())
        if self.copy_rows:
            rows, self.copy_rows = self.copy_rows, []
            self.publisher.publish(COPY, copy_columns(rows), len(rows), self.status())

    def coll_columns(self, rows: list[tuple[Any, ...]]) -> dict[str, np.ndarray]:
        arr = np.array(rows, dtype=COLL_ROW)
        n = len(arr)
        nbytes = np.full(n, self.coll_nbytes, dtype=COLL_COLUMNS["nbytes"])
        algbw = algbw_gbps(nbytes, arr["dur_us"])
        return {
            "iteration": arr["iteration"],
            "step": arr["step"],
            "epoch": arr["epoch"],
            "mode": arr["mode"],
            "op": np.full(n, self.op_index, dtype=COLL_COLUMNS["op"]),
            "group": np.full(n, WORLD_GROUP, dtype=COLL_COLUMNS["group"]),
            "dtype": np.full(n, self.dtype_code, dtype=COLL_COLUMNS["dtype"]),
            "nbytes": nbytes,
            "host_ns": arr["host_ns"],
            "start_ns": arr["start_ns"],
            "dur_us": arr["dur_us"],
            "algbw": algbw,
            "busbw": algbw * self.bus_factor,
        }


def copy_columns(rows: list[tuple[Any, ...]]) -> dict[str, np.ndarray]:
    arr = np.array(rows, dtype=COPY_ROW)
    return {name: arr[name] for name in COPY_COLUMNS if name != "gbps"} | {
        "gbps": algbw_gbps(arr["nbytes"], arr["dur_us"])
    }
