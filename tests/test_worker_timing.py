"""Timing rings and clocks. CI has no GPU, so the CUDA event ring runs on FakeCudaEvent, a
stand-in whose completion the test controls (a real GPU cannot be made to finish events in a
chosen order); everything else here is real."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

from workers.rank.cuda_events import loaded_cudart
from workers.rank.heartbeat import WorkerStatus
from workers.rank.publisher import NullPublisher, RecordBatcher
from workers.rank.timing import Anchor, CpuTimer, CudaTimer, Instrumentation, StepTimes
from workers.wire.settings import Settings


class FakeGpu:
    """A stream's timeline: events get increasing times (ms) when recorded and complete in
    record order when the test says so."""

    def __init__(self) -> None:
        self.recorded = 0
        self.completed = 0
        self.now_ms = 100.0

    def complete(self, n: int) -> None:
        self.completed = min(self.recorded, self.completed + n)


class FakeCudaEvent:
    def __init__(self, gpu: FakeGpu) -> None:
        self.gpu = gpu
        self.seq = 0
        self.t_ms = 0.0

    def record(self, stream: object = None) -> None:
        self.stream = stream
        self.gpu.recorded += 1
        self.seq = self.gpu.recorded
        self.gpu.now_ms += 0.25
        self.t_ms = self.gpu.now_ms

    def query(self) -> bool:
        return self.seq <= self.gpu.completed

    def elapsed_time(self, other: FakeCudaEvent) -> float:
        assert self.query() and other.query(), "elapsed_time on an unfinished event would raise on a GPU"
        return float(np.float32(other.t_ms - self.t_ms))  # cudaEventElapsedTime is float32 ms


class FakeTorch:
    def __init__(self, gpu: FakeGpu) -> None:
        self.cuda = self
        self.gpu = gpu

    def Event(self, enable_timing: bool = False) -> FakeCudaEvent:  # noqa: N802 - torch's spelling
        assert enable_timing
        return FakeCudaEvent(self.gpu)


@pytest.fixture
def gpu() -> FakeGpu:
    return FakeGpu()


def make_timer(gpu: FakeGpu, capacity: int) -> tuple[CudaTimer, Anchor]:
    anchor_ev = FakeCudaEvent(gpu)
    anchor_ev.record()
    gpu.complete(1)
    anchor = Anchor(anchor_ev, host_ns=1_000_000_000_000)
    return CudaTimer(FakeTorch(gpu), capacity, anchor), anchor


def test_harvest_is_oldest_first_and_stops_at_the_first_unfinished(gpu):
    timer, anchor = make_timer(gpu, capacity=8)
    for i in range(5):
        timer.end(timer.begin((i,)))
    out: list[tuple] = []
    timer.harvest(out)
    assert out == []  # nothing finished yet: no waiting, nothing returned
    gpu.complete(6)  # starts and ends of the first three pairs
    timer.harvest(out)
    assert [r[0] for r in out] == [0, 1, 2]
    first = out[0]
    # anchor at 100.25 ms; first start at 100.5 ms, end at 100.75 ms
    assert first[1] == anchor.host_ns + 250_000
    assert first[2] == pytest.approx(250.0)
    gpu.complete(100)
    timer.harvest(out)
    assert [r[0] for r in out] == [0, 1, 2, 3, 4] and timer.count == 0


def test_full_ring_drops_timing_and_counts_untimed(gpu):
    timer, _ = make_timer(gpu, capacity=4)
    for i in range(6):
        timer.end(timer.begin((i,)))
    assert timer.untimed == 2 and timer.count == 4
    gpu.complete(100)
    out: list[tuple] = []
    timer.harvest(out)
    assert [r[0] for r in out] == [0, 1, 2, 3]
    timer.end(timer.begin((6,)))  # room again after the harvest; slots are reused
    gpu.complete(100)
    timer.harvest(out)
    assert out[-1][0] == 6 and timer.untimed == 2


def test_a_reused_slot_is_not_read_before_its_end_is_recorded(gpu):
    timer, _ = make_timer(gpu, capacity=2)
    for i in range(2):
        timer.end(timer.begin((i,)))
    gpu.complete(100)
    out: list[tuple] = []
    timer.harvest(out)
    token = timer.begin((9,))  # slot 0 again; its old end event still "queries" done
    timer.harvest(out)
    assert [r[0] for r in out] == [0, 1]
    timer.end(token)
    gpu.complete(100)
    timer.harvest(out)
    assert [r[0] for r in out] == [0, 1, 9]


def test_cpu_timer_hands_rows_over_from_another_thread():
    timer = CpuTimer()

    def work() -> None:
        for i in range(1000):
            timer.end(timer.begin((i,)))

    threads = [threading.Thread(target=work) for _ in range(2)]
    for t in threads:
        t.start()
    out: list[tuple] = []
    while any(t.is_alive() for t in threads):
        timer.harvest(out)
    for t in threads:
        t.join()
    timer.harvest(out)
    assert sorted(r[0] for r in out) == sorted(list(range(1000)) * 2)
    assert all(r[2] >= 0 and r[1] > 0 for r in out)


def test_step_times_keep_a_bounded_window():
    times = StepTimes(capacity=4)
    for v in (1000.0, 2000.0, 3000.0, 4000.0, 5000.0, 6000.0):
        times.add(v)
    s = times.summary()
    assert s["steps"] == 6
    assert s["step_ms_mean"] == pytest.approx(4.5)  # only the last four: 3, 4, 5, 6 ms
    assert StepTimes().summary() == {"steps": 0}


def test_anchor_rolls_forward_without_losing_rows_recorded_before_a_hop(gpu):
    anchor_ev = FakeCudaEvent(gpu)
    anchor_ev.record()  # t = 100.25 ms
    gpu.complete(1)
    anchor = Anchor(anchor_ev, host_ns=10**12, spare=FakeCudaEvent(gpu), every_ns=0)
    timer = CudaTimer(FakeTorch(gpu), 8, anchor)
    timer.end(timer.begin(("before",)))  # start at 100.5 ms
    anchor.advance()  # records the spare (101.0 ms)
    anchor.advance()  # not finished yet: nothing changes
    assert anchor.hops == 0
    gpu.complete(100)
    anchor.advance()
    assert anchor.hops == 1 and anchor.host_ns == 10**12 + 750_000
    timer.end(timer.begin(("after",)))  # start at 101.25 ms
    gpu.complete(100)
    out: list[tuple] = []
    timer.harvest(out)
    assert [(r[0], r[1]) for r in out] == [("before", 10**12 + 250_000), ("after", 10**12 + 1_000_000)]


def test_rolling_anchor_keeps_start_times_exact_over_hours(gpu):
    first = FakeCudaEvent(gpu)
    first.record()
    gpu.complete(1)
    t0 = first.t_ms
    fixed = Anchor(first, host_ns=10**12)
    rolling = Anchor(first, host_ns=10**12, spare=FakeCudaEvent(gpu), every_ns=0)
    rolling.spare.record()
    gpu.complete(100)
    rolling.advance()  # first hop; "first" is now the rolling anchor's spare, so give fixed its own
    fixed.event = FakeCudaEvent(gpu)
    fixed.event.seq, fixed.event.t_ms = first.seq, t0
    for _ in range(2 * 3600):  # two hours, one hop a second
        gpu.now_ms += 1000.0
        rolling.advance()
        gpu.complete(100)
        rolling.advance()
    gpu.now_ms += 0.123456  # a time that float32 cannot hold at ~7e6 ms (its step there is 0.5 ms)
    late = FakeCudaEvent(gpu)
    late.record()
    gpu.complete(100)
    exact = 10**12 + round((late.t_ms - t0) * 1e6)
    assert abs(rolling.ns(late) - exact) < 5_000  # within 5 us after 7200 hops
    assert abs(fixed.ns(late) - exact) > 50_000  # a fixed float32 anchor is off by tens of us or more


def test_pairs_are_recorded_on_the_timers_stream() -> None:
    """Passing the stream spares torch a Stream object per record (its main host cost on GPU)."""
    gpu = FakeGpu()
    anchor_event = FakeCudaEvent(gpu)
    anchor_event.record()
    timer = CudaTimer(FakeTorch(gpu), 4, Anchor(anchor_event, 0), stream="side-stream")
    timer.end(timer.begin((0,)))
    assert timer.starts[0].stream == "side-stream" and timer.ends[0].stream == "side-stream"


def test_step_timer_without_anchor_gives_durations_and_no_start(gpu):
    timer = CudaTimer(FakeTorch(gpu), 4, None)
    timer.end(timer.begin((7,)))
    gpu.complete(100)
    out: list[tuple] = []
    timer.harvest(out)
    assert out == [(7, 0, pytest.approx(250.0))]


class CapturingPublisher(NullPublisher):
    """A fake publisher (no socket) that keeps each batch and the thread that sent it."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[tuple[str, dict, str]] = []

    def publish(self, kind, columns, n, status) -> bool:
        self.batches.append((kind, columns, threading.current_thread().name))
        self.sent += n
        return True


