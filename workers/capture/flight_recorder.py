"""Decode torch's Flight Recorder dumps into commtop collectives, and count what they lost (torch-free).

A dump (``_dump_nccl_trace``, or the worker server's ``dump_nccl_trace_pickle``, unpickled) holds
``entries``, one dict per recorded operation, oldest first: ``record_id`` (global, increasing),
``process_group`` ([name, description]), ``collective_seq_id`` (per group, from 1, contiguous:
measured on the H200), ``p2p_seq_id``, ``profiling_name`` ("nccl:_all_gather_base"),
``input_sizes``/``input_dtypes``/``output_sizes``/``output_dtypes``, ``state``
("scheduled"/"started"/"completed"), ``retired``, ``is_p2p``, ``time_created_ns`` (host enqueue,
wall clock) and, with collective timing on (``TORCH_NCCL_ENABLE_TIMING=1``), ``duration_ms``
(CUDA events on the NCCL stream, set when torch's watchdog retires the entry).

How entries count (one collective = one ``collective_seq_id`` of one group):

* a plain collective: one entry, timed by itself;
* a coalesced call (``all_gather_into_tensor_coalesced``, ``reduce_scatter_tensor_coalesced``,
  ``allreduce_coalesced``): one entry whose sizes list every tensor: one collective, its bytes
  summed;
* a ``startCoalescing``/``endCoalescing`` block (``_coalescing_manager``): one entry per op, never
  timed (no events: they stay "scheduled", never retired), then one ``nccl:coalesced`` entry with
  empty sizes that carries the block's timing; all share one ``collective_seq_id``. One
  collective: the ops' op and dtype (the first op's), their bytes summed, the closing entry's time;
* point-to-point (``is_p2p``: ``nccl:send 0->1``, batched sends and their closing entry): not a
  collective in commtop's schema; counted as ``p2p``, never as lost.

Lost (Hello.lost) = ``overwritten`` (a gap in a group's sequence numbers between what was handled
and the oldest entry still in the ring: the ring wrapped before a read) + ``untimed`` (finished
without a duration; in a group that times its collectives, only once two dumps say so: torch
marks an entry retired before it computes its duration, outside its lock) + ``unknown`` (an op
commtop cannot name, or a closing entry whose ops were overwritten) + ``unread`` (at the end:
issued per torch's own count, ``pg_status``, and never seen finished). Bytes follow
nccl-tests' S (total gathered size for all_gather, total input otherwise), as
:mod:`workers.monitor.patch` does.
"""

from __future__ import annotations

import bisect
import io
import pickle
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from workers.wire.protocol import dtype_code

Entry = Mapping[str, Any]


