"""The app as a newcomer meets it: how to connect inside `watch`, help and command palette, ctrl+c,
SIGTERM, banners that say the change made. Pilot tests over the real LiveSource where data
is needed (FakePublisher sends real signed frames over real ZeroMQ)."""

from __future__ import annotations

import io
import shutil
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from app_pilot import run_async, wait_for
from frozen_run import KEY, SESSION, FakePublisher, frozen_hello

from tui.run.connect_help import connect_lines
from tui.view.app import CommtopApp
from tui.view.build import build_app
from tui.view.widgets.connect import ConnectPanel
from workers.wire.connection import Connection
from workers.wire.settings import Settings, settings_from_wire

SIZE = (120, 36)


@run_async
async def test_watch_shows_how_to_connect_until_the_first_rank_and_again_on_i(connection: Connection) -> None:
    app = build_app(connection=connection, title="commtop watch", connect=connect_lines(connection))
    async with app.run_test(size=SIZE) as pilot:
        panel = app.query_one(ConnectPanel)
        await pilot.pause()
        shown = panel.render().plain
        assert panel.display and connection.path in shown
        assert f"--connection-file {connection.path}" in shown and f"COMMTOP_CONNECTION_FILE={connection.path}" in shown
        pub = FakePublisher(app.source.endpoint, KEY, SESSION)  # type: ignore[union-attr]
        pub.send([frozen_hello(0, 1)])
        await wait_for(pilot, lambda: app.snapshot is not None and len(app.snapshot.ranks) == 1)
        await pilot.pause()
        assert not panel.display  # a rank arrived: the chart gets the room
        await pilot.press("i")
        assert panel.display
        await pilot.press("i")
        assert not panel.display
        pub.close()


