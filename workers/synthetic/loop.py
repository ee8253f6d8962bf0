"""The forum's loop, instrumented: per step, offload copies on a side stream, then
``collectives_per_step`` collectives, with the offload mode and copy settings read from a
:class:`~workers.rank.control.Control` at every step boundary.

One code path serves CUDA (NCCL) and CPU (gloo): :class:`Workload` owns the tensors and
how copies run (CUDA side stream; or, on CPU, a background copier thread for ``overlap``
and the loop thread for the sync modes); the instrumentation is one object with a no-op
twin (``--bare``), so the loop below has no telemetry branches.
"""

from __future__ import annotations

import math
import os
import queue
import sys
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from workers.rank.control import Control, StaticControl
from workers.rank.cuda_events import runtime_events
from workers.rank.device import gpu_uuid, nccl_version
from workers.rank.groups import describe
from workers.rank.heartbeat import RunInfo, StopFlag, WorkerStatus, reported_hostname
from workers.rank.publisher import NullPublisher, RecordBatcher, RecordPublisher
from workers.rank.session import RankSession
from workers.rank.timing import (
    Anchor,
    BareInstrumentation,
    CpuTimer,
    CudaTimer,
    Instrumentation,
    NullTimer,
    Timer,
)
from workers.synthetic.delay import Delayer, delay_s
from workers.wire.busbw import bus_factor, collective_bytes
from workers.wire.config import LoopConfig, batch_ms_for_world
from workers.wire.connection import Connection
from workers.wire.endings import bye_reason
from workers.wire.protocol import COLLECTIVES, DIRECTIONS, MODES, dtype_code
from workers.wire.settings import COPY_SCALES, Settings

COLL_RING = 4096
COPY_RING = 1024
STEP_RING = 256
CUPTI_RING = 1 << 16  # metas only (a list slot each), no GPU events
CONNECT_WAIT_S = 1.0  # at start-up, how long to wait for a collector's handshake
#: Steps of copies that may be queued and unfinished (side stream or copier thread). Copies
#: slower than a step's collectives would otherwise pile up without bound; past this the
#: loop waits for the oldest step's copies, as a full CUDA launch queue would make it do.
COPY_STEPS_IN_FLIGHT = 4
#: After SIGTERM, how long the current step may take before the heartbeat ends the process
#: (a rank blocked in a collective whose peer already left); below `commtop run`'s 5 s SIGKILL.
STOP_GRACE_S = 3.0
MODE_INDEX = {m: i for i, m in enumerate(MODES)}


