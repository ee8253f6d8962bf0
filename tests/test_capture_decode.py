"""Decoders of Flight Recorder dumps and CUPTI memcpy records, on real H200 captures.

Fixtures (tests/fixtures/h200/, captured by benchmarks/probes/capture_probe.py on one H200, torch
2.11.0+cu130, NCCL 2.28.9, cupti-python 13.0.1, world size 1): ``fr_dump_*.pkl`` is the
dump after a known list of collectives (see ``fixtures()`` in the probe) and two DDP steps;
``cupti_records_*.json`` the MEMCPY/CONCURRENT_KERNEL records of the same section.
"""

from __future__ import annotations

import copy
import json
import pickle
from pathlib import Path
from typing import Any

import pytest

from workers.capture.cupti_copies import FIELDS, ClockMap, CopyRecord, decode_copy
from workers.capture.flight_recorder import FrCursor, entry_nbytes, issued_by_group, load_dump, op_name, read_all
from workers.capture.fr_batch import batch_of
from workers.capture.rows import RowMaker, StepTimeline
from workers.monitor.records import MONITOR_COLL_ROW, OPS
from workers.rank.groups import GroupTable
from workers.rank.publisher import COPY_ROW
from workers.wire.protocol import DTYPE_INDEX

FIXTURES = Path(__file__).parent / "fixtures" / "h200"
FR_DUMP = FIXTURES / "fr_dump_h200_torch2.11_nccl2.28.9.pkl"
CUPTI = FIXTURES / "cupti_records_h200_cupti13.0.1.json"
MIB = 1 << 20


def decode_copies(records: list[dict[str, Any]], clock: ClockMap) -> list[CopyRecord]:
    """The fixture's records (dicts named like cupti.ActivityMemcpy6's fields) through the
    capture's decoder: DtoH/HtoD memcpys as copies, every other record skipped."""
    out = []
    for r in records:
        if r.get("kind", "MEMCPY") != "MEMCPY":
            continue
        kind, src, dst, nbytes, start, end = (int(r[f]) for f in FIELDS)
        c = decode_copy((kind, src, dst, nbytes, start, end), clock)
        if c is not None:
            out.append(c)
    return out


@pytest.fixture
def dump() -> dict:
    return load_dump(FR_DUMP.read_bytes())  # the real H200 dump loads as plain data


def test_flight_recorder_dump_decodes_to_the_collectives_the_probe_issued(dump: dict) -> None:
    rows, cursor = read_all([dump])
    # The probe issued: all_reduce(fp32 1Mi), all_reduce(bf16 4096), all_gather_into_tensor(bf16 8Mi),
    # reduce_scatter_tensor(fp32 1Mi), broadcast, all_to_all_single, async all_reduce, all_reduce on a
    # second group, barrier; then DDP: shape check all_gather, two init broadcasts, one bucket of
    # 2099200 floats in step 1, rebuilt-bucket broadcasts, two buckets of 1049600 floats in step 2.
    assert [r.op for r in rows] == [
        "all_reduce", "all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "all_reduce",
        "all_reduce", "barrier", "all_gather", "broadcast", "broadcast", "all_reduce", "broadcast",
        "broadcast", "all_reduce", "all_reduce",
    ]  # fmt: skip
    assert [r.nbytes for r in rows[:9]] == [4 * MIB, 8192, 16 * MIB, 4 * MIB, 4 * MIB, 4 * MIB, 4 * MIB, 4 * MIB, 0]
    assert rows[12].nbytes == 2099200 * 4 and rows[15].nbytes == rows[16].nbytes == 1049600 * 4
    assert [r.pg for r in rows].count("1") == 1 and rows[7].pg == "1" and rows[7].desc == "undefined"
    assert {r.desc for i, r in enumerate(rows) if i != 7} == {"default_pg"}
    assert [r.dtype for r in rows[:3]] == [DTYPE_INDEX["float32"], DTYPE_INDEX["bfloat16"], DTYPE_INDEX["bfloat16"]]
    assert rows[9].dtype == DTYPE_INDEX["int64"] and rows[13].dtype == DTYPE_INDEX["int32"]
    assert all(r.ranks == 1 and r.dur_us > 0 and r.host_ns > 1.7e18 for r in rows)
    assert rows[2].dur_us == pytest.approx(69.34, abs=0.01)  # the 16 MiB all_gather, CUDA events on NCCL's stream
    assert [r.host_ns for r in rows] == sorted(r.host_ns for r in rows)
    assert (cursor.lost, cursor.untimed, cursor.p2p, cursor.floor) == (0, 0, 0, 16)