def test_threaded_instrumentation_publishes_every_record_once_off_the_loop_thread(gpu):
    """The loop thread only records; the harvesting thread reads finished pairs while more are
    recorded, and publishes; finish() stops it and sends the rest. Every collective exactly once,
    in order, with its own meta."""
    anchor_ev = FakeCudaEvent(gpu)
    anchor_ev.record()
    gpu.complete(1)
    anchor = Anchor(anchor_ev, host_ns=10**12, spare=FakeCudaEvent(gpu), every_ns=0)
    coll = CudaTimer(FakeTorch(gpu), 64, anchor)
    copy = CudaTimer(FakeTorch(gpu), 16, anchor)
    pub = CapturingPublisher()
    batcher = RecordBatcher(pub, lambda: (0, 0, 0), op_index=0, coll_nbytes=1024, bus_factor=1.0, batch_ms=2.0)
    status = WorkerStatus(settings=Settings())
    instr = Instrumentation(coll, copy, CudaTimer(FakeTorch(gpu), 8, None), batcher, status, anchor, threaded=True)
    instr.period_s = 0.001
    n = 3000
    for i in range(n):
        token = instr.coll_begin(i, i // 32, 0, 0)
        instr.coll_end(token)
        instr.after_collective()  # a no-op on the loop thread when threaded
        if i % 50 == 0:
            gpu.complete(1000)  # the GPU catches up now and then; the ring (64) fills in between
            time.sleep(0.002)
    gpu.complete(10**9)
    instr.finish(lambda: gpu.complete(10**9))
    assert instr._thread is not None and not instr._thread.is_alive()
    iters = np.concatenate([cols["iteration"] for kind, cols, _ in pub.batches if kind == "coll"])
    timed = n - coll.untimed
    assert coll.untimed < n and len(iters) == timed
    assert np.all(np.diff(iters) > 0)  # in order, none twice
    assert any(name == "commtop-harvest" for _, _, name in pub.batches)  # published off the loop thread
    assert anchor.hops >= 1  # the harvesting thread rolls the anchor
    durs = np.concatenate([cols["dur_us"] for kind, cols, _ in pub.batches if kind == "coll"])
    assert np.allclose(durs, 250.0)


def test_the_runtime_torch_loaded_is_found_in_the_memory_map(tmp_path):
    """Frozen /proc/self/maps lines: a process with CUDA 12 and 13 runtimes loaded."""
    maps = tmp_path / "maps"
    lib = "/site-packages/nvidia/cu{0}/lib/libcudart.so.{0}"
    maps.write_text(
        f"7f00-7f01 r-xp 00000000 08:01 1 {lib.format(12)}\n"
        f"7f02-7f03 r-xp 00000000 08:01 2 {lib.format(13)}\n"
        "7f04-7f05 r-xp 00000000 08:01 3 /usr/lib/libc.so.6\n"
    )
    torch13 = SimpleNamespace(version=SimpleNamespace(cuda="13.0"))
    assert loaded_cudart(torch13, str(maps)) == lib.format(13)
    cpu_torch = SimpleNamespace(version=SimpleNamespace(cuda=None))
    assert loaded_cudart(cpu_torch, str(maps)) == ""  # two runtimes, no version to choose by
    maps.write_text("7f04-7f05 r-xp 00000000 08:01 3 /usr/lib/libc.so.6\n")
    assert loaded_cudart(torch13, str(maps)) == ""
    assert loaded_cudart(torch13, str(tmp_path / "absent")) == ""
