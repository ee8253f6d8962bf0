"""ReplaySource: pacing by recorded receive time, pause, speed, seek (back = ResetModel +
re-feed), jump to settings changes; driven by an injected clock (frozen_clock)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from recording_synth import assert_same_message

from tui.ingest.interfaces import ReplayControls, ReplayPosition, ResetModel, Source
from tui.recordings.reader import RecordingError, open_recording
from tui.recordings.replay import MAX_SPEED, MIN_SPEED, ReplaySource, open_replay
from workers.wire import protocol as p


class FrozenClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def advance(self, s: float) -> None:
        self.now += s


def make(recording, **kw) -> tuple[ReplaySource, FrozenClock, list, int]:
    path, items = recording
    clock = FrozenClock()
    return ReplaySource(open_recording(path), clock=clock, **kw), clock, items, items[0][0]


def upto(items: list, t0: int, pos_s: float) -> list:
    return [m for t, m in items if t <= t0 + round(pos_s * 1e9)]


def drain(src: ReplaySource) -> list:
    out = []
    while batch := src.poll(0):
        out += batch
    return out


def test_it_is_a_source_with_replay_controls(recording) -> None:
    src, *_ = make(recording)
    assert isinstance(src, Source) and isinstance(src, ReplayControls)
    assert src.rejected == {} and src.warning == ""
    assert src.meta["ranks"] == [0, 1]


def test_messages_come_out_paced_by_receive_time(recording) -> None:
    src, clock, items, t0 = make(recording)
    first = drain(src)
    assert len(first) == len(upto(items, t0, 0.0)) >= 1
    clock.advance(1.0)
    second = drain(src)
    expected = upto(items, t0, 1.0)
    assert len(first) + len(second) == len(expected)
    for a, b in zip(expected, first + second, strict=True):
        assert_same_message(a, b)
    assert drain(src) == []  # nothing new until the clock moves
    pos = src.position()
    assert pos == ReplayPosition(1.0, pos.duration_s, 1.0, False, pos.changes_s, False)
    assert pos.duration_s == pytest.approx((items[-1][0] - t0) / 1e9)
    assert src.now_ns() == t0 + 1_000_000_000


def test_speed_scales_time_and_is_clamped(recording) -> None:
    src, clock, items, t0 = make(recording)
    src.set_speed(4.0)
    clock.advance(0.5)
    assert len(drain(src)) == len(upto(items, t0, 2.0))
    assert src.position().speed == 4.0
    src.set_speed(1000)
    assert src.position().speed == MAX_SPEED
    src.set_speed(0.001)
    assert src.position().speed == MIN_SPEED
    clock.advance(2.0)
    assert src.position().position_s == pytest.approx(2.5)


def test_pause_stops_the_clock(recording) -> None:
    src, clock, items, t0 = make(recording)
    clock.advance(0.5)
    drain(src)
    src.toggle_pause()
    clock.advance(3.0)
    assert drain(src) == []
    assert src.position().paused and src.position().position_s == pytest.approx(0.5)
    t = time.monotonic()
    assert src.poll(0.05) == []  # waits (up to the timeout) and returns nothing while paused
    assert time.monotonic() - t >= 0.04
    src.toggle_pause()
    clock.advance(0.5)
    drain(src)
    assert src.position().position_s == pytest.approx(1.0)


def test_seek_forward_feeds_up_to_the_target_and_back_resets_and_refeeds(recording) -> None:
    src, clock, items, t0 = make(recording, max_per_poll=50)
    drain(src)
    src.seek(3.0)
    fwd = drain(src)
    assert len(fwd) + len(upto(items, t0, 0.0)) == len(upto(items, t0, 3.0))
    assert not any(isinstance(m, ResetModel) for m in fwd)
    src.seek(-2.0)
    back = src.poll(0)
    assert isinstance(back[0], ResetModel)
    back += drain(src)
    expected = upto(items, t0, 1.0)
    assert len(back) == 1 + len(expected)
    for a, b in zip(expected, back[1:], strict=True):
        assert_same_message(a, b)
    src.seek(-100)  # clamps at the start
    assert src.position().position_s == 0.0
    again = src.poll(0)
    assert isinstance(again[0], ResetModel)
    src.seek(1000)  # clamps at the end
    rest = again[1:] + drain(src)
    assert len(rest) == len(items) and src.position().finished


def test_jump_between_settings_changes(recording) -> None:
    src, clock, items, t0 = make(recording)
    changes = src.position().changes_s
    colls = [(t, m) for t, m in items if isinstance(m, p.Batch) and m.kind == p.COLL]
    first_new = [next((t - t0) / 1e9 for t, m in colls if m.columns["epoch"].max() == e) for e in (1, 2)]
    assert changes == pytest.approx(tuple(first_new), abs=1e-6)
    assert 1.9 < changes[0] < 2.1 and 3.9 < changes[1] < 4.1
    src.jump_change(+1)
    assert src.position().position_s == pytest.approx(changes[0])
    fed = drain(src)
    assert any(isinstance(m, p.Batch) and m.kind == p.COLL and 1 in m.columns["epoch"] for m in fed)
    src.jump_change(+1)
    assert src.position().position_s == pytest.approx(changes[1])
    drain(src)
    src.jump_change(+1)  # no later change: stays
    assert src.position().position_s == pytest.approx(changes[1])
    src.jump_change(-1)  # back from just after a change goes to the one before
    assert src.position().position_s == pytest.approx(changes[0])
    assert isinstance(src.poll(0)[0], ResetModel)
    drain(src)
    src.jump_change(-1)
    assert src.position().position_s == 0.0


def test_the_end_is_finished(recording) -> None:
    src, clock, items, t0 = make(recording)
    clock.advance(1000.0)
    assert len(drain(src)) == len(items)
    pos = src.position()
    assert pos.finished and pos.position_s == pos.duration_s
    src.close()
    assert src.poll(0.1) == []


def test_poll_waits_for_the_next_message_not_longer(recording) -> None:
    path, items = recording
    src = open_replay(path, speed=64.0)  # real clock: the whole 6 s recording in ~0.1 s
    got: list = []
    t = time.monotonic()
    while not src.position().finished and time.monotonic() - t < 5:
        got += src.poll(0.5)
    assert len(got) == len(items)
    assert time.monotonic() - t < 2.0


def test_damaged_recording_replays_with_a_warning(tmp_path: Path, recording) -> None:
    path, items = recording
    data = bytearray(path.read_bytes())
    with open_recording(path) as rec:
        victim = rec.chunks[4]
    data[victim.body + 10] ^= 1
    cut = tmp_path / "damaged.commtop"
    cut.write_bytes(bytes(data[: len(data) - 100]))
    src = ReplaySource(open_recording(cut), clock=FrozenClock())
    assert src.rejected == {"corrupt": 1}
    assert f"corrupt frame at byte {victim.offset}" in src.warning and "recording incomplete" in src.warning
    src.seek(1000)
    assert 0 < len(drain(src)) < len(items)


def test_not_a_recording_is_a_value_error(tmp_path: Path) -> None:
    (tmp_path / "x").write_text("not a recording")
    with pytest.raises(ValueError, match="is not a commtop recording") as err:
        open_replay(tmp_path / "x")
    assert isinstance(err.value, RecordingError)
