"""Streams, steps and lost collectives in the run model, against what a synthetic job issued."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from job_synth import COPY_BYTES, STEP_NS, T0, expected_counts, job_hello, job_run

from tui.model.job import JobInfo
from tui.model.rank_state import RankState
from tui.model.run_model import RunModel
from tui.model.stats import RunAggregate
from tui.model.streams import OTHER, UNNAMED, StreamTable, dtype_name, group_label
from workers.wire import protocol as p
from workers.wire.stats import percentiles


def fed(messages, clock_ns: int | None = None) -> RunModel:
    model = RunModel(clock=lambda: clock_ns or T0)
    for _, m in messages:
        model.apply(m)
    return model


def batches(messages, rank: int | None = None) -> list[p.Batch]:
    return [m for _, m in messages if isinstance(m, p.Batch) and m.kind == p.COLL and rank in (None, m.rank)]


def test_streams_are_named_by_group_not_by_a_ranks_code() -> None:
    items = list(job_run(world=4, steps=60))
    snap = fed(items).snapshot(fresh_run_stats=True)
    got = {(s.group, s.op, s.dtype, s.nbytes): s.count for s in snap.streams}
    assert got == dict(expected_counts(4, 60))
    pair = next(s for s in snap.streams if s.group == "1")
    assert (pair.ranks, pair.group_size, pair.group_text) == (2, 2, "1")  # rank 1 named it code 2, rank 0 code 1
    assert next(s for s in snap.streams if s.group == "2").group_text == "2:pair"
    assert next(s for s in snap.streams if s.op == "broadcast").group_text == "0:default_pg"


def test_stream_numbers_match_numpy_on_its_records() -> None:
    items = list(job_run(world=4, steps=60))
    snap = fed(items).snapshot(fresh_run_stats=True)
    cols = {k: np.concatenate([b.columns[k] for b in batches(items)]) for k in ("op", "nbytes", "dur_us", "busbw")}
    big = (cols["nbytes"] == 4_194_304) & (cols["op"] == p.OP_NAMES.index("all_reduce"))
    view = next(s for s in snap.streams if s.nbytes == 4_194_304)
    p50, p99 = percentiles(cols["dur_us"][big], (50, 99))
    assert (view.p50_ms, view.p99_ms) == (pytest.approx(p50 / 1e3), pytest.approx(p99 / 1e3))
    dur = cols["dur_us"][big].astype(np.float64)
    assert view.busbw_gbps == pytest.approx(float(np.dot(cols["busbw"][big], dur) / dur.sum()), rel=1e-9)
    # the share: time in the stream over the ranks' time (first start to last end, summed)
    model = fed(items)
    rank_time = sum(s.time_ns for s in model.ranks.values())
    assert view.share == pytest.approx(dur.sum() * 1e3 / rank_time, rel=1e-6)
    assert 0 < sum(s.share for s in snap.streams) < 1


def test_a_fold_of_one_stream_equals_the_sorted_fold_of_mixed_batches() -> None:
    """Folds of single-stream batches take a short path (no sort); a mixed batch in the same fold
    takes the sorted one. Both give the stream the same records in the same order."""
    rng = np.random.default_rng(5)
    hello = job_hello(0, 1, T0)
    ar, ag = p.OP_NAMES.index("all_reduce"), p.OP_NAMES.index("all_gather")

    def cols(n: int, ops: np.ndarray) -> dict[str, np.ndarray]:
        return {
            "op": ops.astype(np.uint8),
            "group": np.zeros(n, np.uint16),
            "dtype": np.zeros(n, np.uint8),
            "nbytes": np.full(n, 1024, np.int64),
            "dur_us": rng.lognormal(4, 1, n).astype(np.float32),
            "busbw": rng.random(n).astype(np.float32),
        }

    batches = [cols(500, np.full(500, ar)) for _ in range(20)]
    both = cols(8, np.array([ar, ag] * 4))
    only = {k: v[both["op"] == ar] for k, v in both.items()}  # the same all_reduce records alone
    views = []
    for middle in (only, both):
        table = StreamTable()
        for c in [*batches[:10], middle, *batches[10:]]:
            table.add(0, hello, c)
        views.append({v.op: v for v in table.views(1e12)})
    assert views[0]["all_reduce"] == views[1]["all_reduce"] and views[0]["all_reduce"].count == 10_004
    assert set(views[0]) == {"all_reduce"} and views[1]["all_gather"].count == 4


def test_records_of_a_group_not_yet_named_join_their_stream_when_a_hello_names_it() -> None:
    items = list(job_run(world=2, steps=20))
    model = RunModel(clock=lambda: T0)
    # the first Hellos name no groups: rank 1's code 2 cannot be named yet (code 0 is the world)
    for _, m in items:
        if isinstance(m, p.Hello) and m.t_ns == T0:
            model.apply(job_hello(m.rank, 2, T0, groups=False))
    first = [m for _, m in items if isinstance(m, p.Batch)][:4]
    for m in first:
        model.apply(m)
    waiting = model.snapshot(fresh_run_stats=True).streams
    assert any(s.index == UNNAMED and s.group.startswith("?") for s in waiting)
    assert model.ranks[1].stream_counts[UNNAMED] > 0
    for _, m in items:
        if not (isinstance(m, p.Batch) and any(m is b for b in first)):
            model.apply(m)
    snap = model.snapshot(fresh_run_stats=True)
    assert all(s.index != UNNAMED for s in snap.streams)
    assert {(s.group, s.op, s.dtype, s.nbytes): s.count for s in snap.streams} == dict(expected_counts(2, 20))
    assert model.ranks[1].stream_counts[UNNAMED] == 0


def test_streams_past_the_limit_pool_in_other() -> None:
    table = StreamTable(limit=3)
    hello = job_hello(0, 1, T0)
    n = 10
    cols = {
        "op": np.ones(n, np.uint8),
        "group": np.zeros(n, "<u2"),
        "dtype": np.ones(n, "u1"),
        "nbytes": np.arange(n, dtype=np.int64) * 8 + 8,  # 10 sizes
        "dur_us": np.full(n, 10.0, np.float32),
        "busbw": np.ones(n, np.float32),
    }
    values, single = table.add(0, hello, cols)
    assert single == -1 and values.tolist() == [0, 1, 2] + [OTHER] * 7
    views = table.views(1e9)
    assert [v.op for v in views] == ["all_reduce"] * 3 + ["other"] and views[-1].count == 7
    assert table.count == 3


def test_lost_collectives_count_as_missing_per_rank_and_in_all() -> None:
    items = list(job_run(world=2, steps=20, lost={1: 7}))
    snap = fed(items).snapshot(fresh_run_stats=True)
    assert [(r.missing, r.lost, r.drops) for r in snap.ranks] == [(0, 0, 0), (7, 7, 0)]
    assert (snap.missing, snap.lost) == (7, 7)


def test_step_view_from_the_step_column() -> None:
    steps = 60
    items = list(job_run(world=2, steps=steps, copies=2))
    snap = fed(items).snapshot(fresh_run_stats=True)
    v = snap.steps
    assert v.steps == 2 * steps and v.has_steps
    assert v.steps_per_s == pytest.approx(1e9 / STEP_NS)  # every step starts STEP_NS after the last
    assert v.step.p50_ms == pytest.approx(STEP_NS / 1e6) and v.step.count == 2 * (steps - 1)
    # per step whose length is known: a rank's last step is still open (nothing after it)
    cols = [b.columns for b in batches(items)]
    closed = sum(float(c["dur_us"][c["step"] < steps - 1].astype(np.float64).sum()) for c in cols)
    assert v.coll_ms_per_step == pytest.approx(closed / 1e3 / (2 * (steps - 1)))
    (c,) = v.copies
    assert (c.direction, c.pinned, c.per_step, c.bytes_per_step) == ("d2h", True, 2.0, 2.0 * COPY_BYTES)
    assert c.gbps == pytest.approx(COPY_BYTES / 350.0 / 1e3)
    assert snap.step_rate == pytest.approx(1e9 / STEP_NS)


class _OwnStepTimesModel(RunModel):
    """Test double: a run model whose ranks keep their own step-time aggregates, which the step
    view merges (what every model did before they shared one)."""

    def _rank(self, rank: int) -> RankState:
        state = self.ranks.get(rank)
        if state is None:
            state = self.ranks[rank] = RankState(rank)
        return state


@pytest.mark.parametrize(("world", "steps"), [(4, 60), (2, 8300)])  # 8300: past the exact values' cap
def test_the_step_view_of_one_shared_aggregate_is_that_of_every_ranks_merged(world: int, steps: int) -> None:
    """The run model's ranks put their step times into one aggregate, which the step view reads
    as it is: the same step view as merging an aggregate per rank (the mean to rounding), with
    exact percentiles and past RunAggregate.EXACT_CAP from the histogram alike."""
    items = list(job_run(world=world, steps=steps, copies=1))
    shared = fed(items)
    own = _OwnStepTimesModel(clock=lambda: T0)
    for _, m in items:
        own.apply(m)
    assert shared.ranks[0].steps.times is shared.ranks[1].steps.times  # one aggregate
    assert own.ranks[0].steps.times is not own.ranks[1].steps.times
    a, b = (m.snapshot(fresh_run_stats=True).steps for m in (shared, own))
    assert a.step.count == b.step.count == world * (steps - 1)
    assert a.step.exact == b.step.exact == (world * (steps - 1) <= RunAggregate.EXACT_CAP)
    assert (a.step.p50_ms, a.step.p99_ms, a.step.min_ms, a.step.max_ms) == (
        b.step.p50_ms,
        b.step.p99_ms,
        b.step.min_ms,
        b.step.max_ms,
    )
    assert a.step.mean_ms == pytest.approx(b.step.mean_ms, rel=1e-12)
    assert (a.steps, a.steps_per_s, a.coll_ms_per_step, a.copies) == (
        b.steps,
        b.steps_per_s,
        b.coll_ms_per_step,
        b.copies,
    )


def test_steps_and_streams_catch_up_when_the_model_clock_stands_still() -> None:
    """An ended or paused replay: the model's clock stops, the last records arrive at that same
    instant. The step line and the stream table must show them once the refresh interval has
    passed on the wall clock (they stayed at the earlier numbers for ever: a CI failure)."""
    items = list(job_run(world=2, steps=40, copies=2))
    half = len(items) // 2
    wall = [0.0]
    model = RunModel(clock=lambda: T0)
    model._builder.wall = lambda: wall[0]  # the one clock that moves here
    for _, m in items[:half]:
        model.apply(m)
    early = model.snapshot()
    for _, m in items[half:]:
        model.apply(m)
    assert model.snapshot().steps == early.steps  # within the interval on both clocks: reused
    wall[0] += 1.5
    late = model.snapshot()
    whole = fed(items).snapshot(fresh_run_stats=True)
    assert late.steps.steps == whole.steps.steps == 2 * 40 > early.steps.steps
    assert [s.count for s in late.streams] == [s.count for s in whole.streams]
    assert sum(s.count for s in late.streams) > sum(s.count for s in early.streams)


def test_a_step_gap_is_no_long_step() -> None:
    items = [
        (t, m) for t, m in job_run(world=1, steps=30, steps_per_batch=1) if not (isinstance(m, p.Batch) and m.seq == 10)
    ]
    v = fed(items).snapshot(fresh_run_stats=True).steps
    assert v.step.max_ms == pytest.approx(STEP_NS / 1e6)  # 9 -> 11 is not one step of 9 ms
    assert v.step.count == 30 - 1 - 2


def test_selecting_a_stream_draws_only_its_latency_aligned_across_ranks() -> None:
    items = list(job_run(world=4, steps=40))
    model = fed(items)
    snap = model.snapshot()
    assert snap.history.ms.shape[1] == max(
        len(np.concatenate([b.columns["iteration"] for b in batches(items, r)])) for r in range(4)
    )
    pair = next(s for s in snap.streams if s.group == "2")  # ranks 2 and 3 only
    model.select_stream(pair.index)
    snap = model.snapshot()
    assert snap.selected is not None and snap.selected.group == "2"
    ms = snap.history.ms
    assert ms.shape == (4, 40)  # one column per all_to_all of the pair group
    assert np.isnan(ms[:2]).all() and not np.isnan(ms[2:]).any()
    want = [
        np.concatenate(
            [b.columns["dur_us"][(b.columns["op"] == p.OP_NAMES.index("all_to_all"))] for b in batches(items, r)]
        )
        for r in (2, 3)
    ]
    assert np.allclose(ms[2:], np.array(want) / 1e3)
    # new records of the stream land in the same columns as batches arrive
    model.select_stream(-1)
    assert model.snapshot().selected is None


def test_skew_and_straggler_compare_one_collective_across_ranks_not_each_ranks_kth_record() -> None:
    """Ranks 0 and 1 issue group 1's collectives, ranks 2 and 3 group 2's: a rank's k-th record
    is not the others' k-th collective, so arrival skew and straggler are not read from every
    collective (the sweep's job: 'rank 1 arrived 21.8 ms late at iteration 271', comparing a
    group-2 float64 all_reduce with a group-3 int32 one). Drawing one stream (f) gives them for
    that stream's ranks: rank 2, slow at every collective, is its straggler."""
    model = fed(job_run(world=4, steps=200, slow_rank=2), clock_ns=T0 + 201 * STEP_NS)
    snap = model.snapshot(fresh_run_stats=True)
    assert not model.streams.ranks_aligned(4)
    assert snap.straggler is None and snap.worst_skew is None and snap.recent_skew is None
    pair = next(s for s in snap.streams if s.group == "2")  # ranks 2 and 3 only
    model.select_stream(pair.index)
    snap = model.snapshot(fresh_run_stats=True)
    assert snap.straggler == 2
    shares = {v.rank: v.straggler_share for v in snap.ranks}
    assert math.isnan(shares[0]) and math.isnan(shares[1]) and shares[2] > shares[3]


