"""What the grid leaves out of Textual's per-line work must change nothing on screen.

The rank grid skips Textual's ANSI-to-truecolor line filter (RankGrid.get_line_filters):
that is only right while every style the grid draws is truecolor and not dim. These tests
draw every line of the rows view and the heat map (live, stale, failed and cleanly exited
ranks, straggler, clipped bars) in a real app and check that the filter would leave each
line exactly as it is.
"""

from __future__ import annotations

import asyncio

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
