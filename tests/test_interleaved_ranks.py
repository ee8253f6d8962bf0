"""A job whose collectives come from two threads (the training loop on the world group, a saver
thread on a world-sized group of its own) orders them differently on each rank: a rank's k-th
collective is then not the others' k-th, and comparing ranks by iteration compares a 1 ms
all_reduce with a 0.1 ms one (the "worst arrival skew" was the gap between two different
collectives). The run model sees it (two ranks' records of one iteration in different streams)
and compares ranks only per stream, where every rank of a group issues the same order.

The job here is synthetic (real protocol objects; the orders are chosen, so the test knows
which collective each record is); tests/test_job_streams_recorded.py runs the real threaded job.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
from job_synth import STEP_NS, T0, job_hello

from tui.model.history import HistoryMatrix
from tui.model.run_model import RunModel
from tui.model.skew import clock_offsets, stream_places
from tui.model.streams import UNNAMED, record_shapes
from workers.wire import protocol as p

GROUPS = (("0", "default_pg", 2), ("1", "saver", 2))
#: (group code, op, nbytes, base duration in us) of the loop's and the saver's collective.
LOOP = (0, "all_reduce", 4096, 1000.0)
SAVER = (1, "all_reduce", 1024, 100.0)


def saver_first(rank: int, step: int, same_from: int) -> bool:
    """Rank 0 always issues the loop's collective first; rank 1 lets the saver go first on two
    steps of three before step ``same_from``."""
    return step < same_from and rank == 1 and step % 3 != 0


def threaded_run(steps: int = 300, *, same_from: int = 1 << 30, slow_rank: int = 1, clock_ms: float = 0.0) -> list[Any]:
    """Hellos, then per rank one collective batch per 50 steps, then Byes. Every collective of a
    group ends at the same instant on both ranks (rank 1's host clock ``clock_ms`` ahead);
    ``slow_rank`` arrives last at each, so it waits least."""
    hosts = ("node0", "node1") if clock_ms else ("node0", "node0")
    out: list[Any] = [
        dataclasses.replace(job_hello(r, 2, T0), groups=GROUPS, host=hosts[r], local_rank=0) for r in range(2)
    ]
    for lo in range(0, steps, 50):
        for r in range(2):
            rows: list[tuple[int, int, str, int, int, float]] = []  # iteration, group, op, nbytes, start, dur
            for s in range(lo, lo + 50):
                pair = (SAVER, LOOP) if saver_first(r, s, same_from) else (LOOP, SAVER)
                for group, op, nbytes, base in pair:
                    end = T0 + s * STEP_NS + (2_000_000 if group == 0 else 3_000_000)
                    dur = base * (0.5 if r == slow_rank else 1.0)
                    start = end - int(dur * 1e3) + (int(clock_ms * 1e6) if r == 1 else 0)
                    rows.append((s * 2 + len(rows) % 2, group, op, nbytes, start, dur))
            n = len(rows)
            cols = {
                "iteration": np.array([x[0] for x in rows], np.int64),
                "step": np.repeat(np.arange(lo, lo + 50), 2).astype(np.int64),
                "epoch": np.zeros(n, np.int32),
                "mode": np.zeros(n, np.uint8),
                "op": np.array([p.OP_NAMES.index(x[2]) for x in rows], np.uint8),
                "group": np.array([x[1] for x in rows], np.uint16),
                "dtype": np.full(n, p.DTYPE_INDEX["float32"], np.uint8),
                "nbytes": np.array([x[3] for x in rows], np.int64),
                "host_ns": np.array([x[4] for x in rows], np.int64),
                "start_ns": np.array([x[4] for x in rows], np.int64),
                "dur_us": np.array([x[5] for x in rows], np.float32),
                "algbw": np.ones(n, np.float32),
                "busbw": np.ones(n, np.float32),
            }
            out.append(p.Batch(p.COLL, r, lo // 50, 0, cols, t_ns=T0 + (lo + 50) * STEP_NS))
    end = T0 + (steps + 1) * STEP_NS
    out += [p.Bye(r, 0, "done", end) for r in range(2)]
    return out


def fed(messages: list[Any], now: int) -> RunModel:
    model = RunModel(clock=lambda: now)
    for m in messages:
        model.apply(m, now)
    return model


END = T0 + 301 * STEP_NS


def test_ranks_that_order_their_collectives_differently_are_not_compared_by_iteration() -> None:
    model = fed(threaded_run(), END)
    snap = model.snapshot(fresh_run_stats=True)
    assert model.streams.ranks_aligned(2)  # both groups span the world: the streams alone allow it
    assert model.interleaved and not model.ranks_aligned(2)
    assert snap.worst_skew is None and snap.recent_skew is None and snap.straggler is None
    assert all(np.isnan(v.straggler_share) for v in snap.ranks)


def test_the_same_order_on_every_rank_keeps_the_comparison_by_iteration() -> None:
    """Two groups and two streams, one order: the k-th collectives are the same, and the rank
    that arrives last everywhere is the straggler."""
    model = fed(threaded_run(same_from=0), END)
    snap = model.snapshot(fresh_run_stats=True)
    assert not model.interleaved and model.ranks_aligned(2)
    assert snap.straggler == 1
    assert snap.worst_skew is not None and snap.worst_skew.rank == 1


@pytest.mark.parametrize("group", [0, 1])
def test_one_stream_drawn_compares_its_collectives_across_ranks(group: int) -> None:
    """Drawing a stream (f) compares each rank's k-th record of it: the same collective (one
    group, one order on every rank), so its straggler and skew are exact: rank 1 arrives
    last, late by half the collective's duration."""
    model = fed(threaded_run(), END)
    model.snapshot(fresh_run_stats=True)
    value = next(s.index for s in model.streams.views(1.0) if s.group == GROUPS[group][0])
    model.select_stream(value)
    snap = model.snapshot(fresh_run_stats=True)
    assert snap.straggler == 1
    base = (LOOP, SAVER)[group][3]
    assert snap.worst_skew is not None
    assert snap.worst_skew.skew_ms == pytest.approx(base / 2 / 1e3)