def test_a_skew_found_on_a_drawn_stream_is_placed_by_that_streams_call_not_an_iteration() -> None:
    """On a drawn stream (f) a skew's number counts that stream's calls: the header said "at it
    227" of what the report and its CSV call iteration 455. It says which calls it counts."""
    from tui.view.widgets.header import skew_text, worst_skew_text

    model = fed(job_run(world=4, steps=200, slow_rank=2), clock_ns=T0 + 201 * STEP_NS)
    pair = next(s for s in model.snapshot(fresh_run_stats=True).streams if s.group == "2")
    model.select_stream(pair.index)
    snap = model.snapshot(fresh_run_stats=True)
    assert snap.worst_skew is not None and snap.worst_skew.stream == pair.index
    worst = dataclasses.replace(snap.worst_skew, skew_ms=1e3, typical_ms=1.0)  # headline-worthy
    text = worst_skew_text(dataclasses.replace(snap, worst_skew=worst, recent_skew=None))
    assert f"at call {worst.iteration + 1} of all_to_all 64KiB" in text and "iteration" not in text  # from 1
    recent = skew_text(dataclasses.replace(snap, recent_skew=worst), compact=True)
    assert f"at call {worst.iteration + 1} of all_to_all" in recent


def test_a_job_whose_ranks_all_issue_the_same_collectives_keeps_its_straggler() -> None:
    """One group, every rank: the k-th record of each rank is the same collective."""
    table = StreamTable()
    hello = job_hello(0, 2, T0, lost=0)
    cols = {"op": np.zeros(3, np.uint8), "group": np.zeros(3, np.uint16), "dtype": np.ones(3, np.uint8)}
    cols |= {"nbytes": np.full(3, 4096, np.int64), "dur_us": np.ones(3, np.float32), "busbw": np.ones(3, np.float32)}
    table.add(0, hello, cols)
    table.views(1.0)
    assert table.ranks_aligned(2)
    assert not table.ranks_aligned(4)  # the same stream seen as a group of 2 in a world of 4


