"""Ranks a script starts itself, watched too: ``torch.multiprocessing.spawn`` (the PyTorch DDP
tutorial's way) and ``multiprocessing.Process`` (the "Writing Distributed Applications" tutorial's).

``commtop run --nproc 1 -- python train.py`` where train.py starts the job's N ranks: the torchrun
rank is only the launcher, and the processes it starts are the job's ranks.

``mp.spawn(worker, nprocs=N)``: the bootstrap wraps torch.multiprocessing's ``start_processes``
(``spawn`` calls it): the launcher stands aside (it never issued a collective: it sends nothing,
and its node sampler stops so the first spawned process runs the node's), and each spawned
process runs the capture before the job's function (:func:`rank_main`, pickled by reference) with
LOCAL_RANK its index; its rank and world size come from its process group, as the job's
``init_process_group`` is told.

``Process(target=...).start()`` (or a Process subclass's own ``run``) from a launcher with no
process group: the process may be a rank or a helper (a DataLoader worker), so the capture waits
in it for its ``init_process_group`` (:func:`process_main`); a process that never makes a group
sends nothing. LOCAL_RANK is the rank that call names, else the order in which the launcher
started it. The launcher stands aside at
the first such start, and is a rank again should it make a group itself (a script whose launcher
is rank 0: :meth:`workers.capture.capture.Capture.stand_aside`).

In both, a child sees what it would see run as ``python train.py``: torchrun's variables that the
script did not set itself are popped (with torchrun's agent store in them, its
``init_process_group`` waits on torchrun's store for ever: plain ``torchrun --nproc-per-node 1
train.py`` hangs there). With ``fork`` the child drops the monitor it inherited (the launcher's: closed
there, it would send the launcher's Bye through the launcher's sockets) for its own, and sends
what is left when the job's function returns (a forked process leaves by ``os._exit``: no atexit).

Under several torchrun ranks each would start its own copy of the job's ranks (they collide on
one store, or run the job N times): ``mp.spawn`` is refused in one line before any is started; a
``Process`` is refused, in one line, when it makes its group. A process that already has its
process group starts helpers, not ranks: left as they are.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import os
import sys
from collections.abc import Iterator
from typing import Any

from workers.capture.whole_lines import whole_lines

#: torchrun's variables, about the launcher (a torchrun worker), not a rank it starts: popped in
#: the child unless the script set them (its MASTER_ADDR/MASTER_PORT, before starting its ranks).
LAUNCHER_ENV = (
    "RANK",
    "WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_NAME",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "LOCAL_WORLD_SIZE",
)
#: torchrun's values of LAUNCHER_ENV in this process before the script ran, and the variables the
#: launcher's capture set (its ring size: a child's capture chooses again, as for a torchrun rank)
_torchrun_env: dict[str, str] = {}
_capture_env: dict[str, str] = {}


class OwnRanksError(SystemExit):
    """The script starts its own ranks under several torchrun ranks (exit code 2)."""


@dataclasses.dataclass(frozen=True)
class Launch:
    """What a child is told about how the launcher started it (pickled with its function)."""

    index: int  # the order in which the launcher started it (mp.spawn: its index)
    forked: bool  # it inherited the launcher's memory
    torchruns: tuple[str, ...]  # torchrun's (and the capture's) variables the script did not set: popped
    launchers: int  # torchrun ranks that each run the script (> 1: its ranks are refused)


def install(stand_aside: Any, capture_env: dict[str, str] | None = None) -> None:
    """Before the script: wrap torch.multiprocessing's ``start_processes`` (``spawn`` looks it
    up at call time) and multiprocessing's ``Process.start``; ``stand_aside()`` retires this
    process's monitor before the ranks start; ``capture_env``: what this process's capture set."""
    import torch.multiprocessing  # noqa: F401 - loads torch.multiprocessing.spawn

    _torchrun_env.update({k: os.environ[k] for k in LAUNCHER_ENV if k in os.environ})
    _capture_env.update(capture_env or {})
    _wrap_start_processes(stand_aside)
    _wrap_process_start(stand_aside)


def _launchers() -> int:
    return int(_torchrun_env.get("WORLD_SIZE", "1") or 1)


def _launch(index: int, method: str) -> Launch:
    """How the launcher starts its ``index``-th child, for the child."""
    unchanged = tuple(k for k, v in (_torchrun_env | _capture_env).items() if os.environ.get(k) == v)
    return Launch(index, method == "fork", unchanged, _launchers())


def _refuse(how: str, launchers: int) -> OwnRanksError:
    script = os.path.basename(sys.argv[0]) if sys.argv else "the script"
    print(
        f"commtop: {script} starts its own ranks ({how}) and commtop run started {launchers} copies of it: "
        "run it with `commtop run --nproc 1 -- ...`",
        file=sys.stderr,
        flush=True,
    )
    return OwnRanksError(2)


def _has_group() -> bool:
    dist = sys.modules.get("torch.distributed")
    return bool(dist is not None and dist.is_available() and dist.is_initialized())


# ------------------------------------------------------------ torch.multiprocessing.spawn


def _wrap_start_processes(stand_aside: Any) -> None:
    from workers.monitor.patch import rebind

    spawn_module = sys.modules["torch.multiprocessing.spawn"]  # (``torch.multiprocessing.spawn`` is the function)
    current = spawn_module.start_processes
    original = getattr(current, "__commtop_original__", current)

    @functools.wraps(original)
    def start_processes(
        fn: Any, args: tuple[Any, ...] = (), nprocs: int = 1, join: bool = True, daemon: bool = False, **kw: Any
    ) -> Any:
        if _has_group():  # a rank starting helpers, not ranks
            return original(fn, args, nprocs, join, daemon, **kw)
        if _launchers() > 1:
            raise _refuse(f"torch.multiprocessing, {nprocs} processes", _launchers())
        stand_aside()
        ranked = functools.partial(rank_main, fn, nprocs, _launch(0, kw.get("start_method", "spawn")))
        return original(ranked, args, nprocs, join, daemon, **kw)

    start_processes.__commtop_original__ = original  # type: ignore[attr-defined]
    rebind("start_processes", (current, original), start_processes)  # the spawn module and its re-export


def rank_main(fn: Any, nprocs: int, launch: Launch, index: int, *args: Any) -> Any:
    """In a spawned process: the capture, then the job's function as torch would call it."""
    with _on_its_own(fn, dataclasses.replace(launch, index=index), at_init=False, ranks=nprocs):
        return fn(index, *args)


