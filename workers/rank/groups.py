"""A rank's process groups as the records' ``group`` column codes them, and their Hello table.

Code 0 is the default (world) group; any other group gets the next code the first time this rank
sees it: a collective on it (the monitor's wrappers) or a Flight Recorder entry naming it (the
capture). Both key the group by torch's group name, so the two agree, and the Hello's
``groups`` (name, description, size per code) lets a viewer name a stream by the group, never
by a rank's code. The table is a tuple replaced whole on each new group (GIL-atomic; the
heartbeat only reads it).

On the job's thread a known group costs one dict lookup by the group object; describing a new
one (its name, description and size from torch) happens once per group.
"""

from __future__ import annotations

import threading
from typing import Any, Protocol

from workers.wire.protocol import MAX_GROUPS, WORLD_GROUP

#: (torch's group name, its description, its size), as Hello.groups holds them.
Group = tuple[str, str, int]
#: Code of every group past MAX_GROUPS (counted, never named: Hellos name MAX_GROUPS groups).
OVERFLOW = MAX_GROUPS
#: Group objects remembered for the fast path (beyond: described again at each call).
MAX_OBJECTS = 4 * MAX_GROUPS


class GroupSink(Protocol):
    """Where the table is published (workers.rank.heartbeat.WorkerStatus)."""

    groups: tuple[Group, ...]


def describe(pg: Any) -> Group:
    """(name, description, size) of a torch process group (None: the default group).

    The name is torch's (``_get_process_group_name``, what the Flight Recorder's
    ``process_group`` holds), the description ``group_desc`` ("default_pg", "undefined", or what
    ``new_group(group_desc=...)`` gave) where torch has it."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    if pg is None:
        pg = c10d._get_default_group()
    try:
        name = str(c10d._get_process_group_name(pg))
    except Exception:  # noqa: BLE001 - a torch without it, or a group it does not know
        name = str(getattr(pg, "group_name", ""))
    desc = getattr(pg, "group_desc", "")
    return name, str(desc) if desc is not None else "", int(dist.get_world_size(pg))


class GroupTable:
    """Group codes of one rank: :meth:`of_pg` on the job's thread, :meth:`code` for names."""

    def __init__(self, sink: GroupSink | None = None) -> None:
        self.sink = sink
        self.table: tuple[Group, ...] = ()
        self._codes: dict[str, int] = {}
        #: group object (None: the default group) -> (code, size): the job thread's one lookup
        self.by_pg: dict[Any, tuple[int, int]] = {}
        self._lock = threading.Lock()  # new groups: the job's thread and the capture thread

    @property
    def codes(self) -> dict[str, int]:
        """Group name -> code, for the groups that have one (past MAX_GROUPS: none)."""
        return self._codes

    def world(self, group: Group) -> None:
        """The default group: code 0 (set when the process group exists; again after a new init)."""
        with self._lock:
            rest = list(self.table[1:])
            self._codes = {name: code for code, (name, _d, _s) in enumerate(rest, start=1)}
            self._codes[group[0]] = WORLD_GROUP
            self._publish((group, *rest))
            self.by_pg.clear()

    def code(self, name: str, desc: str, size: int) -> int:
        """The code of the group named ``name`` (a new code the first time)."""
        code = self._codes.get(name)
        if code is not None:
            return code
        with self._lock:
            code = self._codes.get(name)
            if code is None:
                if not self.table:  # no default group known yet: code 0 stays the world's
                    self._publish((("", "", 0),))
                code = len(self.table)
                if code >= MAX_GROUPS:
                    return OVERFLOW
                self._codes[name] = code
                self._publish((*self.table, (name, desc, size)))
            return code

    def of_pg(self, pg: Any) -> tuple[int, int]:
        """(code, size) of a group object (None: the default group). The job's thread calls
        ``by_pg.get(pg)`` first, and this only when that misses (once per group). A group torch
        cannot describe (no default group yet, a foreign object) gets code 0, size 0, uncached:
        the collective still goes to torch, which says what is wrong with it."""
        try:
            if not self.table or not self.table[0][0]:  # the default group is not named yet
                self.world(describe(None))
            name, desc, size = describe(pg)
        except Exception:  # noqa: BLE001 - never into the job from here
            return WORLD_GROUP, 0
        code = self.code(name, desc, size)
        if len(self.by_pg) < MAX_OBJECTS:
            self.by_pg[pg] = (code, size)
        return code, size

    def _publish(self, table: tuple[Group, ...]) -> None:
        self.table = table
        if self.sink is not None:
            self.sink.groups = table