def test_a_ranks_window_numbers_are_the_drawn_streams_as_its_lines_are() -> None:
    """A rank's last / p50 / p99 / busbw / rate are of the stream its lines draw (f): a job of
    1 KiB and 1 MiB all_reduces showed the drawn 1 KiB stream's lines beside a p50 that sat
    between the two sizes (the median of a mix of every collective), none of its own."""
    from workers.wire.stats import percentiles as exact

    items = list(job_run(world=2, steps=40))
    model = fed(items)
    every = {v.rank: v for v in model.snapshot().ranks}
    big = next(s for s in model.snapshot(fresh_run_stats=True).streams if s.nbytes == 4_194_304)
    model.select_stream(big.index)
    drawn = {v.rank: v for v in model.snapshot().ranks}
    for rank in (0, 1):
        cols = [b.columns for b in batches(items, rank)]
        start = np.concatenate([c["start_ns"] for c in cols])
        dur = np.concatenate([c["dur_us"] for c in cols])
        mine = np.concatenate([c["nbytes"] == 4_194_304 for c in cols]) & (start >= start.max() - 5_000_000_000)
        p50, p99 = exact(dur[mine], (50, 99))
        view = drawn[rank]
        assert (view.p50_ms, view.p99_ms, view.last_ms) == pytest.approx((p50 / 1e3, p99 / 1e3, dur[mine][-1] / 1e3))
        assert view.p50_ms != pytest.approx(every[rank].p50_ms)  # the job mixes sizes: it was another number
    model.select_stream(-1)
    assert {v.rank: v.p50_ms for v in model.snapshot().ranks} == pytest.approx({r: v.p50_ms for r, v in every.items()})


