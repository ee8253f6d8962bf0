"""A monitored rank's timers: its collectives and copies timed, finished records batched.

The plumbing under :class:`~workers.monitor.monitor.Monitor`'s hooks. Finished records move
into the :class:`MonitorBatcher` at each harvest. Errors propagate: the Monitor catches them,
logs once and turns timing off.

Timing (details in :meth:`Timers.coll_end`): on CUDA, events on the issuing stream around a
blocking collective; for ``async_op=True``, the end event is recorded on a private stream
made to wait on the Work's future (the NCCL stream's completion), so it marks the
collective's end, not the later ``wait()``. On CPU (gloo): ``perf_counter_ns`` around the
call, or until the Work's future completes (a done-callback on gloo's thread).
PyTorch's own NCCL timing (TORCH_NCCL_ENABLE_TIMING + ``Work.get_duration()``) is not
used: it must be set before the process group exists, gives a duration without a start
time (no timeline), needs each Work kept and polled until done, and has no gloo twin.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

from workers.monitor import patch, wait_hook
from workers.monitor.graphs import GraphCounter
from workers.monitor.patch import WORK_WAIT, Args, Kwargs, OpSpec
from workers.monitor.records import MonitorBatcher
from workers.monitor.unseen import Unseen, collectives
from workers.rank.groups import GroupTable
from workers.rank.heartbeat import WorkerStatus
from workers.rank.timing import Anchor, CpuTimer, CudaTimer
from workers.wire.endings import bye_reason
from workers.wire.protocol import dtype_code

log = logging.getLogger("commtop.monitor")

#: Where a collective's meta tuple (the MONITOR_COLL_ROW fields before start_ns) holds host_ns.
HOST_NS = 9

COLL_RING = 4096
COPY_RING = 1024
#: Threads whose GPU collectives are timed (a ring each); more are counted as lost.
MAX_COLL_RINGS = 8
#: Collectives between two moves of the job's rows into the batcher (keeps the CUDA event rings
#: from filling); sending is the flush thread's (workers.monitor.flush_thread).
HARVEST_EVERY = 64
#: The ops of point-to-point calls (OpSpec.op): NCCL numbers them apart from its collectives.
P2P_OPS = frozenset({"send", "recv"})


class CudaTimers:
    """Made at the first CUDA record: the one host sync anchors event times to time.time_ns().

    A ring of collective events per thread that issues GPU collectives (:meth:`coll_ring`): a
    ring's begin/end pairs never interleave and complete in its thread's stream order, and the
    job's threads do issue them (DDP's comm hook runs on autograd's device thread, a saver
    thread beside the loop). Past MAX_COLL_RINGS threads, a collective is counted, not timed."""

    def __init__(self, torch: Any) -> None:
        torch.cuda.synchronize()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        self.anchor = Anchor(event, time.time_ns())
        self.torch = torch
        self.rings: dict[int, CudaTimer] = {}  # thread id -> its ring (written under _making)
        self._making = threading.Lock()
        self.copy = CudaTimer(torch, COPY_RING, self.anchor)
        self.stream = torch.cuda.Stream()  # ends of async collectives: nothing else runs here
        self.coll_ring()

    def coll_ring(self) -> CudaTimer | None:
        """The calling thread's ring (made at its first GPU collective); None past MAX_COLL_RINGS."""
        me = threading.get_ident()
        ring = self.rings.get(me)
        if ring is None:
            with self._making:
                if len(self.rings) >= MAX_COLL_RINGS:
                    return None
                ring = self.rings[me] = CudaTimer(self.torch, COLL_RING, self.anchor)
        return ring

    def coll_rings(self) -> list[CudaTimer]:
        return list(self.rings.values())  # a copy: another thread may add its ring meanwhile


