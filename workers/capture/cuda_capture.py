"""Drain torch's Flight Recorder and CUPTI memcpy records on a background thread (CUDA/NCCL).

Nothing runs per collective or per copy on the job's thread: NCCL process groups time their
collectives themselves (``TORCH_NCCL_ENABLE_TIMING=1``, set by the bootstrap before any group
exists: CUDA events on the NCCL stream, in C++) and record them in the Flight Recorder ring;
CUPTI records every memcpy. This thread reads both and hands rows to the monitor.

The ring is read when it is ~60 % new (:mod:`workers.capture.fr_source`: torch's status dump
says how full it is, polled every 20-500 ms), through torch's worker server where it runs (the
dump is built off the GIL), and whatever it overwrote before a read is counted as lost
(Hello.lost). CUPTI's buffer callback runs on CUPTI's thread (the raw client's numpy decoder);
the drain keeps only DtoH/HtoD records as 6 integers each, every TICK_S.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Any

import numpy as np

from workers.capture.cupti_copies import FIELDS, ClockMap, decode_copy
from workers.capture.flight_recorder import FrCursor
from workers.capture.fr_source import FlightRecorderSource
from workers.capture.rows import RowMaker, StepTimeline
from workers.monitor.records import OP_INDEX
from workers.rank.cupti_activity import MEMCPY_DTOH, MEMCPY_HTOD

log = logging.getLogger("commtop.capture")

#: How often CUPTI buffers are flushed and copies handed over.
TICK_S = 0.5
#: Copies kept between two ticks at most (beyond: dropped and counted).
COPY_QUEUE = 1 << 16


def fr_dump_function() -> Any:
    """torch's Flight Recorder dump (NCCL), or None on a torch without one."""
    import torch

    c10d = getattr(torch._C, "_distributed_c10d", None)
    return getattr(c10d, "_dump_nccl_trace", None) if c10d is not None else None


