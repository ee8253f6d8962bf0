"""What torch issued on this rank's groups that the Python hooks never saw: counted, not nothing.

The hooks see what Python calls. They cannot see what torch issues from C++ or from code bound
before them: DDP's constructor (shape check, parameter broadcast) and bucket rebuild, the
``*_coalesced`` forms, a functional collective's own backward, compiled regions, a function a
script imported before patching. Each backend numbers what it issues on a group
(``_get_sequence_number_for_group``). gloo (torch 2.13): one per collective or point-to-point
op, as torch.profiler's ``c10d::`` ops count them, with exceptions: a list ``reduce_scatter``
takes 2, ``monitored_barrier`` its sends and receives. NCCL: one per collective it launches (a
coalescing block: one), point-to-point numbered apart (not read: a CUDA tensor's send or receive
is left out of the hooks' count too). That number less what the hooks counted on the group is
what they missed; it goes into the Hello's ``lost`` (shown as missing) beside what the timers lost.

What one call takes is measured, not assumed: the first call of each function on each group is
read before and after (:meth:`Unseen.calibrate`), so torch versions that number otherwise count
right. What a group issued before the hooks went in is left out (:meth:`Unseen.baseline`).
Never more than missed: a hook counts a call before torch numbers it and a read takes
torch's numbers first, then the hooks'; a group's count only grows (a later read that comes out
lower keeps the earlier: in a ``_coalescing_manager`` block the hooks count two all_reduces where
gloo or NCCL issue one); a call counts at least one; collectives a CUDA graph captured are the
graph counter's (workers.monitor.graphs), and no read is taken while a graph is being captured.
A group with a backend of another kind (UCC, MPI, a plugin) is left out; past MAX_GROUPS groups
the count stops. NCCL groups are read only while the hooks time them (:attr:`Unseen.nccl_too`):
under the Flight Recorder capture its ring counts NCCL's, and no hook is in for gloo's, so a gloo
side group's collectives (CPU object collectives, a checkpointer's group) are untimed: all of
them count (:attr:`untimed_gloo`).
Read about once a second on the job's thread (a few groups: microseconds), before
``destroy_process_group`` and at close; after ``destroy_process_group()`` the counts start
again (:meth:`Unseen.forget_groups`).
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Sequence
from typing import Any

from workers.rank.groups import GroupTable
from workers.wire.protocol import MAX_GROUPS

log = logging.getLogger("commtop.monitor")

C10D = "torch.distributed.distributed_c10d"
#: Seconds between two reads while records flow.
READ_EVERY_S = 1.0


#: A backend's class name -> how it numbers what it issues (the module docstring).
NUMBERING = {"ProcessGroupGloo": "gloo", "ProcessGroupNCCL": "nccl"}
#: What the hooks' count is compared with: gloo's numbers, and NCCL's while the hooks time NCCL.
READ_ALWAYS = frozenset({"gloo"})
READ_WITH_NCCL = frozenset({"gloo", "nccl"})


def _backends(pg: Any) -> list[Any]:
    """The group's backends, each once (one may serve several device types)."""
    import torch

    backends = {id(b): b for b in (pg._get_backend(torch.device(d)) for d in pg._device_types)}
    return list(backends.values())


def kinds_of(pg: Any) -> tuple[str, ...]:
    """How each of the group's backends numbers: "gloo", "nccl" or the backend's class name."""
    return tuple(sorted(NUMBERING.get(type(b).__name__, type(b).__name__) for b in _backends(pg)))


def only_gloo(pg: Any) -> bool:
    """Every device of the group served by one gloo backend (its number counts all it issues)."""
    return kinds_of(pg) == ("gloo",)


def _process_group(group: Any) -> Any:
    """A collective's ``group`` argument as a process group (None: the default one)."""
    return group if group is not None else sys.modules[C10D]._get_default_group()


