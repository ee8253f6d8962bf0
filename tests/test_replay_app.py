"""`commtop replay` as the user sees it: the real app under Textual's Pilot, fed by a real
ReplaySource (frozen clock), keys seeking and jumping; and `r` recording what goes by with
the real Recorder, read back unchanged."""

from __future__ import annotations

from pathlib import Path

from app_pilot import FrozenClock, run_async, wait_for
from recording_synth import assert_same_message

from tui.model.run_model import RunModel
from tui.recordings.reader import open_recording
from tui.recordings.recorder import Recorder
from tui.recordings.replay import ReplaySource
from tui.view.app import CommtopApp
from workers.wire import protocol as p

SIZE = (120, 36)


def records_until(items: list, t_ns: float) -> int:
    return sum(len(m) for t, m in items if t <= t_ns and isinstance(m, p.Batch))


@run_async
async def test_replay_keys_drive_the_model_through_the_app(recording) -> None:
    path, items = recording
    t0 = items[0][0]
    source = ReplaySource(open_recording(path), clock=FrozenClock())
    app = CommtopApp(source, RunModel(), links=False, owns_source=True)
    changes = source.position().changes_s
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("n")  # to the first settings change (none -> overlap)
        want = records_until(items, t0 + changes[0] * 1e9)
        await wait_for(pilot, lambda: app.snapshot is not None and app.snapshot.records == want)
        assert "overlap" in app.snapshot.modes_seen
        await pilot.press("right")  # +5 s: past the end, clamps
        want_all = records_until(items, float("inf"))
        await wait_for(pilot, lambda: app.snapshot.records == want_all)
        assert source.position().finished
        await pilot.press("p")  # back to the last change: the model is rebuilt from the start
        want = records_until(items, t0 + changes[1] * 1e9)
        await wait_for(pilot, lambda: app.snapshot.records == want)
        assert set(app.snapshot.modes_seen) == {"none", "overlap", "sync"}
        bar = app.query_one("#replay").render().plain
        await pilot.press("space")
        await wait_for(pilot, lambda: source.position().paused and app.query_one("#replay").render().plain != bar)
        assert [r.state for r in app.snapshot.ranks] == ["live", "live"]


@run_async
async def test_r_records_what_the_app_receives(recording, tmp_path: Path) -> None:
    path, items = recording
    source = ReplaySource(open_recording(path), clock=FrozenClock())
    recorder = Recorder(collective="all_gather", directory=tmp_path, flush_s=0.05)
    app = CommtopApp(source, RunModel(), sinks=[recorder], recorder=recorder, links=False, owns_source=True)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("r")
        await wait_for(pilot, lambda: "REC" in app.query_one("#header").render().plain)
        await pilot.press("right", "right")
        await wait_for(pilot, lambda: app.snapshot is not None and source.position().finished)
        await wait_for(pilot, lambda: app.snapshot.records == records_until(items, float("inf")))
        await pilot.press("r")
        await wait_for(pilot, lambda: "rec off" in app.query_one("#header").render().plain)
    status = recorder.status()
    assert not status.active and status.error == ""
    with open_recording(status.path) as rec:
        assert rec.complete
        got = [m for _, m in rec.messages()]
    assert len(got) == len(items)
    for (_, a), b in zip(items, got, strict=True):
        assert_same_message(a, b)


@run_async
async def test_a_recording_without_rank_data_says_so_instead_of_waiting_for_ranks(tmp_path: Path) -> None:
    from tui.recordings.writer import RecordingWriter
    from tui.view.widgets.header import REPLAY_EMPTY, WAITING

    path = tmp_path / "header_only.commtop"
    with open(path, "wb") as f:  # a run stopped before any rank reported: the header and the trailer
        RecordingWriter(f, {"schema_version": p.SCHEMA_VERSION}).close({})
    source = ReplaySource(open_recording(path), clock=FrozenClock())
    app = CommtopApp(source, RunModel(), links=False, owns_source=True)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: source.position().finished)
        await wait_for(pilot, lambda: REPLAY_EMPTY in app.query_one("#header").render().plain)
        assert WAITING not in app.query_one("#header").render().plain
