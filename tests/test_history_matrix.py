"""The history matrix written on apply gives the picture a rebuild from the rings gives.

``HistoryMatrix`` replaced building the ranks x iterations history afresh for every snapshot.
Here a random stream (ranks joining late, lost batches, gaps, jumps ahead, a rank far behind)
is applied to a real RunModel and every snapshot's history is compared, cell by cell, with
the matrix rebuilt from the rank rings the way the model builds it when the ranks change.
"""

from __future__ import annotations

import numpy as np
from frozen_run import frozen_coll, frozen_hello

from tui.model.history import NO_MODE, HistoryMatrix
from tui.model.run_model import RunModel, _history_matrix, history_iters


def _rebuilt(model: RunModel) -> tuple[int, np.ndarray, np.ndarray, np.ndarray]:
    order = sorted(model.ranks)
    return _history_matrix(order, model.ranks, history_iters(len(order)), model.streams.compared).window()


def test_incremental_history_equals_a_rebuild_from_the_rings() -> None:
    rng = np.random.default_rng(7)
    compared = 0
    for _trial in range(60):
        world = int(rng.integers(1, 10))
        model = RunModel()
        pos = {r: int(rng.integers(0, 50)) for r in range(world)}
        seq = dict.fromkeys(range(world), 0)
        for _step in range(int(rng.integers(5, 50))):
            r = int(rng.integers(0, world))
            n = int(rng.integers(0, 700))
            its = np.arange(pos[r], pos[r] + n)
            if n and rng.random() < 0.3:  # records lost inside the batch
                its = its[rng.random(n) > 0.2]
            pos[r] += n + (int(rng.integers(0, 5000)) if rng.random() < 0.05 else 0)  # a jump ahead
            modes = rng.integers(0, 4, len(its)).astype(np.uint8)
            model.apply(frozen_coll(r, seq[r], its, rng.random(len(its)) * 3000, world=world, mode=modes))
            seq[r] += 1
            if rng.random() < 0.3:
                h = model.snapshot().history
                first, ms, mode, start = _rebuilt(model)
                assert h.first_iteration == first
                np.testing.assert_array_equal(h.ms, ms)
                np.testing.assert_array_equal(h.mode, mode)
                np.testing.assert_array_equal(h.start_ns, start)
                compared += 1
    assert compared > 100


def test_a_rank_joining_rebuilds_the_matrix_with_its_row() -> None:
    model = RunModel()
    model.apply(frozen_hello(0, 2))
    model.apply(frozen_coll(0, 0, range(10), np.full(10, 1000.0), world=2))
    assert model.snapshot().history.ms.shape == (1, 10)
    model.apply(frozen_coll(1, 0, range(5, 12), np.full(7, 2000.0), world=2))  # no hello yet: a new rank
    h = model.snapshot().history
    assert h.ms.shape == (2, 12)
    assert np.isnan(h.ms[1, :5]).all() and (h.ms[1, 5:] == 2.0).all()
    assert np.isnan(h.ms[0, 10:]).all() and (h.ms[0, :10] == 1.0).all()


def test_ring_columns_are_cleared_when_iterations_move_past_the_width() -> None:
    m = HistoryMatrix([0, 1], width=4)
    cols = {"iteration": np.arange(4), "dur_us": np.full(4, 1000.0, np.float32), "mode": np.ones(4, np.uint8)}
    cols["start_ns"] = np.arange(1, 5, dtype=np.int64) * 100
    assert m.add(0, cols) and m.add(1, cols)
    later = {k: v[:1] for k, v in cols.items()} | {"iteration": np.array([6])}
    m.add(0, later)  # rank 0 reaches iteration 6: iterations 3..6 shown; 4, 5 have no record
    first, ms, mode, start = m.window()
    assert first == 3
    np.testing.assert_array_equal(ms[0], [1.0, np.nan, np.nan, 1.0])
    np.testing.assert_array_equal(ms[1], [1.0, np.nan, np.nan, np.nan])
    assert list(mode[1]) == [1, NO_MODE, NO_MODE, NO_MODE]
    assert list(start) == [400, 0, 0, 100]  # from the lowest rank that has the iteration
    m.add(1, {k: v[:1] for k, v in cols.items()} | {"iteration": np.array([1])})  # too old: left out
    assert m.window()[0] == 3 and not m.add(5, cols)  # a rank without a row is refused


def test_the_newest_record_of_an_iteration_wins() -> None:
    """A restarted rank repeats iterations: the column shows what it reported last."""
    model = RunModel()
    model.apply(frozen_coll(0, 0, range(20), np.full(20, 1000.0), world=1))
    model.snapshot()
    model.apply(frozen_coll(0, 1, range(5, 10), np.full(5, 4000.0), world=1))
    h = model.snapshot().history
    assert (h.ms[0, 5:10] == 4.0).all() and (h.ms[0, :5] == 1.0).all() and (h.ms[0, 10:] == 1.0).all()


def test_queued_batches_scatter_as_the_batches_added_one_by_one() -> None:
    """The model queues its batches and the matrix scatters them together when read: the same
    cells, modes and start times as adding each batch in turn, also where a rank repeats
    iterations (a restart), jumps past the width, lags behind it, or has no start time."""
    rng = np.random.default_rng(11)
    reads = 0
    for _trial in range(200):
        world, width = int(rng.integers(1, 7)), int(rng.integers(1, 40))
        one_by_one, queued = HistoryMatrix(list(range(world)), width), HistoryMatrix(list(range(world)), width)
        pos = {r: int(rng.integers(0, 30)) for r in range(world)}
        for _step in range(int(rng.integers(1, 60))):
            r = int(rng.integers(0, world))
            n = int(rng.integers(1, 30))
            if rng.random() < 0.1:
                pos[r] = max(0, pos[r] - int(rng.integers(1, 40)))  # a restart repeats iterations
            its = np.arange(pos[r], pos[r] + n, dtype=np.int64)
            if rng.random() < 0.3:
                its = its[rng.random(n) > 0.3] if n > 1 else its
            pos[r] += n + (int(rng.integers(0, 3 * width)) if rng.random() < 0.1 else 0)
            if not len(its):
                continue
            cols = {
                "iteration": its,
                "dur_us": (rng.random(len(its)) * 3000).astype(np.float32),
                "mode": rng.integers(0, 4, len(its)).astype(np.uint8),
                "start_ns": np.where(rng.random(len(its)) < 0.2, 0, rng.integers(1, 10**6, len(its))).astype(np.int64),
            }
            one_by_one.add(r, cols)
            queued.queue(r, cols, int(its.min()), int(its.max()))
            if rng.random() < 0.15:
                for got, want in zip(queued.window(), one_by_one.window(), strict=True):
                    np.testing.assert_array_equal(got, want)
                reads += 1
        for got, want in zip(queued.window(), one_by_one.window(), strict=True):
            np.testing.assert_array_equal(got, want)
    assert reads > 100
    assert not HistoryMatrix([0], 4).queue(3, {"iteration": np.arange(2)}, 0, 1)  # no row for rank 3
