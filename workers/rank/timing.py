"""Timing of collectives, copies and steps, without ever synchronising for it.

GPU work is timed with a preallocated ring of CUDA event pairs recorded on the stream the
work runs on; finished pairs are harvested oldest-first with ``Event.query()`` (never
``synchronize``), so telemetry cannot stall the workload. The loop thread only records the
two events (directly through the CUDA runtime where it can); a harvesting thread reads them,
builds the batches and publishes. CPU work (gloo) is timed with
``perf_counter_ns`` around the blocking call. Both produce the same row tuples
``(*meta, start_ns, dur_us)`` that :mod:`workers.rank.publisher` turns into batches.

:class:`Instrumentation` is everything commtop adds to the loop; :class:`BareInstrumentation`
is its no-op twin (only whole steps are timed), so ``--bare`` A/B runs differ in exactly that.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from workers.rank.cuda_events import TorchEvents
from workers.rank.heartbeat import WorkerStatus
from workers.rank.publisher import RecordBatcher
from workers.wire.stats import percentiles

Row = tuple[Any, ...]


class Timer(Protocol):
    untimed: int

    def begin(self, meta: Row) -> Any: ...

    def end(self, token: Any) -> None: ...

    def harvest(self, out: list[Row]) -> None:
        """Move finished rows into ``out`` (oldest first); never waits."""
        ...


class NullTimer:
    """Times nothing (the bare loop, and warm-up)."""

    untimed = 0

    def begin(self, meta: Row) -> None:
        return None

    def end(self, token: Any) -> None:
        pass

    def harvest(self, out: list[Row]) -> None:
        pass


class CpuTimer:
    """perf_counter_ns around a blocking call. ``end`` may run on another thread than
    ``harvest`` (the overlap copier): a deque hands rows over without a lock."""

    untimed = 0

    def __init__(self) -> None:
        self.ready: deque[Row] = deque()

    def begin(self, meta: Row) -> tuple[Row, int, int]:
        return meta, time.time_ns(), time.perf_counter_ns()

    def end(self, token: tuple[Row, int, int]) -> None:
        end = time.perf_counter_ns()
        meta, start_ns, start_pc = token
        self.ready.append((*meta, start_ns, (end - start_pc) / 1000.0))

    def harvest(self, out: list[Row]) -> None:
        ready = self.ready
        while ready:
            out.append(ready.popleft())


class Anchor:
    """Maps CUDA event times onto the host wall clock: one event recorded right after the
    single start-up ``torch.cuda.synchronize()``, and ``time.time_ns()`` taken with it.

    cudaEventElapsedTime is float32 milliseconds: measured from one fixed event, start times
    would lose resolution as the run goes on (62 us after 10 minutes, 0.25 ms after an hour).
    So, given a ``spare`` event, :meth:`advance` rolls the anchor forward about once a second
    without any sync: it records the spare on the current stream and, once that has finished,
    dates it from the old anchor over a short interval (rounding ~0.1 us per hop) and makes
    it the anchor. Elapsed times may be negative, so rows recorded before a hop stay right.
    """

    def __init__(
        self, event: Any, host_ns: int, spare: Any = None, every_ns: int = 1_000_000_000, stream: Any = None
    ) -> None:
        self.stream = stream  # where the spare is recorded (None: the current stream)
        self.event = event
        self.host_ns = host_ns
        self.spare = spare
        self.every_ns = every_ns
        self.hops = 0
        self._pending = False
        self._next = time.monotonic_ns() + every_ns

    def ns(self, event: Any) -> int:
        return self.host_ns + int(self.event.elapsed_time(event) * 1e6)

    def advance(self) -> None:
        """Call from the thread that harvests (it reads the anchor): at most one event
        record or query."""
        spare = self.spare
        if spare is None:
            return
        if self._pending:
            if spare.query():
                self.host_ns = self.ns(spare)
                self.event, self.spare = spare, self.event
                self._pending = False
                self.hops += 1
        elif time.monotonic_ns() >= self._next:
            if self.stream is None:
                spare.record()
            else:
                spare.record(self.stream)
            self._pending = True
            self._next = time.monotonic_ns() + self.every_ns


class CudaTimer:
    """A ring of ``capacity`` preallocated CUDA event pairs, all recorded on one stream, so
    completion is in ring order.

    The loop thread only calls :meth:`begin` and :meth:`end` (two event records and one tuple
    per record); :meth:`harvest` (query, elapsed times, rows) may run on another thread, one
    harvester at a time: ``issued`` is written only by ``end`` and ``harvested`` only by
    ``harvest``, and a slot is reused only after it was harvested. ``api``
    (:mod:`workers.rank.cuda_events`) is torch's Event methods by default, or the CUDA
    runtime called directly on the same events (a third of torch's per-call cost).
    ``anchor`` None: rows carry start 0 (step durations need no start time)."""

    def __init__(self, torch: Any, capacity: int, anchor: Anchor | None, stream: Any = None, api: Any = None) -> None:
        # The stream every pair is recorded on. Given, it saves torch building a Stream object
        # (a device context switch) on every record; None = whatever stream is current.
        self.stream = stream
        self.capacity = capacity
        self.api = api = api if api is not None else TorchEvents()
        self.starts = [torch.cuda.Event(enable_timing=True) for _ in range(capacity)]
        self.ends = [torch.cuda.Event(enable_timing=True) for _ in range(capacity)]
        api.prepare(self.starts + self.ends, stream)
        self._starts = [api.handle(e) for e in self.starts]
        self._ends = [api.handle(e) for e in self.ends]
        self._stream = api.stream_handle(stream)
        self._record = api.recorder()
        self._query = api.query()
        self._elapsed = api.elapsed_ms()
        self.meta: list[Row] = [()] * capacity
        self.anchor = anchor
        self.issued = 0  # pairs whose end was recorded (loop thread)
        self.harvested = 0  # pairs turned into rows (harvesting thread)
        self.untimed = 0

    @property
    def count(self) -> int:
        """Pairs recorded and not harvested."""
        return self.issued - self.harvested

    def begin(self, meta: Row) -> int:
        n = self.issued
        if n - self.harvested >= self.capacity:
            self.untimed += 1  # ring full (GPU far behind): no timing for this one
            return -1
        slot = n % self.capacity
        self._record(self._starts[slot], self._stream)
        self.meta[slot] = meta
        return slot

    def end(self, slot: int) -> None:
        if slot >= 0:
            self._record(self._ends[slot], self._stream)
            self.issued += 1  # only now may harvest look at it (a reused event queries done)

    def harvest(self, out: list[Row]) -> None:
        h, n = self.harvested, self.issued
        if h == n:
            return
        cap, ends, query = self.capacity, self._ends, self._query
        if not query(ends[(n - 1) % cap]):  # newest unfinished: find the first unfinished (stream order)
            k = h
            while k < n and query(ends[k % cap]):
                k += 1
            n = k
        if n == h:
            return
        starts, meta, elapsed = self._starts, self.meta, self._elapsed
        anchor = self.anchor
        append = out.append
        if anchor is None:
            for i in range(h, n):
                s = i % cap
                append((*meta[s], 0, elapsed(starts[s], ends[s]) * 1000.0))
        else:
            a, host_ns = self.api.handle(anchor.event), anchor.host_ns
            for i in range(h, n):
                s = i % cap
                start = starts[s]
                append((*meta[s], host_ns + int(elapsed(a, start) * 1e6), elapsed(start, ends[s]) * 1000.0))
        self.harvested = n


class StepTimes:
    """Durations of the last ``capacity`` steps (a fixed numpy ring), for the summary."""

    def __init__(self, capacity: int = 1 << 16) -> None:
        self.values = np.zeros(capacity, dtype=np.float64)
        self.n = 0

    def add(self, dur_us: float) -> None:
        self.values[self.n % len(self.values)] = dur_us
        self.n += 1

    def summary(self) -> dict[str, float | int]:
        vals = self.values[: min(self.n, len(self.values))]
        if not len(vals):
            return {"steps": 0}
        p50, p99 = percentiles(vals, (50, 99))
        return {
            "steps": self.n,
            "step_ms_mean": round(float(vals.mean()) / 1000, 4),
            "step_ms_p50": round(float(p50) / 1000, 4),
            "step_ms_p99": round(float(p99) / 1000, 4),
        }


class StepClock:
    """Times whole steps with ``timer`` (identical in both twins, for the overhead A/B)."""

    def __init__(self, timer: Timer) -> None:
        self.timer = timer
        self.times = StepTimes()
        self._token: Any = None
        self._rows: list[Row] = []

    def begin(self, step: int) -> None:
        self._token = self.timer.begin((step,))

    def end(self) -> None:
        self.timer.end(self._token)
        self.drain()

    def drain(self) -> None:
        """Collect the steps that finished (on GPU, earlier steps; never waits)."""
        self.timer.harvest(self._rows)
        for row in self._rows:
            self.times.add(row[-1])
        self._rows.clear()


#: How often the harvesting thread looks for finished GPU records (and publishes a due batch).
HARVEST_PERIOD_S = 0.005


class Instrumentation:
    """commtop's instrumentation of the loop: per-collective and per-copy records, batched
    and published. The loop calls exactly these methods, nothing else.

    ``threaded`` (GPU timers): the loop thread only records events; a ``commtop-harvest``
    thread turns finished pairs into rows, builds the batches and publishes them (it owns the
    publisher's socket until :meth:`finish`), and rolls the anchor. CPU timers harvest on the
    loop thread (their rows are ready at once, and gloo's loop has no GPU to wait for)."""

    bare = False

    def __init__(
        self,
        coll_timer: Timer,
        copy_timer: Timer,
        step_timer: Timer,
        batcher: RecordBatcher,
        status: WorkerStatus,
        anchor: Anchor | None = None,
        *,
        threaded: bool = False,
        period_s: float = HARVEST_PERIOD_S,
    ) -> None:
        self.anchor = anchor
        self.coll_timer = coll_timer
        self.copy_timer = copy_timer
        self.steps = StepClock(step_timer)
        self.batcher = batcher
        self.status = status
        self.period_s = period_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.harvest_error = ""
        self.coll_end = coll_timer.end  # type: ignore[method-assign]  # one call level less per record
        if threaded:
            self.after_collective = _nothing  # type: ignore[method-assign]
            self._thread = threading.Thread(target=self._run, name="commtop-harvest", daemon=True)
            self._thread.start()

    def step_begin(self, step: int) -> None:
        if self.anchor is not None and self._thread is None:
            self.anchor.advance()
        self.steps.begin(step)

    def step_end(self) -> None:
        self.steps.end()

    def coll_begin(self, iteration: int, step: int, epoch: int, mode: int) -> Any:
        return self.coll_timer.begin((iteration, step, epoch, mode, time.time_ns()))

    def coll_end(self, token: Any) -> None:
        self.coll_timer.end(token)

    def collect(self) -> None:
        """Harvest what finished, publish if a batch is due: once per collective on the loop
        thread (CPU timers), or every ``period_s`` on the harvesting thread (GPU timers)."""
        batcher = self.batcher
        self.coll_timer.harvest(batcher.coll_rows)
        self.copy_timer.harvest(batcher.copy_rows)
        if batcher.due():
            batcher.flush()
            self.status.untimed = self.coll_timer.untimed + self.copy_timer.untimed

    after_collective = collect  # the loop's call once per collective (a no-op when threaded)

    def _run(self) -> None:
        anchor = self.anchor
        while not self._stop.wait(self.period_s):
            try:
                if anchor is not None:
                    anchor.advance()
                self.collect()
            except Exception as exc:  # noqa: BLE001 - telemetry never breaks the job; records then go untimed
                self.harvest_error = f"commtop: harvesting GPU timings stopped: {exc!r}"
                print(self.harvest_error, file=sys.stderr, flush=True)
                return

    def stop_thread(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()

    def finish(self, wait_all: Callable[[], None] | None) -> None:
        """At exit: ``wait_all`` (a device sync, fine now) lets every record be harvested."""
        self.stop_thread()
        if wait_all is not None:
            wait_all()
            for timer in (self.coll_timer, self.copy_timer):
                settle = getattr(timer, "settle", None)  # records that arrive after the GPU is done (CUPTI)
                if settle is not None:
                    settle()
        self.coll_timer.harvest(self.batcher.coll_rows)
        self.copy_timer.harvest(self.batcher.copy_rows)
        self.steps.drain()
        self.batcher.flush()
        self.status.untimed = self.coll_timer.untimed + self.copy_timer.untimed


def _nothing() -> None:
    pass


class BareInstrumentation:
    """The no-op twin: whole steps timed the same way, nothing per collective, no sends."""

    bare = True

    def __init__(self, step_timer: Timer) -> None:
        self.copy_timer: Timer = NullTimer()
        self.steps = StepClock(step_timer)

    def step_begin(self, step: int) -> None:
        self.steps.begin(step)

    def step_end(self) -> None:
        self.steps.end()

    def coll_begin(self, iteration: int, step: int, epoch: int, mode: int) -> None:
        return None

    def coll_end(self, token: Any) -> None:
        pass

    def after_collective(self) -> None:
        pass

    def finish(self, wait_all: Callable[[], None] | None) -> None:
        if wait_all is not None:
            wait_all()
        self.steps.drain()
