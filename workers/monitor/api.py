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

Timing (see ``Monitor.coll_end``): on CUDA, events on the issuing stream around a
blocking collective; for ``async_op=True``, the end event is recorded on a private stream
made to wait on the Work's future (the NCCL stream's completion), so it marks the
collective's end, not the later ``wait()``. On CPU (gloo): ``perf_counter_ns`` around the
call, or until the Work's future completes (a done-callback on gloo's thread).
PyTorch's own NCCL timing (TORCH_NCCL_ENABLE_TIMING + ``Work.get_duration()``) is not
used: it must be set before the process group exists, gives a duration without a start
time (no timeline), needs each Work kept and polled until done, and has no gloo twin.

Control units: ``apply_at`` in batch headers counts ``step()`` calls here (Hello.config
``control_unit`` = "step"), not collectives: ranks may issue different numbers of
collectives per step, but they all enter the same steps. Knobs must be declared on every
rank, before the first step (the first Hello, which the collector adopts as the settings
in force, is sent then).
"""

from __future__ import annotations

import atexit
import logging
import os
import queue
import sys
import threading
import time
from collections.abc import Sequence
from types import TracebackType
from typing import Any

from workers.monitor import patch as monitor_patch
from workers.monitor.patch import Args, Kwargs, OpSpec
from workers.monitor.records import OPS, MonitorBatcher
from workers.rank.control import Control, StaticControl
from workers.rank.heartbeat import RunInfo, WorkerStatus, reported_hostname
from workers.rank.session import RankSession
from workers.rank.timing import Anchor, CpuTimer, CudaTimer
from workers.wire.config import batch_ms_for_world
from workers.wire.connection import CONNECTION_FILE_ENV, Connection, ConnectionError_, find_by_endpoint, load
from workers.wire.lifeline import arm_from_env
from workers.wire.protocol import DIRECTIONS, MODES, bye_reason
from workers.wire.settings import MAX_KNOBS, Settings

log = logging.getLogger("commtop.monitor")

COLL_RING = 4096
COPY_RING = 1024
#: Collectives between harvests when a step runs many (keeps the CUDA event rings from filling).
HARVEST_EVERY = 64
EXIT_LINGER_MS = 500
EXIT_DRAIN_S = 1.0
MAX_NAME = 64
MAX_CHOICES = 16

_active: Monitor | None = None
_lock = threading.Lock()


# --------------------------------------------------------------------------- public API


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
        if conn is None and connection_file is None and connect is None and _env_int("RANK", 0) == 0:
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
    scatter; async_op=True included) into the active monitor. Returns the names patched."""
    try:
        return monitor_patch.patch()
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


# --------------------------------------------------------------------------- the monitor


class _CudaTimers:
    """Made at the first CUDA record: the one host sync anchors event times to time.time_ns()."""

    def __init__(self, torch: Any) -> None:
        torch.cuda.synchronize()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        anchor = Anchor(event, time.time_ns())
        self.torch = torch
        self.coll = CudaTimer(torch, COLL_RING, anchor)
        self.copy = CudaTimer(torch, COPY_RING, anchor)
        self.stream = torch.cuda.Stream()  # ends of async collectives: nothing else runs here