def test_interleaving_seen_once_holds_for_the_run() -> None:
    """The histories that showed it scroll away (here: after 100 steps both ranks keep one
    order for 2900 more, and the history is rebuilt from the rings when its rows change); the
    ranks stay incomparable by iteration."""
    items = threaded_run(3000, same_from=100)
    model = fed(items[:6], END)  # the hellos and the first two batches of each rank
    model.snapshot()
    assert model.interleaved
    for m in items[6:]:
        model.apply(m, END)
        model.snapshot()
    assert model.history_matrix([0]).interleaved == 0  # other rows: rebuilt, nothing to compare
    assert model.history_matrix([0, 1]).interleaved == 0  # rebuilt from the newest records only
    assert not model.ranks_aligned(2)
    model.reset()
    assert not model.interleaved  # a new run (a replay seeking back) starts without it


def test_the_history_compares_each_columns_shape_and_named_stream_added_one_by_one_or_queued() -> None:
    for queued in (False, True):
        m = HistoryMatrix([0, 1], width=8)

        def put(
            row: int, its: list[int], streams: list[int], shapes: list[int], m: HistoryMatrix = m, queued: bool = queued
        ) -> None:
            cols = {
                "iteration": np.array(its, np.int64),
                "dur_us": np.ones(len(its), np.float32),
                "mode": np.zeros(len(its), np.uint8),
                "start_ns": np.ones(len(its), np.int64),
                "stream": np.array(streams, np.uint8),
                "shape": np.array(shapes, np.int64),
            }
            if queued:
                m.queue(row, cols, its[0], its[-1])
            else:
                m.add(row, cols)

        put(0, [0, 1, 2], [3, 4, 3], [70, 80, 70])
        put(1, [0, 1, 2], [3, 4, UNNAMED], [70, 80, 70])  # a group rank 1 has not named yet: its shape
        m.window()
        assert m.interleaved == 0
        put(1, [3, 4], [4, 3], [80, 70])  # another shape
        put(0, [3, 4], [3, 4], [70, 80])
        m.window()
        assert m.interleaved == 2
        put(1, [5, 6], [UNNAMED, 6], [90, 90])  # one shape, two groups: the named streams differ
        put(0, [5, 6], [UNNAMED, 7], [90, 90])
        m.window()
        assert m.interleaved == 3
        put(0, [12, 13], [5, 5], [70, 70])  # the columns of iterations 4 and 5 are reused: fresh again
        put(1, [12, 13], [5, 5], [70, 70])
        m.window()
        assert m.interleaved == 3