@pytest.mark.parametrize("root", [True, False])
def test_gather_and_scatter_count_every_ranks_tensor_as_nccl_tests_do(dump: dict, root: bool) -> None:
    """gather_perf and scatter_perf count S = a rank's count x nranks. The entries as torch 2.13's
    gloo ring holds them (tests/jobs/two_groups.py's shapes): a gather's input is the rank's
    tensor and its output only the root's list; a scatter's input is the root's list and
    nothing elsewhere, its output the rank's piece. Every rank gets the same S (one stream)."""
    d = copy.deepcopy(dump)
    d["pg_config"]["0"]["ranks"] = "[0, 1]"
    gather, scatter = d["entries"][0], d["entries"][1]
    gather.update(
        profiling_name="nccl:gather",
        input_sizes=[[1000]],
        input_dtypes=["Float"],
        output_sizes=[[2, 1000]] if root else [],
        output_dtypes=["Float"] if root else [],
    )
    scatter.update(
        profiling_name="nccl:scatter",
        input_sizes=[[2, 1000]] if root else [],
        input_dtypes=["Float"] if root else [],
        output_sizes=[[1000]],
        output_dtypes=["Float"],
    )
    rows, _ = read_all([d])
    assert [(r.op, r.nbytes, r.ranks, r.dtype) for r in rows[:2]] == [
        ("gather", 8000, 2, DTYPE_INDEX["float32"]),
        ("scatter", 8000, 2, DTYPE_INDEX["float32"]),
    ]
    assert entry_nbytes("gather", gather, 2) == entry_nbytes("scatter", scatter, 2) == 8000


def test_cursor_returns_each_entry_once_and_waits_for_unfinished_ones(dump: dict) -> None:
    early = copy.deepcopy(dump)
    for e in early["entries"][10:]:
        e["state"] = "started"  # as a dump taken while they ran would show them
        e["retired"] = False
        e.pop("duration_ms")
    early["entries"][12]["state"] = "completed"  # finished out of order (another group)
    early["entries"][12]["duration_ms"] = dump["entries"][12]["duration_ms"]
    early["entries"][12]["retired"] = True
    early["entries"][11]["state"] = "completed"  # finished, not yet retired by the watchdog: no duration yet
    early["entries"][11]["retired"] = False
    cursor = FrCursor()
    first = cursor.read(early)
    assert [r.record_id for r in first] == [*range(10), 12]
    assert cursor.floor == 9 and cursor.pending == 6
    second = cursor.read(dump)
    assert [r.record_id for r in second] == [10, 11, 13, 14, 15, 16]
    assert cursor.read(dump) == []
    assert cursor.floor == 16 and cursor.lost == 0 and cursor.untimed == 0 and cursor.pending == 0


def test_entries_the_ring_overwrote_unread_are_counted_lost(dump: dict) -> None:
    cursor = FrCursor()
    head = copy.deepcopy(dump)
    head["entries"] = head["entries"][:4]
    assert len(cursor.read(head)) == 4
    wrapped = copy.deepcopy(dump)
    wrapped["entries"] = wrapped["entries"][9:]  # ids 4..8 fell out of the ring before this dump
    assert [r.record_id for r in cursor.read(wrapped)] == list(range(9, 17))
    assert cursor.overwritten == 4  # seqs 5-8 of the default group: its oldest entry left is seq 9
    # Group "1"'s one collective (id 7) left with them, unseen: torch's own count says it was issued.
    assert cursor.finish(issued_by_group(dump)) == 1 and cursor.lost == 5


def test_untimed_and_point_to_point_entries_are_counted_not_emitted(dump: dict) -> None:
    d = copy.deepcopy(dump)
    d["entries"][0].pop("duration_ms")
    d["entries"][1]["profiling_name"] = "nccl:send 0->1"
    d["entries"][1]["is_p2p"] = True
    rows, cursor = read_all([d])
    assert len(rows) == 15 and cursor.untimed == 1 and cursor.p2p == 1 and cursor.floor == 16
    assert cursor.lost == 1  # the untimed one; a send is no collective (never lost)


