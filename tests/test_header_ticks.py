"""The header between two text ticks: the screen's snapshots then keep the last full one's ranks
and all the header reads (tui.model.snapshot_builder._between_ticks), so the three lines are not
rebuilt; a new tick, a control or recording change and a resize rebuild them."""

from __future__ import annotations

import asyncio

import pytest
from frozen_run import frozen_run

import tui.view.widgets.header as header
from tui.ingest.interfaces import RecordingStatus
from tui.model.run_model import RunModel
from tui.view.app import CommtopApp
from tui.view.widgets.header import RunHeader

T0 = 1_700_000_000_000_000_000


def test_the_header_is_rebuilt_at_text_ticks_not_between_them(monkeypatch: pytest.MonkeyPatch) -> None:
    messages = frozen_run(world=2, iterations=400)
    quarter = len(messages) // 4  # both quarters in one mode (the second half changes it)
    now, wall = [T0], [0.0]
    model = RunModel(clock=lambda: now[0])
    model._builder.wall = lambda: wall[0]  # noqa: SLF001 - the builder's wall clock, as in test_model
    for m in messages[:quarter]:
        model.apply(m)
    tick = model.snapshot(text_every_s=0.2)
    for m in messages[quarter : 2 * quarter - 2]:
        model.apply(m)
    now[0] += int(0.1e9)
    wall[0] += 0.1
    between = model.snapshot(text_every_s=0.2)
    assert between.ranks is tick.ranks and between.history is not tick.history  # the premise
    wall[0] += 0.25
    now[0] += int(0.25e9)
    next_tick = model.snapshot(text_every_s=0.2)
    assert next_tick.ranks is not tick.ranks

    built: list[int] = []
    real = header.header_text
    monkeypatch.setattr(header, "header_text", lambda *a, **k: (built.append(1), real(*a, **k))[1])

    async def body() -> list[int]:
        app = CommtopApp(links=False)
        counts = []
        async with app.run_test(size=(140, 40)) as pilot:
            head = app.query_one(RunHeader)
            app.show_snapshot(tick)
            await pilot.pause()
            built.clear()
            app.show_snapshot(between)
            counts.append(len(built))  # 0: only the history moved
            app.show_snapshot(next_tick)
            counts.append(len(built))  # 1: a new text tick
            head.show(next_tick, None, RecordingStatus(active=True, path="x.commtop", bytes_written=10))
            counts.append(len(built))  # 2: the recording changed
            head.show(next_tick, None, RecordingStatus(active=True, path="x.commtop", bytes_written=10))
            counts.append(len(built))  # 2: nothing changed
            await pilot.resize_terminal(100, 40)
            await pilot.pause()
            counts.append(len(built))  # 3: a new width
            assert "REC" in head._text.plain  # noqa: SLF001
        return counts

    counts = asyncio.run(body())
    assert counts[:4] == [0, 1, 2, 2]
    assert counts[4] >= 3