class CuptiCopies:
    """CUPTI MEMCPY activity: DtoH/HtoD records as (copy_kind, src, dst, bytes, start, end).

    Through the raw client (:mod:`workers.rank.cupti_activity`, MEMCPY only): a buffer is
    decoded with numpy on CUPTI's thread, no Python object per record. One CUPTI client per
    process: if torch.profiler or Nsight holds CUPTI, the constructor raises and the caller
    reports copies as not captured."""

    def __init__(self) -> None:
        from workers.rank import cupti_activity

        self.cupti = cupti_activity.client((cupti_activity.KIND_MEMCPY,))
        self.queue: deque[tuple[int, int, int, int, int, int]] = deque(maxlen=COPY_QUEUE)
        self.seen = 0
        self.clock = ClockMap()

    @property
    def activities(self) -> int:
        """Records CUPTI handed over (every kind)."""
        return self.cupti.records

    @property
    def cpu_ns(self) -> int:
        """CPU time of CUPTI's buffer callbacks (decoding) so far."""
        return self.cupti.callback_cpu_ns

    def start(self) -> None:
        self.sync_clock()

    def _drain(self) -> None:
        q = self.queue
        for d in self.cupti.take():
            m = d.memcpy
            ck = m["copy_kind"]
            self.seen += len(ck)
            keep = (ck == MEMCPY_DTOH) | (ck == MEMCPY_HTOD)
            if keep.any():
                cols = [m[f][keep].tolist() for f in FIELDS]
                q.extend(zip(*cols, strict=True))

    def sync_clock(self) -> None:
        a = time.time_ns()
        c = self.cupti.timestamp()
        b = time.time_ns()
        self.clock.update(c, (a + b) // 2)

    def flush(self) -> None:
        self.cupti.flush()
        self._drain()

    def stop(self) -> None:
        try:
            self.cupti.flush(forced=True)
            self._drain()
            self.cupti.stop()
        except Exception:  # noqa: BLE001 - at exit, best effort
            pass


class CaptureThread:
    """Reads the Flight Recorder when its fill level says so, CUPTI copies every TICK_S, and
    hands both to the monitor (which batches and sends them from this thread)."""

    def __init__(
        self,
        mon: Any,
        timeline: StepTimeline,
        fr: FlightRecorderSource | None,
        copies: CuptiCopies | None,
        before: tuple[int, int] = (0, 0),
    ) -> None:
        """``before``: (lost, untimed) of the captures this process ran before this one (groups
        ``destroy_process_group()`` took): the Hello's counts go on from them."""
        self.mon = mon
        self.fr = fr
        self.copies = copies
        self.before = before
        self.rows = RowMaker(timeline, mon.groups, mon.take_iterations)
        self._stop = threading.Event()
        self._lock = threading.Lock()  # one drain at a time (thread vs final drain)
        self.thread = threading.Thread(target=self._run, name="commtop-capture", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _run(self) -> None:
        next_copies = time.monotonic() + TICK_S
        wait = 0.0
        while not self._stop.wait(wait):
            now = time.monotonic()
            try:
                copies = now >= next_copies
                if copies:
                    next_copies = now + TICK_S
                self.drain(force_fr=False, copies=copies)
            except Exception as exc:  # noqa: BLE001 - never into the job
                log.warning("commtop capture: stopped after an internal error: %r", exc)
                return
            due = next_copies if self.fr is None else min(next_copies, self.fr.next_poll_at)
            wait = max(0.0, due - time.monotonic())

    def drain(self, force_fr: bool, copies: bool = True) -> None:
        with self._lock:
            mon = self.mon
            epoch, mode = mon._epoch, mon._mode
            coll: np.ndarray | None = None
            copy: list[tuple[Any, ...]] = []
            fr = self.fr
            if fr is not None:
                now = time.monotonic()
                if fr.poll(now) or force_fr:
                    coll = self.rows.coll_array(fr.read(now), epoch, mode)
                    mon.status.iteration = self.rows.iteration
                    mon.status.untimed = self.before[1] + fr.cursor.untimed
                    mon.status.gpu_inside = self._inside(fr.cursor)
                    mon.capture_lost(self.before[0] + fr.lost)
            cp = self.copies
            if cp is not None and copies:
                cp.flush()
                cp.sync_clock()
                q = cp.queue
                decoded = []
                while q:
                    c = decode_copy(q.popleft(), cp.clock)
                    if c is not None:
                        decoded.append(c)
                copy = self.rows.copy_rows(decoded, epoch)
            if coll is not None and len(coll):
                mon.add_coll_array(coll)
            mon.add_records([], copy)  # also sends what an earlier call left batched, once due

    def _inside(self, cursor: FrCursor) -> tuple[int, int, int, int] | tuple[()]:
        """The Hello's ``inside`` from the oldest collective still running at the last read."""
        if not cursor.inside:
            return ()
        op, name, nbytes, since = cursor.inside
        g = cursor.groups.get(name)
        code = self.mon.groups.code(name, g.desc if g is not None else "", cursor.size_of(name))
        return (OP_INDEX.get(op, 0), code, int(nbytes), int(since))

    def stop(self, settle_s: float = 1.0) -> None:
        """Stop the thread and read what finished meanwhile (at destroy_process_group / exit);
        then count what torch issued and nobody read."""
        self._stop.set()
        if self.thread.is_alive() and threading.current_thread() is not self.thread:
            self.thread.join(timeout=TICK_S + 5.0)
        deadline = time.monotonic() + settle_s
        while True:  # the watchdog retires finished works within ~0.1 s
            try:
                self.drain(force_fr=True)
            except Exception as exc:  # noqa: BLE001
                log.warning("commtop capture: final read failed: %r", exc)
                break
            if self.fr is None or self.fr.cursor.pending == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        if self.fr is not None:
            try:
                self.fr.finish()
            except Exception as exc:  # noqa: BLE001
                log.warning("commtop capture: final count failed: %r", exc)
            self.fr.close()  # the decoder child, where there is one
            self.mon.capture_lost(self.before[0] + self.fr.lost)  # the last Hello (before the Bye) carries it
        if self.copies is not None:
            self.copies.stop()
