"""Snapshot tests: the app drawn from FROZEN data (a constructed run fed through the real
model, a fixed clock, no live source, no links panel: that one belongs to its own tests).

Update after an intended visual change with: pytest tests/test_app_snapshots.py --snapshot-update
(and look at the SVGs in tests/__snapshots__/ before committing them).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from frozen_run import frozen_snapshot

from tui.model.interfaces import ControlView
from tui.view.app import CommtopApp
from tui.view.messages import SnapshotReady

SETTINGS = {"copies": 5, "copy_scale": 1.0, "pinned": True, "direction": "d2h"}


class FrozenController:
    """Test-only controller frozen mid-switch: none requested, overlap in force."""

    def request(self, changes: dict[str, Any]) -> str:
        return ""

    def view(self) -> ControlView:
        return ControlView(requested={"mode": "none", **SETTINGS})


def frozen_app(world: int, **kw: Any) -> tuple[CommtopApp, Any]:
    app = CommtopApp(title="commtop run", links=False, controller=FrozenController())
    # frozen mid-switch: overlap in force at epoch 1, epoch 2 pending at iteration 640
    snap = replace(
        frozen_snapshot(world=world, **kw),
        settings={"mode": "overlap", **SETTINGS},
        epoch_in_force=1,
        pending_epoch=2,
        apply_at=640,
    )

    async def show(pilot: Any) -> None:
        pilot.app.post_message(SnapshotReady(snap))  # what the ingest thread posts
        await pilot.pause()

    return app, show


def test_eight_ranks_rows_with_stale_exited_and_straggler(snap_compare: Any) -> None:
    app, show = frozen_app(8, stale=4, exited=6)
    assert snap_compare(app, terminal_size=(120, 36), run_before=show)


def test_two_ranks_on_a_large_terminal(snap_compare: Any) -> None:
    app, show = frozen_app(2, iterations=1000)
    assert snap_compare(app, terminal_size=(200, 50), run_before=show)


def test_sixty_four_ranks_switch_to_the_heat_map(snap_compare: Any) -> None:
    app, show = frozen_app(64, stale=5, exited=9)
    assert snap_compare(app, terminal_size=(160, 48), run_before=show)


def test_heat_map_of_eight_ranks_on_v(snap_compare: Any) -> None:
    app, show = frozen_app(8, stale=4)
    assert snap_compare(app, terminal_size=(120, 36), run_before=show, press=["v"])
