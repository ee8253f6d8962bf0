"""Where neither Flight Recorder timing nor CUPTI can run (gloo/CPU, an old torch, FR off):
time collectives with :mod:`workers.monitor`'s Python wrappers, and make DDP's C++ all-reduce
visible by giving each DDP model the equivalent Python comm hook.

DDP all-reduces its gradient buckets in C++, out of the wrappers' sight, unless a comm hook
is registered; ``default_hooks.allreduce_hook`` does what the built-in does (divide by the
world size, all_reduce) through ``dist.all_reduce``. It is registered at the model's first
forward, and only if the script registered no hook of its own by then (DDP takes one hook).
DDP's own set-up collectives (parameter broadcast, shape check, bucket rebuild) run in C++:
untimed on this path, and counted as lost (workers.monitor.unseen).
"""

from __future__ import annotations

import functools
import logging
import sys
from typing import Any

from workers import monitor
from workers.capture.caller_warnings import at_the_callers_line

log = logging.getLogger("commtop.capture")

_ddp_patched = False


def install() -> list[str]:
    """Patch torch.distributed's collectives and DDP; returns the functions patched."""
    names = monitor.patch_distributed()
    try:
        patch_ddp()
    except Exception as exc:  # noqa: BLE001 - DDP's buckets then go unseen; the job goes on
        log.warning("commtop capture: DDP buckets not visible (%r)", exc)
    return names


def patch_ddp() -> None:
    """Give every DDP model the Python all-reduce comm hook (see the module docstring)."""
    global _ddp_patched
    if _ddp_patched:
        return
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    original_init = DDP.__init__
    original_register = DDP.register_comm_hook

    @functools.wraps(original_register)
    def register_comm_hook(self: Any, state: Any, hook: Any) -> Any:
        self._commtop_user_hook = True
        return original_register(self, state, hook)

    @functools.wraps(original_init)
    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        with at_the_callers_line(__file__, sys._getframe(1)):  # its warnings name the job's line
            original_init(self, *args, **kwargs)

        def first_forward(module: Any, _inputs: Any) -> None:
            handle.remove()
            if not getattr(module, "_commtop_user_hook", False) and getattr(module, "process_group", None) is not None:
                try:
                    original_register(module, module.process_group, default_hooks.allreduce_hook)
                except Exception as exc:  # noqa: BLE001
                    log.warning("commtop capture: DDP buckets not visible (%r)", exc)

        handle = self.register_forward_pre_hook(first_forward)

    DDP.__init__ = init  # type: ignore[method-assign]
    DDP.register_comm_hook = register_comm_hook  # type: ignore[method-assign]
    _ddp_patched = True
