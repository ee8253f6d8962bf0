"""What the capture bootstrap installs in a rank (workers.capture.bootstrap runs it before the
user's script; workers.capture.spawned before a rank the script spawned): see the bootstrap's
docstring for the whole story."""

from __future__ import annotations

import atexit
import functools
import logging
import os
import signal
import sys
import time
import urllib.parse
from types import FrameType
from typing import Any

CAPTURE_ENV = "COMMTOP_CAPTURE"
#: ``rank`` decodes the Flight Recorder in the rank rather than in a child process (to compare).
DECODE_ENV = "COMMTOP_FR_DECODE"
log = logging.getLogger("commtop.capture")
#: On SIGTERM, how long the last Flight Recorder read waits for running collectives to be retired
#: (the job's thread is parked, so the ring goes quiet once torch's watchdog, every ~0.1 s, has
#: seen them end; a read of a full ring through the worker server takes ~0.25 s). The job's peers
#: are being stopped too, so some may never end: the wait is bounded (the whole flush has 3 s,
#: on_sigterm).
SIGTERM_SETTLE_S = 1.0


_OPTIMIZER_FILE = os.path.join("torch", "optim", "optimizer.py")


def _inside_another_step() -> bool:
    """Whether this optimizer step runs inside another's (ZeroRedundancyOptimizer steps its own
    ``optim``; a wrapper optimizer its inner one): one training step, counted once, by the
    outermost. Read from the stack, not a pre-hook's count, which a step that raised would leave
    wrong for the rest of the run: each step runs in torch's ``profile_hook_step`` wrapper."""
    frame: FrameType | None = sys._getframe(1)  # noqa: SLF001 - once a step
    steps = 0
    while frame is not None:
        code = frame.f_code
        if code.co_name == "wrapper" and code.co_filename.endswith(_OPTIMIZER_FILE):
            steps += 1
            if steps > 1:
                return True
        frame = frame.f_back
    return False


