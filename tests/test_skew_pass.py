"""The worst arrival skew of the window and of its recent iterations, from one pass (numpy only)."""

from __future__ import annotations

import numpy as np

from tui.model.skew import SKEW_ITERS, straggler_shares, worst_skews
from tui.model.snapshot import History
from workers.wire.straggler import STRAGGLER_ITERS


def brute_force(history: History, settle: int, since_ns: int) -> tuple[int, float] | None:
    """(iteration, skew) of the largest spread among complete iterations >= settle that started
    at or after since_ns, searched one column at a time among the newest SKEW_ITERS complete ones."""
    ms = history.ms
    cols = [j for j in range(ms.shape[1]) if not np.isnan(ms[:, j]).any() and history.first_iteration + j >= settle][
        -SKEW_ITERS:
    ]
    best: tuple[int, float] | None = None
    for j in cols:
        if history.start_ns[j] < since_ns:
            continue
        spread = float(ms[:, j].max() - ms[:, j].min())
        if best is None or spread > best[1]:
            best = (history.first_iteration + j, spread)
    return best


def test_one_pass_finds_what_a_column_by_column_search_finds() -> None:
    rng = np.random.default_rng(7)
    for trial in range(40):
        ranks, width = int(rng.integers(2, 9)), int(rng.integers(1, 700))
        ms = rng.gamma(2.0, 1.0, (ranks, width)).astype(np.float32)
        if trial % 2:
            ms[rng.random((ranks, width)) < 0.02] = np.nan  # some iterations a rank has not sent yet
        else:  # the usual window: complete but for the newest few (its columns are read as a view)
            ms[int(rng.integers(0, ranks)), width - int(rng.integers(0, 4)) :] = np.nan
        start = np.cumsum(rng.integers(1, 1000, width)).astype(np.int64)
        history = History(
            first_iteration=int(rng.integers(0, 50)), ms=ms, mode=np.zeros_like(ms, np.uint8), start_ns=start
        )
        settle = int(rng.integers(0, 60))
        since = int(start[int(rng.integers(0, width))]) if trial % 4 else 0
        overall, recent = worst_skews(history, list(range(100, 100 + ranks)), settle, since_ns=since)
        for found, want in (
            (overall, brute_force(history, settle, 0)),
            (recent, brute_force(history, settle, since) if since else None),
        ):
            if want is None:
                assert found is None
            else:
                assert found is not None and (found.iteration, round(found.skew_ms, 4)) == (want[0], round(want[1], 4))
                col = found.iteration - history.first_iteration
                assert found.rank == 100 + int(np.argmin(ms[:, col])) and found.t_ns == int(start[col])


def test_straggler_shares_count_the_first_lowest_rank_of_each_complete_iteration() -> None:
    rng = np.random.default_rng(11)
    for trial in range(60):
        ranks, width = int(rng.integers(2, 40)), int(rng.integers(1, 900))
        ms = rng.integers(1, 6, (ranks, width)).astype(np.float32)  # few values: many ties
        if trial % 2:
            ms[rng.random((ranks, width)) < 0.01] = np.nan
        else:
            ms[:, width - int(rng.integers(0, 3)) :] = np.nan
        history = History(
            first_iteration=0, ms=ms, mode=np.zeros_like(ms, np.uint8), start_ns=np.zeros(width, np.int64)
        )
        cols = [j for j in range(width) if not np.isnan(ms[:, j]).any()][-STRAGGLER_ITERS:]
        shares = straggler_shares(history)
        if not cols:
            assert shares is None
            continue
        want = np.bincount([int(np.argmin(ms[:, j])) for j in cols], minlength=ranks) / len(cols)
        assert shares is not None and shares.tolist() == want.tolist()