def issued_on(pg: Any) -> int:
    """What the group's backends numbered so far: the group's own number where one backend
    serves it, else the sum of its backends' (a ``cpu:gloo,cuda:nccl`` group)."""
    backends = _backends(pg)
    if len(backends) == 1:
        return int(pg._get_sequence_number_for_group())
    return sum(int(b._get_sequence_number_for_group()) for b in backends)


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
        #: what groups gone with ``destroy_process_group()`` missed, per name (:meth:`forget_groups`)
        self.gone: dict[str, int] = {}
        self._kinds: dict[str, tuple[str, ...]] = {}  # group name -> kinds_of, asked once
        self._code_kinds: dict[int, tuple[str, ...]] = {}  # the same by group code, for the calls
        self._gloo_codes: dict[int, bool] = {}  # group code -> only gloo serves it (per call)
        self._before: dict[str, int] = {}  # group name -> what it issued before the hooks went in
        #: no hooks on gloo's collectives (the Flight Recorder capture times NCCL's): all are missed
        self.untimed_gloo = False
        #: the hooks time NCCL's collectives too (False under the Flight Recorder capture)
        self.nccl_too = True
        #: the CUDA graph counter (workers.monitor.graphs): its captures are its own count
        self.graphs: Any = None
        self._next_read = 0.0
        #: reads count only once :meth:`baseline` was taken (a monitor clears it at its start: its
        #: idle flush thread may read between the hooks going in and their baseline, and a group's
        #: count only grows: on a loaded CI run a test's earlier collectives read as 22 missed)
        self.baselined = True
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
        if not set(self.kinds(code, group)) <= READ_WITH_NCCL:
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

    def issued_anyway(self, code: int) -> bool:
        """A call on this group raised: whether torch numbered it all the same (it failed after
        it was issued: a peer gone, a timeout, gloo's own checks), read now, the hooks' count
        still holding it. Then it stays counted as seen and counts as failed, not as missed.
        Refused before it was issued (a bad root: torch's number did not move), or a group
        this count does not read: False. An out-of-sight collective since the last read makes
        a refused call read as issued: the total stays right (the number is torch's)."""
        table = self.groups.table
        if not 0 <= code < len(table):
            return False
        name = table[code][0]
        number = dict(self._numbers()).get(name)
        if number is None:
            return False
        captured = self.graphs.captured_on.get(name, 0) if self.graphs is not None else 0
        beyond = number - self._before.get(name, 0) - self.seen[code] - captured
        return beyond >= self.missed.get(name, 0)

    # ---------------------------------------------------------------- reads

    def due(self) -> bool:
        return time.monotonic() >= self._next_read

    def baseline(self) -> None:
        """The hooks go in now: what the groups issued before is nobody's miss (a script that
        starts the monitor after its first collectives)."""
        self._before = {name: n for name, n in self._misses(self._numbers())}
        self.baselined = True

    def read(self) -> int:
        """Compare the backends' numbers with the hooks' counts now; the total missed so far.
        Not before the baseline, nor while a CUDA graph is captured (its collectives are numbered
        before they are the graph counter's)."""
        self._next_read = time.monotonic() + READ_EVERY_S
        if not self.baselined or (self.graphs is not None and self.graphs.capturing):
            return self.total
        for name, n in self._misses(self._numbers()):
            missed = n - self._before.get(name, 0)
            if missed > self.missed.get(name, 0):
                self.missed[name] = missed
        self.total = sum(self.gone.values()) + sum(self.missed.values())
        return self.total

    def forget_groups(self) -> None:
        """``destroy_process_group()`` took every group, after a last read. A group made later
        takes a gone one's name and code (torch names groups from 0 again) and its backend counts
        from 0: what the gone groups missed is kept, the hooks' counts and measures start again
        (before, phase 1's count on group 0 hid up to as many misses of phase 2's)."""
        for name, n in self.missed.items():
            self.gone[name] = self.gone.get(name, 0) + n
        self.missed.clear()
        self._before.clear()
        self.seen[:] = [0] * len(self.seen)  # in place: the timers hold this list
        for calls in self.issued.values():
            calls[:] = [0] * len(calls)
        self._kinds.clear()
        self._code_kinds.clear()
        self._gloo_codes.clear()
        self.total = sum(self.gone.values())

    def _numbers(self) -> list[tuple[str, int]]:
        """(name, its backends' number) of every group torch holds now that is read (the
        module docstring)."""
        c10d = sys.modules.get(C10D)
        if c10d is None or len(self.groups.table) >= MAX_GROUPS:
            return []
        try:
            names = dict(c10d._world.pg_names)  # a copy: the job may make a group meanwhile
        except Exception:  # noqa: BLE001 - a torch without it: nothing to compare
            return []
        read = READ_ALWAYS if self.untimed_gloo or not self.nccl_too else READ_WITH_NCCL
        issued: list[tuple[str, int]] = []
        for pg, name in names.items():
            try:
                if set(self._kinds_of(pg, name)) <= read:
                    issued.append((name, issued_on(pg)))
            except Exception:  # noqa: BLE001 - a group being torn down
                continue
        return issued

    def _misses(self, issued: list[tuple[str, int]]) -> list[tuple[str, int]]:
        """Per group, torch's number less the hooks' count, read after it, and less what CUDA
        graphs captured on it (the module docstring)."""
        codes = dict(self.groups.codes)
        seen = self.seen[:]
        captured = dict(self.graphs.captured_on) if self.graphs is not None else {}
        out = []
        measuring = set(self._measuring)
        for name, n in issued:
            code = codes.get(name)
            if code is not None and code in measuring:  # its count lands when the call returns
                continue
            out.append((name, n - (seen[code] if code is not None else 0) - captured.get(name, 0)))
        return out

    def is_gloo(self, code: int, group: Any) -> bool:
        """Whether a collective's group (None: the default one; ``code`` its code) is served only
        by gloo: asked of torch once per code (the job's thread asks it per call in gloo-only mode:
        one dict lookup, for every NCCL collective of a job with a gloo side group)."""
        gloo = self._gloo_codes.get(code)
        if gloo is None:
            gloo = self._gloo_codes[code] = self.kinds(code, group) == ("gloo",)
        return gloo

    def numbered_apart(self, code: int, group: Any) -> bool:
        """Whether a CUDA tensor's send or receive on this group is numbered apart from its
        collectives (NCCL's): then the hooks leave it out of the count too."""
        return "nccl" in self.kinds(code, group)

    def kinds(self, code: int, group: Any) -> tuple[str, ...]:
        """:func:`kinds_of` a collective's group, asked of torch once per code ("?": it cannot say)."""
        kinds = self._code_kinds.get(code)
        if kinds is None:
            try:
                kinds = self._kinds_of(_process_group(group))
            except Exception:  # noqa: BLE001 - a group torch cannot describe
                kinds = ("?",)
            self._code_kinds[code] = kinds
        return kinds

    def _kinds_of(self, pg: Any, name: str | None = None) -> tuple[str, ...]:
        if name is None:
            name = str(sys.modules[C10D]._get_process_group_name(pg))
        kinds = self._kinds.get(name)
        if kinds is None:
            try:
                kinds = kinds_of(pg)
            except Exception:  # noqa: BLE001 - a group torch cannot describe
                kinds = ("?",)
            self._kinds[name] = kinds
        return kinds