def test_selected_stream_history_grows_with_new_batches() -> None:
    items = list(job_run(world=2, steps=40))
    model = RunModel(clock=lambda: T0)
    half = len(items) // 2
    for _, m in items[:half]:
        model.apply(m)
    big = next(s for s in model.snapshot(fresh_run_stats=True).streams if s.nbytes == 4_194_304)
    model.select_stream(big.index)
    model.snapshot()
    for _, m in items[half:]:
        model.apply(m)
    incremental = model.snapshot().history.ms
    model.select_stream(-1)
    model.select_stream(big.index)  # rebuilt from the rings
    rebuilt = model.snapshot().history.ms
    assert incremental.shape == (2, 40) and np.array_equal(incremental, rebuilt, equal_nan=True)


def test_job_info_from_the_config() -> None:
    assert JobInfo.of(
        {"source": "monitor", "collective": "monitor: train.py", "capture": "flight recorder"}
    ) == JobInfo("job", "train.py", "flight recorder", "")
    assert not JobInfo.of({"source": "monitor", "collective": "monitor: x.py"}).has_modes
    assert JobInfo.of({"source": "monitor", "collective": "monitor: x.py", "mode_knob": "offload"}).has_modes
    assert (
        JobInfo.of({"collective": "all_gather"}).kind == "loop" and JobInfo.of({"collective": "all_gather"}).has_modes
    )
    assert JobInfo.of({}).kind == ""


