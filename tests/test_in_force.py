"""One rule for "in force / pending": the run model and the control server read one tracker."""

from __future__ import annotations

from frozen_run import frozen_coll, frozen_hello

from tui.model.in_force import InForce, InForceTracker
from tui.model.run_model import RunModel
from workers.wire import protocol as p
from workers.wire.settings import Settings


def header(rank: int, epoch: int, pending: int = -1, apply_at: int = -1, t_ns: int = 1) -> p.Batch:
    return p.Batch(p.COPY, rank, 0, 0, {}, epoch_in_force=epoch, pending_epoch=pending, apply_at=apply_at, t_ns=t_ns)


def test_nothing_heard_is_unknown() -> None:
    assert InForceTracker().state() == InForce()


def test_lead_rank_names_the_epoch_and_a_newer_pending_epoch_on_any_rank_is_pending() -> None:
    tracker = InForceTracker()
    for r in (1, 0):
        tracker.note(frozen_hello(r, world=2))
    tracker.note(header(0, 1, t_ns=5))
    tracker.note(header(1, 1, pending=2, apply_at=640, t_ns=5))
    now = tracker.state()
    assert (now.epoch, now.pending_epoch, now.apply_at) == (1, 2, 640)
    tracker.note(header(0, 2, t_ns=6))  # the lead switched: rank 1's stale "pending 2" is not newer
    assert (tracker.state().epoch, tracker.state().pending_epoch) == (2, -1)
    tracker.note(header(0, 1, t_ns=4))  # an older header arriving late changes nothing
    assert tracker.state().epoch == 2


def test_settings_of_an_epoch_come_from_what_was_published_until_a_hello_reports_them() -> None:
    tracker = InForceTracker()
    tracker.note(frozen_hello(0, world=1))
    tracker.note_settings(1, Settings(mode="sync", copies=3))
    tracker.note(header(0, 1, t_ns=2))
    assert tracker.state().settings == Settings(mode="sync", copies=3)


def test_the_mode_comes_from_the_newest_record_of_the_lead() -> None:
    tracker = InForceTracker()
    tracker.note(frozen_hello(0, world=1))
    tracker.note(frozen_coll(0, 0, [0, 1], [10.0, 10.0], world=1, mode=2))
    assert tracker.state().settings.mode == protocol_mode(2)


def test_a_bye_releases_a_pending_change() -> None:
    tracker = InForceTracker()
    tracker.note(frozen_hello(0, world=2))
    tracker.note(header(1, 0, pending=1, apply_at=64))
    assert tracker.state().pending_epoch == 1
    tracker.note(p.Bye(rank=1, exit_code=1, reason="x", t_ns=3))
    assert tracker.state().pending_epoch == -1


def test_the_run_model_snapshot_shows_its_tracker_state() -> None:
    model = RunModel(clock=lambda: 10**18)
    model.apply(frozen_hello(0, world=1))
    model.apply(header(0, 0, pending=1, apply_at=99))
    snap = model.snapshot(10**18)
    now = model.in_force.state()
    assert (snap.settings, snap.epoch_in_force, snap.pending_epoch, snap.apply_at) == (
        now.settings,
        now.epoch,
        now.pending_epoch,
        now.apply_at,
    )
    assert snap.pending_epoch == 1


def protocol_mode(index: int) -> str:
    return p.MODES[index]


def test_a_hello_with_new_settings_is_read_anew_and_one_repeating_them_keeps_them() -> None:
    """Settings are parsed once per change (every Hello repeats them), never kept past a change."""
    tracker = InForceTracker()
    first = frozen_hello(0, world=1)
    tracker.note(first)
    kept = tracker.state().settings
    tracker.note(frozen_hello(0, world=1, t_ns=first.t_ns + 1))
    assert tracker.state().settings is kept
    changed = frozen_hello(0, world=1, t_ns=first.t_ns + 2, epoch=1, settings={**first.settings, "mode": "sync"})
    tracker.note(changed)
    assert tracker.state().settings is not None and tracker.state().settings.mode == "sync"
    assert tracker.settings_of(1) == tracker.state().settings and tracker.settings_of(0) == kept