class Ender:
    """Done-callback of an async gloo Work's future: ends its timing on gloo's thread, and the
    rank's ``inside`` where this collective holds it (``status``: None where it does not). A
    Work that failed (a peer gone, a timeout) is no record: ``failed`` counts it."""

    __slots__ = ("timer", "token", "status", "inside", "failed")

    def __init__(
        self,
        timer: CpuTimer,
        token: Any,
        status: WorkerStatus | None = None,
        inside: Any = None,
        failed: Callable[[BaseException, int], None] | None = None,
    ) -> None:
        self.timer = timer
        self.token = token
        self.status = status
        self.inside = inside
        self.failed = failed

    def __call__(self, future: Any) -> None:
        try:
            if future is not None:
                try:
                    future.value()  # raises the Work's error (its value: the tensors, at once)
                except Exception as exc:  # noqa: BLE001 - the job sees it from its own wait()
                    self.fail(exc)
                    return
            self.timer.end(self.token)
            self._release()
        except Exception:  # noqa: BLE001 - never raise on torch's thread
            pass

    def fail(self, exc: BaseException) -> None:
        """The Work failed after it was issued: counted as failed, not timed."""
        try:
            if self.failed is not None:
                self.failed(exc, self.iteration)
            self._release()
        except Exception:  # noqa: BLE001 - never raise on torch's thread
            pass

    def _release(self) -> None:
        status = self.status
        if status is not None and status.inside is self.inside:
            status.inside = ()

    def done(self) -> None:
        """The end seen by the job's own wait() (workers.monitor.wait_hook)."""
        self(None)

    @property
    def iteration(self) -> int:
        return int(self.token[0][0])


