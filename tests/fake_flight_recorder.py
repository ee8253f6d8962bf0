"""A FAKE Flight Recorder ring for tests: entries as torch 2.11's ProcessGroupNCCL writes them.

CI has no NCCL, so the decoder's NCCL cases are fed entries built here, shaped like the H200
dumps (tests/fixtures/h200/fr_dump_*.pkl, /work/notes/device1/fr_2000.json): the same fields,
``record_id`` global and increasing, ``collective_seq_id`` per group from 1 and ``op_id`` per
group, ``p2p_seq_id`` per group for point-to-point ops. What torch does, mirrored here:

* a plain or coalesced call (``collectiveCoalesced``: one entry listing every tensor) bumps the
  group's collective seq and records one entry, timed when the watchdog retires it;
* a ``startCoalescing``/``endCoalescing`` block bumps the seq once; each op records an entry
  with no events (it stays "scheduled", never retired), then ``endCoalescing`` records
  ``nccl:coalesced`` with empty sizes and the same seq, the one that gets timed;
* point-to-point ops bump ``p2p_seq_id`` only (``is_p2p``, "nccl:send 0->1"); a batch of them
  ends with an ``is_p2p`` ``nccl:coalesced`` entry;
* ``pg_status[pg_id]["last_enqueued_collective"]`` is the seq of the last work enqueued on the
  group (ProcessGroupNCCL::workEnqueue takes the work's seq, p2p or not), keyed by the group's
  ``pg_id`` (the count of NCCL groups this process made: not its name where a gloo group or a
  group this rank is not in took a name, or the groups were made again), gone groups' kept;
* the ring keeps the newest ``size`` entries.
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass, field
from typing import Any

ELEMENT = {"Float": 4, "BFloat16": 2, "Half": 2, "Long": 8, "Int": 4}


@dataclass
class _Group:
    name: str
    desc: str
    ranks: int
    pg_id: int = 0
    seq: int = 0
    p2p: int = 0
    op_id: int = 0
    last_enqueued: int = -1


@dataclass
class FakeRing:
    """A ring of ``size`` entries shared by every group of the process, as torch's is."""

    size: int = 2000
    world: int = 2
    entries: deque[dict[str, Any]] = field(default_factory=deque)
    groups: dict[str, _Group] = field(default_factory=dict)
    next_id: int = 0
    clock_ns: int = 1_796_363_919_325_845_048
    issued: int = 0  # collectives issued (what the job would count)
    made: list[_Group] = field(default_factory=list)  # every group ever made, gone ones too (pg_status)

    def __post_init__(self) -> None:
        self.entries = deque(maxlen=self.size)
        self.group("0", "default_pg", self.world)

    def group(self, name: str, desc: str = "undefined", ranks: int | None = None) -> str:
        if name not in self.groups:
            g = self.groups[name] = _Group(name, desc, ranks or self.world, pg_id=len(self.made))
            self.made.append(g)
        return name

    # ------------------------------------------------------------------ what a job issues

    def collective(
        self,
        name: str,
        inputs: list[list[int]],
        outputs: list[list[int]],
        dtype: str = "Float",
        pg: str = "0",
        *,
        done: bool = False,
    ) -> dict[str, Any]:
        """One collective (plain or a coalesced call): one entry, running until :meth:`complete`
        (``done``: finished and retired at once, timed)."""
        g = self.groups[pg]
        g.seq += 1
        self.issued += 1
        e = self._record(g, name, inputs, outputs, dtype, p2p=False)
        g.last_enqueued = g.seq
        if done:
            e.update(state="completed", retired=True, duration_ms=0.05)
        return e

    def coalescing_block(self, ops: list[tuple[str, list[list[int]], list[list[int]]]], dtype: str, pg: str = "0"):
        """startCoalescing; the ops; endCoalescing: one collective of len(ops) entries + a closer."""
        g = self.groups[pg]
        g.seq += 1
        self.issued += 1
        for name, inputs, outputs in ops:
            e = self._record(g, name, inputs, outputs, dtype, p2p=False)
            e["untimed_forever"] = True  # no events: torch never moves it past "scheduled"
        closer = self._record(g, "nccl:coalesced", [], [], dtype, p2p=False, bump_op=False)
        g.last_enqueued = g.seq
        return closer

    def send(self, peer: int, n: int, pg: str = "0", recv: bool = False) -> dict[str, Any]:
        g = self.groups[pg]
        g.p2p += 1
        name = f"nccl:recv 0<-{peer}" if recv else f"nccl:send 0->{peer}"
        e = self._record(g, name, [[n]], [[n]], "Float", p2p=True)
        g.last_enqueued = g.p2p  # the work's seq: its p2p seq
        return e

    def p2p_batch(self, n: int, count: int, pg: str = "0") -> dict[str, Any]:
        """batch_isend_irecv: ``count`` sends and receives in a block, then its closing entry."""
        g = self.groups[pg]
        g.p2p += 1
        for i in range(count):
            peer = 1 - i % 2
            e = self._record(
                g, f"nccl:send 0->{peer}" if i % 2 else f"nccl:recv 0<-{peer}", [[n]], [[n]], "Float", p2p=True
            )
            e["untimed_forever"] = True
        closer = self._record(g, "nccl:coalesced", [], [], "Float", p2p=True, bump_op=False)
        g.last_enqueued = g.p2p
        return closer

    def complete(self, *, duration_ms: float = 0.05, timed: bool = True, upto: int | None = None) -> None:
        """The GPU finished and the watchdog retired every entry (up to record ``upto``)."""
        for e in self.entries:
            if (upto is not None and e["record_id"] > upto) or e.get("untimed_forever") or e["state"] == "completed":
                continue
            e["state"] = "completed"
            e["retired"] = True
            e["time_discovered_started_ns"] = e["time_discovered_completed_ns"] = self.clock_ns
            if timed:
                e["duration_ms"] = duration_ms

    # ------------------------------------------------------------------ what torch dumps

    def dump(self) -> dict[str, Any]:
        """``_dump_nccl_trace`` unpickled: the ring, oldest first."""
        entries = [{k: v for k, v in e.items() if k != "untimed_forever"} for e in self.entries]
        for e in entries:
            e["process_group"] = tuple(e["process_group"])  # pickle keeps torch's tuple
        return {
            "version": "2.10",
            "pg_config": {
                g.name: {"name": g.name, "desc": g.desc, "ranks": str(list(range(g.ranks)))}
                for g in self.groups.values()
            },
            "comm_lib_version": "2.28.9",
            "pg_status": self._status(str_values=False),
            "entries": entries,
        }

    def status(self) -> dict[str, Any]:
        """``_dump_nccl_trace_json(includeCollectives=False)`` decoded: no entries, counts as strings."""
        return json.loads(json.dumps({"version": "2.10", "pg_status": self._status(str_values=True)}))

    # ------------------------------------------------------------------ internals

    def _status(self, str_values: bool) -> dict[str, Any]:
        def v(n: int) -> Any:
            return str(n) if str_values else n

        return {
            str(g.pg_id): {
                "last_enqueued_collective": v(g.last_enqueued),
                "last_started_collective": v(g.last_enqueued),
                "last_completed_collective": v(g.last_enqueued),
            }
            for g in self.made
        }

    def _record(
        self, g: _Group, name: str, inputs: list[list[int]], outputs: list[list[int]], dtype: str, *, p2p: bool,
        bump_op: bool = True,
    ) -> dict[str, Any]:  # fmt: skip
        if bump_op:
            g.op_id += 1
        self.clock_ns += 1000
        e: dict[str, Any] = {
            "record_id": self.next_id,
            "pg_id": g.pg_id,
            "process_group": [g.name, g.desc],
            "thread_name": "python3",
            "thread_id": "139955297296704",
            "collective_seq_id": g.seq,
            "p2p_seq_id": g.p2p,
            "op_id": g.op_id,
            "profiling_name": name,
            "time_created_ns": self.clock_ns,
            "input_sizes": inputs,
            "input_dtypes": [dtype] * len(inputs),
            "output_sizes": outputs,
            "output_dtypes": [dtype] * len(outputs),
            "state": "scheduled",
            "time_discovered_started_ns": None,
            "time_discovered_completed_ns": None,
            "retired": False,
            "timeout_ms": 600000,
            "is_p2p": p2p,
        }
        self.next_id += 1
        self.entries.append(e)
        return e