class Capture:
    """What the bootstrap installed in this rank (one per process)."""

    def __init__(self) -> None:
        from workers.capture.rows import StepTimeline

        self.mode = os.environ.get(CAPTURE_ENV, "auto")
        self.timeline = StepTimeline()
        self.mon: Any = None
        self.step = 0
        self.block: Any = None
        self.thread: Any = None
        self.how = ""
        self.user_steps = False  # the script drives steps itself (``with mon.step(n):``)
        self._mon_step: Any = None
        self.ring_note = ""  # the Flight Recorder ring's size and who chose it, for the start line
        self.server: Any = None  # torch's worker server, read off the GIL (workers.capture.fr_source)
        self.stood_aside = False  # this process started the job's ranks (:meth:`stand_aside`)
        #: what install set in the environment, not the user (a rank this process starts chooses again)
        self.env_set: dict[str, str] = {}
        #: Flight Recorder captures stopped by ``destroy_process_group()``: the newest record id
        #: they read, their (lost, untimed); a capture for the groups made again goes on from them
        self.fr_before: tuple[int, int, int] = (-1, 0, 0)
        self.fr_gone_pg_ids: set[str] = set()  # the groups they read (torch's status keeps them)
        self.starts = 0  # captures started in this process (each its own worker server socket)

    # ---------------------------------------------------------------- install

    def install(self) -> None:
        if self.mode == "off":
            return
        import torch.distributed.distributed_c10d as c10d
        from torch.optim.optimizer import register_optimizer_step_post_hook

        from workers import monitor
        from workers.monitor.patch import rebind

        self.mon = monitor.start()
        if not self.mon.on:
            return
        if self.mode != "hooks":
            before = dict(os.environ)
            os.environ.setdefault("TORCH_NCCL_ENABLE_TIMING", "1")  # read when each NCCL group is made
            self._size_ring()
            self.env_set = {k: v for k, v in os.environ.items() if before.get(k) != v}
        register_optimizer_step_post_hook(self._on_optimizer_step)
        self._adopt_monitor()
        for name, wrap in (("init_process_group", self._wrap_init), ("destroy_process_group", self._wrap_destroy)):
            current = getattr(c10d, name)
            # every torch module that bound it (init_device_mesh calls device_mesh's own)
            rebind(name, (current, getattr(current, "__commtop_original__", current)), wrap(current))
        atexit.register(self.finish)
        from workers.capture import on_sigterm

        on_sigterm.install(
            self._flush_on_sigterm, lambda: self.mon.hold_for_exit(-int(signal.SIGTERM), "stopped by SIGTERM")
        )
        from workers.capture import on_os_exit

        on_os_exit.install(self._flush_on_os_exit)

    def _adopt_monitor(self) -> None:
        # the optimizer hook counts the job's steps from here: a job that never steps took 0
        self.mon.status.steps = -1 if self.user_steps else self.step
        self._mon_step = self.mon.step
        self.mon.step = self._user_step  # a script that names its steps takes over from the optimizer hook
        self._mon_close = self.mon.close
        self.mon.close = self._close_monitor  # a script's monitor.stop() comes after our last read

    def stand_aside(self) -> None:
        """This process starts the job's ranks (workers.capture.spawned): it is none of them, so
        it says nothing. Should it make a process group after all, it is a rank again (:meth:`_rejoin`)."""
        if self.mon is not None and not self.how:
            self.mon.stand_aside()
            self.stood_aside = True

    def _rejoin(self) -> None:
        """The process that stood aside makes a process group: a fresh monitor for it."""
        from workers import monitor

        self.stood_aside = False
        monitor.stop()  # the one that stood aside (closed: nothing is sent)
        self.mon = monitor.start()
        self._adopt_monitor()

    @staticmethod
    def _own_rendezvous(world_size: Any) -> None:
        """The launcher joins the ranks it started (a world larger than torchrun's): torchrun's
        agent store is not that group's (env:// would wait on it for ever), as run alone."""
        if isinstance(world_size, int) and world_size > 0 and str(world_size) != os.environ.get("WORLD_SIZE", "1"):
            os.environ.pop("TORCHELASTIC_USE_AGENT_STORE", None)

    @staticmethod
    def _own_tcp_store(init_method: Any) -> None:
        """A ``tcp://`` rendezvous at another port than torchrun's store: under torchrun torch
        makes every rank a client of it (the agent store's way) and no rank serves it, a hang
        of the whole timeout (as under plain torchrun; QA: ~110 s, then DistNetworkError). Run
        by hand, rank 0 serves it: so it does under `commtop run -- python script.py`."""
        if isinstance(init_method, str) and init_method.startswith("tcp://"):
            try:
                port = urllib.parse.urlparse(init_method).port
            except ValueError:
                return  # torch says what is wrong with it
            if port is not None and str(port) != os.environ.get("MASTER_PORT"):
                os.environ.pop("TORCHELASTIC_USE_AGENT_STORE", None)

    def _wrap_init(self, original: Any) -> Any:
        original = getattr(original, "__commtop_original__", original)

        @functools.wraps(original)
        def init_process_group(*args: Any, **kwargs: Any) -> Any:
            self._own_tcp_store(kwargs.get("init_method", args[1] if len(args) > 1 else None))
            if self.stood_aside:
                self._own_rendezvous(kwargs.get("world_size", args[3] if len(args) > 3 else -1))
            result = original(*args, **kwargs)
            try:
                if self.stood_aside:
                    self._rejoin()
                self._start_capture()
            except Exception as exc:  # noqa: BLE001 - never into the job
                log.warning("commtop capture: off (%r)", exc)
            return result

        init_process_group.__commtop_original__ = original  # type: ignore[attr-defined]
        return init_process_group

    def _wrap_destroy(self, original: Any) -> Any:
        original = getattr(original, "__commtop_original__", original)

        @functools.wraps(original)
        def destroy_process_group(*args: Any, **kwargs: Any) -> Any:
            self.mon.count_unseen()  # the groups' own numbers go with them
            every = (args[0] if args else kwargs.get("group")) is None
            if every:  # the whole job's groups: read them first
                self.finish()
            result = original(*args, **kwargs)
            if every:
                self.mon.forget_groups()  # a group made later takes a gone one's name
                if self.how not in ("", "hooks"):  # groups made again get a capture of their own
                    self.how = ""
            return result

        destroy_process_group.__commtop_original__ = original  # type: ignore[attr-defined]
        return destroy_process_group

    def _start_capture(self) -> None:
        if self.how:
            return
        import torch.distributed as dist

        from workers.monitor.rank_info import backend_name

        backend = backend_name(dist)
        self.mon._refresh()  # its rank from the process group (a spawned rank's environment names none)
        self.mon.count_graphs()  # collectives in CUDA graphs: no Flight Recorder entry, no hook sees a replay
        self.how = "hooks"
        if self.mode != "hooks" and backend == "nccl":
            self.how = self._start_cuda() or "hooks"
        if self.how == "hooks":
            from workers.capture import fallback

            fallback.install()
            if self.mon.rank == 0:
                why = "forced by $COMMTOP_CAPTURE" if self.mode == "hooks" else f"{backend}: no Flight Recorder timing"
                print(f"commtop: {why}; timing each collective call with Python hooks", file=sys.stderr)
        self.mon.capture = {"hooks": "python hooks"}.get(self.how, self.how)
        self.mon._refresh()  # Hello: backend, world size, device, capture
        self._begin_step()

    def _size_ring(self) -> None:
        """Before the script (torch reads the size once, at the ring's first use): where NCCL can
        run and torch's worker server can read the ring off the GIL, a ring sized for a high
        collective rate, unless the user set one."""
        import torch

        from workers.capture.fr_source import choose_ring
        from workers.rank.device import gpu_visible

        if gpu_visible():  # not torch.cuda.is_available(): that keeps forked children off CUDA
            c10d = getattr(torch._C, "_distributed_c10d", None)
            self.ring_note = choose_ring(os.environ, server=hasattr(c10d, "_WorkerServer"))

    def _start_cuda(self) -> str:
        """Flight Recorder collectives (+ CUPTI copies); '' when the Flight Recorder cannot serve."""
        from workers.capture import gloo_side
        from workers.capture.cuda_capture import CaptureThread, CuptiCopies, fr_dump_function
        from workers.capture.fr_child import ChildDecoder
        from workers.capture.fr_source import FlightRecorderSource, InProcessDump, nccl_status, ring_size

        dump = fr_dump_function()
        ring = ring_size(os.environ)
        if dump is None or ring == 0 or os.environ.get("TORCH_NCCL_ENABLE_TIMING") in ("0", ""):
            return ""
        copies: CuptiCopies | None = None
        note = "copies from CUPTI"
        held = cupti_holder()
        if held:
            note = f"copies not captured (CUPTI is held by {held}: one CUPTI client per process)"
        else:
            try:
                copies = CuptiCopies()
                copies.start()
            except Exception as exc:  # noqa: BLE001 - no cupti-python, or CUPTI held by a profiler
                copies = None
                note = f"copies not captured (CUPTI: {type(exc).__name__}: {str(exc)[:80]})"
        in_process = InProcessDump(dump)
        server, why = self._worker_server()
        readers: list[Any] = [server, in_process] if server is not None else [in_process]
        first: Any = readers.pop(0)
        if server is not None and os.environ.get(DECODE_ENV, "child") != "rank":
            try:
                first, readers = ChildDecoder(server.path), [server, in_process]
            except OSError as exc:
                why = f" (no decoder child: {exc}; decoded in the rank)"
        fr = FlightRecorderSource(first, nccl_status(), ring, fallbacks=readers, rank=self.mon.rank)
        self.mon.gloo_untimed()  # a gloo side group's collectives count as missing until timed:
        gloo_side.install(self.mon.time_gloo_groups)  # ... from its creation on (workers.capture.gloo_side)
        read_upto, lost, untimed = self.fr_before
        if read_upto >= 0:  # the groups were made again: the ring still holds the gone ones' entries
            fr.start_after(read_upto, sorted(self.fr_gone_pg_ids))
        self.thread = CaptureThread(self.mon, self.timeline, fr, copies, before=(lost, untimed))
        self.thread.start()
        self.starts += 1
        self._monitor_api_uses_this_capture(copies is not None)
        if self.mon.rank == 0:
            ring_note = self.ring_note or f"ring {ring}"
            print(
                f"commtop: collectives from torch's Flight Recorder (NCCL timing on; {ring_note}; read through "
                f"{fr.how}{why}); {note}",
                file=sys.stderr,
            )
        return "flight recorder + CUPTI copies" if copies is not None else "flight recorder"

    def _worker_server(self) -> tuple[Any, str]:
        """(a ServerDump through torch's worker server on a socket in the run's folder, "") or
        (None, why not)."""
        from workers.capture.fr_source import ServerDump, WorkerServer, post

        conn = self.mon.conn
        folder = os.path.dirname(conn.path) if conn is not None and conn.path else "/tmp"
        try:
            again = f"-{self.starts}" if self.starts else ""  # groups made again: a new server
            server = WorkerServer(folder, f"fr-{self.mon.rank}-{os.getpid()}{again}.sock")
        except Exception as exc:  # noqa: BLE001 - a torch without it
            return None, f" (no worker server: {type(exc).__name__}: {str(exc)[:60]})"
        reader = ServerDump(server.path)
        try:
            post(server.path, reader.query.replace("includecollectives=true", "includecollectives=false"), timeout=5.0)
        except OSError as exc:
            server.shutdown()
            return None, f" (the worker server cannot serve it: {str(exc)[:80]})"
        self.server = server
        return reader, ""

    def _monitor_api_uses_this_capture(self, copies: bool) -> None:
        """A script that also uses ``workers.monitor`` gets each record once: its
        ``patch_distributed()`` becomes a no-op (the Flight Recorder sees every collective) and,
        with CUPTI, its ``mon.copy()`` blocks only set the stream."""
        import workers.monitor as monitor_pkg
        from workers.monitor import api

        def patch_distributed() -> list[str]:
            return []

        monitor_pkg.unpatch_distributed()
        monitor_pkg.patch_distributed = patch_distributed  # type: ignore[assignment]
        api.patch_distributed = patch_distributed  # type: ignore[assignment]
        self.mon.copies_captured = copies

    # ---------------------------------------------------------------- steps

    def _begin_step(self) -> None:
        self.timeline.mark(time.time_ns(), self.step)
        self.block = self._mon_step(self.step)
        self.block.__enter__()

    def _user_step(self, step: int) -> Any:
        if not self.user_steps:
            self.user_steps = True
            self.mon.status.steps = -1  # the script's own steps, not the optimizer's: not counted
            block, self.block = self.block, None
            if block is not None:
                block.__exit__(None, None, None)
        self.timeline.mark(time.time_ns(), step)
        block = self._mon_step(step)
        self.mon.hold_if_stopping()
        return block

    def _on_optimizer_step(self, _optimizer: Any, _args: Any, _kwargs: Any) -> None:
        if self.block is None or self.user_steps or _inside_another_step():
            return
        self.block.__exit__(None, None, None)
        self.step += 1
        self.mon.status.steps = self.step  # its Hellos say how many the job took (the report's count)
        self._begin_step()
        self.mon.hold_if_stopping()

    def _close_monitor(self) -> None:
        """The script closes the monitor (``monitor.stop()``): read what is left first, else
        the records since the last periodic read are lost (seen on the H200: half of a
        50-step run's collectives)."""
        self.finish()
        self._mon_close()

    def _flush_on_sigterm(self) -> None:
        """SIGTERM (off the main thread, :mod:`.on_sigterm`): what was captured and batched goes
        out with the rank's Bye. No device sync: a stopped job's collectives may never end."""
        self.finish(synchronize=False, settle_s=SIGTERM_SETTLE_S)
        self._mon_close()

    def _flush_on_os_exit(self, code: int) -> None:
        """The job calls ``os._exit(code)`` (:mod:`.on_os_exit`): atexit will not run, so what was
        captured goes out with the rank's Bye now, saying the exit code. No device sync (a job may
        leave that way because something is stuck); bounded as on SIGTERM."""
        self.mon.exit_with(code, "finished" if code == 0 else f"os._exit({code})")
        self.finish(synchronize=False, settle_s=SIGTERM_SETTLE_S)
        self._mon_close()

    def finish(self, synchronize: bool = True, settle_s: float = 1.0) -> None:
        """Read what is left (before the groups go away, or at exit); ``settle_s``: how long
        the last read waits for collectives still running to end. Idempotent."""
        thread, self.thread = self.thread, None
        if thread is not None:
            try:
                import torch

                if synchronize and torch.cuda.is_initialized():  # the job used CUDA in this process
                    torch.cuda.synchronize()  # end of the job: its last collectives finish
            except Exception:  # noqa: BLE001
                pass
            thread.stop(settle_s)
            fr = thread.fr
            if fr is not None:  # what a capture for groups made later goes on from
                cursor = fr.cursor
                read_upto, lost, untimed = self.fr_before
                self.fr_before = (max(read_upto, cursor.last_record), lost + fr.lost, untimed + cursor.untimed)
                self.fr_gone_pg_ids |= set(cursor.pg_names) | cursor.gone_pg_ids
        server, self.server = self.server, None
        if server is not None:
            server.shutdown()
        block, self.block = self.block, None
        if block is not None:
            block.__exit__(None, None, None)


def cupti_holder() -> str:
    """Who already uses CUPTI in this process ('' if nobody we can see): Nsight Systems/Compute
    inject themselves through CUDA_INJECTION64_PATH; torch.profiler (Kineto) when it is on."""
    if os.environ.get("CUDA_INJECTION64_PATH") or os.environ.get("NSYS_PROFILING_SESSION_ID"):
        return "Nsight"
    try:
        import torch

        if torch.autograd.profiler._is_profiler_enabled:
            return "torch.profiler"
    except Exception:  # noqa: BLE001
        pass
    return ""