@dataclass(frozen=True)
class Runtime:
    """Where this rank runs."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    cuda: bool
    backend: str  # "nccl" or "gloo/cpu" (as reported in Hello)
    device_index: int = -1


@dataclass(frozen=True)
class WorkerResult:
    exit_code: int
    reason: str
    iterations: int
    summary: dict[str, Any] = field(default_factory=dict)


# --------------------------------------------------------------------------- copies


class ThreadCopier:
    """CPU stand-in for a side stream: copies run on a background thread (torch's copy_
    releases the GIL, so they really overlap the gloo collective). The job queue is bounded,
    like a CUDA launch queue: if copies fall far behind, the loop waits for room."""

    def __init__(self, timer: Timer, depth: int = COPY_STEPS_IN_FLIGHT) -> None:
        self.timer = timer
        self.jobs: queue.Queue[tuple[Any, Any, tuple[Any, ...], int] | None] = queue.Queue(maxsize=depth)
        self.thread = threading.Thread(target=self._run, name="commtop-copier", daemon=True)
        self.thread.start()

    def submit(self, dst: Any, src: Any, meta: tuple[Any, ...], n: int) -> None:
        self.jobs.put((dst, src, meta, n))

    def wait_idle(self) -> None:
        self.jobs.join()

    def _run(self) -> None:
        while True:
            job = self.jobs.get()
            try:
                if job is None:
                    return
                dst, src, meta, n = job
                timer = self.timer
                for _ in range(n):
                    token = timer.begin(meta)
                    dst.copy_(src)
                    timer.end(token)
            finally:
                self.jobs.task_done()

    def close(self) -> None:
        self.jobs.put(None)
        self.thread.join(timeout=5.0)


class Workload:
    """The tensors of one rank and the two things the loop does with them."""

    def __init__(self, config: LoopConfig, rt: Runtime) -> None:
        self.config = config
        self.rt = rt
        self.cuda = rt.cuda
        device = torch.device("cuda", rt.device_index) if rt.cuda else torch.device("cpu")
        dtype = getattr(torch, config.dtype)
        numel = math.prod(config.shape)
        ws = rt.world_size
        op = config.collective
        if op == "all_to_all" and numel % ws:
            raise ValueError(f"all_to_all needs the tensor's {numel} elements to divide by world size {ws}")
        self.tensor = torch.ones(numel, dtype=dtype, device=device)
        self.nbytes = collective_bytes(op, self.tensor.nbytes, ws)
        self.bus_factor = bus_factor(op, ws)
        self.op_index = COLLECTIVES.index(op)
        self.collective = self._collective(op, numel, dtype, device)

        copy_numel = int(numel * max(COPY_SCALES))
        self.dev_buf = torch.ones(copy_numel, dtype=dtype, device=device)  # copy source (d2h) / target (h2d)
        self.host_bufs = {False: torch.ones(copy_numel, dtype=dtype)}
        self.pinned_bytes = 0
        if rt.cuda:
            self.host_bufs[True] = torch.ones(copy_numel, dtype=dtype, pin_memory=True)
            self.pinned_bytes = self.host_bufs[True].nbytes
        self._views: dict[tuple[bool, str, float], tuple[Any, Any, int, int]] = {}
        self.side = torch.cuda.Stream(device=device, priority=-1) if rt.cuda else None
        self.copier: ThreadCopier | None = None
        self._copies_done: deque[Any] = deque()  # one plain event per queued step of copies (CUDA)
        self.cupti_signature: Any = _UNSET  # learnt once (workers.rank.cupti_timer.learn_collective)
        if rt.cuda:
            torch.cuda.synchronize()  # start-up: buffers filled before any side-stream copy reads them

    def _collective(self, op: str, numel: int, dtype: Any, device: Any) -> Any:
        ws, t = self.rt.world_size, self.tensor
        if op == "all_gather":
            out = torch.empty(numel * ws, dtype=dtype, device=device)
            fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
            return lambda: fn(out, t)
        if op == "reduce_scatter":
            big = torch.ones(numel * ws, dtype=dtype, device=device)
            out = torch.empty(numel, dtype=dtype, device=device)
            fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
            return lambda: fn(out, big)
        if op == "all_reduce":
            return lambda: dist.all_reduce(t)
        if op == "broadcast":
            return lambda: dist.broadcast(t, src=0)
        if op == "all_to_all":
            out = torch.empty(numel, dtype=dtype, device=device)
            return lambda: dist.all_to_all_single(out, t)
        raise ValueError(f"unknown collective {op!r}")

    def copy_views(self, settings: Settings) -> tuple[Any, Any, int, int]:
        """(dst, src, nbytes, pinned) for the settings; views made once per combination."""
        pinned = settings.pinned and self.cuda  # CPU tensors cannot be pinned without CUDA
        key = (pinned, settings.direction, settings.copy_scale)
        views = self._views.get(key)
        if views is None:
            n = int(self.tensor.numel() * settings.copy_scale)
            dev, host = self.dev_buf[:n], self.host_bufs[pinned][:n]
            dst, src = (host, dev) if settings.direction == "d2h" else (dev, host)
            views = self._views[key] = (dst, src, dev.nbytes, int(pinned))
        return views

    def copies(self, n: int, settings: Settings, overlap: bool, timer: Timer, step: int, epoch: int) -> None:
        """Issue ``n`` copies. CUDA: on the side stream (async); CPU: on the copier thread
        when ``overlap``, else right here."""
        dst, src, nbytes, pinned = self.copy_views(settings)
        meta = (step, epoch, nbytes, DIRECTIONS.index(settings.direction), pinned)
        if self.side is not None:
            done = self._copies_done
            while len(done) >= COPY_STEPS_IN_FLIGHT:
                done.popleft().synchronize()  # workload pacing (see COPY_STEPS_IN_FLIGHT), not telemetry
            # The step's copies start when the main stream reaches this step (not earlier:
            # the host runs ahead of the GPU), so they overlap this step's collectives.
            self.side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(self.side):
                for _ in range(n):
                    token = timer.begin(meta)
                    dst.copy_(src, non_blocking=True)  # pageable host memory: effectively synchronous
                    timer.end(token)
                event = torch.cuda.Event()
                event.record()
            done.append(event)
        elif overlap:
            if self.copier is None:
                self.copier = ThreadCopier(timer)
            self.copier.submit(dst, src, meta, n)
        else:
            for _ in range(n):
                token = timer.begin(meta)
                dst.copy_(src)
                timer.end(token)

    def join_copies(self) -> None:
        """End of an overlap step: the next step waits for this step's copies, on the GPU
        (a stream wait, no host sync) or for the CPU copier thread. Without it the host
        would queue copies ahead of the collectives they are meant to overlap."""
        if self.side is not None:
            torch.cuda.current_stream().wait_stream(self.side)
        elif self.copier is not None:
            self.copier.wait_idle()

    def synchronize(self) -> None:
        """What the sync modes wait for: the whole device (CUDA), or the copier (CPU)."""
        if self.cuda:
            torch.cuda.synchronize()
        elif self.copier is not None:
            self.copier.wait_idle()

    def close(self) -> None:
        if self.copier is not None:
            self.copier.close()
            self.copier = None


# --------------------------------------------------------------------------- the loop


def warm_up(work: Workload, iterations: int, settings: Settings) -> None:
    """Untimed: NCCL communicator set-up, allocator, first copies."""
    for _ in range(iterations):
        work.collective()
    if iterations and settings.copies:
        work.copies(1, settings, overlap=False, timer=NullTimer(), step=-1, epoch=0)


def run_steps(
    work: Workload,
    instr: Instrumentation | BareInstrumentation,
    control: Control,
    stop: StopFlag,
    status: WorkerStatus,
    iters: int,
) -> int:
    """Steps until ``iters`` collectives (0: until ``stop``); returns collectives done."""
    per_step = work.config.collectives_per_step
    collective = work.collective
    copy_timer = instr.copy_timer
    it = 0
    step = 0
    delayer = Delayer(torch, work.cuda)
    wait = 0.0
    while not stop.requested and (iters == 0 or it < iters):
        settings, epoch = control.begin_step(it)
        if settings is not status.settings:
            status.settings = settings
            status.epoch = epoch
            wait = delay_s(settings, work.rt.rank, work.rt.world_size)
        mode = settings.mode
        mode_index = MODE_INDEX[mode]
        instr.step_begin(step)
        if mode != "none" and settings.copies:
            work.copies(settings.copies, settings, mode == "overlap", copy_timer, step, epoch)
            if mode != "overlap":
                work.synchronize()
                if mode == "sync-barrier":
                    dist.barrier()
        n = per_step if iters == 0 else min(per_step, iters - it)
        for _ in range(n):
            if wait:
                delayer.wait(wait, settings.delay_on)
            token = instr.coll_begin(it, step, epoch, mode_index)
            collective()
            instr.coll_end(token)
            it += 1
            status.iteration = it
            instr.after_collective()
        if mode == "overlap" and settings.copies:
            work.join_copies()
        instr.step_end()
        step += 1
    return it


# --------------------------------------------------------------------------- one worker


def run_info(config: LoopConfig, rt: Runtime, live: bool = True) -> RunInfo:
    """Who this rank is, for its Hellos; ``live``: its settings follow the collector (the
    collector refuses every change when they do not)."""
    device, uuid, nccl = "cpu", "", ""
    if rt.cuda:
        device = torch.cuda.get_device_name(rt.device_index)
        uuid = gpu_uuid(rt.device_index)
        nccl = nccl_version()
    return RunInfo(
        rank=rt.rank,
        world_size=rt.world_size,
        local_rank=rt.local_rank,
        local_world_size=rt.local_world_size,
        host=reported_hostname(),
        pid=os.getpid(),
        backend=rt.backend,
        device=device,
        device_index=rt.device_index,
        gpu_uuid=uuid,
        torch_version=torch.__version__,
        nccl_version=nccl,
        config=config.as_dict() | {"live_control": live},
    )


_UNSET: Any = object()


def cupti_feed(work: Workload, bare: bool) -> Any:
    """A :class:`~workers.rank.cupti_timer.CuptiFeed` where CUPTI can time this loop (CUDA,
    ``COMMTOP_TIMING`` not ``events``), else None: CUDA events then, said once in one line.

    Every rank runs the same few set-up collectives to learn what one collective leaves in
    CUPTI (even a rank whose CUPTI failed to start, so that ranks never disagree on how
    many collectives were issued). The bare twin pauses CUPTI, so A/B blocks differ in it."""
    if not work.cuda or os.environ.get("COMMTOP_TIMING", "cupti") == "events":
        return None
    from workers.rank import cupti_activity
    from workers.rank.cupti_timer import LEARN_OPS, CuptiFeed, learn_collective

    try:
        cupti: Any = cupti_activity.client()
    except cupti_activity.CuptiUnavailable as exc:
        cupti = None
        _say_once(f"commtop: timing with CUDA events ({exc})")
    sig = getattr(work, "cupti_signature", _UNSET)
    if sig is _UNSET:
        if cupti is None:
            for _ in range(LEARN_OPS):
                work.collective()
            sig = None
        else:
            sig = learn_collective(cupti, work.collective, torch.cuda.synchronize)
            if sig is None:
                _say_once(
                    f"commtop: CUPTI shows no records that tell one {work.config.collective} from the next; "
                    "timing with CUDA events"
                )
        work.cupti_signature = sig
    if cupti is None or sig is None:
        return None
    if bare:
        cupti.pause()
        return None
    cupti.resume()
    torch.cuda.synchronize()  # set-up: records before this are not the timed loop's
    return CuptiFeed(cupti, sig, cupti.timestamp())


_said: set[str] = set()


def _say_once(line: str) -> None:
    if line not in _said:
        _said.add(line)
        print(line, file=sys.stderr, flush=True)


def _make_instrumentation(
    config: LoopConfig,
    work: Workload,
    publisher: RecordPublisher | NullPublisher,
    control: Control,
    status: WorkerStatus,
    bare: bool,
) -> Instrumentation | BareInstrumentation:
    if work.cuda:
        torch.cuda.synchronize()  # the one start-up sync: anchors GPU event times to time.time_ns()
        main_stream = torch.cuda.current_stream()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        cuda_anchor = Anchor(event, time.time_ns(), spare=torch.cuda.Event(enable_timing=True), stream=main_stream)
        event.synchronize()  # done within microseconds (the GPU is idle); harvests may use it at once
        anchor: Anchor | None = cuda_anchor
        api = runtime_events(torch)  # the same events, recorded through the CUDA runtime directly

        def timer(capacity: int, stream: Any = None, timed_start: bool = True) -> Timer:
            s = stream if stream is not None else main_stream
            return CudaTimer(torch, capacity, cuda_anchor if timed_start else None, s, api)

    else:
        anchor = None

        def timer(capacity: int, stream: Any = None, timed_start: bool = True) -> Timer:
            return CpuTimer()

    feed = cupti_feed(work, bare)
    if bare:
        return BareInstrumentation(timer(STEP_RING, timed_start=False))
    batcher = RecordBatcher(
        publisher,
        control.status,
        op_index=work.op_index,
        coll_nbytes=work.nbytes,
        dtype_code=dtype_code(config.dtype),
        bus_factor=work.bus_factor,
        batch_ms=batch_ms_for_world(config.batch_ms, work.rt.world_size),
    )
    step_timer = timer(STEP_RING, timed_start=False)  # harvested on the loop thread: no anchor reads there
    if feed is not None:
        from workers.rank.cupti_timer import CuptiTimer

        # Records arrive a buffer at a time (tens of ms): rings sized for ~4 s at 15,000/s.
        coll_timer: Timer = CuptiTimer(feed, "collectives", CUPTI_RING, feed.sig.per_op)
        copy_timer: Timer = CuptiTimer(feed, "copies", CUPTI_RING // 8)
    else:
        coll_timer = timer(COLL_RING)
        copy_timer = timer(COPY_RING, work.side)  # copies are recorded on the side stream
    return Instrumentation(coll_timer, copy_timer, step_timer, batcher, status, anchor, threaded=work.cuda)


def run_worker(
    config: LoopConfig,
    rt: Runtime,
    conn: Connection | None,
    control: Control,
    *,
    bare: bool = False,
    stop: StopFlag | None = None,
    dead_man: bool = False,
    sampler_gpus: list[str] | None = None,
    prometheus: str = "",
) -> WorkerResult:
    """Run one rank's loop in an initialised process group; publish to ``conn`` if given.

    ``dead_man`` (the real worker process, not tests) lets the heartbeat thread end the
    process if the launcher vanishes or a stop does not complete in time; ``sampler_gpus``
    starts the node sampler on local rank 0 (see :class:`workers.rank.session.RankSession`);
    ``prometheus`` ([HOST:]PORT) makes it serve this node's metrics, fed a copy of every batch.
    """
    stop = stop or StopFlag()
    status = WorkerStatus(settings=config.initial_settings(), rejected=getattr(control, "rejected", None))
    status.groups = (describe(None),)  # every record runs on the default group: code 0
    session = RankSession(
        None if bare else conn,
        run_info(config, rt, live=not isinstance(control, StaticControl)),
        status,
        stop=stop,
        dead_man=dead_man,
        sampler_gpus=None if bare else sampler_gpus,
        prometheus="" if bare else prometheus,
    )
    publisher = session.publisher
    session.start_heartbeat()
    work: Workload | None = None
    instr: Instrumentation | BareInstrumentation | None = None
    iterations = 0
    code, reason = 0, "finished"
    try:
        work = Workload(config, rt)
        status.pinned_bytes = work.pinned_bytes
        if conn is not None and not bare and not publisher.wait_connected(CONNECT_WAIT_S) and rt.local_rank == 0:
            print(
                f"commtop worker rank {rt.rank}: no collector at {conn.data} yet; running anyway "
                "(records are dropped until one listens)",
                file=sys.stderr,
                flush=True,
            )
        warm_up(work, config.warmup, status.settings)
        instr = _make_instrumentation(config, work, publisher, control, status, bare)
        iterations = run_steps(work, instr, control, stop, status, config.iters)
        instr.finish(work.synchronize)
        if stop.requested:
            reason = stop.reason or "stopped"
    except BaseException as exc:  # reported in Bye (and on stderr); the caller exits with ``code``
        iterations = status.iteration
        if isinstance(exc, KeyboardInterrupt):
            stop.request("interrupted")
        if stop.requested:
            reason = f"{stop.reason or 'stopped'} (a peer left during a collective: {type(exc).__name__})"
        else:
            traceback.print_exc(file=sys.stderr)
            code, reason = 1, bye_reason(exc)
        if instr is not None:
            try:
                instr.finish(None)  # flush what was timed; no device sync on a failing path
            except Exception:
                pass
    finally:
        if work is not None:
            work.close()
        session.close(code, reason)
    summary: dict[str, Any] = {"rank": rt.rank, "bare": bare, "iterations": iterations}
    if instr is not None:
        summary |= instr.steps.times.summary()
        if isinstance(instr, Instrumentation):
            summary |= {"sent": publisher.sent, "dropped": publisher.dropped, "untimed": status.untimed}
            if prometheus and not bare:
                summary["tap_dropped"] = getattr(publisher, "tap_dropped", 0)
    return WorkerResult(code, reason, iterations, summary)
