"""`commtop watch` says when ranks are missing and why they may be: before, a job whose ranks
never reached the collector showed `ranks 0/2` and nothing else. Pilot tests over the real
LiveSource; FakePublisher sends real signed frames over real ZeroMQ (one with another run's key)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from frozen_run import KEY, SESSION, FakePublisher, frozen_hello

from tui.run.connect_help import connect_lines
from tui.view.build import build_app
from tui.view.widgets import missing_ranks
from tui.view.widgets.status import StatusLine
from workers.wire.connection import Connection


async def _status_says(pilot: Any, app: Any, words: str, timeout_s: float = 15.0) -> str:
    deadline = time.monotonic() + timeout_s
    while True:
        text = app.query_one(StatusLine).render().plain
        if words in text:
            return str(text)
        assert time.monotonic() < deadline, f"{words!r} never shown; status: {text!r}"
        await pilot.pause(0.1)


def test_watch_says_no_rank_said_hello_and_what_to_check(connection: Connection, monkeypatch) -> None:
    monkeypatch.setattr(missing_ranks, "NO_HELLO_S", 0.5)

    async def scenario() -> None:
        app = build_app(connection=connection, title="commtop watch", connect=connect_lines(connection))
        async with app.run_test(size=(200, 40)) as pilot:
            endpoint = app.source.endpoint  # type: ignore[union-attr]
            stranger = FakePublisher(endpoint, bytes(32), SESSION)  # another run's key
            stranger.send([frozen_hello(0, 2)])
            text = await _status_says(pilot, app, "frames refused")
            assert "no rank has said hello in" in text and "another run's key" in text
            assert "-m workers.capture.bootstrap" in text and "COMMTOP_CONNECTION_FILE" in text
            pub = FakePublisher(endpoint, KEY, SESSION)
            pub.send([frozen_hello(0, 2)])
            text = await _status_says(pilot, app, "ranks 1 of 2 have not said hello")
            pub.send([frozen_hello(1, 2)])
            deadline = time.monotonic() + 10
            while "said hello" in app.query_one(StatusLine).render().plain:
                assert time.monotonic() < deadline, "still said once every rank said hello"
                await pilot.pause(0.1)
            stranger.close()
            pub.close()

    asyncio.run(scenario())


def test_nothing_is_said_before_the_wait_or_once_every_rank_is_there() -> None:
    from tui.model.snapshot import RankView, Snapshot

    now = [0.0]
    watch = missing_ranks.MissingRanks(watch=True, clock=lambda: now[0])
    assert watch.lines(None) == []  # still within NO_HELLO_S
    now[0] = missing_ranks.NO_HELLO_S + 1
    assert watch.lines(None)[0] == f"no rank has said hello in {missing_ranks.NO_HELLO_S + 1:.0f} s"
    both = Snapshot(now_ns=0, ranks=(RankView(rank=0), RankView(rank=1)), world_size=2)
    assert watch.lines(both) == []
    run = missing_ranks.MissingRanks(watch=False, clock=lambda: now[0])
    now[0] += missing_ranks.NO_HELLO_S
    assert "COMMTOP_CAPTURE=off" in run.lines(None)[1]  # a job commtop started: other reasons