# ------------------------------------------------------------ multiprocessing.Process


def _wrap_process_start(stand_aside: Any) -> None:
    """Every context's processes (torch.multiprocessing's re-export included): a process started
    by a launcher with no process group runs :func:`process_main` around its target."""
    from multiprocessing.process import BaseProcess

    original = getattr(BaseProcess.start, "__commtop_original__", BaseProcess.start)
    order = itertools.count()

    @functools.wraps(original)
    def start(self: Any) -> None:
        job = _job_of(self, BaseProcess)
        if job:
            launch = _launch(next(order), _start_method(self))
            if job == "target":
                self._target = functools.partial(process_main, self._target, launch)
            else:  # the subclass's run(), as the instance's: pickled as getattr(self, "run"), which
                # the child resolves to the class's (the instance's attributes come back after it)
                self.run = functools.partial(process_main, type(self).run.__get__(self), launch)
            if _launchers() == 1:  # several: they stay ranks, and a child that makes a group is refused
                stand_aside()
        original(self)

    start.__commtop_original__ = original  # type: ignore[attr-defined]
    BaseProcess.start = start  # type: ignore[method-assign]


def _job_of(process: Any, base: Any) -> str:
    """What a process started by a process with no process group runs: "target", or "run" (a
    subclass's own), "" where it is one of ``mp.spawn``'s (:func:`rank_main` has those) or
    already wrapped."""
    if _has_group() or isinstance(process.__dict__.get("run"), functools.partial):
        return ""
    target = getattr(process, "_target", None)
    if target is None:
        return "run" if type(process).run is not base.run else ""
    spawn_module = sys.modules.get("torch.multiprocessing.spawn")
    if getattr(target, "func", None) is process_main or target is getattr(spawn_module, "_wrap", None):
        return ""
    return "target"


