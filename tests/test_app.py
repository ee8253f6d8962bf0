"""The app under Textual's Pilot: live data through the real LiveSource, keys to the
controller / recorder / replay, views, the status line, and a flood that must not freeze it."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import replace
from typing import Any

import numpy as np
from app_pilot import run_async, wait_for
from frozen_run import KEY, SESSION, T0, FakePublisher, frozen_coll, frozen_hello, frozen_run, frozen_snapshot

from tui.ingest.interfaces import ControlView, RecordingStatus, ReplayPosition
from tui.view.app import CommtopApp
from tui.view.build import build_app
from tui.view.widgets.header import header_text
from tui.view.widgets.rank_grid import RankGrid
from tui.view.widgets.status import StatusLine
from workers.wire.connection import Connection
from workers.wire.settings import Settings, settings_from_wire

SIZE = (120, 36)


def grid_text(app: CommtopApp) -> list[str]:
    return app.query_one(RankGrid).line_texts()


@run_async
async def test_live_source_to_two_rank_rows(connection: Connection) -> None:
    app = build_app(connection=connection, title="commtop test")
    async with app.run_test(size=SIZE) as pilot:
        pub = FakePublisher(app.source.endpoint, KEY, SESSION)  # type: ignore[union-attr]
        pub.send(frozen_run(world=2, iterations=200))
        await wait_for(pilot, lambda: app.snapshot is not None and sum(r.count for r in app.snapshot.ranks) == 400)
        # the bars, not only the counts (once seen missing from the first drawn rows on a loaded machine)
        await wait_for(pilot, lambda: any(ch in grid_text(app)[0] for ch in "▁▂▃▄▅▆▇█"))
        lines = grid_text(app)
        grid = app.query_one(RankGrid)
        assert len(lines) == 2 * grid.row_h and grid.row_h > 1  # room for taller bars
        rows = lines[:: grid.row_h]
        assert lines[1].strip().startswith("whole run") and " max " in lines[1]
        assert rows[0].startswith("●     0  node-a:cpu") and rows[1].startswith("●     1◀ node-a:cpu")
        assert any(ch in rows[0] for ch in "▁▂▃▄▅▆▇█")
        header = app.query_one("#header").render().plain
        assert "backend gloo/cpu" in header and "world 2" in header and "all_gather 1024x1024 float32" in header
        pub.close()
    assert app.ingest is not None and not app.ingest.running


class FakeController:
    """Test-only controller: remembers requests; refuses copies above 6."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.settings = {"mode": "overlap", "copies": 5, "copy_scale": 1.0, "pinned": True, "direction": "d2h"}

    def request(self, changes: dict[str, Any]) -> str:
        self.requests.append(dict(changes))
        if changes.get("copies", 0) > 6:
            return "copies must be at most 6 here"
        self.settings.update(changes)
        return ""

    def view(self) -> ControlView:
        return ControlView(requested=settings_from_wire(self.settings))


@run_async
async def test_control_keys_request_changes_and_show_refusals() -> None:
    ctl = FakeController()
    app = CommtopApp(controller=ctl, links=False)
    async with app.run_test(size=SIZE) as pilot:
        app.show_snapshot(frozen_snapshot(world=2))
        await pilot.press("o", "3", "C", "C", "c", "s", "h", "d")
        # every key handled before the app closes (one pause was not enough on a loaded machine: a
        # key still queued met an app without screens, ScreenStackError)
        await wait_for(pilot, lambda: len(ctl.requests) == 8)
        await pilot.pause()
    assert ctl.requests == [
        {"mode": "sync"},
        {"mode": "sync"},
        {"copies": 6},
        {"copies": 7},
        {"copies": 5},
        {"copy_scale": 2.0},
        {"pinned": False},
        {"direction": "h2d"},
    ]
    messages = [n.message for n in app._notifications]
    assert "copies must be at most 6 here" in messages


