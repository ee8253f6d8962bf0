"""Replay through the live ingest path: ReplaySource -> IngestLoop -> RunModel, as `commtop
replay` wires it; seeking back rebuilds the model, and a paused replay does not go stale."""

from __future__ import annotations

from app_pilot import FrozenClock

from tui.ingest.loop import IngestLoop
from tui.model.run_model import RunModel
from tui.recordings.reader import open_recording
from tui.recordings.replay import ReplaySource
from workers.wire import protocol as p


def pump(loop: IngestLoop) -> None:
    while loop.step(0):
        pass


def records_until(items: list, t_ns: int) -> int:
    return sum(len(m) for t, m in items if t <= t_ns and isinstance(m, p.Batch))  # collectives + copies


def test_replay_feeds_the_model_and_seek_back_rebuilds_it(recording) -> None:
    path, items = recording
    clock = FrozenClock(50.0)
    source = ReplaySource(open_recording(path), clock=clock)
    model = RunModel()
    loop = IngestLoop(source, model)
    t0 = items[0][0]
    clock.now += 3.0
    pump(loop)
    snap = loop.snapshot()
    assert snap.now_ns == t0 + 3_000_000_000  # the replay's clock, not the wall clock
    assert snap.records == records_until(items, t0 + 3_000_000_000) > 0
    assert [r.rank for r in snap.ranks] == sorted({m.rank for _, m in items if isinstance(m, p.Batch)})  # every rank
    assert all(r.state == "live" for r in snap.ranks)
    assert snap.epoch_in_force == 1
    source.seek(-2.0)
    pump(loop)
    snap = loop.snapshot()
    assert snap.records == records_until(items, t0 + 1_000_000_000)
    assert snap.epoch_in_force == 0 and set(snap.modes_seen) == {"none"}
    source.toggle_pause()
    clock.now += 600.0  # ten minutes paused: nothing goes stale
    pump(loop)
    assert all(r.state == "live" for r in loop.snapshot().ranks)
    source.toggle_pause()
    source.seek(100.0)
    pump(loop)
    snap = loop.snapshot()
    assert snap.records == sum(len(m) for _, m in items if isinstance(m, p.Batch))
    assert {"none", "overlap", "sync"} <= set(snap.modes_seen)
    assert source.position().finished