def test_op_names_map_to_commtop_ops() -> None:
    assert op_name("nccl:_all_gather_base") == "all_gather"
    assert op_name("nccl:_reduce_scatter_base") == "reduce_scatter"
    assert op_name("nccl:all_reduce_barrier") == "barrier"
    assert op_name("gloo:all_reduce") == "all_reduce"
    assert op_name("nccl:send") is None
    assert entry_nbytes("all_gather", {"output_sizes": [[4, 2]], "output_dtypes": ["Half"]}) == 16
    assert all(op in OPS for op in ("all_gather", "reduce_scatter", "barrier", "all_to_all"))


def test_cupti_memcpy_records_decode_to_copies_with_direction_memory_and_rate() -> None:
    data = json.loads(CUPTI.read_text())
    clock = ClockMap.from_pairs(data["clock_pairs"])
    copies = decode_copies(data["records"], clock)
    # The probe's side-stream copies: 32 MiB D2H then H2D, pinned, then a 4 MiB pageable D2H.
    big = [c for c in copies if c.nbytes >= 4 * MIB]
    assert [(c.direction, c.pinned, c.nbytes) for c in big[:3]] == [
        ("d2h", True, 32 * MIB),
        ("h2d", True, 32 * MIB),
        ("d2h", False, 4 * MIB),
    ]
    assert 50 < big[0].gbps < 60  # PCIe Gen5 x16 pinned D2H on the H200 (55 GB/s in FACTS.md)
    assert big[2].gbps < 10  # pageable: staged through a bounce buffer
    # DtoD memcpys (the world-size-1 NCCL all_gather, DDP's bucket copies) and kernels are not copies.
    n_memcpy = sum(1 for r in data["records"] if r["kind"] == "MEMCPY")
    n_d2d = sum(1 for r in data["records"] if r["kind"] == "MEMCPY" and r["copy_kind"] == 8)
    assert len(copies) == n_memcpy - n_d2d
    # Start times land on time.time_ns(): within the capture's clock pairs.
    lo, hi = (p["time_ns"] for p in data["clock_pairs"])
    assert all(lo <= c.start_ns <= hi for c in copies)


def test_rows_take_their_step_from_the_timeline_and_fit_the_batch_dtypes(dump: dict) -> None:
    rows, _ = read_all([dump])
    timeline = StepTimeline()
    timeline.mark(rows[9].host_ns, 0)  # DDP's first collective starts step 0
    timeline.mark(rows[13].host_ns, 1)
    groups = GroupTable()
    groups.world(("0", "default_pg", 1))
    maker = RowMaker(timeline, groups)
    arr = maker.coll_array(batch_of(rows, FrCursor(), len(dump["entries"])), epoch=0, mode=0)
    assert arr.dtype == MONITOR_COLL_ROW
    assert arr["step"].tolist() == [-1] * 9 + [0] * 4 + [1] * 4
    assert arr["iteration"].tolist() == list(range(17))
    assert [timeline.step_at(r.host_ns) for r in rows] == arr["step"].tolist()
    import numpy as np

    assert arr["op"][2] == OPS.index("all_gather") and arr["nbytes"][2] == 16 * MIB
    assert arr["group"].tolist() == [0] * 7 + [1] + [0] * 9 and groups.table[1] == ("1", "undefined", 1)
    assert arr["dtype"][1] == DTYPE_INDEX["bfloat16"]
    data = json.loads(CUPTI.read_text())
    copies = decode_copies(data["records"], ClockMap.from_pairs(data["clock_pairs"]))
    carr = np.array([maker.copy_row(c, epoch=0) for c in copies], dtype=COPY_ROW)
    assert carr["nbytes"][0] == 32 * MIB and carr["pinned"][0] == 1 and carr["direction"][1] == 1


def test_a_dump_that_names_a_class_or_function_is_refused() -> None:
    import os

    with pytest.raises(pickle.UnpicklingError):
        load_dump(pickle.dumps({"entries": [os.getcwd]}))
    with pytest.raises(pickle.UnpicklingError):
        load_dump(pickle.dumps([1, 2]))
