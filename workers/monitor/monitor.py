"""The object a monitored job holds (``mon = monitor.start()``): one rank's user API and hooks.

``step``, ``copy``, ``knob`` and ``setting`` are what the job calls; ``coll_begin`` and
``coll_end`` are what the patched collectives call (:mod:`workers.monitor.patch`), and
``add_records`` what a capture thread calls (:mod:`workers.capture`). None of them raises
into the job: an internal failure is logged once and turns timing off. The timing itself is
in :mod:`workers.monitor.timers`, the knobs and their agreement in :mod:`workers.monitor.knobs`,
who the rank is in :mod:`workers.monitor.rank_info`.

Control units: ``apply_at`` in batch headers counts ``step()`` calls here (Hello.config
``control_unit`` = "step"), not collectives: ranks may issue different numbers of
collectives per step, but they all enter the same steps. Knobs must be declared on every
rank, before the first step (the first Hello, which the collector adopts as the settings
in force, is sent then).
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Sequence
from types import TracebackType
from typing import Any

import numpy as np

from workers.monitor import graphs
from workers.monitor import patch as monitor_patch
from workers.monitor.exits import system_exit_status
from workers.monitor.flush_thread import FlushThread
from workers.monitor.knobs import MAX_NAME, Knobs, live_control
from workers.monitor.patch import Args, Kwargs, OpSpec
from workers.monitor.rank_info import env_int, node_gpus, run_info, world_group
from workers.monitor.records import MonitorBatcher
from workers.monitor.timers import Timers
from workers.monitor.unseen import say_missed
from workers.rank.control import Control, StaticControl, live_control_off
from workers.rank.groups import GroupTable
from workers.rank.heartbeat import RunInfo, WorkerStatus
from workers.rank.session import RankSession
from workers.wire.config import batch_ms_for_world
from workers.wire.connection import Connection
from workers.wire.endings import bye_reason
from workers.wire.lifeline import arm_from_env
from workers.wire.protocol import DIRECTIONS
from workers.wire.settings import Settings

log = logging.getLogger("commtop.monitor")

#: At close, how long the records still in flight (and async Works) may take to finish.
EXIT_DRAIN_S = 1.0
#: Copy names a job may report (later names are timed, not listed).
MAX_COPY_NAMES = 32


class Monitor:
    """One rank's view of a user's job; see the module docstring. Use :func:`workers.monitor.start`."""

    def __init__(self, conn: Connection | None, *, batch_ms: float = 50.0, sampler: bool = True) -> None:
        self.conn = conn
        self.rank = env_int("RANK", 0)
        self.local_rank = env_int("LOCAL_RANK", 0)
        self.world_size = env_int("WORLD_SIZE", 1)
        self.local_world_size = env_int("LOCAL_WORLD_SIZE", 1)
        self.on = conn is not None  # timing and publishing (Hooks.on)
        self.inside: set[int] = set()  # Hooks.inside
        self.failure = ""
        self.copy_names: list[str] = []
        self._knobs = Knobs()
        self._raw = Settings(mode="none", copies=0)  # as the control hands them over
        # what the records are stamped with (the capture thread reads _epoch and _mode too)
        self._epoch = 0
        self._mode = 0
        self._step = -1
        self._next_step = -1
        self._boundary = 0
        self._in_copy = False
        self._closed = False
        self._exit: tuple[int, str] = (0, "finished")
        self._holding = False  # SIGTERM: the job's thread stops at its next collective hook
        self._held = threading.Event()
        self.control: Control | None = None
        self._making_control = threading.Lock()
        self._closing = threading.RLock()
        self._step_block = _StepBlock(self)
        #: Copies are captured underneath (CUPTI, workers.capture): ``copy()`` blocks only set the stream.
        self.copies_captured = False
        #: How records are captured, for Hello.config (workers.capture sets it; "" = this API's hooks).
        self.capture = ""
        self.status = WorkerStatus(settings=self._raw)
        #: The rank's process groups by code (the records' ``group`` column, Hello.groups).
        self.groups = GroupTable(self.status)
        self.session = RankSession(
            conn,
            self._run_info(on_gpu=False),  # rank and world size from the process group when it exists
            self.status,
            sampler_gpus=node_gpus(self.local_world_size) if sampler else None,
            prometheus=conn.prometheus if conn is not None else "",  # `commtop run --prometheus -- ...`
        )
        self.publisher = self.session.publisher
        self.batcher = MonitorBatcher(
            self.publisher, self._control_status, batch_ms=batch_ms_for_world(batch_ms, self.world_size)
        )
        self.timers = Timers(self.batcher, self.status, on_cuda=self._refresh, groups=self.groups)
        self.timers.unseen.baselined = False  # no read counts before the hooks' baseline (hooks_in)
        #: perf_counter_ns after which a job that never calls step() makes its control (and starts
        #: its Hellos) at its next collective, on its own thread
        self._control_due_ns = time.perf_counter_ns() + self.batcher.batch_ns
        self._flush_thread = FlushThread(self._harvest_and_send, self.rank, self.batcher.batch_ns / 1e9)
        self._flush_thread.start()
        if monitor_patch.patched():
            self.hooks_in()
        self.count_graphs()
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
            value, declared = self._knobs.declare(name, choices, default)
            if declared:
                self._mode = self._knobs.mode
                self._refresh()
            return value
        except Exception as exc:  # noqa: BLE001 - a bad declaration must not stop the job
            self._warn_once("knob", f"knob {name!r} not declared: {exc}")
            return None if default is None else str(default)

    def setting(self, name: str) -> Any:
        """A knob's value in force (None for an undeclared name)."""
        return self._knobs.values.get(name)

    @property
    def knobs(self) -> dict[str, tuple[str, ...]]:
        """The declared knobs and their choices."""
        return self._knobs.choices

    @property
    def mode_knob(self) -> str:
        """The knob whose value fills the records' mode column ("" for none)."""
        return self._knobs.mode_knob

    def wait_connected(self, timeout_s: float) -> bool:
        """Wait (bounded) until a collector is connected; False if none came."""
        return self.publisher.wait_connected(timeout_s)

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Send what is left, say Bye, stop the threads. Idempotent; never raises. One close at a
        time: a rank that ends with ``os._exit`` while torchrun's SIGTERM arrives closes from two
        threads (workers.capture.on_os_exit, .on_sigterm); the second waits for the first, so one
        Bye goes out, whole, before the process ends."""
        with self._closing:
            self._close()

    def _close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._flush_thread.stop()
        try:
            self.timers.stop_waiter(EXIT_DRAIN_S)  # the Works it waits on end first
            if self.on:
                deadline = time.monotonic() + EXIT_DRAIN_S
                while True:
                    self.harvest()
                    if not self.timers.in_flight() or time.monotonic() > deadline:
                        break
                    time.sleep(0.01)
                self.timers.flush()
                self.timers.count_unfinished()
                if self.timers.graph_counter is not None:
                    graphs.stop(self.timers.graph_counter)
                self._say_unseen()
            if self.control is not None:
                self.control.close()
            self.session.close(*self._exit)
        except Exception as exc:  # noqa: BLE001
            log.warning("commtop monitor: while closing: %r", exc)

    def _say_unseen(self) -> None:
        """One line at the end for each way torch issued collectives that went unrecorded (they
        count as missing): CUDA graphs, calls that failed after they were issued, no hook saw them."""
        graphs.say_lost(self.rank, self.timers.graph_counter, self.timers.graph_captured)
        self.timers.say_failed(self.rank)
        say_missed(self.rank, self.timers.unseen, self.groups.table, self.timers.gloo_only)

    # ------------------------------------------------------------------ hooks (never raise)

    def coll_begin(self, spec: OpSpec, args: Args, kwargs: Kwargs) -> Any:
        """Before a collective: its metadata and the start of its timing (the token)."""
        if self._holding:
            self._hold()
        try:
            return self.timers.coll_begin(spec, args, kwargs, self._step, self._epoch, self._mode)
        except Exception as exc:  # noqa: BLE001
            self.fail(exc)
            return None

    def coll_end(self, token: Any, result: Any) -> None:
        """After the call returned (:meth:`Timers.coll_end`); every HARVEST_EVERY records moves
        them into the batcher (the sending is the flush thread's)."""
        if token is None:
            return
        try:
            if self.timers.coll_end(token, result) or (
                self.control is None and time.perf_counter_ns() >= self._control_due_ns
            ):
                self.harvest(send=False)
        except Exception as exc:  # noqa: BLE001
            self.fail(exc)
        if self._holding:
            self._hold()

    def failed_with(self, exc: BaseException) -> None:
        """The job ends by this exception: the Bye says so (and why), with the exit status
        Python gives it (a ``SystemExit``'s own code)."""
        self._exit = system_exit_status(exc) if isinstance(exc, SystemExit) else (1, bye_reason(exc))

    def exit_with(self, code: int, reason: str) -> None:
        """The job ends with this exit code (``os._exit``): the Bye says so."""
        self._exit = (code, reason)

    def hold_for_exit(self, exit_code: int, reason: str) -> threading.Event:
        """A SIGTERM ends this process (workers.capture.on_sigterm): the job's thread stops at
        its next collective hook (after the record of a collective that returned, before a new
        one), so what is sent next is all it issued, and the Bye says how the rank ends. Returns
        the event set once the job's thread stopped there (never, if it issues no collective)."""
        self._exit = (exit_code, reason)
        self._holding = True
        return self._held

    def hold_if_stopping(self) -> None:
        """A point where the job's thread is outside commtop's locks (the end of the capture's
        step hooks): while a SIGTERM stops the rank, it stops here, as at a collective hook. A
        SIGTERM that lands in such a hook cannot park the job there (on_sigterm), and under the
        Flight Recorder capture no collective hook comes."""
        if self._holding:
            self._hold()

    def _hold(self) -> None:
        self._held.set()
        threading.Event().wait()  # until the process ends (on_sigterm ends it once the records went out)

    def coll_failed(self, token: Any) -> None:
        """The call raised: no record, and its iteration is given back (not a gap). While a
        SIGTERM stops the rank, the job's thread stops here instead of raising: the peer it waited
        for was stopped too, and the rank ends by SIGTERM, not by that error."""
        if token is not None:
            try:
                self.timers.coll_failed(token, sys.exc_info()[1])
            except Exception as exc:  # noqa: BLE001
                self.fail(exc)
        if self._holding:
            self._hold()

    def stand_aside(self) -> None:
        """This process only starts the job's ranks (workers.capture.spawned): it was never a rank,
        so it says nothing (no Hello, no Bye) and its node sampler stops (a spawned rank runs it)."""
        if self._closed:
            return
        self._closed = True
        self.on = False
        try:
            self.session.close(0, "launcher", linger_ms=0, quiet=True)
        except Exception as exc:  # noqa: BLE001
            log.warning("commtop monitor: while standing aside: %r", exc)

    def gloo_untimed(self) -> None:
        """The Flight Recorder capture times NCCL's collectives and no hook is in: from here on
        every collective torch issues on a gloo group counts as lost (workers.monitor.unseen)."""
        try:
            self.timers.unseen.untimed_gloo = True
            self.timers.unseen.baseline()
        except Exception as exc:  # noqa: BLE001 - a count, never worth the job
            self._warn_once("unseen", f"collectives on gloo groups are not counted ({exc!r})")

    def take_iterations(self, n: int) -> int:
        """The first of ``n`` record iterations for the Flight Recorder capture's records (one
        numbering with the hooks' records: workers.capture.gloo_side)."""
        return self.timers.take(n)

    def time_gloo_groups(self) -> None:
        """Under the Flight Recorder capture: the job has a gloo group. The wrappers go in, timing
        only collectives on gloo groups (NCCL's stay the Flight Recorder's). Once."""
        if self.timers.gloo_only or not self.on:
            return
        try:
            self.timers.gloo_only = True
            self.timers.unseen.nccl_too = False  # the Flight Recorder counts NCCL's
            monitor_patch.patch()
        except Exception as exc:  # noqa: BLE001 - they stay counted as missing
            self._warn_once("gloo", f"collectives on gloo groups not timed ({exc!r})")

    def capture_lost(self, n: int) -> None:
        """What the Flight Recorder capture lost so far (workers.capture), beside the timers' own."""
        self.timers.capture_lost = n
        self.timers.publish_lost()

    def count_graphs(self) -> None:
        """Count the collectives the job's CUDA graphs capture and replay (workers.monitor.graphs):
        once torch is imported (the capture's start, the hooks going in)."""
        if self.timers.graph_counter is not None or "torch" not in sys.modules:
            return
        try:
            counter = graphs.GraphCounter(self.timers.publish_lost)
            if graphs.install(counter):
                self.timers.graph_counter = counter
                self.timers.unseen.graphs = counter
        except Exception as exc:  # noqa: BLE001 - a count, never worth the job
            self._warn_once("graphs", f"collectives in CUDA graphs are not counted ({exc!r})")

    def hooks_in(self) -> None:
        """The wrappers went in (now, or before this monitor): from here on, what torch issues on
        a gloo group that no hook saw is counted (workers.monitor.unseen)."""
        self.count_graphs()
        try:
            self.timers.unseen.baseline()
        except Exception as exc:  # noqa: BLE001 - a count, never worth the job
            self._warn_once("unseen", f"collectives the hooks did not see are not counted ({exc!r})")

    def count_unseen(self) -> None:
        """Before the job's groups go (``destroy_process_group``): count what torch issued on
        them that no hook saw (workers.monitor.unseen) while torch can still say."""
        if self.on and not self._closed:
            try:
                self.timers.count_unseen()
            except Exception as exc:  # noqa: BLE001 - a count, never worth the job
                self._warn_once("unseen", f"collectives the hooks did not see are not counted ({exc!r})")

    def forget_groups(self) -> None:
        """After ``destroy_process_group()`` (every group): groups made later count from 0."""
        if self.on and not self._closed:
            try:
                self.timers.forget_groups()
            except Exception as exc:  # noqa: BLE001 - a count, never worth the job
                self._warn_once("unseen", f"collectives the hooks did not see are not counted ({exc!r})")

    def harvest(self, send: bool = True) -> None:
        """Move finished records into the batcher; with ``send``, send a batch if one is due
        (the job's threads pass False: only a full batcher is sent from them). Never waits."""
        if self.control is None and not self._closed:  # a job that never calls step(): Hellos anyway
            with self._making_control:  # once, whichever of the job's threads harvests first
                if self.control is None:
                    self._make_control()
        self.timers.harvest(send)

    def _harvest_and_send(self) -> None:
        """The flush thread's (workers.monitor.flush_thread), every batch interval."""
        if self.on and not self._closed:
            self.timers.harvest()

    def add_records(self, coll_rows: list[tuple[Any, ...]], copy_rows: list[tuple[Any, ...]]) -> None:
        """Rows captured off the job's thread (workers.capture): batched and sent from the
        caller's thread. Never raises."""
        if not self.on or self._closed:
            return
        try:
            self.timers.add(coll_rows, copy_rows)
        except Exception as exc:  # noqa: BLE001
            self.fail(exc)

    def add_coll_array(self, records: np.ndarray) -> None:
        """Collectives captured off the job's thread as MONITOR_COLL_ROW records (a Flight
        Recorder read), batched and sent from the caller's thread. Never raises."""
        if not self.on or self._closed:
            return
        try:
            self.timers.add_array(records)
        except Exception as exc:  # noqa: BLE001
            self.fail(exc)

    def fail(self, exc: BaseException) -> None:
        """An internal error: log it once and stop timing (the job goes on untouched)."""
        if not self.on:
            return
        self.on = False
        self.failure = f"{type(exc).__name__}: {exc}"
        log.warning(
            "commtop monitor (rank %d): telemetry disabled after an internal error: %s", self.rank, self.failure
        )

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
        if not self._knobs.final:
            self._knobs.final = True
            self._refresh()  # Hello: the knobs are final
        if not self.on:
            return
        try:
            self.status.iteration = self.timers.iteration
            self.harvest(send=False)
        except Exception as exc:  # noqa: BLE001
            self.fail(exc)

    def _make_control(self) -> Control:
        """At the first step (knobs are declared by then): the live, agreed control, or a
        static one when there is no collector or no store to agree through."""
        self._refresh()
        initial = self._raw = self._knobs.settings()
        self.status.settings = initial
        control: Control = StaticControl(initial)
        if self.conn is not None and not live_control_off():
            try:
                control = live_control(
                    self.conn,
                    rank=self.rank,
                    world_size=self.world_size,
                    initial=initial,
                    knob_choices=self._knobs.choices,
                    context=self.session.ctx,
                )
            except Exception as exc:  # noqa: BLE001
                self._warn_once("control", f"live knobs off on rank {self.rank} ({exc})")
        self.control = control
        self._refresh()  # Hello: whether the knobs follow the collector
        self.status.rejected = getattr(control, "rejected", None)  # refused control messages, in Hello
        if self.conn is not None:
            # Hellos start now: the collector adopts the first settings it hears as the
            # state in force, so they must already hold the declared knobs.
            self.session.start_heartbeat()
        return control

    def _apply(self, settings: Settings, epoch: int) -> None:
        """Settings agreed for this step: the knobs take their values (:meth:`Knobs.apply`)."""
        prev, self._raw, self._epoch = self._raw, settings, epoch
        self._knobs.apply(prev, settings)
        self._mode = self._knobs.mode
        self.status.settings = self._knobs.settings()
        self.status.epoch = epoch

    def _control_status(self) -> tuple[int, int, int]:
        control = self.control
        return control.status() if control is not None else (0, -1, -1)

    # ------------------------------------------------------------------ internals

    def _run_info(self, on_gpu: bool) -> RunInfo:
        """Who this rank is now (the process group, once it exists, names rank and world size)."""
        info = run_info(
            rank=self.rank,
            world_size=self.world_size,
            local_rank=self.local_rank,
            local_world_size=self.local_world_size,
            on_gpu=on_gpu,
            knobs=self._knobs,
            copy_names=self.copy_names,
            capture=self.capture,
            live=not isinstance(self.control, StaticControl),
        )
        self.rank, self.world_size = info.rank, info.world_size
        world = world_group()
        if world is not None and (not self.groups.table or self.groups.table[0] != world):
            self.groups.world(world)  # code 0, named in the Hellos from now on
        return info

    def _refresh(self) -> None:
        """A new frozen RunInfo for the heartbeat (rank, backend, knobs as known now)."""
        self.session.info = self._run_info(on_gpu=self.timers.cuda is not None)
        # the knobs' values in force, also those declared after the control started (the capture
        # bootstrap starts it at init_process_group, before the script declares its knobs)
        self.status.settings = self._knobs.settings()

    def _warn_once(self, what: str, message: str) -> None:
        key = f"_warned_{what}"
        if not getattr(self, key, False):
            setattr(self, key, True)
            log.warning("commtop monitor: %s", message)


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
            if self.name not in mon.copy_names and len(mon.copy_names) < MAX_COPY_NAMES:
                mon.copy_names.append(str(self.name)[:MAX_NAME])
                mon._refresh()
            pinned = self.pinned if self.pinned is not None else self.stream is not None
            meta = (mon._step, mon._epoch, int(self.nbytes), DIRECTIONS.index(self.direction), int(bool(pinned)))
            timer = mon.timers.copy_timer(on_gpu=self.stream is not None)
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


def _hook_excepthook(mon: Monitor) -> None:
    """Remember an uncaught exception so the Bye says the job failed (and why)."""
    previous = sys.excepthook

    def hook(et: type[BaseException], ev: BaseException, tb: TracebackType | None) -> None:
        mon.failed_with(ev)
        previous(et, ev, tb)

    sys.excepthook = hook
