"""The TUI's setting keys (o 1-4 c C s h d) and a, as the run allows them: the footer and the
help list only what works, a key the run has no setting for says why in the status line and
changes nothing (no epoch starts), and a's arms are checked before a block starts. The real
ControlServer learns what the run can change from its Hello (tui.model.changeable)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
from frozen_run import frozen_hello
from rich_text import plain
from textual.widgets import Input

from tui.model.run_model import RunModel
from tui.run.control_server import ControlServer
from tui.view.app import CommtopApp
from tui.view.widgets.help import HelpScreen
from tui.view.widgets.status import StatusLine
from tui.view.widgets.verdict import VerdictLine
from workers.wire import connection as connections
from workers.wire.settings import Settings

SETTING_KEYS = ("o", "1", "2", "3", "4", "c", "C", "s", "h", "d")
PLAIN = {"source": "monitor", "collective": "monitor: train_ddp_plain.py", "knobs": {}, "mode_knob": ""}
DDP = {
    "source": "monitor",
    "collective": "monitor: train_ddp.py",
    "knobs": {"offload": ["none", "overlap", "sync"]},
    "mode_knob": "offload",
}


@pytest.fixture()
def server(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[ControlServer]:
    monkeypatch.setenv(connections.RUNTIME_DIR_ENV, str(tmp_path / "rt"))
    srv = ControlServer(connections.create_run(label="test"), publish_s=0.1)
    yield srv
    srv.close()


def run_app(
    server: ControlServer, config: dict[str, Any], settings: Settings, body: Callable[..., Awaitable[None]]
) -> None:
    hello = frozen_hello(0, config=config, settings=settings.as_dict())
    server.write(hello)
    model = RunModel()
    model.apply(hello)

    async def main() -> None:
        app = CommtopApp(model=model, controller=server, links=False, title="commtop run")
        async with app.run_test(size=(160, 30)) as pilot:
            app.show_snapshot(model.snapshot())
            await pilot.pause()
            await body(app, pilot)

    asyncio.run(main())


def footer_keys(app: CommtopApp) -> set[str]:
    return {str(k.key) for k in app.query("FooterKey")}


def status_text(app: CommtopApp) -> str:
    return str(app.query_one(StatusLine).render())


def test_an_unmodified_job_offers_no_setting_key_and_refuses_each_with_the_reason(server: ControlServer) -> None:
    async def body(app: CommtopApp, pilot: Any) -> None:
        footer = footer_keys(app)
        assert not footer & {"o", "1", "c", "s", "h", "d", "a"}, footer
        for key in (*SETTING_KEYS, "a"):
            app.refused.why = ""
            await pilot.press(key)
            await pilot.pause()
            assert "train_ddp_plain.py has no live knobs" in status_text(app), key
            assert not isinstance(app.screen, HelpScreen) and len(app.screen_stack) == 1, key  # no A/B dialog
        assert server.desired == (0, Settings(mode="none", copies=0))  # no epoch started
        assert not app.ab.running
        # no verdict line: nothing to compare (its line goes to the ranks; the help and each key say why)
        assert not app.query_one(VerdictLine).display
        await pilot.press("question_mark")
        await pilot.pause()
        text = plain(app.screen.query_one("#help-text").content)
        assert "this run can change: nothing (no knobs)" in text
        assert "One copy per step fewer" not in text and "Next offload mode" not in text

    run_app(server, PLAIN, Settings(mode="none", copies=0), body)


def test_a_monitored_job_offers_its_mode_knob_only(server: ControlServer) -> None:
    async def body(app: CommtopApp, pilot: Any) -> None:
        footer = footer_keys(app)
        assert {"o", "1", "a"} <= footer and not footer & {"c", "s", "h", "d"}, footer
        await pilot.press("h")
        await pilot.pause()
        assert "train_ddp.py has no knob for pinned" in status_text(app)
        assert server.desired is not None and server.desired[0] == 0
        for _ in range(3):  # o cycles through the knob's own choices: sync -> none -> overlap, never sync-barrier
            await pilot.press("o")
            await pilot.pause()
        assert server.desired is not None and server.desired[0] == 3
        assert server.desired[1].knobs == {"offload": "overlap"} and server.desired[1].mode == "overlap"
        await pilot.press("question_mark")
        await pilot.pause()
        text = plain(app.screen.query_one("#help-text").content)
        assert "this run can change: knobs offload (none/overlap/sync)" in text and "Next offload mode" in text
        assert "pinned or pageable" not in text

    run_app(server, DDP, Settings(mode="overlap", copies=0, knobs={"offload": "overlap"}), body)


def test_a_checks_both_arms_before_a_block_starts(server: ControlServer) -> None:
    async def body(app: CommtopApp, pilot: Any) -> None:
        await pilot.press("a")
        await pilot.pause()
        assert app.screen.query_one("#ab-a", Input).value == "mode=none"
        assert app.screen.query_one("#ab-b", Input).value == "mode=overlap"
        app.screen.query_one("#ab-b", Input).value = "knob.offload=on"
        await pilot.press("enter")
        await pilot.pause()
        assert not app.ab.running and server.desired is not None and server.desired[0] == 0
        assert "arm B (knob.offload=on): knob.offload=on: choices none, overlap, sync" in status_text(app)

    run_app(server, DDP, Settings(mode="overlap", copies=0, knobs={"offload": "overlap"}), body)


def test_commtops_loop_offers_every_key(server: ControlServer) -> None:
    async def body(app: CommtopApp, pilot: Any) -> None:
        footer = footer_keys(app)
        assert {"o", "1", "c", "s", "h", "d", "a"} <= footer, footer
        await pilot.press("c")
        await pilot.pause()
        assert server.desired is not None and server.desired[0] == 1 and server.desired[1].copies == 4

    run_app(server, {"collective": "all_gather"}, Settings(), body)


def test_live_control_off_offers_no_setting_key(server: ControlServer) -> None:
    async def body(app: CommtopApp, pilot: Any) -> None:
        assert not footer_keys(app) & {"o", "1", "c", "s", "h", "d", "a"}
        await pilot.press("2")
        await pilot.pause()
        assert "live control is off in this run" in status_text(app)
        assert server.desired == (0, Settings())

    run_app(server, {"collective": "all_gather", "live_control": False}, Settings(), body)