def _start_method(process: Any) -> str:
    """How ``process`` will start: its context's method, else the default context's."""
    method = getattr(process, "_start_method", None)
    if method:
        return str(method)
    import multiprocessing

    chosen = multiprocessing.get_start_method(allow_none=True)  # allow_none: choosing nothing
    return chosen or str(multiprocessing.get_context()._name)  # type: ignore[attr-defined]


def process_main(target: Any, launch: Launch, *args: Any, **kwargs: Any) -> Any:
    """In a process the launcher started: the capture waits for its ``init_process_group``."""
    with _on_its_own(target, launch, at_init=True):
        return target(*args, **kwargs)


# ------------------------------------------------------------ in the child


@contextlib.contextmanager
def _on_its_own(fn: Any, launch: Launch, *, at_init: bool, ranks: int = 0) -> Iterator[None]:
    """As if run alone, watched (now, or at its ``init_process_group``); at the end, the Bye.
    ``ranks``: how many the launcher started (mp.spawn's nprocs; 0: known at the group)."""
    for name in [*launch.torchruns, *(k for k in os.environ if k.startswith("TORCHELASTIC_"))]:
        os.environ.pop(name, None)
    os.environ["LOCAL_RANK"] = str(launch.index)
    whole_lines()  # the ranks share the launcher's stdout: a line split in two writes interleaves
    if ranks:
        os.environ["LOCAL_WORLD_SIZE"] = str(ranks)
    try:
        from workers.capture.capture import Capture
        from workers.monitor.patch import add_globals

        if launch.forked:  # the launcher's monitor is not this process's
            from workers.monitor import api

            api.forget_inherited()
        add_globals(fn)  # the script's own names (``from torch.distributed import init_process_group``)
        if at_init:
            _capture_at_init(launch.launchers)
        else:
            Capture().install()
    except Exception as exc:  # noqa: BLE001 - the rank runs even if commtop cannot watch it
        print(f"commtop: not watching process {launch.index} ({type(exc).__name__}: {exc})", file=sys.stderr)
    try:
        yield
    except BaseException as exc:
        _monitor_says_failed(exc)
        raise
    finally:
        _close_monitor()


def _capture_at_init(launchers: int) -> None:
    """Wrap ``init_process_group``: at the first call the capture goes in (it wraps it again,
    around torch's), then that call goes on through it."""
    import torch.distributed.distributed_c10d as c10d

    from workers.monitor.patch import rebind

    current = c10d.init_process_group
    original = getattr(current, "__commtop_original__", current)

    @functools.wraps(original)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        if launchers > 1:
            raise _refuse("multiprocessing", launchers)
        # one node: the script's ranks are its local ranks (as the call, else its env://, says)
        rank = kwargs.get("rank", args[4] if len(args) > 4 else -1)
        world = kwargs.get("world_size", args[3] if len(args) > 3 else -1)
        rank = rank if isinstance(rank, int) and rank >= 0 else os.environ.get("RANK", "")
        world = world if isinstance(world, int) and world > 0 else os.environ.get("WORLD_SIZE", "")
        if str(rank).isdigit():
            os.environ["LOCAL_RANK"] = str(rank)
        if str(world).isdigit():
            os.environ.setdefault("LOCAL_WORLD_SIZE", str(world))
        from workers.capture.capture import Capture

        rebind("init_process_group", (init_process_group,), original)
        try:
            Capture().install()
        except Exception as exc:  # noqa: BLE001 - the rank runs even if commtop cannot watch it
            print(f"commtop: not watching this process ({type(exc).__name__}: {exc})", file=sys.stderr)
        return c10d.init_process_group(*args, **kwargs)

    init_process_group.__commtop_original__ = original  # type: ignore[attr-defined]
    rebind("init_process_group", (current, original), init_process_group)


def _monitor_says_failed(exc: BaseException) -> None:
    """multiprocessing prints a target's exception itself (no excepthook): the Bye says it."""
    from workers import monitor

    mon = monitor.active()
    if mon is not None and not (isinstance(exc, SystemExit) and exc.code in (0, None)):
        mon.failed_with(exc)


def _close_monitor() -> None:
    """This process's capture, if it made one, sends what is left and its Bye."""
    from workers import monitor

    mon = monitor.active()
    if mon is not None:
        mon.close()
