"""What the grid leaves out of Textual's per-line work must change nothing on screen.

The rank grid skips Textual's ANSI-to-truecolor line filter (RankGrid.get_line_filters):
that is only right while every style the grid draws is truecolor and not dim; and it hands
its strips to the compositor itself (RankGrid.render_lines) instead of through Textual's
styles cache, which only copies them while the grid has no border, padding or tint. These tests
draw every line of the rows view and the heat map (live, stale, failed and cleanly exited
ranks, straggler, clipped bars) in a real app and check that the filter would leave each
line exactly as it is.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import pytest
from frozen_run import frozen_snapshot
from rich.segment import Segment
from textual.color import Color
from textual.filter import ANSIToTruecolor

from tui.view.app import CommtopApp
from tui.view.widgets.rank_grid import RankGrid


def _grid_lines(snap, view: str, size: tuple[int, int]) -> tuple[list[list[Segment]], list[object]]:
    async def body() -> tuple[list[list[Segment]], list[object]]:
        app = CommtopApp(links=False)
        async with app.run_test(size=size) as pilot:
            app.show_snapshot(snap)
            await pilot.pause()
            grid = app.query_one(RankGrid)
            grid.view_mode = view
            await pilot.pause()
            lines = [list(grid.render_line(y)) for y in range(grid.size.height)]
            filters = list(app.get_line_filters())
            kept = list(grid.get_line_filters())
            return lines, [f for f in filters if f not in kept]

    return asyncio.run(body())


@pytest.mark.parametrize("view", ["rows", "heat"])
@pytest.mark.parametrize("world", [4, 64])
def test_the_skipped_truecolor_filter_would_change_no_grid_line(view: str, world: int) -> None:
    snap = frozen_snapshot(world=world, iterations=400, stale=1, exited=2)
    lines, skipped = _grid_lines(snap, view, (140, 40))
    assert [type(f) for f in skipped] == [ANSIToTruecolor]  # the one filter the grid leaves out
    truecolor = skipped[0]
    assert isinstance(truecolor, ANSIToTruecolor)
    styled = [seg for line in lines for seg in line if seg.style is not None]
    assert len(styled) > 50 and any(seg.text.strip() for seg in styled)  # real content was drawn
    for line in lines:
        assert truecolor.apply(line, Color(0, 0, 0)) == line


def test_only_changed_grid_lines_are_repainted_and_the_screen_matches_a_full_redraw() -> None:
    """A snapshot in which one rank moved on repaints that rank's changed lines, not the grid;
    what is on screen afterwards is what a fresh app shows for the same snapshot. (Rank 3 stays a
    batch behind, so the chart's edge, where every rank has reported, stays where it was.)"""
    from frozen_run import frozen_run

    from tui.model.run_model import RunModel
    from workers.wire.protocol import Batch

    messages = frozen_run(world=4, iterations=400)
    late = [m for m in messages if isinstance(m, Batch) and m.rank == 2][-1]  # rank 2's last batch
    behind = [m for m in messages if isinstance(m, Batch) and m.rank == 3][-1]  # rank 3's, never sent
    model = RunModel(clock=lambda: late.t_ns)
    for m in messages:
        if m is not late and m is not behind:
            model.apply(m)
    before = model.snapshot()
    model.apply(late)  # rank 2 catches up with ranks 0 and 1: only its lines change
    after = model.snapshot()

    async def body() -> tuple[list[tuple[int, int]], list[str], list[str]]:
        app = CommtopApp(links=False)
        async with app.run_test(size=(140, 40)) as pilot:
            app.show_snapshot(before)
            await pilot.pause()
            grid = app.query_one(RankGrid)
            calls: list[tuple[int, int]] = []  # (first line, lines) of each region refreshed
            refresh = grid.refresh

            def counted(*regions: Any, **kwargs: Any) -> Any:
                calls.extend((r.y, r.height) for r in regions)
                return refresh(*regions, **kwargs)

            grid.refresh = counted  # type: ignore[method-assign]
            app.show_snapshot(after)
            await pilot.pause()
            shown = [app.screen._compositor.render_update(full=True).render_segments(app.console)]  # noqa: SLF001
            texts = grid.line_texts()
        fresh = CommtopApp(links=False)
        async with fresh.run_test(size=(140, 40)) as pilot:
            fresh.show_snapshot(after)
            await pilot.pause()
            assert fresh.query_one(RankGrid).line_texts() == texts
            shown.append(fresh.screen._compositor.render_update(full=True).render_segments(fresh.console))  # noqa: SLF001
        return calls, texts, shown

    calls, texts, shown = asyncio.run(body())
    repainted = sum(n for _, n in calls)
    assert 0 < repainted < len(texts) // 2  # rank 2's lines (and what moved), not the whole grid
    assert len(shown[0]) > 1000 and shown[0] == shown[1]  # the same escape codes a terminal gets


def test_a_frame_that_moves_only_the_grid_renders_none_of_the_lines_above_or_below_it(monkeypatch: Any) -> None:
    """Textual's partial repaint renders every widget whose container overlaps what changed: the
    header, verdict, column header, status line and footer sit in containers of their own
    (CommtopApp.compose), which keep their own lines (tui.view.widgets.covered_box), so a frame
    of new grid lines renders the grid and the screen's background only (the widgets around the
    grid were ~0.4 ms a frame at 8 ranks on the VM)."""
    from frozen_run import frozen_run
    from textual.widget import Widget

    from tui.model.run_model import RunModel
    from workers.wire.protocol import Batch

    messages = frozen_run(world=4, iterations=400)
    late = [m for m in messages if isinstance(m, Batch) and m.rank == 2][-1]
    model = RunModel(clock=lambda: late.t_ns)
    for m in messages:
        if m is not late:
            model.apply(m)
    before = model.snapshot()
    model.apply(late)
    moved = replace(before, history=model.snapshot().history)  # the same text, new latency lines
    rendered: list[str] = []
    render = Widget.render_lines
    monkeypatch.setattr(Widget, "render_lines", lambda w, crop: (rendered.append(type(w).__name__), render(w, crop))[1])
    own = RankGrid.render_lines  # the grid's own (plain box) path
    monkeypatch.setattr(RankGrid, "render_lines", lambda w, crop: (rendered.append("RankGrid"), own(w, crop))[1])

    async def body() -> None:
        app = CommtopApp(links=True)
        async with app.run_test(size=(140, 40)) as pilot:
            app.show_snapshot(before)
            await pilot.pause()
            for timer in list(app._timers):  # noqa: SLF001 - the side poll (status line, footer's keys):
                timer.pause()  # on a loaded machine a tick landed in the measured frame
            await pilot.pause()
            rendered.clear()
            app.show_snapshot(moved)
            app.screen._on_timer_update()  # noqa: SLF001 - the frame, now
            await pilot.pause()

    asyncio.run(body())
    assert "RankGrid" in rendered  # the frame drew the grid's new lines
    assert set(rendered) <= {"RankGrid", "Screen"}, sorted(set(rendered))  # the boxes kept their lines


def test_a_covered_box_renders_its_lines_again_after_a_refresh_or_a_style_change() -> None:
    from tui.view.widgets.covered_box import CoveredBox

    async def body() -> list[bool]:
        app = CommtopApp(links=False)
        seen = []
        async with app.run_test(size=(120, 30)) as pilot:
            await pilot.pause()
            box = app.query_one("#top", CoveredBox)
            first = box.render_lines(box.region.reset_offset)
            seen.append(box.render_lines(box.region.reset_offset) is first)  # kept
            box.refresh()
            seen.append(box.render_lines(box.region.reset_offset) is first)
            again = box.render_lines(box.region.reset_offset)
            box.styles.background = "red"
            await pilot.pause()
            seen.append(box.render_lines(box.region.reset_offset) is again)
        return seen

    assert asyncio.run(body()) == [True, False, False]


@pytest.mark.parametrize(("world", "scroll"), [(8, 0), (64, 0), (64, 5), (200, 40)])
def test_the_grids_own_render_lines_equal_textuals_styles_cache_path(world: int, scroll: int) -> None:
    """Every crop of the grid (whole, a few lines, columns cut, under the scrollbar) renders as
    Textual's own Widget.render_lines does; and with a line filter (NO_COLOR's monochrome) or
    a padding the grid adds, the result still matches it."""
    from textual.filter import Monochrome
    from textual.geometry import Region
    from textual.widget import Widget

    snap = frozen_snapshot(world=world, iterations=300, stale=1, exited=2)

    async def body() -> None:
        app = CommtopApp(links=False)
        async with app.run_test(size=(140, 40)) as pilot:
            app.show_snapshot(snap)
            await pilot.pause()
            grid = app.query_one(RankGrid)
            grid.scroll_to(y=scroll, animate=False)
            await pilot.pause()
            w, h = grid.region.width, grid.region.height
            crops = [Region(0, 0, w, h), Region(0, 3, w, 4), Region(5, 0, w - 9, h), Region(0, h - 1, w - 1, 1)]

            def same() -> None:
                for crop in crops:
                    ours = grid.render_lines(crop)
                    grid._styles_cache.clear()  # noqa: SLF001  (Textual's path from scratch)
                    theirs = Widget.render_lines(grid, crop)
                    assert [list(s) for s in ours] == [list(s) for s in theirs], crop
                    assert [s.cell_length for s in ours] == [s.cell_length for s in theirs]

            assert grid._plain_box()  # noqa: SLF001
            same()
            grid.get_line_filters = lambda: [Monochrome()]  # type: ignore[method-assign]
            same()
            del grid.get_line_filters
            grid.styles.padding = (0, 1)
            assert not grid._plain_box()  # noqa: SLF001
            await pilot.pause()
            same()

    asyncio.run(body())


def _plain_settled_last(ms: Any, first: int, wait: int) -> int:
    """The chart's last iteration by its definition (grid_cells.settled_last): the oldest of the
    ranks' newest records, over the ranks whose newest is at most ``wait`` behind the newest."""
    import numpy as np

    newest = first + ms.shape[1] - 1
    lasts = [first + int(np.flatnonzero(np.isfinite(row))[-1]) for row in ms if np.isfinite(row).any()]
    close = [it for it in lasts if it >= newest - wait]
    return min(close) if wait > 0 and len(ms) >= 2 and close else newest


def test_bucket_equals_the_max_of_every_k_iterations() -> None:
    """bucket() computes only the cells the history reaches, with k element-wise passes; here it
    is checked against the plain definition: cell j = max over its k iterations, NaN-skipping,
    up to the iteration the ranks within ``wait`` of the newest have all reported."""
    import warnings

    import numpy as np

    from tui.model.history import NO_MODE
    from tui.model.snapshot import History
    from tui.view.widgets.grid_cells import bucket

    rng = np.random.default_rng(3)
    for _ in range(400):
        n, cols = int(rng.integers(0, 5)), int(rng.integers(1, 200))
        ms = rng.random((n, cols)).astype(np.float32)
        ms[rng.random((n, cols)) < 0.3] = np.nan
        mode = rng.integers(0, 4, (n, cols)).astype(np.uint8)
        mode[rng.random((n, cols)) < 0.2] = NO_MODE
        first = int(rng.integers(0, 1000))
        h = History(first_iteration=first, ms=ms, mode=mode, start_ns=np.arange(1, cols + 1, dtype=np.int64))
        cells, k = int(rng.integers(1, 80)), int(rng.choice([1, 2, 4, 8, 16, 32]))
        wait = int(rng.choice([0, 0, 1, 5, 40, 500]))
        got = bucket(h, cells, k, wait)
        last = _plain_settled_last(ms, first, wait)
        start = (last // k - cells + 1) * k
        assert got.first_iteration == start
        for j in range(cells):
            its = np.arange(start + j * k, start + (j + 1) * k) - first
            its = its[(its >= 0) & (its <= last - first)]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                want = np.nanmax(ms[:, its], axis=1) if len(its) else np.full(n, np.nan)
            np.testing.assert_array_equal(got.ms[:, j], want)
            m = mode[:, its].astype(np.int16)
            want_mode = np.where(m == NO_MODE, -1, m).max(axis=1) if len(its) else np.full(n, -1)
            np.testing.assert_array_equal(got.mode[:, j], want_mode)


def test_the_axis_top_from_a_partition_is_the_one_percentile_definition() -> None:
    import numpy as np

    from tui.view.widgets.grid_cells import _percentile_by_partition
    from workers.wire.stats import percentile

    rng = np.random.default_rng(1)
    for _ in range(3000):
        n = int(rng.integers(1, 300))
        x = rng.lognormal(0, 1, n).astype(np.float32)
        if rng.random() < 0.2:
            x[rng.integers(0, n, max(1, n // 3))] = x[0]  # ties
        if rng.random() < 0.1:
            x[: n // 2] = 0  # zeros take numpy's path
        q = float(rng.choice([99, 50, 0, 100, 37.5]))
        assert _percentile_by_partition(x, q) == percentile(x, q)