def test_a_records_place_in_its_stream_names_the_same_collective_on_every_rank() -> None:
    """Rank 0: L S L L S; rank 1: S L L S L (L, S: two streams), 3 L and 2 S seen before."""
    counts = np.zeros(256, np.int64)
    counts[[1, 2]] = (6, 4)  # the ranks' records per stream so far, these included
    r0 = stream_places(np.array([1, 2, 1, 1, 2], np.uint8), counts)
    r1 = stream_places(np.array([2, 1, 1, 2, 1], np.uint8), counts)
    assert sorted(r0.tolist()) == sorted(r1.tolist())
    assert r0.tolist() == [1 << 40 | 3, 2 << 40 | 2, 1 << 40 | 4, 1 << 40 | 5, 2 << 40 | 3]
    assert stream_places(np.array([UNNAMED, 1], np.uint8), counts).tolist() == [-1, 1 << 40 | 5]


def test_clock_offsets_between_hosts_match_collectives_by_their_place_in_a_stream() -> None:
    model = fed(threaded_run(clock_ms=5.0), END)
    model.snapshot(fresh_run_stats=True)
    ref, offsets = clock_offsets([0, 1], model.ranks, by_stream=True)
    assert ref == "node0"
    assert offsets["node1"] == pytest.approx(5.0, abs=1e-3)
    assert model.snapshot(fresh_run_stats=True).clock_offsets_ms["node1"] == pytest.approx(5.0, abs=1e-3)


def test_the_summary_and_the_header_say_why_no_rank_is_compared() -> None:
    from tui.run.headless import format_summary
    from tui.view.widgets.header import job_streams_text

    model = fed(threaded_run(), END)
    snap = model.snapshot(fresh_run_stats=True)
    assert "not compared across ranks: they issue their collectives in different orders" in format_summary(snap)
    assert job_streams_text(snap).endswith("ranks differ in order: skew per stream (f)")
    model.select_stream(next(s.index for s in snap.streams if s.group == "0"))
    assert "differ in order" not in job_streams_text(model.snapshot(fresh_run_stats=True))  # a stream drawn
    same = fed(threaded_run(same_from=0), END).snapshot(fresh_run_stats=True)
    assert "different orders" not in format_summary(same) and "differ in order" not in job_streams_text(same)


def test_a_job_with_subgroups_is_not_said_to_interleave() -> None:
    """Ranks 0-1 and 2-3 issue their own pair group's all_to_all at the same place (job_synth):
    their k-th collectives differ too, but the streams already say why no rank is compared
    across groups, and the summary does not blame threads."""
    from job_synth import job_run

    from tui.run.headless import format_summary

    model = RunModel(clock=lambda: T0)
    for _, m in job_run(world=4, steps=60):
        model.apply(m, T0)
        model.snapshot()
    snap = model.snapshot(fresh_run_stats=True)
    assert model.interleaved and not model.streams.ranks_aligned(4)
    assert not snap.interleaved and "different orders" not in format_summary(snap)