class Monitor:
    """One rank's view of a user's job; see the module docstring. Use :func:`start`."""

    def __init__(self, conn: Connection | None, *, batch_ms: float = 50.0, sampler: bool = True) -> None:
        self.conn = conn
        self.rank = _env_int("RANK", 0)
        self.local_rank = _env_int("LOCAL_RANK", 0)
        self.world_size = _env_int("WORLD_SIZE", 1)
        self.local_world_size = _env_int("LOCAL_WORLD_SIZE", 1)
        self.on = conn is not None  # timing and publishing (Hooks.on)
        self.busy = False  # Hooks.busy
        self.failure = ""
        self.knobs: dict[str, tuple[str, ...]] = {}  # declared knobs (read by rank 0's listener)
        self.mode_knob = ""  # the knob whose value fills the records' mode column
        self.copy_names: list[str] = []
        self._values: dict[str, str] = {}  # knob values in force
        self._raw = Settings(mode="none", copies=0)  # as the control hands them over
        self._epoch = 0
        self._mode = 0
        self._step = -1
        self._next_step = -1
        self._boundary = 0
        self._iteration = 0
        self._since_harvest = 0
        self._in_copy = False
        self._closed = False
        self._exit: tuple[int, str] = (0, "finished")
        self._groups: dict[Any, int] = {}
        self._cuda: _CudaTimers | None = None
        self._waiter: queue.SimpleQueue[tuple[Any, _Ender] | None] | None = None
        self.control: Control | None = None
        self._step_block = _StepBlock(self)
        self._publish_lock = threading.RLock()  # harvest vs rows from a capture thread (add_records)
        #: Copies are captured underneath (CUPTI, workers.capture): ``copy()`` blocks only set the stream.
        self.copies_captured = False
        #: How records are captured, for Hello.config (workers.capture sets it; "" = this API's hooks).
        self.capture = ""
        self.status = WorkerStatus(settings=self._raw)
        # rank and world size from the process group when it exists
        self.session = RankSession(
            conn,
            self._run_info(),
            self.status,
            sampler_gpus=self._gpus() if sampler else None,
            prometheus=conn.prometheus if conn is not None else "",  # `commtop run --prometheus -- ...`
        )
        self.publisher = self.session.publisher
        self.batcher = MonitorBatcher(
            self.publisher, self._control_status, batch_ms=batch_ms_for_world(batch_ms, self.world_size)
        )
        self.cpu_coll = CpuTimer()
        self.cpu_copy = CpuTimer()
        if conn is not None:
            arm_from_env()  # under `commtop run -- ...`: end with the torchrun agent, however it ends
            _hook_excepthook(self)

    # ------------------------------------------------------------------ user API

    def step(self, step: int) -> _StepBlock:
        """``with mon.step(step):`` one step of the job. On entry, knob changes agreed by
        every rank apply (the same step everywhere); on exit, finished records are sent."""
        self._next_step = step
        return self._step_block

    def copy(
        self,
        name: str,
        *,
        stream: Any = None,
        nbytes: int = 0,
        direction: str = "d2h",
        pinned: bool | None = None,
    ) -> _CopyBlock:
        """``with mon.copy("offload", stream=s, nbytes=n):`` times the copies issued in the
        block. With a CUDA ``stream``, the block runs with it as the current stream (like
        ``torch.cuda.stream(s)``) and is timed by events on it; else by the host clock."""
        return _CopyBlock(self, name, stream, nbytes, direction, pinned)

    def knob(self, name: str, choices: Sequence[str], default: str | None = None) -> str | None:
        """Declare a live knob (same on every rank, before the loop) and return its value.
        The first knob whose choices are offload modes (none/overlap/sync/...) also
        colours the records by mode, and the TUI's mode key switches it."""
        try:
            values = tuple(str(c) for c in choices)
            if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME or name.startswith("knob."):
                raise ValueError(f"knob name must be 1..{MAX_NAME} characters; got {name!r}")
            if not 0 < len(values) <= MAX_CHOICES or len(set(values)) != len(values):
                raise ValueError(f"knob {name!r} needs 1..{MAX_CHOICES} distinct choices; got {values!r}")
            if name in self.knobs:
                return self._values[name]
            if len(self.knobs) >= MAX_KNOBS:
                raise ValueError(f"at most {MAX_KNOBS} knobs")
            value = values[0] if default is None else str(default)
            if value not in values:
                raise ValueError(f"default {default!r} of knob {name!r} is not one of {values!r}")
            self.knobs[name] = values
            self._values[name] = value
            if not self.mode_knob and set(values) <= set(MODES):
                self.mode_knob = name
                self._mode = MODES.index(value)
            self._refresh()
            return value
        except Exception as exc:  # noqa: BLE001 - a bad declaration must not stop the job
            self._warn_once("knob", f"knob {name!r} not declared: {exc}")
            return None if default is None else str(default)

    def setting(self, name: str) -> Any:
        """A knob's value in force (None for an undeclared name)."""
        return self._values.get(name)

    def wait_connected(self, timeout_s: float) -> bool:
        """Wait (bounded) until a collector is connected; False if none came."""
        return self.publisher.wait_connected(timeout_s)

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ hooks (never raise)

    def coll_begin(self, spec: OpSpec, args: Args, kwargs: Kwargs) -> Any:
        """Before a collective: its metadata and the start of its timing (the token)."""
        try:
            tensor, nbytes, group, is_async = spec.parse(args, kwargs)
            ranks = self._groups.get(group)
            if ranks is None:
                ranks = self._group_size(group)
            it = self._iteration
            self._iteration = it + 1
            meta = (it, self._step, self._epoch, self._mode, spec.code, nbytes, ranks, time.time_ns())
            if tensor is not None and tensor.is_cuda:
                timer = (self._cuda or self._init_cuda()).coll
                return timer, timer.begin(meta), is_async
            return None, meta, is_async, time.perf_counter_ns()
        except Exception as exc:  # noqa: BLE001
            self.fail(exc)
            return None

    def coll_end(self, token: Any, result: Any) -> None:
        """After the call returned: end now (blocking call), or when the Work completes.

        CPU, blocking: the row is appended right here (start_ns = host_ns, as the schema
        says for CPU). CPU, async: a CpuTimer token ended by the Work future's done-callback
        on gloo's thread (or by a waiter thread for Works without a future). CUDA, blocking:
        the end event on the issuing stream, which the call made wait for the NCCL stream.
        CUDA, async: the end event on a private stream made to wait on the Work's future,
        i.e. on the NCCL stream's completion event; the job's own wait() comes later and
        does not move it. (Calling Work.wait() there instead would unstash the tensors the
        Work keeps alive for the caching allocator: unsafe.)
        """
        if token is None:
            return
        try:
            timer = token[0]
            if timer is None:
                _, meta, is_async, pc = token
                if not is_async or result is None:
                    self.batcher.coll_rows.append((*meta, meta[7], (time.perf_counter_ns() - pc) / 1000.0))
                else:
                    ender = _Ender(self.cpu_coll, (meta, meta[7], pc))
                    try:
                        future = result.get_future()
                    except RuntimeError:  # a Work without a future (gloo's reduce_scatter_tensor)
                        (self._waiter or self._start_waiter()).put((result, ender))
                    else:
                        future.add_done_callback(ender)
            else:
                _, slot, is_async = token
                if not is_async or result is None:
                    timer.end(slot)
                elif slot >= 0:
                    cuda = self._cuda
                    assert cuda is not None
                    try:
                        future = result.get_future()
                    except RuntimeError:  # a Work without a future: this record goes untimed
                        future = None
                    if future is None or not future.done():  # NCCL marks it done at launch; never block
                        timer.untimed += 1
                        return
                    with cuda.torch.cuda.stream(cuda.stream):
                        future.wait()  # this private stream waits for the NCCL stream's end event
                        timer.end(slot)  # ... so this end event marks the collective's completion
            self._since_harvest += 1
            if self._since_harvest >= HARVEST_EVERY:
                self.harvest()
        except Exception as exc:  # noqa: BLE001
            self.fail(exc)

    def harvest(self) -> None:
        """Move finished records into the batcher; send a batch if one is due. Never waits
        (the lock is only contended by a capture thread's add_records, a list extend)."""
        self._since_harvest = 0
        if self.control is None and not self._closed:  # a job that never calls step(): Hellos anyway
            self._make_control()
        with self._publish_lock:
            b = self.batcher
            self.cpu_coll.harvest(b.coll_rows)
            self.cpu_copy.harvest(b.copy_rows)
            cuda = self._cuda
            if cuda is not None:
                cuda.coll.harvest(b.coll_rows)
                cuda.copy.harvest(b.copy_rows)
            if b.due():
                b.flush()
                if cuda is not None:
                    self.status.untimed = cuda.coll.untimed + cuda.copy.untimed

    def add_records(self, coll_rows: list[tuple[Any, ...]], copy_rows: list[tuple[Any, ...]]) -> None:
        """Rows captured off the job's thread (workers.capture): batched and sent from the
        caller's thread. Never raises."""
        if not self.on or self._closed:
            return
        try:
            with self._publish_lock:
                b = self.batcher
                b.coll_rows.extend(coll_rows)
                b.copy_rows.extend(copy_rows)
                if b.due():
                    b.flush()
        except Exception as exc:  # noqa: BLE001
            self.fail(exc)

    # ------------------------------------------------------------------ steps and knobs

    def _begin_step(self) -> None:
        self._step = self._next_step
        if self._closed:
            return
        try:
            control = self.control or self._make_control()
            settings, epoch = control.begin_step(self._boundary)
            self._boundary += 1
            if settings is not self._raw:
                self._apply(settings, epoch)
        except Exception as exc:  # noqa: BLE001
            self.fail(exc)
            self.control = StaticControl(self._raw)  # knobs stay where they are

    def _end_step(self) -> None:
        if not self.on:
            return
        try:
            self.status.iteration = self._iteration
            self.harvest()
        except Exception as exc:  # noqa: BLE001
            self.fail(exc)

    def _initial_settings(self) -> Settings:
        return Settings(mode=MODES[self._mode], copies=0, knobs=dict(self._values))

    def _make_control(self) -> Control:
        """At the first step (knobs are declared by then): the live, agreed control, or a
        static one when there is no collector or no store to agree through."""
        self._refresh()
        initial = self._raw = self._initial_settings()
        self.status.settings = initial
        control: Control = StaticControl(initial)
        if self.conn is not None:
            try:
                control = self._live_control(initial)
            except Exception as exc:  # noqa: BLE001
                self._warn_once("control", f"live knobs off on rank {self.rank} ({exc})")
        self.control = control
        self.status.rejected = getattr(control, "rejected", None)  # refused control messages, in Hello
        if self.conn is not None:
            # Hellos start now: the collector adopts the first settings it hears as the
            # state in force, so they must already hold the declared knobs.
            self.session.start_heartbeat()
        return control

    def _live_control(self, initial: Settings) -> Control:
        from workers.rank.live_control import DesiredListener, LiveControl, connect_store, store_prefix

        assert self.conn is not None
        if self.world_size == 1:
            from torch.distributed import HashStore

            store: Any = HashStore()
        else:
            store = connect_store()
        desired = None
        if self.rank == 0:
            desired = DesiredListener(
                self.conn.control, self.conn.key, self.conn.session, knob_choices=self.knobs, context=self.session.ctx
            )
            desired.note_in_force(0, initial)
        return LiveControl(
            store,
            rank=self.rank,
            world_size=self.world_size,
            settings=initial,
            prefix=store_prefix(self.conn.session) + "/monitor",
            step=1,
            desired=desired,
        )

    def _apply(self, settings: Settings, epoch: int) -> None:
        """Settings agreed for this step: changed knobs take their new value. A changed
        ``mode`` (the TUI's mode key) moves the mode knob when that knob itself did not change."""
        prev, self._raw, self._epoch = self._raw, settings, epoch
        values = dict(self._values)
        changed = set()
        for name, value in settings.knobs.items():
            if name in self.knobs and value in self.knobs[name] and value != prev.knobs.get(name):
                values[name] = value
                changed.add(name)
        mk = self.mode_knob
        if mk and mk not in changed and settings.mode != prev.mode and settings.mode in self.knobs[mk]:
            values[mk] = settings.mode
        self._values = values
        if mk and values[mk] in MODES:
            self._mode = MODES.index(values[mk])
        self.status.settings = Settings(mode=MODES[self._mode], copies=0, knobs=dict(values))
        self.status.epoch = epoch

    def _control_status(self) -> tuple[int, int, int]:
        control = self.control
        return control.status() if control is not None else (0, -1, -1)

    # ------------------------------------------------------------------ internals

    def _init_cuda(self) -> _CudaTimers:
        import torch

        self._cuda = _CudaTimers(torch)
        self._refresh()
        return self._cuda

    def _start_waiter(self) -> queue.SimpleQueue[tuple[Any, _Ender] | None]:
        """A thread that waits on async CPU Works without a future, to time their end."""
        waiter: queue.SimpleQueue[tuple[Any, _Ender] | None] = queue.SimpleQueue()

        def run() -> None:
            while (job := waiter.get()) is not None:
                work, ender = job
                try:
                    work.wait()  # releases the GIL; the job's own wait() is unaffected
                except Exception:  # noqa: BLE001 - the job sees the error from its own wait()
                    continue
                ender(None)

        self._waiter_thread = threading.Thread(target=run, name="commtop-monitor-waiter", daemon=True)
        self._waiter_thread.start()
        self._waiter = waiter
        return waiter

    def _group_size(self, group: Any) -> int:
        import torch.distributed as dist

        n = int(dist.get_world_size(group))
        if len(self._groups) < 64:
            self._groups[group] = n
        return n

    def _run_info(self) -> RunInfo:
        """Who this rank is (refreshed when the process group, knobs or GPU timing appear)."""
        backend, device, index, uuid, torch_version, nccl = "unknown", "cpu", -1, "", "", ""
        torch = sys.modules.get("torch")
        if torch is not None:
            torch_version = str(torch.__version__)
            dist = sys.modules.get("torch.distributed")
            if dist is not None and dist.is_available() and dist.is_initialized():
                backend = str(dist.get_backend())
                self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
            if self._cuda is not None or backend == "nccl":
                from workers.rank.device import gpu_uuid, nccl_version

                index = torch.cuda.current_device()
                device, uuid, nccl = torch.cuda.get_device_name(index), gpu_uuid(index), nccl_version()
        config = {
            "source": "monitor",
            "collective": f"monitor: {os.path.basename(sys.argv[0] or 'python')}",
            "op_names": list(OPS),
            "knobs": {k: list(v) for k, v in self.knobs.items()},
            "mode_knob": self.mode_knob,
            "copy_names": list(self.copy_names),
            "control_unit": "step",
            "capture": self.capture or "monitor hooks",
        }
        return RunInfo(
            rank=self.rank,
            world_size=self.world_size,
            local_rank=self.local_rank,
            local_world_size=self.local_world_size,
            host=reported_hostname(),
            pid=os.getpid(),
            backend=backend if backend != "gloo" else "gloo/cpu",
            device=device,
            device_index=index,
            gpu_uuid=uuid,
            torch_version=torch_version,
            nccl_version=nccl,
            config=config,
        )

    def _gpus(self) -> list[str]:
        """This node's GPUs, for the node sampler (none seen yet: it watches every GPU)."""
        torch = sys.modules.get("torch")
        if torch is None or not torch.cuda.is_available():
            return []
        from workers.rank.device import gpu_uuid

        return [gpu_uuid(i) for i in range(min(self.local_world_size, torch.cuda.device_count()))]

    def _refresh(self) -> None:
        """A new frozen RunInfo for the heartbeat (rank, backend, knobs as known now)."""
        self.session.info = self._run_info()
        if self.control is None:
            self.status.settings = self._initial_settings()

    def _warn_once(self, what: str, message: str) -> None:
        key = f"_warned_{what}"
        if not getattr(self, key, False):
            setattr(self, key, True)
            log.warning("commtop monitor: %s", message)

    def fail(self, exc: BaseException) -> None:
        """An internal error: log it once and stop timing (the job goes on untouched)."""
        if not self.on:
            return
        self.on = False
        self.failure = f"{type(exc).__name__}: {exc}"
        log.warning(
            "commtop monitor (rank %d): telemetry disabled after an internal error: %s", self.rank, self.failure
        )

    def close(self) -> None:
        """Send what is left, say Bye, stop the threads. Idempotent; never raises."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._waiter is not None:  # the Works it waits on end first
                self._waiter.put(None)
                self._waiter_thread.join(EXIT_DRAIN_S)
            if self.on:
                deadline = time.monotonic() + EXIT_DRAIN_S
                while True:
                    self.harvest()
                    cuda = self._cuda
                    if cuda is None or (not cuda.coll.count and not cuda.copy.count) or time.monotonic() > deadline:
                        break
                    time.sleep(0.01)
                with self._publish_lock:
                    self.batcher.flush()
            if self.control is not None:
                self.control.close()
            self.session.close(*self._exit)
        except Exception as exc:  # noqa: BLE001
            log.warning("commtop monitor: while closing: %r", exc)


class _StepBlock:
    """``with mon.step(n):`` (one reusable object: no allocation per step)."""

    __slots__ = ("mon",)

    def __init__(self, mon: Monitor) -> None:
        self.mon = mon

    def __enter__(self) -> Monitor:
        self.mon._begin_step()
        return self.mon

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.mon._end_step()


class _CopyBlock:
    """``with mon.copy(...)``: the stream is made current even when the monitor is off."""

    __slots__ = ("mon", "name", "stream", "nbytes", "direction", "pinned", "_ctx", "_timer", "_token")

    def __init__(self, mon: Monitor, name: str, stream: Any, nbytes: int, direction: str, pinned: bool | None):
        self.mon = mon
        self.name = name
        self.stream = stream
        self.nbytes = nbytes
        self.direction = direction
        self.pinned = pinned
        self._ctx: Any = None
        self._timer: Any = None
        self._token: Any = None

    def __enter__(self) -> _CopyBlock:
        if self.stream is not None:
            import torch

            self._ctx = torch.cuda.stream(self.stream)
            self._ctx.__enter__()
        mon = self.mon
        if not mon.on or mon._in_copy or mon.copies_captured:
            return self
        try:
            if self.name not in mon.copy_names and len(mon.copy_names) < 32:
                mon.copy_names.append(str(self.name)[:MAX_NAME])
                mon._refresh()
            pinned = self.pinned if self.pinned is not None else self.stream is not None
            meta = (mon._step, mon._epoch, int(self.nbytes), DIRECTIONS.index(self.direction), int(bool(pinned)))
            timer = (mon._cuda or mon._init_cuda()).copy if self.stream is not None else mon.cpu_copy
            self._token = timer.begin(meta)
            self._timer = timer
            mon._in_copy = True
        except Exception as exc:  # noqa: BLE001
            mon.fail(exc)
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        timer = self._timer
        if timer is not None:
            self._timer = None
            self.mon._in_copy = False
            if et is None:
                try:
                    timer.end(self._token)
                except Exception as exc:  # noqa: BLE001
                    self.mon.fail(exc)
        if self._ctx is not None:
            ctx, self._ctx = self._ctx, None
            ctx.__exit__(et, ev, tb)


class _Ender:
    """Done-callback of an async gloo Work's future: ends its timing on gloo's thread."""

    __slots__ = ("timer", "token")

    def __init__(self, timer: CpuTimer, token: Any) -> None:
        self.timer = timer
        self.token = token

    def __call__(self, _future: Any) -> None:
        try:
            self.timer.end(self.token)
        except Exception:  # noqa: BLE001 - never raise on torch's thread
            pass


# --------------------------------------------------------------------------- helpers


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


def _hook_excepthook(mon: Monitor) -> None:
    """Remember an uncaught exception so the Bye says the job failed (and why)."""
    previous = sys.excepthook

    def hook(et: type[BaseException], ev: BaseException, tb: TracebackType | None) -> None:
        mon._exit = (1, bye_reason(ev))
        previous(et, ev, tb)

    sys.excepthook = hook


__all__ = ["Monitor", "active", "patch_distributed", "start", "stop", "unpatch_distributed"]
