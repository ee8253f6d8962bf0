"""Replay after n / p shows the settings of the epoch in force at that position (not those
of the last hello before it), n visits every epoch, and a pending switch says what changes.
On the committed H200 recording (recordings/), through the real ReplaySource and RunModel."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from app_pilot import FrozenClock

from tui.ingest.interfaces import ResetModel
from tui.model.run_model import RunModel
from tui.recordings.replay import open_replay
from tui.view.app import CommtopApp
from tui.view.widgets.header import header_text, settings_change

H200 = Path(__file__).resolve().parent.parent / "recordings" / "h200-nccl-1gpu-all_gather-modes.commtop"


def _drain(src: Any, model: RunModel) -> None:
    while True:
        batch = src.poll(0)
        if not batch:
            return
        for m in batch:
            if isinstance(m, ResetModel):
                model.reset()
            else:
                model.apply(m, src.now_ns())


def test_each_n_lands_in_the_next_epoch_with_its_own_settings() -> None:
    src = open_replay(H200, clock=FrozenClock(0.0))
    model = RunModel(clock=src.now_ns)
    model.learn_epoch_settings(src.epoch_settings)
    src.toggle_pause()  # paused: what the position shows must already be the new epoch
    seen = []
    for _ in range(len(src.position().changes_s)):
        src.jump_change(1)
        _drain(src, model)
        snap = model.snapshot(src.now_ns())
        seen.append((snap.epoch_in_force, snap.settings))
    assert [e for e, _ in seen] == list(range(1, len(seen) + 1))  # none skipped
    # The report's epoch table (from the hellos) says epoch 5 is pageable: so does the header.
    assert seen[4][1].pinned is False and seen[4][1].mode == "overlap"
    assert seen[5][1].pinned is True and seen[5][1].copy_scale == 2.0
    assert "pageable" in header_text(_at_epoch(5)).plain


def _at_epoch(epoch: int) -> Any:
    src = open_replay(H200, clock=FrozenClock(0.0))
    model = RunModel(clock=src.now_ns)
    model.learn_epoch_settings(src.epoch_settings)
    src.toggle_pause()
    for _ in range(epoch):
        src.jump_change(1)
    _drain(src, model)
    return model.snapshot(src.now_ns())


def test_p_goes_back_to_the_previous_epoch_and_its_settings() -> None:
    clock = FrozenClock(0.0)
    src = open_replay(H200, clock=clock)
    model = RunModel(clock=src.now_ns)
    model.learn_epoch_settings(src.epoch_settings)
    src.toggle_pause()
    for _ in range(6):
        src.jump_change(1)
    _drain(src, model)
    assert model.snapshot(src.now_ns()).epoch_in_force == 6
    src.jump_change(-1)
    _drain(src, model)
    snap = model.snapshot(src.now_ns())
    assert snap.epoch_in_force == 5 and snap.settings is not None and snap.settings.pinned is False


def test_a_pending_switch_says_what_changes() -> None:
    src = open_replay(H200, clock=FrozenClock(0.0))
    model = RunModel(clock=src.now_ns)
    model.learn_epoch_settings(src.epoch_settings)
    src.toggle_pause()
    # Step through the second before the pinned -> pageable change (epoch 4 -> 5) until the
    # records announce it.
    change = src.position().changes_s[4]
    src.seek(change - 1.5)
    found = ""
    for _ in range(60):
        src.seek(0.025)
        _drain(src, model)
        snap = model.snapshot(src.now_ns())
        if snap.pending_epoch == 5:
            found = header_text(snap).plain
            break
    assert "⇢ switching mode none → overlap, pinned → pageable at iteration" in found


def test_settings_change_words() -> None:
    base = {"mode": "sync", "copies": 5, "copy_scale": 1.0, "pinned": True, "direction": "d2h", "knobs": {}}
    assert settings_change(base, {**base, "copies": 6}) == "copies 5 → 6"
    assert settings_change(base, {**base, "copy_scale": 2.0}) == "size ×1 → ×2"
    assert settings_change(base, {**base, "direction": "h2d"}) == "direction d2h → h2d"
    assert settings_change(base, base) == ""


def test_replay_app_header_after_n_shows_the_epoch_settings() -> None:
    async def run() -> str:
        src = open_replay(H200, clock=FrozenClock(0.0))
        app = CommtopApp(src, RunModel(clock=src.now_ns), links=False, owns_source=True)
        async with app.run_test(size=(160, 40)) as pilot:
            await pilot.press("space")
            for _ in range(5):
                await pilot.press("n")
            deadline = time.monotonic() + 20
            while not (app.snapshot and app.snapshot.epoch_in_force == 5):
                assert time.monotonic() < deadline, "the replay never reached epoch 5"
                await pilot.pause(0.05)
            await pilot.pause(0.2)
            return header_text(app.snapshot).plain

    text = asyncio.run(run())
    assert "pageable" in text and "epoch 5" in text
