"""Ranks a script starts itself (``torch.multiprocessing.spawn``, the PyTorch DDP tutorial's way), watched too.

``commtop run --nproc 1 -- python train.py`` where train.py calls ``mp.spawn(worker, nprocs=N)``:
the torchrun rank is only the launcher, and the N processes it starts are the job's ranks. The
bootstrap wraps torch.multiprocessing's ``start_processes`` (``spawn`` calls it): the launcher's
monitor stands aside (it never issued a collective: it sends nothing, and its node sampler
stops so the first spawned process runs the node's), and each spawned process runs the capture
before the job's function (:func:`rank_main`, pickled by reference) with LOCAL_RANK its index and
none of torchrun's other variables; its rank and world size come from its process group, as the
job's ``init_process_group`` is told.

Under several torchrun ranks each would start its own copy of the job's ranks (they collide on
one store, or run the job N times): refused in one line, before any is started. ``fork`` (a
spawned process would inherit the launcher's threads) is left unwatched, said in one line. A
process that already has its process group starts helpers, not ranks: left as they are.
"""

from __future__ import annotations

import functools
import os
import sys
from typing import Any

#: torchrun's variables, about the launcher (a torchrun worker), not a spawned rank: popped in a
#: spawned rank, which then sees what it would see run as ``python train.py`` (its process group
#: names its rank; its store is its own: with torchrun's agent store it would wait on torchrun's).
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
)


class OwnRanksError(SystemExit):
    """The script starts its own ranks under several torchrun ranks (exit code 2)."""


def install(stand_aside: Any) -> None:
    """Wrap ``start_processes`` in torch.multiprocessing (``spawn`` looks it up at call time);
    ``stand_aside()`` retires this process's monitor before the ranks start."""
    import torch.multiprocessing  # noqa: F401 - loads torch.multiprocessing.spawn

    from workers.monitor.patch import rebind

    spawn_module = sys.modules["torch.multiprocessing.spawn"]  # (``torch.multiprocessing.spawn`` is the function)
    current = spawn_module.start_processes
    original = getattr(current, "__commtop_original__", current)

    @functools.wraps(original)
    def start_processes(
        fn: Any, args: tuple[Any, ...] = (), nprocs: int = 1, join: bool = True, daemon: bool = False, **kw: Any
    ) -> Any:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():  # a rank starting helpers, not ranks
            return original(fn, args, nprocs, join, daemon, **kw)
        method = kw.get("start_method", "spawn")
        launchers = int(os.environ.get("WORLD_SIZE", "1") or 1)
        if launchers > 1:
            script = os.path.basename(sys.argv[0]) if sys.argv else "the script"
            print(
                f"commtop: {script} starts its own ranks (torch.multiprocessing, {nprocs} processes) and commtop run "
                f"started {launchers} copies of it: run it with `commtop run --nproc 1 -- ...`",
                file=sys.stderr,
                flush=True,
            )
            raise OwnRanksError(2)
        if method == "fork":
            print("commtop: ranks started with fork are not watched (use spawn)", file=sys.stderr, flush=True)
            return original(fn, args, nprocs, join, daemon, **kw)
        stand_aside()
        ranked = functools.partial(rank_main, fn, nprocs)
        return original(ranked, args, nprocs, join, daemon, **kw)

    start_processes.__commtop_original__ = original  # type: ignore[attr-defined]
    rebind("start_processes", (current, original), start_processes)  # the spawn module and its re-export


def rank_main(fn: Any, nprocs: int, index: int, *args: Any) -> Any:
    """In a spawned process: the capture, then the job's function as torch would call it."""
    for name in [*LAUNCHER_ENV, *(k for k in os.environ if k.startswith("TORCHELASTIC_"))]:
        os.environ.pop(name, None)
    os.environ["LOCAL_RANK"] = str(index)
    os.environ["LOCAL_WORLD_SIZE"] = str(nprocs)
    from workers.capture.capture import Capture

    try:
        Capture().install()
    except Exception as exc:  # noqa: BLE001 - the rank runs even if commtop cannot watch it
        print(f"commtop: not watching spawned rank {index} ({type(exc).__name__}: {exc})", file=sys.stderr)
    return fn(index, *args)
