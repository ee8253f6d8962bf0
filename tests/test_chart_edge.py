"""Where the latency chart ends: at the newest iteration every rank has reported, so the ranks'
batches arriving one after another do not blink the chart's last cells, unless a rank is further
behind than the wait (late, stalled, exited): then that rank shows its gap."""

from __future__ import annotations

import numpy as np

from tui.model.snapshot import History
from tui.view.widgets.grid_cells import bucket, settled_last

FIRST = 1000


def history(newest_by_rank: list[int], cols: int = 0) -> History:
    """Ranks with a record (2.5 ms) for every iteration up to column ``newest_by_rank[r]``; the
    history reaches the newest any has (or ``cols`` columns)."""
    cols = cols or max(newest_by_rank) + 1
    ms = np.full((len(newest_by_rank), cols), np.nan, dtype=np.float32)
    for r, newest in enumerate(newest_by_rank):
        ms[r, : newest + 1] = 2.5
    mode = np.zeros(ms.shape, dtype=np.uint8)
    return History(first_iteration=FIRST, ms=ms, mode=mode, start_ns=np.arange(1, cols + 1, dtype=np.int64) * 1000)


def test_the_chart_ends_where_every_rank_has_reported() -> None:
    h = history([99, 95, 97])
    assert settled_last(h, wait_its=10) == FIRST + 95
    cells = bucket(h, 20, 1, wait_its=10)
    assert cells.first_iteration + 19 == FIRST + 95  # the last cell is the settled iteration
    assert np.isfinite(cells.ms[:, -1]).all()  # no rank's last cell is blank


def test_batches_arriving_in_turn_never_blank_a_last_cell() -> None:
    """Each step one rank's batch (5 iterations) arrives; the others are a batch or two behind."""
    newest = [40, 35, 30]
    for step in range(12):
        newest[step % 3] = max(newest) + 5
        h = history(newest)
        cells = bucket(h, 16, 2, wait_its=20)
        last = cells.first_iteration + 2 * 16 - 1  # the last cell's last iteration
        assert last >= settled_last(h, 20) >= FIRST + min(newest)
        assert np.isfinite(cells.ms[:, -1]).all(), (step, newest)


def test_a_rank_further_behind_than_the_wait_shows_its_gap() -> None:
    h = history([99, 95, 50])  # rank 2 stalled at 50
    assert settled_last(h, wait_its=10) == FIRST + 95
    cells = bucket(h, 20, 1, wait_its=10)
    assert np.isfinite(cells.ms[:2, -1]).all()
    assert np.isnan(cells.ms[2, -20:]).all()  # its tail is empty (the state note goes there)


def test_without_a_wait_or_with_one_rank_the_chart_ends_at_the_newest_iteration() -> None:
    assert settled_last(history([99, 95, 97]), wait_its=0) == FIRST + 99
    assert settled_last(history([90], cols=100), wait_its=10) == FIRST + 99
    assert settled_last(history([99, 95, 97]), wait_its=10_000) == FIRST + 95
    empty = History(FIRST, np.full((2, 0), np.nan, dtype=np.float32), np.zeros((2, 0), dtype=np.uint8))
    assert settled_last(empty, wait_its=10) == FIRST - 1


def test_a_late_rank_catching_up_does_not_scroll_the_chart_back() -> None:
    """Rank 2 was beyond the wait (the chart went on without it); its next batch brings it within
    the wait but still behind the last frame's edge: the edge stays (rank 2 shows its gap)."""
    first = bucket(history([99, 98, 80]), 20, 1, wait_its=10)
    assert first.last_iteration == FIRST + 98
    caught_up = history([99, 98, 92])
    assert settled_last(caught_up, wait_its=10) == FIRST + 92
    assert settled_last(caught_up, wait_its=10, not_before=first.last_iteration) == FIRST + 98
    cells = bucket(caught_up, 20, 1, wait_its=10, not_before=first.last_iteration)
    assert cells.last_iteration == FIRST + 98 and np.isnan(cells.ms[2, -6:]).all()


def test_an_edge_beyond_the_history_is_forgotten() -> None:
    """A new run or a replay sought back starts again below the last frame's edge."""
    assert settled_last(history([40, 35, 38]), wait_its=10, not_before=FIRST + 98) == FIRST + 35


def test_the_grid_keeps_its_edge_for_one_stream_only() -> None:
    """The grid holds the last edge it drew while the same stream is drawn; another stream's
    iterations are another count, so picking one (f) starts from its own settled edge."""
    import asyncio
    from dataclasses import replace

    from frozen_run import frozen_snapshot

    from tui.view.app import CommtopApp
    from tui.view.widgets.rank_grid import RankGrid

    base = frozen_snapshot(world=3, iterations=200)
    every = replace(base, history=history([99, 98, 80]), iter_rate=10.0, selected_stream=-1)
    caught_up = replace(every, history=history([99, 98, 92]))
    stream = replace(caught_up, selected_stream=0)

    async def body() -> list[int]:
        app = CommtopApp(links=False)
        edges = []
        async with app.run_test(size=(140, 40)) as pilot:
            grid = app.query_one(RankGrid)
            for snap in (every, caught_up, stream):
                grid.show(snap)
                await pilot.pause()
                edges.append(grid._chart_last[1])  # noqa: SLF001
        return edges

    assert asyncio.run(body()) == [FIRST + 98, FIRST + 98, FIRST + 92]