class _PlainData(pickle.Unpickler):
    """Unpickles dicts, lists, tuples, strings and numbers only: any class or function a pickle
    names is refused, so loading a dump can never run code."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"a Flight Recorder dump names {module}.{name}: refused (plain data only)")


def load_dump(raw: bytes) -> dict[str, Any]:
    """A Flight Recorder dump (the bytes torch's dump API returns) as plain data; raises
    pickle.UnpicklingError for anything but plain data (torch 2.11's dumps are plain data)."""
    # through a buffered reader: with ``peek`` the C unpickler reads ahead in blocks instead of one
    # read() call per opcode (torch writes protocol 2, unframed): 3x faster, as fast as loading bytes
    data = _PlainData(io.BufferedReader(io.BytesIO(raw), 1 << 16)).load()
    if not isinstance(data, dict):
        raise pickle.UnpicklingError(f"a Flight Recorder dump is a map, not {type(data).__name__}")
    return data


#: c10 ScalarType names as Flight Recorder writes them -> bytes per element.
DTYPE_BYTES: dict[str, int] = {
    "Float": 4,
    "Double": 8,
    "Half": 2,
    "BFloat16": 2,
    "Long": 8,
    "Int": 4,
    "Short": 2,
    "Char": 1,
    "Byte": 1,
    "Bool": 1,
    "UInt16": 2,
    "UInt32": 4,
    "UInt64": 8,
    "ComplexHalf": 4,
    "ComplexFloat": 8,
    "ComplexDouble": 16,
    "Float8_e4m3fn": 1,
    "Float8_e5m2": 1,
    "Float8_e4m3fnuz": 1,
    "Float8_e5m2fnuz": 1,
}

#: Flight Recorder op names (after "nccl:"/"gloo:" and leading underscores) -> commtop op names.
OP_OF: dict[str, str] = {
    "all_reduce": "all_reduce",
    "allreduce": "all_reduce",
    "allreduce_coalesced": "all_reduce",
    "all_reduce_coalesced": "all_reduce",
    "all_gather": "all_gather",
    "all_gather_base": "all_gather",
    "allgather_base": "all_gather",
    "allgather": "all_gather",
    "all_gather_into_tensor_coalesced": "all_gather",
    "allgather_into_tensor_coalesced": "all_gather",
    "reduce_scatter": "reduce_scatter",
    "reduce_scatter_base": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "broadcast": "broadcast",
    "broadcast_oop": "broadcast",
    "all_to_all": "all_to_all",
    "alltoall": "all_to_all",
    "alltoall_base": "all_to_all",
    "reduce": "reduce",
    "reduce_oop": "reduce",
    "gather": "gather",
    "scatter": "scatter",
    "all_reduce_barrier": "barrier",
    "barrier": "barrier",
}

#: The closing entry of a startCoalescing/endCoalescing block.
COALESCED = "coalesced"

WAIT, TIMED, UNTIMED = 0, 1, 2


class FrCollective(NamedTuple):
    """One finished, timed collective of a dump (a named tuple: built for every collective read)."""

    record_id: int  # the entry that carried its timing
    pg: str  # process group name (torch's, as the monitor's group table keys it)
    desc: str  # the group's description ("default_pg", "undefined", ...)
    seq: int  # collective_seq_id within its group
    op: str  # commtop op name (workers.monitor.records.OPS)
    dtype: int  # workers.wire.protocol.DTYPES code (0: not known)
    nbytes: int  # nccl-tests S, summed over a coalesced collective's tensors
    ranks: int  # size of the process group (0: the dump does not say)
    host_ns: int  # time_created_ns: when the rank enqueued it (wall clock)
    dur_us: float  # CUDA events on the NCCL stream
    parts: int = 1  # ops of a startCoalescing block (1 otherwise)


def op_name(profiling_name: str) -> str | None:
    """'nccl:_all_gather_base' -> 'all_gather'; None for point-to-point and unknown ops."""
    name = profiling_name.split(":", 1)[-1].lstrip("_")
    return OP_OF.get(name)


def _bytes(sizes: Any, dtypes: Any) -> int:
    total = 0
    for shape, dtype in zip(sizes or (), dtypes or (), strict=False):
        n = 1
        for d in shape:
            n *= int(d)
        total += n * DTYPE_BYTES.get(str(dtype), 0)
    return total


#: Ops whose entry's output holds what nccl-tests counts: all_gather's gathered tensor, and
#: scatter's received one (its input is the root's list, and nothing on the other ranks).
OUTPUT_SIZED = frozenset({"all_gather", "scatter"})
#: Ops whose nccl-tests S is one rank's tensor times the group's size (gather_perf and
#: scatter_perf: count * nranks * typesize), as all_gather's gathered size is.
TIMES_GROUP = frozenset({"gather", "scatter"})


def entry_nbytes(op: str, entry: Entry, group_size: int = 0) -> int:
    """nccl-tests S of one entry (every tensor of a coalesced entry): the gathered output for
    all_gather, a rank's tensor times ``group_size`` for gather and scatter, the input otherwise."""
    if op == "barrier":
        return 0
    if op in OUTPUT_SIZED:
        nbytes = _bytes(entry.get("output_sizes"), entry.get("output_dtypes") or entry.get("input_dtypes"))
    else:
        nbytes = _bytes(entry.get("input_sizes"), entry.get("input_dtypes"))
    return nbytes * group_size if op in TIMES_GROUP and group_size > 0 else nbytes


def group_sizes(dump: Mapping[str, Any]) -> dict[str, int]:
    """pg name -> number of ranks, from ``pg_config`` ("ranks": "[0, 1, 2]")."""
    out: dict[str, int] = {}
    for name, cfg in (dump.get("pg_config") or {}).items():
        ranks = str(cfg.get("ranks", "")).strip("[] ")
        out[str(name)] = len([r for r in ranks.split(",") if r.strip()]) if ranks else 0
    return out


def issued_by_group(status: Mapping[str, Any]) -> dict[str, int]:
    """Group name -> collectives issued so far, from a dump's ``pg_status``
    (``last_enqueued_collective``: an int in a pickled dump, a string in a JSON one)."""
    out: dict[str, int] = {}
    for name, st in (status.get("pg_status") or {}).items():
        try:
            out[str(name)] = max(0, int(st.get("last_enqueued_collective", 0)))
        except (TypeError, ValueError, AttributeError):
            continue
    return out


def finished(e: Entry) -> int:
    """TIMED (done, with its duration), UNTIMED (done without one: its group's timing is off,
    or a ring that records no events, gloo's) or WAIT (running, or done but not retired yet:
    the watchdog sets the duration when it retires it)."""
    if e.get("duration_ms") is not None and (e.get("state") == "completed" or e.get("retired")):
        return TIMED
    return UNTIMED if e.get("retired") else WAIT


def _rid(e: Entry) -> int:
    return int(e.get("record_id", -1))


@dataclass
class GroupState:
    """One group's bookkeeping: every seq below ``expect`` is accounted (read or lost)."""

    desc: str = ""
    expect: int = 1
    done: set[int] = field(default_factory=set)  # accounted seqs above ``expect``
    last_seq: int = 0  # highest seq any dump showed
    p2p: bool = False  # it ran point-to-point ops (its pg_status count is then not collectives only)

    def account(self, seq: int) -> None:
        if seq == self.expect:
            self.expect += 1
            done = self.done
            while self.expect in done:
                done.discard(self.expect)
                self.expect += 1
        elif seq > self.expect:
            self.done.add(seq)

    def skip_to(self, seq: int) -> int:
        """The ring's oldest entry of this group is ``seq``: the seqs below it that were not
        accounted left the ring unread. Returns how many; all are accounted from now on."""
        if seq <= self.expect:
            return 0
        below = {d for d in self.done if d < seq}
        gone = seq - self.expect - len(below)
        self.done -= below
        self.expect = seq
        while self.expect in self.done:
            self.done.discard(self.expect)
            self.expect += 1
        return gone


class FrCursor:
    """Reads successive dumps of the same ring: each collective is returned once, and every one
    not returned is counted (see the module docstring for how entries count)."""

    def __init__(self) -> None:
        self.groups: dict[str, GroupState] = {}
        self.floor = -1  # every entry with a record_id <= floor is accounted
        self.last_record = -1  # newest record_id of the last dump
        self.overwritten = 0
        self.untimed = 0
        self.unknown = 0
        self.unread = 0
        self.p2p = 0  # point-to-point entries seen (not collectives; never lost)
        self.pending = 0  # collectives of the last dump still running or not retired yet
        self._pending: dict[str, set[int]] = {}
        #: the oldest collective still running at the last read: [op, group, nbytes, time created
        #: (ns, wall clock)], [] when none; a hang's stuck collective (Hello.inside)
        self.inside: list[Any] = []
        #: (group, seq) retired without a duration in the last dump: torch marks an entry retired
        #: and computes its duration after, outside its lock, so a dump can fall in between; the
        #: next dump says whether it was timed. Untimed only if it still has none then.
        self._settling: set[tuple[str, int]] = set()
        self._settling_next: set[tuple[str, int]] = set()
        #: Groups that have shown a timed collective: only there is "no duration" a maybe (gloo's
        #: rings, or a group whose timing is off, time nothing: untimed at once, as they wrap fast).
        self._timed_groups: set[str] = set()
        self._p2p_upto = -1
        #: torch's ``pg_status`` is keyed by each group's ``pg_id`` (a count of the groups this process
        #: made), the entries name their group too: pg_id -> group name, from the entries read. They
        #: differ where a rank is not in every group, past a gloo group, with hashed names, and for
        #: groups made again after ``destroy_process_group()``
        self.pg_names: dict[str, str] = {}
        #: pg_ids of groups a capture before this one read (:meth:`start_after`): not this one's
        self.gone_pg_ids: set[str] = set()
        self._sizes: dict[str, int] = {}
        self._kinds: dict[str, tuple[str | None, bool]] = {}  # profiling name -> (op, closer)
        self._dtypes: dict[str, int] = {}  # c10 dtype name -> code

    @property
    def lost(self) -> int:
        """Collectives issued and never returned (Hello.lost)."""
        return self.overwritten + self.untimed + self.unknown + self.unread

    def start_after(self, record_id: int, gone_pg_ids: Iterable[str] = ()) -> None:
        """Entries up to ``record_id`` were another cursor's (a capture of the groups
        ``destroy_process_group()`` took: their entries stay in the ring, and the groups made
        again reuse their names), and so are the groups ``gone_pg_ids`` (torch's status keeps
        them). Record ids that restart below it say torch reset its ring."""
        self.floor = max(self.floor, record_id)
        self.last_record = max(self.last_record, record_id)
        self.gone_pg_ids.update(str(i) for i in gone_pg_ids)

    def by_name(self, issued: Mapping[str, int]) -> dict[str, int]:
        """torch's counts per ``pg_id`` (:func:`issued_by_group`) per group name; a key no entry
        named is a group's own name (a torch that keys its status so), else a group no read has
        shown (``pg_id N``); gone groups left out."""
        out: dict[str, int] = {}
        for key, n in issued.items():
            if key in self.gone_pg_ids:
                continue
            name = self.pg_names.get(key)
            if name is None:
                name = key if key in self.groups else f"pg_id {key}"
            out[name] = out.get(name, 0) + n
        return out

    def read(self, dump: Mapping[str, Any]) -> list[FrCollective]:
        """New finished collectives of ``dump``, in the order they were issued."""
        self._sizes.update(group_sizes(dump))
        entries: Sequence[Entry] = dump.get("entries") or ()
        if entries and not _rid(entries[0]) <= _rid(entries[len(entries) // 2]) <= _rid(entries[-1]):
            entries = sorted(entries, key=_rid)  # torch dumps the ring oldest first; anything else is sorted
        if entries and _rid(entries[-1]) < self.last_record:  # record ids restarted: the recorder was reset
            self.floor = self._p2p_upto = -1
        units, oldest = self._collect(entries[bisect.bisect_right(entries, self.floor, key=_rid) :])
        for name, seq in oldest.items():
            self.overwritten += self.groups[name].skip_to(seq)
        out: list[FrCollective] = []
        self._pending = {}
        self._settling_next = set()
        lowest_pending: int | None = None
        running: tuple[str, list[Entry]] | None = None  # the oldest collective still running
        for (name, seq), unit in units.items():
            g = self.groups[name]
            if seq < g.expect or seq in g.done:
                continue
            state, row = self._unit(name, seq, unit)
            if state == WAIT:
                self._pending.setdefault(name, set()).add(seq)
                first = _rid(unit[0])
                if lowest_pending is None or first < lowest_pending:
                    lowest_pending, running = first, (name, unit)
                continue
            g.account(seq)
            if row is not None:
                out.append(row)
        self._settling = self._settling_next
        self.pending = sum(len(s) for s in self._pending.values())
        self.inside = self._inside(*running) if running is not None else []
        if entries:
            self.last_record = _rid(entries[-1])
            self.floor = lowest_pending - 1 if lowest_pending is not None else max(self.floor, self.last_record)
        return out

    def finish(self, issued: Mapping[str, int] | None) -> int:
        """At the end, after the last read: count what never came. ``issued``: torch's own count
        per group's pg_id (:func:`issued_by_group`), trusted for groups that ran no point-to-point op;
        elsewhere the collectives still pending count. Returns how many were added to ``unread``."""
        before = self.unread
        issued = self.by_name(issued or {})
        for name, g in self.groups.items():
            n = issued.pop(name, None)
            if n is not None and not g.p2p:
                self.unread += max(0, n - g.expect + 1 - sum(1 for d in g.done if d <= n))
                g.done = {d for d in g.done if d > n}
                g.expect = max(g.expect, n + 1)
            else:
                for seq in sorted(self._pending.get(name, ())):
                    if seq >= g.expect and seq not in g.done:
                        self.unread += 1
                        g.account(seq)
        for _name, n in issued.items():  # groups no dump ever showed
            self.unread += n
        self._pending = {}
        self.pending = 0
        self.inside = []
        return self.unread - before

    def state(self) -> dict[str, Any]:
        """Everything the cursor knows, as plain data (JSON-safe): a decoder in a child process
        hands it over with each batch, and :meth:`from_state` carries on from it."""
        return {
            "groups": {n: [g.desc, g.expect, sorted(g.done), g.last_seq, g.p2p] for n, g in self.groups.items()},
            "floor": self.floor,
            "last_record": self.last_record,
            "counts": [self.overwritten, self.untimed, self.unknown, self.unread, self.p2p, self.pending],
            "pending": {n: sorted(s) for n, s in self._pending.items()},
            "inside": self.inside,
            "settling": sorted([n, q] for n, q in self._settling),
            "timed_groups": sorted(self._timed_groups),
            "p2p_upto": self._p2p_upto,
            "sizes": dict(self._sizes),
            "pg_names": dict(self.pg_names),
            "gone_pg_ids": sorted(self.gone_pg_ids),
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> FrCursor:
        """A cursor that goes on where the one that wrote ``state`` stopped; ValueError if
        ``state`` is not what :meth:`state` writes."""
        c = cls()
        try:
            for name, (desc, expect, done, last_seq, p2p) in dict(state["groups"]).items():
                c.groups[str(name)] = GroupState(
                    str(desc), int(expect), {int(d) for d in done}, int(last_seq), bool(p2p)
                )
            c.floor, c.last_record, c._p2p_upto = int(state["floor"]), int(state["last_record"]), int(state["p2p_upto"])
            c.overwritten, c.untimed, c.unknown, c.unread, c.p2p, c.pending = (int(v) for v in state["counts"])
            c._pending = {str(n): {int(s) for s in seqs} for n, seqs in dict(state["pending"]).items()}
            c.inside = list(state.get("inside", ()))
            c._settling = {(str(n), int(q)) for n, q in state.get("settling", ())}
            c._timed_groups = {str(n) for n in state.get("timed_groups", ())}
            c._sizes = {str(n): int(v) for n, v in dict(state["sizes"]).items()}
            c.pg_names = {str(k): str(v) for k, v in dict(state.get("pg_names", {})).items()}
            c.gone_pg_ids = {str(k) for k in state.get("gone_pg_ids", ())}
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a Flight Recorder cursor state: {exc!r}") from exc
        return c

    # ------------------------------------------------------------------ internals

    def _collect(self, entries: Iterable[Entry]) -> tuple[dict[tuple[str, int], list[Entry]], dict[str, int]]:
        """The entries above the floor by (group, seq), and each group's oldest seq among them."""
        units: dict[tuple[str, int], list[Entry]] = {}
        oldest: dict[str, int] = {}
        groups = self.groups
        pg_names = self.pg_names
        for e in entries:
            try:  # torch writes every one of these fields
                name, desc = e["process_group"][:2]
                p2p = e["is_p2p"]
                seq = e["collective_seq_id"]
            except (KeyError, TypeError, ValueError):
                pg = e.get("process_group") or (e.get("pg_id", ""), "")
                name, desc = pg[0], pg[1] if len(pg) > 1 else ""
                p2p = e.get("is_p2p", False)
                seq = int(e.get("collective_seq_id", -1))
            if type(name) is not str:
                name = str(name)
            g = groups.get(name)
            if g is None:
                g = groups[name] = GroupState(desc=str(desc))
            pg_id = e.get("pg_id")
            if pg_id is not None:
                pg_names[str(pg_id)] = name
            if p2p:
                g.p2p = True
                rid = _rid(e)
                if rid > self._p2p_upto:
                    self.p2p += 1
                    self._p2p_upto = rid
                continue
            if seq > g.last_seq:
                g.last_seq = seq
            if name not in oldest:
                oldest[name] = seq
            if seq >= g.expect and seq not in g.done:
                key = (name, seq)
                unit = units.get(key)
                if unit is None:
                    units[key] = [e]
                else:
                    unit.append(e)
        return units, oldest

    def _untimed(self, name: str, seq: int) -> tuple[int, None]:
        """A collective retired without a duration: in a group that times its collectives, WAIT
        the first time (torch may be computing it right now, see ``_settling``), UNTIMED if the
        dump before said the same; elsewhere UNTIMED."""
        if name not in self._timed_groups or (name, seq) in self._settling:
            self.untimed += 1
            return UNTIMED, None
        self._settling_next.add((name, seq))
        return WAIT, None

    def _unit(self, name: str, seq: int, unit: list[Entry]) -> tuple[int, FrCollective | None]:
        """(WAIT, None) while it runs; else it is accounted, with its row unless it is lost."""
        if len(unit) == 1:  # a plain (or coalesced-call) collective: the common case, kept short
            e = unit[0]
            op, closer = self._kinds.get(e.get("profiling_name", "")) or self._kind(e)
            if not closer:
                dur = e.get("duration_ms")
                if dur is None or not (e.get("state") == "completed" or e.get("retired")):
                    if not e.get("retired"):
                        return WAIT, None
                    return self._untimed(name, seq)
                if op is None:
                    self.unknown += 1
                    return TIMED, None
                dtypes: Sequence[str] = e.get("input_dtypes") or e.get("output_dtypes") or ("",)
                dtype = self._dtypes.get(dtypes[0], -1)
                if dtype < 0:
                    dtype = self._dtypes[dtypes[0]] = dtype_code(str(dtypes[0]))
                size = self._sizes.get(name, 0)
                sizes: Sequence[Sequence[int]] = e.get("output_sizes" if op in OUTPUT_SIZED else "input_sizes") or ()
                if (
                    len(sizes) == 1 and len(sizes[0]) == 1 and op != "barrier" and op not in TIMES_GROUP
                ):  # one 1-d tensor
                    nbytes = int(sizes[0][0]) * DTYPE_BYTES.get(str(dtypes[0]), 0)
                else:
                    nbytes = entry_nbytes(op, e, size)
                self._timed_groups.add(name)
                return TIMED, FrCollective(
                    e["record_id"],
                    name,
                    self.groups[name].desc,
                    seq,
                    op,
                    dtype,
                    nbytes,
                    size,
                    int(e.get("time_created_ns") or 0),
                    float(dur) * 1e3,
                )
        # a startCoalescing block (its ops and closing entry), or a closing entry alone
        ops = [e for e in unit if not self._kind(e)[1]]
        done = [e for e in ops if finished(e) != WAIT]
        if done:  # a plain collective, timed by itself
            timing, parts = done[0], done[:1]
        else:
            closers = [e for e in unit if self._kind(e)[1]]
            if not closers:
                return WAIT, None
            timing, parts = closers[-1], ops  # a startCoalescing block: its ops, its closing entry's time
        state = finished(timing)
        if state == WAIT:
            return WAIT, None
        if state == UNTIMED:
            return self._untimed(name, seq)
        op = self._kind(parts[0])[0] if parts else None
        if op is None:
            self.unknown += 1
            return TIMED, None
        first = parts[0]
        size = self._sizes.get(name, 0)
        names: Sequence[str] = first.get("input_dtypes") or first.get("output_dtypes") or ("",)
        dtype = self._dtypes.get(names[0], -1)
        if dtype < 0:
            dtype = self._dtypes[names[0]] = dtype_code(str(names[0]))
        self._timed_groups.add(name)
        return TIMED, FrCollective(
            _rid(timing),
            name,
            self.groups[name].desc,
            seq,
            op,
            dtype,
            entry_nbytes(op, first, size) if len(parts) == 1 else sum(entry_nbytes(op, p, size) for p in parts),
            size,
            int(timing.get("time_created_ns") or 0),
            float(timing["duration_ms"]) * 1e3,
            len(parts),
        )

    def size_of(self, name: str) -> int:
        """The size of a group the dumps named (0: unknown)."""
        return self._sizes.get(name, 0)

    def _inside(self, name: str, unit: list[Entry]) -> list[Any]:
        """[op, group, nbytes, time created] of a running collective (its first entry's)."""
        e = unit[0]
        op = self._kind(e)[0]
        if op is None:
            return []
        return [op, name, entry_nbytes(op, e, self._sizes.get(name, 0)), int(e.get("time_created_ns") or 0)]

    def _kind(self, e: Entry) -> tuple[str | None, bool]:
        """(commtop op or None, is a startCoalescing closing entry) of an entry's profiling name."""
        name = e.get("profiling_name", "")
        kind = self._kinds.get(name)
        if kind is None:
            text = str(name)
            kind = self._kinds[name] = (op_name(text), text.split(":", 1)[-1] == COALESCED)
        return kind


def read_all(dumps: Iterable[Mapping[str, Any]]) -> tuple[list[FrCollective], FrCursor]:
    """Every new finished collective of successive dumps (tests, offline decoding)."""
    cursor = FrCursor()
    rows: list[FrCollective] = []
    for d in dumps:
        rows.extend(cursor.read(d))
    return rows, cursor