def test_ranks_restarted_by_torchrun_number_their_collectives_again_without_seeming_interleaved() -> None:
    """torchrun --max-restarts: both ranks start again from iteration 0 (a job of 30 all_reduces
    and a barrier, then 20 and a barrier). The new run's records land in columns that hold the
    old run's (an all_reduce where the new run has its barrier): not a difference in order."""
    model = RunModel(clock=lambda: END)
    hellos = [dataclasses.replace(job_hello(r, 2, T0), groups=GROUPS[:1]) for r in range(2)]
    for h in hellos:
        model.apply(h, END)

    def attempt(n: int, rank: int, seq: int) -> p.Batch:
        ops = ["all_reduce"] * n + ["barrier"]
        k = len(ops)
        cols = {
            "iteration": np.arange(k, dtype=np.int64),
            "step": np.zeros(k, np.int64),
            "epoch": np.zeros(k, np.int32),
            "mode": np.zeros(k, np.uint8),
            "op": np.array([p.OP_NAMES.index(o) for o in ops], np.uint8),
            "group": np.zeros(k, np.uint16),
            "dtype": np.array([p.DTYPE_INDEX["float32"]] * n + [0], np.uint8),
            "nbytes": np.array([1024] * n + [0], np.int64),
            "host_ns": T0 + np.arange(k, dtype=np.int64),
            "start_ns": T0 + np.arange(k, dtype=np.int64),
            "dur_us": np.full(k, 100.0, np.float32),
            "algbw": np.ones(k, np.float32),
            "busbw": np.ones(k, np.float32),
        }
        return p.Batch(p.COLL, rank, seq, 0, cols, t_ns=T0 + seq)

    for rank, seq, n in ((1, 0, 30), (0, 0, 30), (0, 1, 20), (1, 1, 20)):
        model.apply(attempt(n, rank, seq), END)
        model.snapshot()
    assert not model.interleaved and model.ranks_aligned(2)
    rebuilt = model.history_matrix([1, 0])  # other rows: rebuilt from the rings, which hold both runs
    assert rebuilt.interleaved == 0


def test_skews_read_before_the_ranks_were_seen_to_differ_are_dropped() -> None:
    """Two threads' collectives of one shape on two groups, before the ranks' Hellos name the
    saver's group: nothing tells the columns apart yet, and a skew is read across different
    collectives. Once the groups are named the streams differ: that skew is not kept."""
    model = RunModel(clock=lambda: END)
    for r in range(2):
        model.apply(dataclasses.replace(job_hello(r, 2, T0), groups=GROUPS[:1]), END)  # "1:saver" not named
    same = (1, "all_reduce", 4096, 100.0)  # the saver's collective has the loop's shape
    items = [m for m in threaded_run() if isinstance(m, p.Batch)]
    for m in items[:4]:
        cols = dict(m.columns)
        cols["nbytes"] = np.full(len(m), same[2], np.int64)
        model.apply(p.Batch(p.COLL, m.rank, m.seq, 0, cols, t_ns=m.t_ns), END)
    snap = model.snapshot(fresh_run_stats=True)
    assert not model.interleaved and snap.worst_skew is not None  # compared, wrongly, by iteration
    for r in range(2):
        model.apply(dataclasses.replace(job_hello(r, 2, T0 + 1), groups=GROUPS), END)
    for m in items[4:8]:
        model.apply(m, END)
    snap = model.snapshot(fresh_run_stats=True)
    assert model.interleaved and snap.worst_skew is None and snap.recent_skew is None


def test_an_uneven_all_to_all_and_the_two_ends_of_a_send_are_one_shape_on_every_rank() -> None:
    """An MoE's all_to_all moves a different number of bytes on each rank, a pipeline's stage
    sends what the next receives: the ranks' k-th collectives are the same call, not a sign of
    several threads (QA: an MoE job lost its arrival skew to "different orders (several threads)").
    Other ops of another size still differ."""
    op = {name: p.OP_NAMES.index(name) for name in ("all_to_all", "send", "recv", "all_reduce", "gather")}

    def shapes(ops: list[str], nbytes: list[int]) -> list[int]:
        cols = {
            "op": np.array([op[o] for o in ops], np.uint8),
            "dtype": np.zeros(len(ops), np.uint8),
            "nbytes": np.array(nbytes, np.int64),
        }
        return record_shapes(cols).tolist()

    rank0 = shapes(["all_to_all", "send", "gather", "all_reduce"], [4096, 512, 64, 256])
    rank1 = shapes(["all_to_all", "recv", "gather", "all_reduce"], [6144, 1024, 128, 256])
    assert rank0 == rank1
    assert shapes(["all_reduce"], [512]) != shapes(["all_reduce"], [256])
    assert shapes(["all_to_all"], [512]) != shapes(["send"], [512])
