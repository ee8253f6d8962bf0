"""What torch issued on this rank's gloo groups that the Python hooks never saw: counted, not nothing.

The hooks see what Python calls. They cannot see what torch issues from C++ or from code bound
before them: DDP's constructor (shape check, parameter broadcast) and bucket rebuild, the
``*_coalesced`` forms, a functional collective's own backward, compiled regions, a function a
script imported before patching. gloo numbers what it issues on a group
(``ProcessGroup._get_sequence_number_for_group``; torch 2.13: one per collective or
point-to-point op, as torch.profiler's ``c10d::`` ops count them, with exceptions: a list
``reduce_scatter`` takes 2, ``monitored_barrier`` its sends and receives). That number less what
the hooks counted on the group is what they missed; it goes into the Hello's ``lost`` (shown as
missing) beside what the timers lost.

What one call takes is measured, not assumed: the first call of each function on each group is
read before and after (:meth:`Unseen.calibrate`), so torch versions that number otherwise count
right. What a group issued before the hooks went in is left out (:meth:`Unseen.baseline`).
Never more than missed: a hook counts a call before torch numbers it and a read takes
torch's numbers first, then the hooks'; a group's count only grows (a later read that comes out
lower keeps the earlier: in a ``_coalescing_manager`` block the hooks count two all_reduces where
gloo issues one); a call counts at least one. NCCL and mixed groups are left out (the Flight
Recorder counts NCCL's; their numbers count otherwise); past MAX_GROUPS groups the count stops.
Under the Flight Recorder capture (NCCL) no hook is in and a gloo side group's collectives (CPU
object collectives, a checkpointer's group) are untimed: all of them count (:attr:`untimed_gloo`).
Read about once a second on the job's thread (a few groups: microseconds), before
``destroy_process_group`` and at close.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from workers.rank.groups import GroupTable
from workers.wire.protocol import MAX_GROUPS

C10D = "torch.distributed.distributed_c10d"
#: Seconds between two reads while records flow.
READ_EVERY_S = 1.0


def only_gloo(pg: Any) -> bool:
    """Every device of the group served by one gloo backend (its number counts all it issues)."""
    import torch

    backends = {id(b): b for b in (pg._get_backend(torch.device(d)) for d in pg._device_types)}
    return len(backends) == 1 and type(next(iter(backends.values()))).__name__ == "ProcessGroupGloo"


def _process_group(group: Any) -> Any:
    """A collective's ``group`` argument as a process group (None: the default one)."""
    return group if group is not None else sys.modules[C10D]._get_default_group()


def issued_on(pg: Any) -> int:
    """gloo's number of what it issued on ``pg`` so far."""
    return int(pg._get_sequence_number_for_group())