class Timers:
    """The host-clock and CUDA-event timers of one monitored rank, and its records' way into
    the batcher. ``on_cuda`` runs once, when the first GPU record makes the CUDA timers."""

    def __init__(
        self, batcher: MonitorBatcher, status: WorkerStatus, on_cuda: Callable[[], None], groups: GroupTable
    ) -> None:
        self.batcher = batcher
        self.status = status
        self.groups = groups
        self.on_cuda = on_cuda
        self.cpu_coll = CpuTimer()
        self.cpu_copy = CpuTimer()
        self.cuda: CudaTimers | None = None
        self.iteration = 0  # collectives begun on this rank (the records' iteration)
        self.lock = threading.RLock()  # harvest vs rows from a capture thread (add)
        self._since_harvest = 0
        self._dtypes: dict[Any, int] = {}  # torch dtype -> protocol code (a handful per job)
        #: what torch issued on gloo groups that no hook saw (counted into the Hello's ``lost``)
        self.unseen = Unseen(groups)
        self._seen = self.unseen.seen
        self._issued = self.unseen.issued
        self._cuda_lost = 0
        self._ring_less_lost = 0  # GPU collectives of threads past MAX_COLL_RINGS
        self.graph_captured = 0  # GPU collectives the hooks saw issued while a CUDA graph was captured
        #: calls that raised after torch issued them (a peer gone, a timeout): (count, the last error)
        self.failed: tuple[int, str] = (0, "")
        #: Of those, the ones that raised in the job's call (their iteration went back: no gap)...
        self._failed_in_call = 0
        #: ... and the iterations of async ones (their wait raised, the newest kept): a later
        #: record shows each as a gap, so at close only those after the last record batched
        #: count as lost (counted at once, a later gap counted them twice: a Hello's ``lost``
        #: never goes down).
        self._failed_async: deque[int] = deque(maxlen=wait_hook.MAX_DROPPED)
        self._failed_async_lost = 0
        #: At close: collectives whose Work or tensor the job never waited on, after the last record
        self.unwaited = 0
        #: Counts the collectives in CUDA graphs, captured and replayed (workers.monitor.graphs),
        #: once installed; until then what the hooks saw captured counts.
        self.graph_counter: GraphCounter | None = None
        #: Whether the current CUDA stream is being captured into a CUDA graph (a function, so
        #: a test without a GPU can say yes).
        self.capturing: Callable[[], bool] = self._first_capturing
        #: collectives lost elsewhere (the Flight Recorder capture's overwritten entries)
        self.capture_lost = 0
        #: Under the Flight Recorder capture: the hooks time only gloo groups' collectives
        #: (workers.capture.gloo_side), and the iterations are shared with the capture thread
        #: (:meth:`take`).
        self.gloo_only = False
        #: Iterations are taken under this lock: by the job's threads (an asynchronous
        #: checkpoint's saver beside the training loop) and the Flight Recorder capture's.
        self._numbers = threading.Lock()
        self._spares: list[int] = []  # iterations given back after later ones were taken
        self._making = threading.Lock()  # the CUDA timers are made once, whichever thread comes first
        self._waiter: queue.SimpleQueue[tuple[Any, Ender] | None] | None = None
        self._waiter_thread: threading.Thread | None = None

    def cuda_timers(self) -> CudaTimers:
        if self.cuda is None:
            import torch

            with self._making:
                if self.cuda is None:
                    self.cuda = CudaTimers(torch)
                    self.on_cuda()
        return self.cuda

    def copy_timer(self, on_gpu: bool) -> CudaTimer | CpuTimer:
        """The timer of a ``mon.copy()`` block: CUDA events with a stream, else the host clock."""
        return self.cuda_timers().copy if on_gpu else self.cpu_copy

    # ------------------------------------------------------------------ collectives

    def coll_begin(self, spec: OpSpec, args: Args, kwargs: Kwargs, step: int, epoch: int, mode: int) -> Any:
        """Before a collective: its metadata and the start of its timing (the token). The token
        holds all that :meth:`coll_end` or :meth:`coll_failed` need of this call: several of the
        job's threads may be inside collectives at once. Arguments the hooks cannot describe (a
        list where torch wants a tensor: torch refuses the call itself) give no token: that call
        is not timed, and the monitor stays on."""
        try:
            tensor, nbytes, group, is_async = spec.parse(args, kwargs)
        except Exception:  # noqa: BLE001 - torch's own check of its arguments says what is wrong
            return None
        if type(group) is int:  # torch's GroupMember.NON_GROUP_MEMBER: not this rank's group, torch issues nothing
            return None
        on_gpu = tensor is not None and tensor.is_cuda
        if on_gpu and self.capturing():  # also under the Flight Recorder capture: torch records none
            return self._in_graph_capture()
        if spec.at_wait and (tensor is None or on_gpu):  # NCCL's: see patch.METHODS, patch.FUNCOL
            return None
        known = self.groups.by_pg.get(group)  # (code, size): one lookup once the group was seen
        code, ranks = known if known is not None else self.groups.of_pg(group)
        if self.gloo_only and not self.unseen.is_gloo(code, group):  # NCCL's: the Flight Recorder's
            return None
        ring = None
        if on_gpu:
            ring = (self.cuda or self.cuda_timers()).coll_ring()
            if ring is None:
                return self._ring_less()
        if spec.times_group:  # nccl-tests' S of gather and scatter: every rank's tensor
            nbytes *= ranks
        calls = self._issued.get(spec.func)  # what one call of it issues on this group, once known
        issued = calls[code] if calls is not None else 0
        calibrating = None
        if not issued:  # its first call on this group: 1 now, the rest when it returned
            issued = 1
            if on_gpu and spec.op in P2P_OPS and self.unseen.numbered_apart(code, group):
                issued = 0  # NCCL numbers its sends and receives apart: not in the count compared
            else:
                calibrating = self.unseen.calibrate(spec.func, code, group)
        self._seen[code] += issued
        dtype = 0
        if tensor is not None:
            dtype = self._dtypes.get(tensor.dtype, -1)
            if dtype < 0:
                dtype = self._dtypes[tensor.dtype] = dtype_code(str(tensor.dtype))
        with self._numbers:  # one numbering for every thread (and the Flight Recorder capture's)
            if self._spares:
                it = self._spares.pop()
            else:
                it = self.iteration
                self.iteration = it + 1
        meta = (it, step, epoch, mode, spec.code, code, dtype, nbytes, ranks, time.time_ns())
        inside = None  # a hang shows where (Hello.inside): the oldest collective begun, not finished
        if (ring is None or not is_async) and not self.status.inside:  # (a GPU async one ends on the GPU)
            inside = self.status.inside = (spec.code, code, nbytes, meta[HOST_NS])
        if ring is not None:
            return ring, ring.begin(meta), is_async, 0, 0, it, code, issued, calibrating, inside
        return None, meta, is_async, time.perf_counter_ns(), spec.at_wait, it, code, issued, calibrating, inside

    def coll_end(self, token: Any, result: Any) -> bool:
        """After the call returned: end now (blocking call), or when the Work completes.
        True when a harvest is due.

        CPU, blocking: the row is handed to the harvest right here (start_ns = host_ns, as the
        schema says for CPU). CPU, async: a CpuTimer token ended by the Work future's done-callback
        on gloo's thread (or by a waiter thread for Works without a future; for isend/irecv,
        which only the job's own wait() finishes, when that wait returns). CUDA, blocking:
        the end event on the issuing stream, which the call made wait for the NCCL stream.
        CUDA, async: the end event on a private stream made to wait on the Work's future,
        i.e. on the NCCL stream's completion event; the job's own wait() comes later and
        does not move it. (Calling Work.wait() there instead would unstash the tensors the
        Work keeps alive for the caching allocator: unsafe.)
        """
        timer, meta, is_async, pc, at_wait, _it, _code, _issued, calibrating, inside = token
        held = inside is not None and self.status.inside is inside
        if held and (timer is not None or not is_async or result is None or at_wait):
            # ended here; an async gloo one when its Work completes (Ender); one the job's own wait
            # ends (isend, a functional collective) may never be waited on: not held
            self.status.inside = ()
            held = False
        if calibrating is not None:
            self.unseen.calibrated(calibrating)
        if timer is None:
            if not is_async or result is None:  # a deque: thread-safe beside another thread's harvest
                self.cpu_coll.ready.append((*meta, meta[HOST_NS], (time.perf_counter_ns() - pc) / 1000.0))
            else:
                ender = Ender(
                    self.cpu_coll, (meta, meta[HOST_NS], pc), self.status if held else None, inside, self._async_failed
                )
                if at_wait:  # untimed if it cannot be followed (a gap)
                    if at_wait == WORK_WAIT:
                        wait_hook.expect(result, ender)
                    elif type(result).__name__ == "AsyncCollectiveTensor":  # (a tensor's getattr miss: ~2 us)
                        wait_hook.expect_tensor(result.elem, ender)
                    else:  # already waited inside the call (a gather on another dimension, tracing)
                        ender.done()
                    return self._count()
                try:
                    future = result.get_future()
                except RuntimeError:  # a Work without a future (gloo's reduce_scatter_tensor)
                    self._waiter_queue().put((result, ender))
                else:
                    future.add_done_callback(ender)
        else:
            slot = meta
            if not is_async or result is None:
                timer.end(slot)
            elif slot >= 0:
                cuda = self.cuda
                assert cuda is not None
                try:
                    future = result.get_future()
                except RuntimeError:  # a Work without a future: this record goes untimed
                    future = None
                if future is None or not future.done():  # NCCL marks it done at launch; never block
                    timer.untimed += 1
                    return False
                with cuda.torch.cuda.stream(cuda.stream):
                    future.wait()  # this private stream waits for the NCCL stream's end event
                    timer.end(slot)  # ... so this end event marks the collective's completion
        return self._count()

    def take(self, n: int) -> int:
        """The first of ``n`` iterations for records captured off the job's thread."""
        with self._numbers:
            it = self.iteration
            self.iteration = it + n
            return it

    def _count(self) -> bool:
        """One more collective ended or handed on; True when the job's thread moves its rows on."""
        self._since_harvest += 1
        return self._since_harvest >= HARVEST_EVERY

    def _first_capturing(self) -> bool:
        """The first GPU collective: from now on ``capturing`` is torch's own C function (~0.1 us
        a call, on every GPU collective), or False where torch has none (a CPU build: the
        tests' stand-in CUDA tensors)."""
        import torch

        compiled = torch.cuda._is_compiled()  # a CPU build has a stand-in that raises
        self.capturing = torch._C._cuda_isCurrentStreamCapturing if compiled else _never
        return bool(self.capturing())

    def _in_graph_capture(self) -> None:
        """A GPU collective issued while its stream is captured into a CUDA graph: NCCL only
        records it there (it runs at each replay of the graph, where no hook sees it), torch's
        Flight Recorder keeps no entry of it, and no event may be recorded on the stream (nor
        the CUDA timers made: they synchronize). Not timed, counted as lost (by the graph
        counter, with the replays, where it is in); said once at the end (Monitor._say_unseen)."""
        with self._numbers:
            self.graph_captured += 1
        self.publish_lost()

    def _ring_less(self) -> None:
        """A GPU collective of a thread past MAX_COLL_RINGS: not timed, counted as lost (the
        Hello's ``lost``), never silently left out."""
        with self._numbers:
            self._ring_less_lost += 1
        self.publish_lost()

    def coll_failed(self, token: Any, error: BaseException | None = None) -> None:
        """The call of ``token`` raised: its iteration goes back, so a later collective takes it
        and no gap counts as missing. Refused before it was issued (torch's checks of its
        arguments): not counted at all. Issued, then failed (a peer gone, a timeout: torch
        numbered it): counted as lost, with ``error`` said at the end. A CUDA start event stays
        unharvested; the next begin reuses its slot."""
        timer, slot, _is_async, _pc, _at_wait, it, code, issued, calibrating, inside = token
        if inside is not None and self.status.inside is inside:
            self.status.inside = ()
        with self._numbers:
            if self.iteration == it + 1:
                self.iteration = it
            else:  # another thread (or the capture) took later ones meanwhile
                self._spares.append(it)
        if issued and self.unseen.issued_anyway(code):
            with self._numbers:
                self.failed = (self.failed[0] + 1, bye_reason(error, 160) if error is not None else "")
                self._failed_in_call += 1
            self.publish_lost()
        else:
            self._seen[code] -= issued
        if calibrating is not None:
            self.unseen.abandon(calibrating)
        if timer is not None and slot < 0:
            timer.untimed -= 1  # the ring was full: it counted one untimed

    # ------------------------------------------------------------------ records

    def harvest(self, send: bool = True) -> None:
        """Move finished records into the batcher; send a batch if one is due (``send``), else
        only a full one (the job's threads: bounded memory, the rest is the flush thread's).
        The lock is contended by the flush thread's send and a capture thread's add."""
        self._since_harvest = 0
        with self.lock:
            b = self.batcher
            self.cpu_coll.harvest(b.coll_rows)
            self.cpu_copy.harvest(b.copy_rows)
            cuda = self.cuda
            if cuda is not None:
                for ring in cuda.coll_rings():
                    ring.harvest(b.coll_rows)
                cuda.copy.harvest(b.copy_rows)
            if b.due() if send else b.full():
                b.flush()
                if cuda is not None:
                    self._count_untimed(cuda, in_flight=False)
                if self.unseen.due():
                    self.count_unseen()

    def add(self, coll_rows: list[tuple[Any, ...]], copy_rows: list[tuple[Any, ...]]) -> None:
        """Rows captured off the job's thread (workers.capture), batched and sent from the
        caller's thread."""
        with self.lock:
            b = self.batcher
            b.coll_rows.extend(coll_rows)
            b.copy_rows.extend(copy_rows)
            if b.due():
                b.flush()
            if self.unseen.untimed_gloo and self.unseen.due():  # the Flight Recorder capture's thread
                self.count_unseen()

    def add_array(self, records: np.ndarray) -> None:
        """MONITOR_COLL_ROW records captured off the job's thread, batched and sent from the
        caller's thread."""
        with self.lock:
            b = self.batcher
            b.add_array(records)
            if b.due():
                b.flush()

    def in_flight(self) -> bool:
        """GPU records begun whose events have not completed yet."""
        cuda = self.cuda
        return cuda is not None and bool(cuda.copy.count or any(r.count for r in cuda.coll_rings()))

    def flush(self) -> None:
        with self.lock:
            self.batcher.flush()

    def count_unfinished(self) -> None:
        """At close, after the last harvest: GPU records whose end never came (a kernel ahead of
        them, a stopped peer) will never be timed or sent: count them (the last Hello's ``lost``
        and ``untimed``), not drop them silently. Before, a rank stuck behind a 60 s kernel when
        stopped lost 148 collectives on an H100 with ``lost 0``. Then what no hook saw."""
        cuda = self.cuda
        with self.lock:
            if cuda is not None:
                self._count_untimed(cuda, in_flight=True)
            self.count_unseen()
            self._count_unwaited()

    def _count_unwaited(self) -> None:
        """Records ended by the job's own wait (isend, irecv, functional collectives) that it
        never waited on (workers.monitor.wait_hook.unwaited) never come: those after the last
        record batched are no gap the collector could count, so they count here."""
        top = self.batcher.top_iteration
        ends = wait_hook.unwaited()
        self.unwaited = sum(1 for e in ends if isinstance(e, Ender) and e.timer is self.cpu_coll and e.iteration > top)
        with self._numbers:
            self._failed_async_lost = sum(1 for it in self._failed_async if it > top)
        self.publish_lost()

    def _count_untimed(self, cuda: CudaTimers, in_flight: bool) -> None:
        """The status's ``untimed`` (collectives and copies) and ``lost`` (collectives begun, never
        timed nor sent); ``in_flight``: those whose end is still awaited count too (at close)."""
        coll = sum(r.untimed + (r.count if in_flight else 0) for r in cuda.coll_rings())
        copy = cuda.copy.untimed + (cuda.copy.count if in_flight else 0)
        self.status.untimed = coll + copy
        self._cuda_lost = coll
        self.publish_lost()

    def count_unseen(self) -> None:
        """Compare gloo's numbers with what the hooks saw (workers.monitor.unseen) while the
        groups exist: about once a second, before ``destroy_process_group``, at close. Only
        while the hooks are in (without them every number would read as missed), or while the
        Flight Recorder capture leaves gloo's collectives untimed (every one is missed)."""
        if patch.patched() or self.unseen.untimed_gloo:
            self.unseen.read()
            self.publish_lost()

    def forget_groups(self) -> None:
        """``destroy_process_group()`` took every group (after :meth:`count_unseen`): groups made
        later count from 0 (workers.monitor.unseen)."""
        with self.lock:
            self.unseen.forget_groups()
            self.publish_lost()

    def _async_failed(self, error: BaseException, iteration: int) -> None:
        """An async Work failed after it was issued (Ender, on gloo's or the waiter's thread)."""
        with self._numbers:
            self.failed = (self.failed[0] + 1, bye_reason(error, 160))
            self._failed_async.append(iteration)
        self.publish_lost()

    def say_failed(self, rank: int) -> None:
        """One line at the end where calls failed after torch issued them, one where the job never
        waited on calls whose end is its wait (they count as missing)."""
        if self.unwaited:
            log.warning(
                "commtop monitor: rank %d: %s ended by the job's own wait() (isend, irecv, functional "
                "collectives) never waited on: not timed, counted as missing",
                rank,
                collectives(self.unwaited),
            )
        failed, error = self.failed
        if failed:
            log.warning(
                "commtop monitor: rank %d: %s failed inside torch once issued "
                "(the last: %s): not timed, counted as missing",
                rank,
                collectives(failed),
                error,
            )

    def publish_lost(self) -> None:
        """The Hello's ``lost``: every way this rank knows collectives went unrecorded."""
        graphs = self.graph_counter.lost if self.graph_counter is not None else self.graph_captured
        failed = self._failed_in_call + self._failed_async_lost
        lost = self.capture_lost + self._cuda_lost + self._ring_less_lost + graphs + failed + self.unwaited
        self.status.lost = lost + self.unseen.total

    def stop_waiter(self, timeout_s: float) -> None:
        """At close: the waiter thread ends once the Works it waits on have."""
        if self._waiter is not None and self._waiter_thread is not None:
            self._waiter.put(None)
            self._waiter_thread.join(timeout_s)

    # ------------------------------------------------------------------ internals

    def _waiter_queue(self) -> queue.SimpleQueue[tuple[Any, Ender] | None]:
        """The queue of a thread that waits on async CPU Works without a future, to time their
        end; started at the first such Work (once, whichever of the job's threads gets there)."""
        waiter = self._waiter
        if waiter is not None:
            return waiter
        with self._numbers:
            if self._waiter is None:
                self._waiter = self._start_waiter()
            return self._waiter

    def _start_waiter(self) -> queue.SimpleQueue[tuple[Any, Ender] | None]:
        waiter: queue.SimpleQueue[tuple[Any, Ender] | None] = queue.SimpleQueue()

        def run() -> None:
            while (job := waiter.get()) is not None:
                work, ender = job
                try:
                    work.wait()  # releases the GIL; the job's own wait() is unaffected
                except Exception as exc:  # noqa: BLE001 - the job sees the error from its own wait()
                    ender.fail(exc)
                    continue
                ender(None)

        self._waiter_thread = threading.Thread(target=run, name="commtop-monitor-waiter", daemon=True)
        self._waiter_thread.start()
        return waiter


def _never() -> bool:
    return False
