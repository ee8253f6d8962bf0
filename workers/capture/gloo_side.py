"""A GPU job's gloo side groups under the Flight Recorder capture: timed by the Python hooks.

torch's Flight Recorder dump is NCCL's: a group served by gloo (``new_group(backend="gloo")``:
CPU object collectives, a checkpointer's or a data loader's group) is not in it. When the job
makes such a group (``_new_group_with_tag``, which ``new_group``, ``new_subgroups`` and a CPU
device mesh go through), or has one when the capture starts, the monitor's wrappers go in
(workers.monitor.patch) timing only collectives on gloo groups (``Timers.gloo_only``); NCCL's stay
the Flight Recorder's, and both kinds of record take their iterations from one numbering. A job
with no gloo group has no wrapper in, and pays nothing for this. With them in, a collective
called from Python on an NCCL group pays the wrapper's check (about a microsecond of the job's
thread); those issued from C++ (DDP's buckets) pay nothing. What a gloo group issued before the
wrappers went in, or out of their sight, counts as lost (workers.monitor.unseen).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

from workers.monitor.patch import rebind
from workers.monitor.unseen import C10D, only_gloo

#: What ``new_group``, ``new_subgroups`` and a CPU device mesh make their groups through.
NEW_GROUP = "_new_group_with_tag"


def install(on_gloo_group: Callable[[], None]) -> None:
    """Call ``on_gloo_group`` now if the job has a gloo group, else at the first one it makes."""
    c10d = sys.modules[C10D]
    if any(_gloo(pg) for pg in list(c10d._world.pg_names)):
        on_gloo_group()
        return
    current = getattr(c10d, NEW_GROUP, None)
    if current is None:  # a torch without it: its gloo groups stay counted as missing
        return
    original = getattr(current, "__commtop_original__", current)

    @functools.wraps(original)
    def _new_group_with_tag(*args: Any, **kwargs: Any) -> Any:
        group = original(*args, **kwargs)
        if _gloo(group):
            rebind(NEW_GROUP, (_new_group_with_tag,), original)  # once is enough
            on_gloo_group()
        return group

    _new_group_with_tag.__commtop_original__ = original  # type: ignore[attr-defined]
    rebind(NEW_GROUP, (current, original), _new_group_with_tag)  # new_group looks it up at call time


def _gloo(group: Any) -> bool:
    try:
        return only_gloo(group)
    except Exception:  # noqa: BLE001 - not a group (GroupMember.NON_GROUP_MEMBER), or not one torch describes
        return False