class Unseen:
    """The hooks' count per group code (:attr:`seen`, the job's thread) against gloo's numbers."""

    def __init__(self, groups: GroupTable) -> None:
        self.groups = groups
        #: operations the hooks counted per group code (a failed call gives its count back)
        self.seen = [0] * (MAX_GROUPS + 1)
        #: function name -> per group code, what one call issues (0: not measured yet)
        self.issued: dict[str, list[int]] = {}
        #: the highest count read per group name
        self.missed: dict[str, int] = {}
        self.total = 0
        self._gloo: dict[str, bool] = {}  # group name -> only_gloo, asked once
        self._gloo_codes: dict[int, bool] = {}  # the same by group code, for the calls
        self._before: dict[str, int] = {}  # group name -> what it issued before the hooks went in
        #: no hooks on gloo's collectives (the Flight Recorder capture times NCCL's): all are missed
        self.untimed_gloo = False
        self._next_read = 0.0
        #: group code -> calls being measured on it now (calibrate .. calibrated), by any thread
        self._measuring: dict[int, int] = {}

    # ---------------------------------------------------------------- the job's thread, per call

    def calibrate(self, func: str, code: int, group: Any) -> tuple[str, int, Any, int] | None:
        """The first call of ``func`` on this group: torch's number before it (the pending read
        :meth:`calibrated` ends), or None where there is nothing to read (1 per call then)."""
        calls = self.issued.get(func)
        if calls is None:
            calls = self.issued[func] = [0] * (MAX_GROUPS + 1)
        calls[code] = 1
        if not self.is_gloo(code, group):
            return None
        try:
            pg = _process_group(group)
            pending = func, code, pg, issued_on(pg)
        except Exception:  # noqa: BLE001 - a group torch cannot describe: 1 per call
            return None
        self._measuring[code] = self._measuring.get(code, 0) + 1  # a read meanwhile leaves this group as it was
        return pending

    def calibrated(self, pending: tuple[str, int, Any, int]) -> None:
        """After that call returned: what it issued (at least 1; 1 was counted before it)."""
        func, code, pg, before = pending
        try:
            n = max(1, issued_on(pg) - before)
        except Exception:  # noqa: BLE001
            n = 1
        self.issued[func][code] = n
        self.seen[code] += n - 1
        self._measured(code)

    def abandon(self, pending: tuple[str, int, Any, int]) -> None:
        """That call raised: its next call measures again."""
        func, code, _pg, _before = pending
        self.issued[func][code] = 0
        self._measured(code)

    def _measured(self, code: int) -> None:
        left = self._measuring.get(code, 0) - 1
        if left > 0:
            self._measuring[code] = left
        else:
            self._measuring.pop(code, None)

    # ---------------------------------------------------------------- reads

    def due(self) -> bool:
        return time.monotonic() >= self._next_read

    def baseline(self) -> None:
        """The hooks go in now: what the groups issued before is nobody's miss (a script that
        starts the monitor after its first collectives)."""
        self._before = {name: n for name, n in self._misses(self._numbers())}

    def read(self) -> int:
        """Compare gloo's numbers with the hooks' counts now; the total missed so far."""
        self._next_read = time.monotonic() + READ_EVERY_S
        for name, n in self._misses(self._numbers()):
            missed = n - self._before.get(name, 0)
            if missed > self.missed.get(name, 0):
                self.missed[name] = missed
        self.total = sum(self.missed.values())
        return self.total

    def _numbers(self) -> list[tuple[str, int]]:
        """(name, gloo's number) of every gloo group torch holds now."""
        c10d = sys.modules.get(C10D)
        if c10d is None or len(self.groups.table) >= MAX_GROUPS:
            return []
        try:
            names = dict(c10d._world.pg_names)  # a copy: the job may make a group meanwhile
        except Exception:  # noqa: BLE001 - a torch without it: nothing to compare
            return []
        issued: list[tuple[str, int]] = []
        for pg, name in names.items():
            try:
                if self._is_gloo(pg, name):
                    issued.append((name, issued_on(pg)))
            except Exception:  # noqa: BLE001 - a group being torn down
                continue
        return issued

    def _misses(self, issued: list[tuple[str, int]]) -> list[tuple[str, int]]:
        """Per group, torch's number less the hooks' count, read after it (the module docstring)."""
        codes = dict(self.groups.codes)
        seen = self.seen[:]
        out = []
        measuring = set(self._measuring)
        for name, n in issued:
            code = codes.get(name)
            if code is not None and code in measuring:  # its count lands when the call returns
                continue
            out.append((name, n - (seen[code] if code is not None else 0)))
        return out

    def is_gloo(self, code: int, group: Any) -> bool:
        """Whether a collective's group (None: the default one; ``code`` its code) is served only
        by gloo: asked of torch once per code (the job's thread asks it per call in gloo-only mode)."""
        gloo = self._gloo_codes.get(code)
        if gloo is None:
            try:
                gloo = self._is_gloo(_process_group(group))
            except Exception:  # noqa: BLE001 - a group torch cannot describe
                gloo = False
            self._gloo_codes[code] = gloo
        return gloo

    def _is_gloo(self, pg: Any, name: str | None = None) -> bool:
        if name is None:
            name = str(sys.modules[C10D]._get_process_group_name(pg))
        gloo = self._gloo.get(name)
        if gloo is None:
            try:
                gloo = only_gloo(pg)
            except Exception:  # noqa: BLE001 - a group torch cannot describe
                gloo = False
            self._gloo[name] = gloo
        return gloo