@run_async
async def test_control_keys_do_nothing_without_a_controller() -> None:
    app = CommtopApp(links=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("o", "c")
        assert app.check_action("cycle_mode", ()) is False


class FakeRecorder:
    def __init__(self) -> None:
        self.active = False
        self.calls: list[str] = []

    def write(self, message: Any) -> None:
        pass

    def start(self, path: str | None = None) -> str:
        self.active = True
        self.calls.append("start")
        return "/tmp/rec.commtop"

    def stop(self) -> None:
        self.active = False
        self.calls.append("stop")

    def status(self) -> RecordingStatus:
        return RecordingStatus(active=self.active, path="/tmp/rec.commtop", bytes_written=3 * 2**20, elapsed_s=65)


@run_async
async def test_r_toggles_the_recorder_and_the_header_shows_it() -> None:
    rec = FakeRecorder()
    app = CommtopApp(recorder=rec, links=False)
    async with app.run_test(size=SIZE) as pilot:
        app.show_snapshot(frozen_snapshot(world=2))
        await pilot.press("r")
        await pilot.pause()
        assert "● REC 3.0 MiB 1:05" in app.query_one("#header").render().plain
        await pilot.press("r")
        await pilot.pause()
        assert "rec off" in app.query_one("#header").render().plain
    assert rec.calls == ["start", "stop"]


class FakeReplay:
    """Test-only replay source: no messages; records the controls used."""

    def __init__(self) -> None:
        self.rejected: Counter[str] = Counter()
        self.calls: list[tuple[str, Any]] = []
        self.speed = 1.0
        self.paused = False

    def poll(self, timeout_s: float) -> list[Any]:
        time.sleep(min(timeout_s, 0.01))
        return []

    def close(self) -> None:
        pass

    def toggle_pause(self) -> None:
        self.paused = not self.paused
        self.calls.append(("pause", self.paused))

    def set_speed(self, factor: float) -> None:
        self.speed = factor
        self.calls.append(("speed", factor))

    def seek(self, delta_s: float) -> None:
        self.calls.append(("seek", delta_s))

    def jump_change(self, direction: int) -> None:
        self.calls.append(("jump", direction))

    def position(self) -> ReplayPosition:
        return ReplayPosition(30.0, 120.0, self.speed, self.paused, changes_s=(60.0,))


@run_async
async def test_replay_keys_and_progress_bar() -> None:
    replay = FakeReplay()
    app = CommtopApp(replay, links=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("space", "plus", "minus", "minus", "right", "left", "n", "p")
        await pilot.pause()
        bar = app.query_one("#replay").render().plain
        assert bar.startswith(" ‖ 0:30 ") and "2:00" in bar and "◆" in bar and "×0.5" in bar
    assert replay.calls == [
        ("pause", True),
        ("speed", 2.0),
        ("speed", 1.0),
        ("speed", 0.5),
        ("seek", 5),
        ("seek", -5),
        ("jump", 1),
        ("jump", -1),
    ]


@run_async
async def test_v_toggles_rows_and_heat_map_and_many_ranks_switch_automatically() -> None:
    app = CommtopApp(links=False)
    async with app.run_test(size=SIZE) as pilot:
        app.show_snapshot(frozen_snapshot(world=8))
        await pilot.pause()
        grid = app.query_one(RankGrid)
        assert grid.shown_view == "rows"
        assert app.whole_run_stats  # the rows view draws whole-run numbers: refreshed
        await pilot.press("v")
        assert grid.shown_view == "heat"
        assert not app.whole_run_stats  # the heat map draws none
        assert grid_text(app)[0].startswith("mode")
        await pilot.press("v")
        assert grid.shown_view == "rows" and app.whole_run_stats
        grid.view_mode = "auto"
        app.show_snapshot(frozen_snapshot(world=64, iterations=200))
        await pilot.pause()
        assert grid.shown_view == "heat" and not app.whole_run_stats
        assert len(grid_text(app)) == 1 + 32  # mode line + two ranks per line


class FakeJob:
    def __init__(self, code: int | None, lines: list[str]) -> None:
        self.code = code
        self._lines = lines

    def lines(self) -> list[str]:
        return self._lines

    def exit_code(self) -> int | None:
        return self.code


@run_async
async def test_status_line_shows_the_job_failure() -> None:
    job = FakeJob(None, ["starting 2 ranks"])
    app = CommtopApp(process_watch=job, links=False, hint="listening on ipc://x")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert app.query_one(StatusLine).render().plain == "listening on ipc://x"
        job.code, job._lines = 1, ["[rank1]: RuntimeError: boom"]
        await pilot.pause(0.4)
        assert (
            app.query_one(StatusLine).render().plain.startswith("✗ job exited with code 1: [rank1]: RuntimeError: boom")
        )


class FakeFloodSource:
    """Test-only source that never runs dry: 2000 records of 2 ranks every poll."""

    def __init__(self) -> None:
        self.rejected: Counter[str] = Counter()
        self.seq = 0

    def poll(self, timeout_s: float) -> list[Any]:
        out = []
        for _ in range(20):
            lo = self.seq * 50
            its = range(lo, lo + 50)
            out += [frozen_coll(r, self.seq, its, np.full(50, 1000.0)) for r in (0, 1)]
            self.seq += 1
        return out

    def close(self) -> None:
        pass


@run_async
async def test_a_flood_does_not_freeze_the_keyboard() -> None:
    """Keys are handled promptly while ingest runs flat out. (Pilot's own idle wait
    cannot be used as the measure: it waits for the *process* to idle, which a flood
    never lets happen, so we time when the action itself ran.)"""
    app = CommtopApp(FakeFloodSource(), links=False)
    ran: list[float] = []
    toggle = app.action_toggle_view

    def timed_toggle() -> None:
        ran.append(time.monotonic())
        toggle()

    app.action_toggle_view = timed_toggle  # type: ignore[method-assign]
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.applied >= 2)
        before = app.model.records
        t0 = time.monotonic()
        await pilot.press("v")
        assert ran and ran[0] - t0 < 2.0  # queued behind the flood it would wait for the flood to end
        assert app.query_one(RankGrid).shown_view == "heat"
        await wait_for(pilot, lambda: app.applied >= 4)
    assert app.model.records > before


def test_header_text_without_data_and_with_pending_switch() -> None:
    assert "waiting for ranks" in header_text(None).plain
    base = {"copies": 5, "copy_scale": 1.0, "pinned": True, "direction": "d2h"}
    snap = replace(
        frozen_snapshot(world=2),
        settings=Settings(mode="overlap", **base),
        epoch_in_force=3,
        pending_epoch=4,
        apply_at=640,
    )
    view = ControlView(requested=Settings(mode="sync", **base))
    text = header_text(snap, view).plain
    assert "mode  overlap " in text and "epoch 3" in text and "⇢ switching mode overlap → sync at iteration 640" in text


def test_header_says_the_ranks_exited_once_the_job_ended() -> None:
    """After the job ended the header read "ranks 0/2" in the warning colour (QA: a fault?)."""
    from tui.model.run_model import RunModel
    from workers.wire import protocol as p

    model = RunModel()
    for m in frozen_run(world=2, iterations=100):
        model.apply(m)
    assert "ranks 2/2" in header_text(model.snapshot()).plain
    for rank in (0, 1):
        model.apply(p.Bye(rank, 0, "finished", T0 + 10**9))
    text = header_text(model.snapshot()).plain
    assert "ranks 2 exited" in text
    assert "it/s -" in text  # the newest seconds' rate of a run that ended is no rate (it read the last one)


def test_header_counts_stalled_ranks_as_there_not_gone() -> None:
    """A job's data-loader stall (heartbeats, no collective for 2 s): the header read "ranks 0/2"
    while both rows said "heartbeat alive"."""
    from dataclasses import replace

    snap = frozen_snapshot(world=2, iterations=100)
    stalled = replace(snap, ranks=tuple(replace(r, state="stalled") for r in snap.ranks))
    assert "ranks 2/2 (2 stalled)" in header_text(stalled).plain


def test_header_text_shows_hello_only_runs() -> None:
    from tui.model.run_model import RunModel

    model = RunModel()
    model.apply(frozen_hello(0, world=4, backend="nccl"))
    text = header_text(model.snapshot()).plain
    assert "backend nccl on NVIDIA H200" in text and "ranks 0/4" in text


@run_async
async def test_status_line_shows_a_worker_traceback_while_the_job_runs_and_a_clean_finish() -> None:
    job = FakeJob(None, ["rank 0 ok", "[rank1]: Traceback (most recent call last):", "[rank1]: ValueError: bad"])
    app = CommtopApp(process_watch=job, links=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert app.query_one(StatusLine).render().plain == "✗ worker: [rank1]: ValueError: bad"
        job.code, job._lines = 0, []
        await pilot.pause(0.4)
        assert app.query_one(StatusLine).render().plain == "job finished (exit code 0) · q to quit"


def test_header_lists_rejections_by_reason() -> None:
    from dataclasses import replace

    snap = replace(frozen_snapshot(world=2), rejected={"signature": 2, "version": 1})
    assert "rejected 3 (signature 2, version 1)" in header_text(snap).plain


def test_header_shows_only_the_requested_changes_not_yet_in_force() -> None:
    base = {"mode": "overlap", "copies": 5, "copy_scale": 1.0, "pinned": True, "direction": "d2h"}
    snap = replace(frozen_snapshot(world=2), settings=Settings(**base), epoch_in_force=3)
    view = ControlView(requested=Settings(**{**base, "mode": "sync", "pinned": False}))
    text = header_text(snap, view).plain
    assert "requested mode overlap → sync, pinned → pageable (not yet in force)" in text
    same = ControlView(requested=Settings(**base))
    assert "requested" not in header_text(snap, same).plain


def test_rows_mark_failed_exits_red_and_clean_exits_dim() -> None:
    from tui.model.run_model import RunModel
    from tui.view.widgets.grid_cells import bucket
    from tui.view.widgets.palette import EXITED, style
    from tui.view.widgets.rank_rows import RowsView
    from workers.wire.protocol import Bye

    model = RunModel()
    for m in frozen_run(world=2, iterations=100):
        model.apply(m)
    model.apply(Bye(rank=0, exit_code=0, reason="", t_ns=2**62))
    model.apply(Bye(rank=1, exit_code=3, reason="CUDA error", t_ns=2**62))
    snap = model.snapshot()
    view = RowsView(snap, bucket(snap.history, 60, 1), 15.0, 150)
    lines = [view.line(i) for i in range(view.n_lines)]
    text = ["".join(seg.text for seg in line) for line in lines]
    assert text[0].startswith("✓") and "exited (0)" in text[0]
    assert text[1].startswith("✗") and "exited (3): CUDA error" in text[1]
    assert lines[1][0].style == style(EXITED) and lines[0][0].style != style(EXITED)


@run_async
async def test_an_unchanged_links_panel_is_not_repainted_but_a_changed_one_is() -> None:
    """The links panel is updated at every snapshot; it repaints only when its lines change
    (a repainted panel also makes Textual redraw every widget between it and the grid)."""
    from tui.view.widgets.links import LinksPanel

    app = CommtopApp()
    async with app.run_test(size=SIZE) as pilot:
        app.show_snapshot(frozen_snapshot(world=8))
        await pilot.pause()
        panel = app.query_one(LinksPanel)
        repaints: list[bool] = []
        refresh = panel.refresh
        panel.refresh = lambda *a, **k: (repaints.append(True), refresh(*a, **k))[1]  # type: ignore[method-assign]
        app.show_snapshot(frozen_snapshot(world=8))  # no GPUs, as before: the same note
        await pilot.pause()
        assert repaints == []
        app.show_snapshot(frozen_snapshot(world=8, gpus=1))  # a GPU's telemetry arrives
        await pilot.pause()
        assert repaints and panel.line_text(0) != ""


@run_async
async def test_a_snapshot_is_painted_in_the_wake_up_that_shows_it() -> None:
    """The UI thread paints a snapshot's changes while handling it, not on Textual's update timer
    a second wake-up later: the screen's update ran once in the handler and left nothing dirty
    (so the idle check that follows starts no timer)."""
    from textual.screen import Screen

    from tui.view.messages import SnapshotReady

    app = CommtopApp(links=False)
    async with app.run_test(size=SIZE) as pilot:
        app.show_snapshot(frozen_snapshot(world=2, iterations=200))
        await pilot.pause()
        painted: list[int] = []
        update = Screen._on_timer_update

        def counted(screen: Screen) -> None:
            painted.append(1)
            update(screen)

        Screen._on_timer_update = counted  # type: ignore[method-assign]
        try:
            app.on_snapshot_ready(SnapshotReady(frozen_snapshot(world=4, iterations=300)))
            screen = app.screen
            assert painted == [1]  # painted once, here
            assert not screen._dirty_widgets and not screen._repaint_required and not screen._layout_required
            assert len([row for row in grid_text(app) if row.startswith("●")]) == 4
        finally:
            Screen._on_timer_update = update  # type: ignore[method-assign]
