"""RunModel against hand-computed values: windows, busbw, gaps, drops, liveness, stragglers."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np
import pytest
from frozen_run import T0, TENSOR_BYTES, frozen_coll, frozen_copy, frozen_hello, frozen_run

from tui.model.run_model import HISTORY_ITERS, RunModel, history_iters
from tui.model.snapshot import Snapshot
from tui.model.stats import RING_SIZE
from tui.run.headless_out import Progress
from tui.view.widgets.rank_rows import _counts, state_note
from workers.wire.protocol import OP_NAMES, Batch, Bye

S = 1_000_000_000


class FrozenClock:
    """A test clock (ns) that moves only when told to."""

    def __init__(self, t: int = T0) -> None:
        self.t = t

    def __call__(self) -> int:
        return self.t


def model_with(*messages: object) -> tuple[RunModel, FrozenClock]:
    clock = FrozenClock()
    model = RunModel(clock=clock)
    for m in messages:
        model.apply(m)
    return model, clock


def test_window_latency_and_busbw_from_one_batch() -> None:
    model, _ = model_with(frozen_hello(0), frozen_coll(0, 0, [0, 1, 2, 3], [1000, 2000, 3000, 4000]))
    r = model.snapshot().ranks[0]
    assert (r.count, r.last_iteration) == (4, 3)
    assert r.last_ms == pytest.approx(4.0)
    assert r.p50_ms == pytest.approx(2.5)  # linear (numpy default) of 1, 2, 3, 4 ms
    assert r.p99_ms == pytest.approx(3.97)
    # all_gather on 2 ranks: S = 2 x tensor, busbw factor 1/2; bytes moved 4 x S/2 in 10 ms
    assert r.busbw_gbps == pytest.approx(4 * TENSOR_BYTES / 10_000 / 1e3, rel=1e-5)
    assert r.iter_rate == pytest.approx(100.0)  # records start every 10 ms
    assert r.mode == "overlap" and r.state == "live"


def test_header_fields_come_from_the_hello() -> None:
    model, _ = model_with(frozen_hello(0, world=4), frozen_hello(1, world=4))
    s = model.snapshot()
    assert (s.backend, s.world_size, s.collective, s.shape, s.dtype) == (
        "gloo/cpu",
        4,
        "all_gather",
        (1024, 1024),
        "float32",
    )
    assert s.tensor_bytes == TENSOR_BYTES and s.settings is not None and s.settings.mode == "overlap"
    assert [r.state for r in s.ranks] == ["waiting", "waiting"]
    assert s.ranks[0].host == "node-a" and s.ranks[0].gpu == "cpu"


def test_ring_wrap_keeps_the_newest_records_and_whole_run_counts() -> None:
    n = RING_SIZE + 904
    dur = np.full(n, 1000.0)
    dur[-1] = 7000.0
    model, _ = model_with(frozen_coll(0, 0, range(n), dur, period_ns=1_000_000))
    r = model.snapshot().ranks[0]
    assert r.count == n and r.run.count == n and r.missing == 0
    assert r.last_ms == pytest.approx(7.0)
    assert r.run.max_ms == pytest.approx(7.0) and r.run.min_ms == pytest.approx(1.0)
    assert model.ranks[0].coll.view()["iteration"][0] == n - RING_SIZE


def test_window_covers_the_last_five_seconds_of_record_time() -> None:
    # 1 record a second: 10 old slow ones, then 5 fast ones; the window holds t-5s..t
    its = range(15)
    dur = [9000.0] * 10 + [1000.0] * 5
    model, _ = model_with(frozen_coll(0, 0, its, dur, period_ns=S))
    r = model.snapshot().ranks[0]
    assert r.p50_ms == pytest.approx(1.0)
    assert r.p99_ms == pytest.approx(8.6)  # 6 records in [9 s, 14 s]: one slow one (1 + 0.95 x 8)
    assert r.run.count == 15


def test_gaps_and_drops_are_not_double_counted() -> None:
    a = frozen_coll(0, 0, range(10), [1000] * 10, dropped=0)
    b = frozen_coll(0, 2, range(15, 20), [1000] * 5, dropped=3)  # seq 1 lost, 5 records missing
    model, clock = model_with(a, b)
    r = model.snapshot().ranks[0]
    assert (r.missing, r.drops) == (0, 3)  # the live view counts a gap once it lasted GAP_SETTLE_NS
    clock.t += int(1.1 * S)
    r = model.snapshot().ranks[0]
    assert (r.missing, r.dropped, r.lost_batches, r.drops) == (5, 3, 1, 5)
    model.apply(frozen_coll(0, 3, range(20, 22), [1000] * 2, dropped=8))
    r = model.snapshot().ranks[0]
    assert (r.missing, r.dropped, r.drops) == (5, 8, 8)
    model.apply(frozen_hello(0, seq_coll=6, dropped=9))  # 6 sent, 3 received
    r = model.snapshot().ranks[0]
    assert (r.lost_batches, r.dropped, r.drops) == (3, 9, 9)
    assert model.snapshot().drops == 9


def test_a_gap_that_fills_within_a_second_is_never_shown_missing_and_the_end_counts_every_gap() -> None:
    """A rank numbers a collective when it starts: one that runs long on one thread is recorded
    after later ones of another (live, the TUI showed "missing 1" for a moment, then 0). A gap
    filled within GAP_SETTLE_NS never shows; one that stays shows after it; the end (a fresh
    summary) counts every gap at once."""
    model, clock = model_with(frozen_coll(0, 0, [0, 1, 3, 4], [1000] * 4))
    assert model.snapshot().ranks[0].missing == 0
    clock.t += int(0.5 * S)
    assert model.snapshot(fresh_run_stats=True).ranks[0].missing == 1  # the end: every gap
    model.apply(frozen_coll(0, 1, [2, 5, 7], [1000] * 3))  # 2 came late; 6 never will
    clock.t += int(0.4 * S)
    assert model.snapshot().ranks[0].missing == 0
    clock.t += int(0.7 * S)
    assert model.snapshot().ranks[0].missing == 0  # iteration 6's gap has lasted 0.7 s
    clock.t += int(0.4 * S)
    snap = model.snapshot()
    assert (snap.ranks[0].missing, snap.ranks[0].drops, snap.drops) == (1, 1, 1)


def test_rank_goes_stale_after_two_silent_seconds_and_comes_back() -> None:
    model, clock = model_with(frozen_coll(0, 0, [0], [1000]), frozen_coll(1, 0, [0], [1000]))
    clock.t += int(1.9 * S)
    model.apply(frozen_coll(1, 1, [1], [1000]))
    assert [r.state for r in model.snapshot().ranks] == ["live", "live"]
    clock.t += int(0.2 * S)
    assert [r.state for r in model.snapshot().ranks] == ["stale", "live"]
    assert model.snapshot().ranks[0].silent_s == pytest.approx(2.1)
    model.apply(frozen_coll(0, 1, [1], [1000]))
    assert [r.state for r in model.snapshot().ranks] == ["live", "live"]


def test_a_stalled_rank_says_which_collective_it_is_inside_and_its_peer_that_it_is_in_none() -> None:
    """A hang: rank 0 inside an all_reduce its peer never joins (its Hello's ``inside``), rank 1
    elsewhere. Both stalled; only rank 0 names a collective, with how long it has been in it."""
    groups = (("0", "default_pg", 2),)
    model, clock = model_with(frozen_coll(0, 0, [0], [1000]), frozen_coll(1, 0, [0], [1000]))
    clock.t += 3 * S
    since = T0 + 1 * S  # rank 0 called its all_reduce a second after the first records
    model.apply(frozen_hello(0, t_ns=clock.t, groups=groups, inside=(OP_NAMES.index("all_reduce"), 0, 256, since)))
    model.apply(frozen_hello(1, t_ns=clock.t, groups=groups))
    ranks = model.snapshot().ranks
    assert [r.state for r in ranks] == ["stalled", "stalled"]
    assert ranks[0].inside == ("all_reduce", "0:default_pg", 256, pytest.approx(2.0)) and ranks[1].inside == ()
    assert state_note(ranks[0], None) == " stalled inside all_reduce on 0:default_pg (256 B) for 2s, heartbeat alive "
    assert state_note(ranks[1], None) == " stalled: no collective for 3s, heartbeat alive "
    assert " 0/s " in "".join(seg.text for seg in _counts(ranks[1]))  # not its last window's rate
    progress = Progress(model, expected_ranks=2, started=0.0).text(30.0)  # the headless progress line
    assert progress.endswith(" · 0:30 · stalled: rank 0 inside all_reduce 2s, rank 1"), progress
    model.apply(frozen_coll(0, 1, [1], [1000]))  # it came out: live, nothing inside
    assert model.snapshot().ranks[0].inside == ()


def test_bye_marks_exited_with_code_until_a_newer_message() -> None:
    model, _ = model_with(frozen_hello(0, t_ns=T0), frozen_coll(0, 0, [0], [1000]))
    model.apply(Bye(rank=0, exit_code=3, reason="CUDA error", t_ns=T0 + 5))
    r = model.snapshot().ranks[0]
    assert (r.state, r.exit_code, r.exit_reason) == ("exited", 3, "CUDA error")
    model.apply(frozen_hello(0, t_ns=T0 + 1))  # sent before the bye, arrived after it
    assert model.snapshot().ranks[0].state == "exited"
    model.apply(frozen_hello(0, t_ns=T0 + 10))  # restarted
    assert model.snapshot().ranks[0].state == "live"


def test_straggler_is_the_rank_that_waits_least() -> None:
    msgs = [frozen_coll(r, 0, range(64), [3000.0 - (500.0 if r == 2 else 0.0) + r] * 64, world=4) for r in range(4)]
    model, _ = model_with(*msgs)
    s = model.snapshot()
    assert s.straggler == 2
    assert s.ranks[2].straggler_share == pytest.approx(1.0)
    assert s.ranks[0].straggler_share == 0.0


def test_no_straggler_when_arrival_order_is_even() -> None:
    msgs = [frozen_coll(r, 0, range(64), np.roll(np.arange(64) % 4, r) * 10.0 + 3000.0, world=4) for r in range(4)]
    model, _ = model_with(*msgs)
    assert model.snapshot().straggler is None


def test_history_is_aligned_by_iteration_with_gaps_as_nan() -> None:
    model, _ = model_with(
        frozen_coll(0, 0, [0, 1, 2, 3], [1000, 2000, 3000, 4000], mode=[1, 1, 0, 0]),
        frozen_coll(1, 0, [0, 1], [1500, 1500]),
    )
    h = model.snapshot().history
    assert h.first_iteration == 0 and h.ms.shape == (2, 4)
    assert h.ms[0].tolist() == [1.0, 2.0, 3.0, 4.0]
    assert h.ms[1, :2].tolist() == [1.5, 1.5] and np.isnan(h.ms[1, 2:]).all()
    assert h.mode[0].tolist() == [1, 1, 0, 0]


def test_history_keeps_the_last_iterations_only() -> None:
    n = history_iters(1) + 100
    model, _ = model_with(frozen_coll(0, 0, range(n), np.arange(n, dtype=float) + 1000))
    h = model.snapshot().history
    assert h.first_iteration == 100 and h.ms.shape == (1, history_iters(1))
    assert h.ms[0, 0] == pytest.approx(1.1)


def test_a_rank_far_behind_has_an_empty_history_row_and_no_crash() -> None:
    """Regression: a rank more than the history window behind once killed the ingest thread."""
    n = history_iters(2) + 2500
    model, _ = model_with(
        frozen_coll(0, 0, range(n), np.full(n, 1000.0)),
        frozen_coll(1, 0, range(10), np.full(10, 1500.0)),
    )
    h = model.snapshot().history
    assert h.ms.shape == (2, history_iters(2))
    assert np.isnan(h.ms[1]).all() and not np.isnan(h.ms[0]).any()


def test_small_worlds_keep_a_longer_history_within_a_bound() -> None:
    """1 rank keeps its whole ring (a GPU at 2000 it/s: ~2 s of chart, ~20 NVML ticks under
    it); many ranks keep HISTORY_ITERS each, so the snapshot's history stays bounded."""
    assert history_iters(1) == 4096 and history_iters(8) == 2048
    assert history_iters(64) == history_iters(512) == HISTORY_ITERS


def test_run_stats_per_mode_and_modes_seen() -> None:
    model, _ = model_with(frozen_coll(0, 0, range(4), [1000, 1000, 9000, 9000], mode=[0, 0, 1, 1]))
    s = model.snapshot()
    assert s.modes_seen == ("none", "overlap")
    by = s.ranks[0].run_by_mode
    assert by["none"].count == 2 and by["none"].max_ms == pytest.approx(1.0)
    assert by["overlap"].p50_ms == pytest.approx(9.0, rel=0.012)


def test_copy_bandwidth() -> None:
    starts = [T0 + i * 10_000_000 for i in range(5)]
    model, _ = model_with(frozen_copy(0, 0, starts, [2470.0] * 5, 128 * 2**20))
    r = model.snapshot().ranks[0]
    assert r.copy_gbps == pytest.approx(128 * 2**20 / 2470.0 / 1e3, rel=1e-5)
    assert r.copies == 5 and r.copy_run.busbw_gbps == pytest.approx(r.copy_gbps, rel=1e-5)


def test_pending_switch_and_epoch_in_force() -> None:
    model, _ = model_with(frozen_hello(0), frozen_coll(0, 0, [0, 1], [1000, 1000], epoch=2, pending=(3, 640)))
    s = model.snapshot()
    assert (s.epoch_in_force, s.pending_epoch, s.apply_at) == (2, 3, 640)


def test_rejected_counts_and_unknown_messages() -> None:
    model, _ = model_with()
    v = model.version
    model.set_rejected({"signature": 2, "malformed": 0})
    model.apply({"k": "ctl_rep", "s": "x"})
    s = model.snapshot()
    assert s.rejected == {"signature": 2} and s.rejected_total == 2
    assert model.ignored == 1 and model.version == v + 1


def test_reset_forgets_everything() -> None:
    model, _ = model_with(*frozen_run(world=2, iterations=100))
    assert model.snapshot().records > 0
    model.reset()
    s = model.snapshot()
    assert (s.records, s.ranks, s.messages) == (0, (), 0)


def test_frozen_run_has_two_modes_and_rank_one_straggles() -> None:
    model, _ = model_with(*frozen_run(world=2, iterations=400))
    s = model.snapshot(T0 + 5 * S)
    assert s.modes_seen == ("none", "overlap")
    assert s.straggler == 1
    assert all(r.count == 400 and r.missing == 0 for r in s.ranks)
    assert not math.isnan(s.iter_rate)


def test_ranks_past_the_announced_world_size_are_refused_and_counted() -> None:
    """A key holder must not exhaust memory by inventing ranks."""
    model, _ = model_with(frozen_hello(0), frozen_hello(1), frozen_coll(0, 0, [0], [1000.0]))
    model.apply(frozen_coll(7, 0, [0], [1000.0]))
    model.apply(frozen_coll(5000, 0, [0], [1000.0]))
    snap = model.snapshot()
    assert sorted(r.rank for r in snap.ranks) == [0, 1]
    assert snap.rejected.get("rank") == 2


def test_large_worlds_refresh_a_bounded_share_of_rank_numbers_per_snapshot() -> None:
    """Above LARGE_WORLD ranks a snapshot recomputes at most max(REFRESH_MIN, n / REFRESH_SHARE)
    ranks' numbers, the longest-waiting first, so every rank is refreshed within REFRESH_SHARE
    snapshots; state and straggler share stay fresh in every snapshot."""
    from tui.model.snapshot_builder import LARGE_WORLD, REFRESH_SHARE

    world = 8 * REFRESH_SHARE  # budget = 8 ranks per snapshot
    assert world > LARGE_WORLD
    model = RunModel()
    for r in range(world):
        model.apply(frozen_coll(r, 0, range(10), np.full(10, 1000.0), world=world))
    model.snapshot()  # the first snapshot computes every rank
    for r in range(world):
        model.apply(frozen_coll(r, 1, range(10, 20), np.full(10, 3000.0), world=world))
    refreshed_at: dict[int, int] = {}
    for k in range(REFRESH_SHARE):
        snap = model.snapshot()
        new = {v.rank for v in snap.ranks if v.count == 20} - set(refreshed_at)
        assert len(new) == 8  # the budget, no more, no less
        refreshed_at.update(dict.fromkeys(new, k))
        assert all(v.state == "live" for v in snap.ranks)
    assert len(refreshed_at) == world  # every rank within REFRESH_SHARE snapshots
    assert all(v.last_ms == pytest.approx(3.0) for v in model.snapshot().ranks)


def test_with_the_heat_map_a_large_world_refreshes_n_over_refresh_share_ranks_and_fresh_loss_counts() -> None:
    """The heat map shows none of a rank's numbers: its snapshots recompute n / REFRESH_SHARE of
    them (no REFRESH_MIN), while the header's loss counts come from every rank's state at once."""
    from tui.model.snapshot_builder import REFRESH_SHARE

    world = 2 * REFRESH_SHARE  # budget = 2 ranks per snapshot
    model = RunModel()
    model.whole_run_stats = False
    for r in range(world):
        model.apply(frozen_coll(r, 0, range(10), np.full(10, 1000.0), world=world))
    model.snapshot()
    for r in range(world):  # every rank skips iterations 10-14: 5 gaps each
        model.apply(frozen_coll(r, 1, range(15, 25), np.full(10, 3000.0), world=world))
    now = model.clock()
    snap = model.snapshot(now)
    assert sum(v.count == 20 for v in snap.ranks) == 2
    model.snapshot(now + int(1.1 * S))
    snap = model.snapshot(now + int(2.2 * S))  # the gaps have lasted GAP_SETTLE_NS (RankState.settled_gaps)
    assert snap.drops == 5 * world  # every rank's gaps, not only the refreshed ranks' views


def test_whole_run_stats_keep_their_values_while_off_and_are_fresh_once_back_on() -> None:
    """The heat map shows no whole-run numbers, so the app turns their refresh off; back on,
    the next snapshot has them fresh, also for a rank that has been silent since."""
    model, clock = model_with(frozen_hello(0), frozen_hello(1), frozen_coll(0, 0, range(4), [1000.0] * 4))
    model.apply(frozen_coll(1, 0, range(4), [1000.0] * 4))
    first = model.snapshot()
    assert [r.run.count for r in first.ranks] == [4, 4]
    model.whole_run_stats = False
    model.apply(frozen_coll(0, 1, range(4, 8), [5000.0] * 4))
    model.apply(frozen_coll(1, 1, range(4, 8), [5000.0] * 4))  # rank 1's last message
    clock.t += 3 * S
    off = model.snapshot()
    assert [r.count for r in off.ranks] == [8, 8]  # the window numbers are current
    assert [r.run.count for r in off.ranks] == [4, 4]  # the whole-run ones kept
    model.apply(frozen_coll(0, 2, range(8, 12), [5000.0] * 4))
    model.whole_run_stats = True
    on = model.snapshot()
    assert [r.run.count for r in on.ranks] == [12, 8]
    assert on.ranks[1].run.max_ms == pytest.approx(5.0)


def test_on_screen_a_rank_s_numbers_follow_at_5_hz_and_every_other_snapshot_at_once() -> None:
    """The screen's snapshots (text_every_s) recompute a changed rank's numbers at most every
    0.2 s on both clocks: its sparkline (the history) moves at every snapshot. Direct snapshots,
    the final summary, and an ended replay once the wall clock moves on see every record."""
    messages = frozen_run(world=2, iterations=400)
    now = [T0]
    wall = [0.0]

    def fed_in_halves(clock: Callable[[], int]) -> tuple[RunModel, Snapshot]:
        """A model fed half the run, a screen snapshot, then the other half."""
        model = RunModel(clock=clock)
        model._builder.wall = lambda: wall[0]
        for m in messages[: len(messages) // 2]:
            model.apply(m)
        first = model.snapshot(text_every_s=0.2)
        for m in messages[len(messages) // 2 :]:
            model.apply(m)
        return model, first

    model, early = fed_in_halves(lambda: now[0])
    now[0] += int(0.1e9)
    wall[0] += 0.1
    shown = model.snapshot(text_every_s=0.2)
    assert [r.count for r in shown.ranks] == [r.count for r in early.ranks]  # numbers held
    assert shown.history.ms.shape[1] > early.history.ms.shape[1]  # the sparklines moved
    assert [r.count for r in model.snapshot().ranks] == [400, 400]  # a direct snapshot: at once
    assert [r.count for r in model.snapshot(text_every_s=0.2, fresh_run_stats=True).ranks] == [400, 400]
    # an ended replay: the model clock stands still, the wall clock moves on
    held, first = fed_in_halves(lambda: T0)
    assert [r.count for r in held.snapshot(text_every_s=0.2).ranks] == [r.count for r in first.ranks]
    wall[0] += 0.25
    assert [r.count for r in held.snapshot(text_every_s=0.2).ranks] == [400, 400]


@pytest.mark.parametrize(
    ("world", "whole_run_stats"), [(20, False), (20, True), (4, True)], ids=["heat", "rows", "small"]
)
def test_between_two_text_ticks_the_screen_s_snapshot_moves_only_its_history(world: int, whole_run_stats: bool) -> None:
    """The screen's snapshots (text_every_s) rebuild their text (rank views, header numbers,
    skew, panels) at most every 0.2 s on both clocks, in any view and world; between two ticks
    they are the last full snapshot with the new history and counters. A direct snapshot is
    always full."""
    messages = frozen_run(world=world, iterations=400)
    quarter = len(messages) // 4  # both quarters in one mode: the second half changes it
    now, wall = [T0], [0.0]
    model = RunModel(clock=lambda: now[0])
    model._builder.wall = lambda: wall[0]
    model.whole_run_stats = whole_run_stats
    for m in messages[:quarter]:
        model.apply(m)
    first = model.snapshot(text_every_s=0.2)
    for m in messages[quarter : 2 * quarter - world]:
        model.apply(m)
    now[0] += int(0.1e9)
    wall[0] += 0.1
    held = model.snapshot(text_every_s=0.2)
    assert held.ranks is first.ranks and held.streams is first.streams and held.steps is first.steps
    assert held.history.ms.shape[1] > first.history.ms.shape[1]  # the lines moved
    assert (held.now_ns, held.version, held.records) == (now[0], model.version, model.records)
    assert held.records > first.records
    assert model.snapshot().ranks is not first.ranks  # a direct snapshot builds them anew
    now[0] += int(0.25e9)
    wall[0] += 0.25
    later = model.snapshot(text_every_s=0.2)
    assert later.ranks is not first.ranks and later.ranks[0].silent_s > first.ranks[0].silent_s


@pytest.mark.parametrize("change", ["bye", "new rank", "stream", "view", "pending epoch"])
def test_what_the_user_acts_on_makes_a_full_snapshot_at_once(change: str) -> None:
    """A rank ending or appearing, another stream drawn, the other view (whole-run statistics)
    or a change of the settings pending shows at the next snapshot, not up to 0.2 s later."""
    now, wall = [T0], [0.0]
    model = RunModel(clock=lambda: now[0])
    model._builder.wall = lambda: wall[0]
    messages = frozen_run(world=3, iterations=100)
    model.whole_run_stats = change != "view"  # "view": the heat map (whole-run statistics off) to the rows
    for m in messages:
        model.apply(m)
    first = model.snapshot(text_every_s=0.2)
    assert model.snapshot(text_every_s=0.2).ranks is first.ranks  # nothing the user acts on: held
    if change == "bye":
        model.apply(Bye(rank=1, exit_code=0, reason="", t_ns=T0 + 10**12))
    elif change == "new rank":
        model.apply(frozen_hello(3, 4))
    elif change == "stream":
        model.select_stream(0)
    elif change == "view":
        model.apply(frozen_coll(0, 10**6, range(100, 104), [1000.0] * 4, world=3))
        model.whole_run_stats = True
    else:
        batch = next(m for m in messages if isinstance(m, Batch) and m.rank == 0)
        model.apply(dataclasses.replace(batch, seq=10**6, pending_epoch=7, apply_at=123, t_ns=T0 + 10**12))
    snap = model.snapshot(text_every_s=0.2)
    assert snap.ranks is not first.ranks
    if change == "bye":
        assert snap.ranks[1].state == "exited"
    elif change == "new rank":
        assert len(snap.ranks) == 4
    elif change == "pending epoch":
        assert (snap.pending_epoch, snap.apply_at) == (7, 123)
    elif change == "view":  # the rows' numbers count what came while the heat map was shown
        assert snap.ranks[0].count == first.ranks[0].count + 4