def test_group_labels() -> None:
    assert [group_label(*g) for g in (("0", "default_pg"), ("1", "undefined"), ("2", ""), ("3", "tp"))] == [
        "0:default_pg",
        "1",
        "2",
        "3:tp",
    ]
    local = "ad56679d2c95f00a464e146ac76c2deb475d8262"  # new_group(use_local_synchronization=True)'s name
    assert group_label(local, "undefined") == "ad56679d…" and group_label(local, "pp") == "ad56679d…:pp"


def test_the_synthetic_loop_is_one_stream_of_the_world_group() -> None:
    from frozen_run import frozen_run

    model = RunModel(clock=lambda: T0)
    for m in frozen_run(world=2, iterations=200):
        model.apply(m)
    snap = model.snapshot(fresh_run_stats=True)
    (s,) = snap.streams
    assert (s.group, s.op, s.dtype, s.count, s.ranks) == ("0", "all_gather", "?", 400, 2)
    assert snap.job.kind == "loop" and math.isfinite(snap.steps.steps_per_s)


def test_time_in_collectives_counts_overlapping_collectives_once() -> None:
    from tui.model.steps import RankSteps, busy_ns

    assert busy_ns(np.array([0, 5, 20]), np.array([10, 12, 25]), -(2**62)) == (17, 25)
    assert busy_ns(np.array([0, 5, 20]), np.array([10, 12, 25]), 8) == (9, 25)  # up to 8 was counted before
    steps = RankSteps()
    # two steps; in each, two async collectives of 3 ms that overlap by 1 ms
    steps.add_coll(np.array([0, 0, 1, 1]), np.array([0, 2, 10, 12]) * 1_000_000, np.full(4, 3000.0, np.float32))
    assert steps.busy_us == pytest.approx(2 * 5000.0) and steps.begun == 2


def test_collectives_after_a_ranks_last_step_are_not_time_per_step() -> None:
    """DDP ``join()``: a rank out of batches goes on with shadow all_reduces in its last step,
    which no later step closes. Time in collectives per step is over the steps whose length is
    known; before, the shadows' time over all steps begun read "122 % of a step"."""
    from tui.model.steps import RankSteps, busy_split_ns, step_view

    ms = 1_000_000
    step = np.array([0, 1, 2, 3, 3, 3, 3, 3, 3])
    start = np.array([0, 10, 20, 30, 32, 42, 52, 62, 72]) * ms  # steps 10 ms apart, 1 ms collectives
    dur = np.array([1000.0] * 4 + [9000.0] * 5, np.float32)  # then five 9 ms shadows
    steps = RankSteps()
    steps.add_coll(step, start, dur)
    view = step_view([steps])
    assert steps.begun == 4 and steps.closed == (3, pytest.approx(3000.0))
    assert view.coll_ms_per_step == pytest.approx(1.0) and view.coll_share == pytest.approx(0.1)
    # the same in two batches, the open step's start in the second: the same per step
    split = RankSteps()
    split.add_coll(step[:2], start[:2], dur[:2])
    split.add_coll(step[2:], start[2:], dur[2:])
    assert split.closed == steps.closed and split.busy_us == steps.busy_us == pytest.approx(49_000.0)
    # out of order (threads): each part is what its own intervals add past the earlier ones
    assert busy_split_ns(np.array([5, 0, 20]), np.array([12, 10, 25]), -(2**62), 1) == (2, 15, 25)