@run_async
async def test_i_is_not_offered_where_there_is_nothing_to_connect() -> None:
    app = CommtopApp(links=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert not app.query(ConnectPanel) and app.check_action("toggle_connect", ()) is False


@run_async
async def test_help_on_question_mark_and_f1_lists_every_key() -> None:
    from rich.console import Console
    from textual.widgets import Static

    from tui.view.keys import KEYS
    from tui.view.widgets.help import HelpScreen, key_name

    app = CommtopApp(links=False)
    async with app.run_test(size=(120, 50)) as pilot:
        for key in ("question_mark", "f1"):
            await pilot.press(key)
            await pilot.pause()
            assert isinstance(app.screen, HelpScreen)
            console = Console(width=200, record=True, file=io.StringIO())
            console.print(app.screen.query_one("#help-text", Static).content)
            text = console.export_text()
            elsewhere = "\n".join(
                ln for ln in text.splitlines() if ln.startswith(("not in this session:", "replay only:"))
            )
            for k in KEYS:
                if not (k.show or k.display):
                    continue
                if app._available(k.action):
                    assert k.help in text and key_name(k.keys, k.display) in text
                else:  # named (so a newcomer learns it), not offered
                    assert k.help not in text and f" {key_name(k.keys, k.display)}" in elsewhere
            assert "replay only: space + - ← → n p" in text  # no replay here
            assert "Next offload mode" not in text  # no controller here (a bare app)
            await pilot.press("escape")
            await pilot.pause()
            assert not isinstance(app.screen, HelpScreen)


@run_async
async def test_command_palette_offers_every_available_action() -> None:
    from tui.view.keys import KEYS

    app = CommtopApp(links=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        titles = [c.title for c in app.get_system_commands(app.screen)]
        for k in KEYS:
            if app.check_action(k.action.partition("(")[0], ()) is not False:
                assert any(t.startswith(k.help) for t in titles), k
        assert not any(t.startswith("Pause or resume the replay") for t in titles)  # not a replay
        await pilot.press("ctrl+p")
        await pilot.pause()
        assert type(app.screen).__name__ == "CommandPalette"
        await pilot.press(*"latency heat")
        await pilot.pause(0.3)
        await pilot.press("enter")
        await pilot.pause(0.3)
        from tui.view.widgets.rank_grid import RankGrid

        assert app.query_one(RankGrid).view_mode in ("rows", "heat")  # the palette ran toggle_view


@run_async
async def test_ctrl_c_quits() -> None:
    app = CommtopApp(links=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert app.return_code is None
        await pilot.press("ctrl+c")
        await pilot.pause()
        assert app.return_code == 0  # exited (Textual's default only says "press ctrl+q")
        assert app.stopped_by == signal.SIGINT  # the command then exits 130, as a shell's Ctrl-C says


@pytest.mark.e2e
def test_sigterm_restores_the_terminal() -> None:
    """The real `commtop replay` on a pseudo-terminal: SIGTERM ends it through the event loop,
    so it leaves the alternate screen, shows the cursor and turns mouse reporting off."""
    import os
    import signal as sig

    from synthetic_ranks import PY, REPO, PtyProc

    tui = PtyProc(
        [PY, "-m", "tui.cli", "replay", str(REPO / "recordings" / "cpu-gloo-4ranks-all_gather-modes.commtop")],
        dict(os.environ),
    )
    try:
        tui.first_seen("rows/heat", timeout_s=60)  # the footer is drawn: Textual owns the terminal
        tui.proc.send_signal(sig.SIGTERM)
        assert tui.wait(30) == 0  # replay starts no job: a SIGTERM is its normal end
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            with tui._lock:
                out = b"".join(data for _, data in tui._chunks)
            if b"\x1b[?1049l" in out:
                break
            time.sleep(0.05)
        tail = out[out.rfind(b"rows/heat") :]
        assert b"\x1b[?1049l" in tail  # left the alternate screen
        assert b"\x1b[?25h" in tail  # cursor shown again
        assert b"\x1b[?1000l" in tail or b"\x1b[?1003l" in tail  # mouse reporting off
    finally:
        tui.kill_all()


def test_the_first_step_is_left_out_of_the_straggler_headline() -> None:
    """Rank 0 arrives 60 ms late at iteration 1 (start-up) and 20 ms late at iteration 100:
    the headline names iteration 100, not the start-up."""
    import numpy as np
    from frozen_run import frozen_coll

    from tui.model.run_model import RunModel
    from tui.view.widgets.header import skew_text

    model = RunModel()
    for r in range(2):
        model.apply(frozen_hello(r, 2))
    its = np.arange(200)
    for r in range(2):
        dur = np.full(200, 2000.0)
        if r == 1:  # rank 1 waits for rank 0: rank 0 is the straggler
            dur[1], dur[100] = 62_000.0, 22_000.0
        model.apply(frozen_coll(r, 0, its, dur))
    snap = model.snapshot()
    assert snap.worst_skew is not None and snap.worst_skew.iteration == 100
    assert "rank 0 arrived 20.0 ms late at iteration 100" in skew_text(snap)


def test_host_line_says_what_tick_and_drops_are() -> None:
    from frozen_links import fixture_ticks

    from tui.model.telemetry import TelemetryModel
    from workers.wire.telemetry import Tick

    model = TelemetryModel()
    msgs = fixture_ticks("node-a", 10**18, 1)
    for m in msgs:
        model.apply(m)
    last = msgs[-1]
    model.apply(Tick(**{**last.__dict__, "t_ns": last.t_ns + 10**8, "dropped": 3}))
    line = model.snapshot(last.t_ns + 10**8).host_line()
    assert "sampler " in line and " ms/tick" in line and "3 sampler ticks dropped" in line
    assert "drop 3" not in line


def test_whole_run_row_says_which_number_is_the_max() -> None:
    from frozen_run import frozen_snapshot

    from tui.view.widgets.grid_cells import bucket
    from tui.view.widgets.rank_rows import RowsView

    snap = frozen_snapshot(world=2)
    view = RowsView(snap, bucket(snap.history, 40, 1), 15.0, 120, row_h=3)
    lines = [view.line(i) for i in range(view.n_lines)]
    run_line = "".join(seg.text for seg in lines[1])
    assert "whole run" in run_line and "whole run max" not in run_line and " max 12." in run_line


def _monitor_hello(rank: int = 0) -> Any:
    from workers.wire.settings import Settings

    return frozen_hello(
        rank,
        1,
        backend="gloo/cpu",
        config={
            "source": "monitor",
            "collective": "monitor: train_ddp.py",
            "knobs": {"offload": ["none", "overlap", "sync"]},
            "mode_knob": "offload",
            "control_unit": "step",
        },
        settings=Settings(mode="overlap", copies=0, knobs={"offload": "overlap"}).as_dict(),
    )


@run_async
async def test_own_job_refuses_keys_it_has_no_knob_for(tmp_path: Path, monkeypatch: Any) -> None:
    """`commtop run -- python examples/train_ddp.py`: the real ControlServer learns the job's
    knobs from its Hello; c / s / h / d and mode 4 are refused with a message, 3 is accepted."""
    from tui.model.run_model import RunModel
    from tui.run.control_server import ControlServer
    from workers.wire import connection as connections

    monkeypatch.setenv(connections.RUNTIME_DIR_ENV, str(tmp_path / "rt"))
    conn = connections.create_run(label="test")
    server = ControlServer(conn, publish_s=0.1)
    try:
        hello = _monitor_hello()
        server.write(hello)
        model = RunModel()
        model.apply(hello)
        app = CommtopApp(model=model, controller=server, links=False, title="commtop run")
        async with app.run_test(size=(140, 30)) as pilot:
            app.show_snapshot(model.snapshot())
            await pilot.pause()
            header = str(app.query_one("#header").render())
            assert "job train_ddp.py" in header and "?" not in header.split("\n")[0]
            assert "knobs offload=overlap" in header and "{" not in header
            for key, word in (("c", "copies"), ("s", "copy scale"), ("h", "pinned"), ("d", "direction")):
                await pilot.press(key)
                await pilot.pause()
                toasts = [n.message for n in app._notifications]
                assert any(f"train_ddp.py has no knob for {word}" in t for t in toasts), (key, toasts)
            assert server.desired[0] == 0  # nothing was accepted
            await pilot.press("4")
            await pilot.pause()
            assert any(
                "mode=sync-barrier: train_ddp.py's offload knob takes none, overlap, sync" in n.message
                for n in app._notifications
            )
            await pilot.press("3")
            await pilot.pause()
            assert server.desired[0] == 1 and server.desired[1].knobs == {"offload": "sync"}
    finally:
        server.close()


def test_a_narrow_header_is_condensed_not_cut() -> None:
    from dataclasses import replace

    from frozen_run import frozen_snapshot

    from tui.ingest.interfaces import ControlView
    from tui.view.widgets.header import header_text

    base = {"mode": "overlap", "copies": 5, "copy_scale": 1.0, "pinned": True, "direction": "d2h"}
    snap = replace(
        frozen_snapshot(world=4, gpus=1), settings=Settings(**base), epoch_in_force=1, pending_epoch=2, apply_at=640
    )
    view = ControlView(requested=Settings(**{**base, "mode": "none"}))
    wide = header_text(snap, view, title="commtop run", width=200).plain.split("\n")
    narrow = header_text(snap, view, title="commtop run", width=80).plain.split("\n")
    assert max(len(line) for line in wide) > 80  # the full header would be cut at 80 columns
    assert all(len(line) <= 80 for line in narrow), narrow
    assert "world 4" in narrow[0] and "all_gather 1024x1024 float32" in narrow[0]
    assert "⇢ mode overlap → none at it 640" in narrow[1] and "cpu " in narrow[2]


def test_an_80_column_grid_leaves_more_chart_columns() -> None:
    from tui.view.widgets.grid_cells import FIXED_W, fixed_width

    assert 80 - fixed_width(80) >= 2 * (80 - FIXED_W)  # 37 columns of chart instead of 14
    assert fixed_width(200) == FIXED_W  # wide terminals keep host:gpu and copy


@run_async
async def test_the_footer_shows_modes_copies_and_the_replay_keys() -> None:
    """Live with a controller: 1-4 and c/C; in a replay: +, -, ←, →, n and p (the grid's own
    ←/→ scrolling must not shadow the seek keys)."""
    from recording_synth import synth_run, write_recording

    from tui.model.run_model import RunModel
    from tui.recordings.reader import open_recording
    from tui.recordings.replay import ReplaySource

    class Controller:
        def request(self, changes: dict[str, Any]) -> str:
            return ""

        def view(self) -> Any:
            return None

    def shown(app: CommtopApp) -> dict[str, str]:
        return {k: b.binding.action for k, b in app.screen.active_bindings.items() if b.binding.show and b.enabled}

    app = CommtopApp(links=False, controller=Controller())
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        keys = shown(app)
        assert keys["1"] == "pick_mode(0)" and keys["c"] == "copies(-1)"
    path = Path(tempfile.mkdtemp(prefix="nc-rec-", dir="/tmp")) / "run.commtop"
    try:
        write_recording(path, list(synth_run(duration_s=2.0, world=1, seed=2)))
        source = ReplaySource(open_recording(path), clock=lambda: 0.0)
        app = CommtopApp(source, RunModel(), links=False, owns_source=True)
        async with app.run_test(size=(160, 30)) as pilot:
            await pilot.pause()
            keys = shown(app)
            for key, action in (
                ("plus", "replay_speed(1)"),
                ("minus", "replay_speed(-1)"),
                ("left", "replay_seek(-5)"),
                ("right", "replay_seek(5)"),
                ("n", "replay_jump(1)"),
                ("p", "replay_jump(-1)"),
            ):
                assert keys.get(key) == action, (key, keys)
    finally:
        shutil.rmtree(path.parent, ignore_errors=True)


@run_async
async def test_after_c_the_banner_says_the_change_made() -> None:
    """C with copies 5 in force: the toast and the header's switch banner say "copies 5 → 6",
    not the mode. (Test-only controller: accepts and remembers what it was asked.)"""
    from dataclasses import replace

    from frozen_run import frozen_snapshot

    from tui.ingest.interfaces import ControlView
    from tui.view.widgets.header import header_text

    class Controller:
        def __init__(self) -> None:
            self.requested: dict[str, Any] = {}

        def request(self, changes: dict[str, Any]) -> str:
            self.requested.update(changes)
            return ""

        def view(self) -> ControlView | None:
            return ControlView(requested=settings_from_wire(self.requested)) if self.requested else None

    controller = Controller()
    app = CommtopApp(links=False, controller=controller)
    async with app.run_test(size=SIZE) as pilot:
        snap = frozen_snapshot(world=2)
        app.show_snapshot(snap)
        controller.requested = snap.settings.as_dict()
        await pilot.press("C")
        await wait_for(pilot, lambda: any(n.message.startswith("requested") for n in app._notifications))
        assert controller.requested["copies"] == 6
        assert [n.message for n in app._notifications] == ["requested copies 5 → 6"]
        pending = replace(snap, pending_epoch=snap.epoch_in_force + 1, apply_at=640)
        text = header_text(pending, app.controller.view()).plain  # type: ignore[union-attr]
        assert "⇢ switching copies 5 → 6 at iteration 640" in text and "switching to" not in text


@run_async
async def test_keys_a_replay_does_not_offer_say_why() -> None:
    """A replay has no job and nothing to change: l and o did nothing and said nothing (QA7);
    the help screen marked them "not in this session". Now the status line says why."""
    app = CommtopApp(links=False)  # no controller, no job: as a replay
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("l")
        await pilot.pause()
        assert "no job's output here" in app.refused.why
        await pilot.press("o")
        await pilot.pause()
        assert "nothing to change" in app.refused.why
