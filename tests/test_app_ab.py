"""Key a: the A/B dialog, a running experiment in the verdict line, stopping it early."""

from __future__ import annotations

import asyncio
from typing import Any

from textual.widgets import Input

from tui.ingest.interfaces import ControlView
from tui.model.changeable import Changeable
from tui.view.app import CommtopApp
from tui.view.widgets.verdict import VerdictLine
from workers.wire.settings import Settings


class FakeController:
    """Test-only controller: accepts every change and numbers the epochs (no workers)."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.epoch = 3

    def request(self, changes: dict[str, Any], new_epoch: bool = False) -> str:
        self.requests.append(dict(changes))
        self.epoch += 1
        return ""

    @property
    def desired(self) -> tuple[int, Any]:
        return (self.epoch, None)

    def view(self) -> ControlView:
        return ControlView(requested=Settings(mode="sync", copies=5), can_change=Changeable.loop(2))


def test_key_a_opens_the_dialog_and_starts_an_experiment() -> None:
    asyncio.run(_key_a())


async def _key_a() -> None:
    ctl = FakeController()
    app = CommtopApp(title="commtop run", links=False, controller=ctl)
    async with app.run_test(size=(140, 30)) as pilot:
        await pilot.press("a")
        await pilot.pause()
        assert app.screen.query_one("#ab-a", Input).value == "mode=none"
        assert app.screen.query_one("#ab-b", Input).value == "mode=sync"  # the current settings
        app.screen.query_one("#ab-duration", Input).value = "nonsense"
        await pilot.press("enter")
        await pilot.pause()
        assert not app.ab.running  # a bad value starts nothing
        app.screen.query_one("#ab-duration", Input).value = "20"
        await pilot.press("enter")
        await pilot.pause()
        assert app.ab.running
        app._side_poll()  # one tick: the first block is requested
        assert ctl.requests[0] in ({"mode": "none"}, {"mode": "sync"})
        assert app.query_one(VerdictLine)._text.startswith("A/B running: 1 blocks")
        await pilot.press("a")  # stops it early
        await pilot.pause()
        assert not app.ab.running
        assert ctl.requests[-1] == {"mode": "sync"}  # the settings from before are restored
