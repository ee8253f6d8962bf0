"""The streams panel and the f key under Textual's Pilot, fed a job through the real LiveSource."""

from __future__ import annotations

from typing import Any

import pytest
from frozen_run import KEY, SESSION, FakePublisher, frozen_run
from job_synth import expected_counts, job_run
from test_app import SIZE, grid_text, run_async, wait_for

from tui.view.build import build_app
from tui.view.widgets.streams import StreamPanel, panel_text
from workers.wire.connection import Connection
from workers.wire.protocol import Bye


def panel(app: Any) -> str:
    return app.query_one(StreamPanel).render().plain


@pytest.mark.e2e
@run_async
async def test_f_steps_the_latency_lines_through_the_streams_and_back(connection: Connection) -> None:
    app = build_app(connection=connection, title="commtop test")
    async with app.run_test(size=(160, 44)) as pilot:
        pub = FakePublisher(app.source.endpoint, KEY, SESSION)  # type: ignore[union-attr]
        pub.send(m for _, m in job_run(world=4, steps=40) if not isinstance(m, Bye))
        total = sum(expected_counts(4, 40).values())
        await wait_for(pilot, lambda: app.snapshot is not None and sum(r.count for r in app.snapshot.ranks) == total)
        await wait_for(pilot, lambda: len(app.snapshot.streams) == 6)
        assert app.query_one(StreamPanel).display and "lines: every collective" in panel(app)
        assert app.check_action("next_stream", ()) is True
        names = [f"{s.group_text} {s.op}" for s in app.snapshot.streams]
        seen = []
        for _ in range(7):
            before = app.snapshot.selected_stream
            await pilot.press("f")
            await wait_for(pilot, lambda b=before: app.snapshot.selected_stream != b)
            sel = app.snapshot.selected
            seen.append("all" if sel is None else f"{sel.group_text} {sel.op}")
        assert seen == [*names, "all"]
        await pilot.press("f", "f", "f", "f", "f", "f")  # the pair group of ranks 2 and 3
        await wait_for(pilot, lambda: app.snapshot.selected is not None and app.snapshot.selected.group == "2")
        await pilot.pause()
        lines, h = grid_text(app), app.query_one("#grid").row_h  # type: ignore[attr-defined]
        bars = [any(ch in "".join(lines[i : i + h]) for ch in "▁▂▃▄▅▆▇█") for i in range(0, len(lines), h)]
        assert bars == [False, False, True, True]  # ranks 0 and 1 are not in group 2
        assert "▶ 2:pair" in panel(app)
        pub.close()


@run_async
async def test_the_synthetic_loop_has_no_panel_and_no_f_key(connection: Connection) -> None:
    app = build_app(connection=connection, title="commtop test")
    async with app.run_test(size=SIZE) as pilot:
        pub = FakePublisher(app.source.endpoint, KEY, SESSION)  # type: ignore[union-attr]
        pub.send(frozen_run(world=2, iterations=200))
        await wait_for(pilot, lambda: app.snapshot is not None and sum(r.count for r in app.snapshot.ranks) == 400)
        await pilot.pause()
        assert not app.query_one(StreamPanel).display
        assert app.check_action("next_stream", ()) is False
        pub.close()


def test_the_stream_after_another_is_in_table_order_then_every_collective() -> None:
    from job_synth import T0

    from tui.model.run_model import RunModel
    from tui.model.streams import NEXT_STREAM

    model = RunModel(clock=lambda: T0)
    for _, m in job_run(world=4, steps=20):
        model.apply(m)
    table = [s.index for s in model.snapshot(fresh_run_stats=True).streams]
    chosen = []
    for _ in range(len(table) + 2):
        model.select_stream(NEXT_STREAM)
        chosen.append(model.selected_stream)
    assert chosen == [*table, -1, table[0]]


def test_the_panel_lists_streams_and_marks_the_selected_one() -> None:
    from job_synth import T0

    from tui.model.run_model import RunModel

    model = RunModel(clock=lambda: T0)
    for _, m in job_run(world=2, steps=20):
        model.apply(m)
    big = next(s for s in model.snapshot(fresh_run_stats=True).streams if s.nbytes == 4 << 20)
    model.select_stream(big.index)
    text = panel_text(model.snapshot(fresh_run_stats=True)).plain
    assert text.splitlines()[0].startswith("steps (whole run): 222.2/s · step p50 4.500 ms")
    assert "lines: 0:default_pg all_reduce float32 4MiB" in text
    marked = [line for line in text.splitlines() if line.startswith("▶")]
    assert len(marked) == 1 and "4MiB" in marked[0]
    assert panel_text(model.snapshot(fresh_run_stats=True), max_rows=2).plain.count("\n  0:default_pg") == 1