@pytest.mark.parametrize("seed", range(20))
def test_busy_time_is_the_length_of_the_union_of_the_intervals(seed: int) -> None:
    from tui.model.steps import busy_ns

    rng = np.random.default_rng(seed)
    start = rng.integers(0, 1000, 30)
    end = start + rng.integers(0, 200, 30)
    after = int(rng.integers(-100, 600))
    covered = set()
    for a, b in zip(start.tolist(), end.tolist(), strict=True):
        covered.update(range(max(a, after), b))
    assert busy_ns(start, end, after) == (len(covered), max(after, int(end.max())))


def test_a_call_that_moves_no_data_has_no_dtype_and_an_unknown_dtype_stays_a_question_mark() -> None:
    assert dtype_name(0, 0) == "-"  # a barrier: no tensor
    assert dtype_name(0, 4096) == "?"  # a tensor of a dtype commtop does not know
    assert dtype_name(1, 0) == "float32"  # an empty float32 tensor still has its dtype


def test_a_stream_size_is_a_whole_unit_or_below_a_mebibyte_its_bytes() -> None:
    from tui.report.views_text import size_cell

    assert [size_cell(n) for n in (8, 2000, 4096, 100_000, 1 << 20, 1_052_672, 3 << 30)] == [
        "8B", "2000B", "4KiB", "100000B", "1MiB", "1.004MiB", "3GiB",
    ]  # fmt: skip


def test_a_live_ranks_step_rate_reads_the_folded_steps_and_catches_up_without_new_data() -> None:
    """Live, a rank's steps/s is read over the steps folded so far (its 5 Hz text does not fold
    them itself); the run's step view folds every rank, and the next snapshot shows the rate of
    every step even with no new batch: a stopped rank's view must not keep a rate of before."""
    items = list(job_run(world=2, steps=60))
    model = fed(items)
    assert all(state.steps.pending for state in model.ranks.values())  # nothing folded yet
    first = model.snapshot()
    assert all(math.isnan(r.step_rate) for r in first.ranks)  # the rank views did not fold
    second = model.snapshot()  # no new data since
    exact = fed(items).snapshot(fresh_run_stats=True)
    assert [r.step_rate for r in second.ranks] == [r.step_rate for r in exact.ranks]
    assert second.step_rate == pytest.approx(1e9 / STEP_NS)


def test_a_job_of_hundreds_of_groups_lists_the_first_in_number_order_then_how_many_more() -> None:
    """A job that made 300 groups (one all_reduce on each) put every group's name in one line of
    the header, the summary and the report, "1, 10, 100, 101, ..." in text order."""
    from tui.model.streams import group_order, listed

    names = sorted((str(i) for i in range(300)), key=group_order)
    assert names[:3] == ["0", "1", "2"] and sorted(["pair", "10", "2"], key=group_order) == ["2", "10", "pair"]
    assert listed(names, 3) == "0, 1, 2, +297 more"
    assert listed(names[:3], 3) == "0, 1, 2"
    table = StreamTable()
    groups = tuple((str(i), "", 2) for i in range(12))
    hello = dataclasses.replace(job_hello(0, 2, T0), groups=groups)
    for code in (10, 2, 11, 1):
        cols = {"op": np.zeros(1, np.uint8), "group": np.full(1, code, np.uint16), "dtype": np.ones(1, np.uint8)}
        cols |= {"nbytes": np.full(1, 64, np.int64), "dur_us": np.ones(1, np.float32), "busbw": np.ones(1, np.float32)}
        table.add(0, hello, cols)
    assert [v.group for v in table.views(1.0)] == ["1", "2", "10", "11"]
    assert [table.keys[v][0] for v in table.order()] == ["1", "2", "10", "11"]
