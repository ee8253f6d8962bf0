"""`commtop replay` says one thing at every position (issue 27, item 6): the header's epoch and
the verdict line's are the same after any seek; `p` right after `n` goes back a change at any
speed; a replay offers only its own keys; a captured job's whole-run row and copies are
filled. The real app under Textual's Pilot, fed by a real ReplaySource whose clock the test
moves (its injectable clock), over real recordings."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest
from app_pilot import FrozenClock, run_async, wait_for
from recording_synth import Epoch, synth_run, write_recording
from rich_text import plain

from tui.model.run_model import RunModel
from tui.recordings.reader import open_recording
from tui.recordings.replay import ReplaySource
from tui.view.app import CommtopApp
from tui.view.widgets.help import HelpScreen

pytestmark = pytest.mark.e2e  # whole stack for seconds of wall time

SIZE = (160, 40)
RECORDINGS = Path(__file__).resolve().parent.parent / "recordings"
EPOCHS = (
    Epoch(0.0, "none", copies=0),
    Epoch(2.0, "overlap"),
    Epoch(4.0, "sync"),
    Epoch(6.0, "sync-barrier"),
    Epoch(8.0, "none", copies=0),
)


@pytest.fixture(scope="module")
def five_epochs(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("replay-agree") / "modes.commtop"
    write_recording(path, list(synth_run(duration_s=10.0, world=2, epochs=EPOCHS, telemetry=False, seed=5)))
    return path


def header_epoch(app: CommtopApp) -> int:
    line = app.query_one("#header").render().plain.split("\n")[1]
    return int(re.search(r"epoch (\d+)", line).group(1))  # type: ignore[union-attr]


def verdict_epoch(app: CommtopApp) -> int | None:
    """The newer epoch the verdict line speaks of (None: it compares none)."""
    text = app.query_one("#verdict").render().plain
    found = re.search(r"\(epochs (\d+), (\d+)", text)
    if found:
        return max(int(found.group(1)), int(found.group(2)))
    found = re.search(r"^\S*\s*epoch (\d+)", text)  # "epoch 3 (sync-barrier) vs epoch 2 ...: waiting"
    return int(found.group(1)) if found else None


async def agree_for(pilot: Any, app: CommtopApp, seconds: float) -> list[tuple[int, int | None]]:
    """Read header and verdict every 50 ms for ``seconds`` (the replay is paused: the wall
    clock moves, the replay's does not); every reading must agree."""
    seen = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        await pilot.pause(0.05)
        if app.snapshot is None or not app.snapshot.ranks:
            continue
        pair = (header_epoch(app), verdict_epoch(app))
        assert pair[1] is None or pair[0] == pair[1], f"header epoch {pair[0]}, verdict epoch {pair[1]}"
        seen.append(pair)
    return seen


@run_async
async def test_header_and_verdict_speak_of_the_same_epoch_after_every_seek(five_epochs: Path) -> None:
    clock = FrozenClock()
    source = ReplaySource(open_recording(five_epochs), clock=clock)
    app = CommtopApp(source, RunModel(), links=False, owns_source=True)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("space")  # paused: only the keys move the replay
        clock.now += 9.5
        await pilot.press("right")  # to 5.0 s (4.5 s feed in one burst, from a paused clock)
        seen = await agree_for(pilot, app, 2.0)
        assert seen[-1] == (2, 2)  # sync, compared with overlap once the burst is in
        moves = (("right", 4), ("left", 2), ("left", 0), ("n", 1), ("n", 2), ("p", 1), ("right", 3))
        for key, want in moves:
            await pilot.press(key)
            seen = await agree_for(pilot, app, 1.6)
            assert seen and seen[-1][0] == want, (key, seen[-1])
        assert "sync-barrier vs sync: p50" in app.query_one("#verdict").render().plain


@run_async
async def test_p_right_after_n_goes_back_a_change_at_speed_4(five_epochs: Path) -> None:
    clock = FrozenClock()
    source = ReplaySource(open_recording(five_epochs), clock=clock, speed=4.0)
    app = CommtopApp(source, RunModel(), links=False, owns_source=True)
    changes = source.position().changes_s
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("n", "n")  # to the second change (overlap -> sync)
        assert source.position().position_s == changes[1]
        clock.now += 0.5  # half a second later: 2 s of the recording at x4
        await pilot.press("p")
        assert source.position().position_s == changes[0]  # not back to changes[1]
        clock.now += 0.5
        await pilot.press("p")
        assert source.position().position_s == 0.0
        clock.now += 3.0  # 3 s on (12 s of the recording): p restarts the change it is in
        await pilot.press("p")
        assert source.position().position_s == changes[2]


@run_async
async def test_a_replay_offers_only_its_own_keys(five_epochs: Path) -> None:
    source = ReplaySource(open_recording(five_epochs), clock=FrozenClock())
    app = CommtopApp(source, RunModel(), links=False, owns_source=True)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.snapshot is not None and app.snapshot.ranks)
        verdict = app.query_one("#verdict").render().plain
        assert verdict == "≈ verdict: one settings epoch so far · n: the next settings change"
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        text = plain(app.screen.query_one("#help-text").content)  # type: ignore[attr-defined]
        assert "Pause or resume the replay" in text and "Jump to the previous settings change" in text
        assert "Next offload mode" not in text and "A/B experiment" not in text
        assert "not in this session: f i l o 1-4 c/C s h d a r" in text  # named, not offered


@run_async
async def test_a_captured_jobs_whole_run_row_and_copies_are_filled_at_the_end() -> None:
    """The H200 recording of an unmodified script: every collective in its last 0.7 s, after
    6 s of start-up; played as time passes (steps of 0.1 s), then ended."""
    clock = FrozenClock()
    source = ReplaySource(open_recording(RECORDINGS / "h200-train_ddp_plain-unmodified.commtop"), clock=clock)
    app = CommtopApp(source, RunModel(), links=False, owns_source=True)
    async with app.run_test(size=SIZE) as pilot:
        while not source.position().finished:
            clock.now += 0.1
            await pilot.pause(0.02)
        # the rank rows and the step line refresh on their own stamps: wait for both (an ended
        # replay's clock stands still; they catch up on the wall clock)
        await wait_for(
            pilot,
            lambda: app.snapshot is not None and app.snapshot.ranks[0].run.count == 253 and app.snapshot.steps.copies,
        )
        rank = app.snapshot.ranks[0]
        assert rank.run.max_ms == pytest.approx(0.37712, rel=1e-4) and rank.copy_run.count == 197
        header = app.query_one("#header").render().plain.split("\n")[1]
        assert "0 copies" not in header  # a job's header names its streams, not the loop's settings
        steps = app.query_one("#streams").render().plain  # its copies, as the records say
        assert "copies d2h pinned" in steps and "/step" in steps