def say_missed(rank: int, unseen: Unseen, table: Sequence[tuple[str, str, int]], gloo_only: bool) -> None:
    """The rank's one line at its end where torch issued collectives no hook saw (none: nothing)."""
    missed = dict(unseen.gone)
    for name, n in unseen.missed.items():
        missed[name] = missed.get(name, 0) + n
    missed = {name: n for name, n in missed.items() if n}
    if not missed:
        return
    names = {name: f"{code}:{desc or name}" for code, (name, desc, _s) in enumerate(table)}
    where = ", ".join(f"{n} on {names.get(name, 'group ' + name)}" for name, n in missed.items())
    if unseen.untimed_gloo and not gloo_only:
        why = "were not timed (the Flight Recorder capture times NCCL's; COMMTOP_CAPTURE=hooks times gloo's)"
    elif unseen.untimed_gloo:
        why = "were not seen by the Python hooks (before the group's first wrapper, C++, *_coalesced, compiled)"
    else:
        why = (
            "were not seen by the Python hooks (DDP's own set-up, its broadcast_buffers' broadcast per forward and "
            "find_unused_parameters' per-step all_reduce, *_coalesced, a funcol backward, compiled code, a "
            "ProcessGroup's own method: pg.allreduce)"
        )
    log.warning(
        "commtop monitor: rank %d: %s torch issued on %s %s (%s): counted as missing",
        rank,
        collectives(sum(missed.values())),
        "gloo groups" if unseen.untimed_gloo or gloo_only else "its groups",
        why,
        where,
    )


def collectives(n: int) -> str:
    """``1 collective``, ``2 collectives``: the count in an end line."""
    return f"{n} collective" if n == 1 else f"{n} collectives"
