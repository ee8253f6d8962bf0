"""Snapshot tests: the app drawn from FROZEN data (a constructed run fed through the real
model, a fixed clock, no live source; the links panel fed the H200's NVML ticks where named).

Update after an intended visual change with: pytest tests/test_app_snapshots.py --snapshot-update
(and look at the SVGs in tests/__snapshots__/ before committing them).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from frozen_run import frozen_snapshot

from tui.ingest.interfaces import ControlView
from tui.view.app import CommtopApp
from tui.view.messages import SnapshotReady
from workers.wire.settings import Settings

SETTINGS = {"copies": 5, "copy_scale": 1.0, "pinned": True, "direction": "d2h"}


class FrozenController:
    """Test-only controller frozen mid-switch: none requested, overlap in force."""

    def request(self, changes: dict[str, Any]) -> str:
        return ""

    def view(self) -> ControlView:
        return ControlView(requested=Settings(mode="none", **SETTINGS))


def frozen_app(world: int, **kw: Any) -> tuple[CommtopApp, Any]:
    app = CommtopApp(title="commtop run", links=False, controller=FrozenController())
    # frozen mid-switch: overlap in force at epoch 1, epoch 2 pending at iteration 640
    snap = replace(
        frozen_snapshot(world=world, **kw),
        settings=Settings(mode="overlap", **SETTINGS),
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


def frozen_links_app(world: int, gpus: int, **kw: Any) -> tuple[CommtopApp, Any]:
    """The app with its links panel, fed the H200's NVML ticks (tests/frozen_links.py) through
    the same SnapshotReady message the ingest thread posts."""
    app = CommtopApp(title="commtop run", controller=FrozenController())
    snap = replace(
        frozen_snapshot(world=world, gpus=gpus, **kw),
        settings=Settings(mode="overlap", **SETTINGS),
        epoch_in_force=1,
        pending_epoch=2,
        apply_at=640,
    )

    async def show(pilot: Any) -> None:
        for _ in range(2):  # the second after the panel took the height it asked for
            pilot.app.post_message(SnapshotReady(snap))
            await pilot.pause()

    return app, show


def test_one_h200_links_share_the_time_axis_and_fill_the_room(snap_compare: Any) -> None:
    app, show = frozen_links_app(1, 1)
    assert snap_compare(app, terminal_size=(160, 42), run_before=show)


def test_eight_gpus_with_nvlink_fall_back_to_one_line_each(snap_compare: Any) -> None:
    app, show = frozen_links_app(8, 8, nvlink=True)
    assert snap_compare(app, terminal_size=(120, 40), run_before=show)


def test_eight_gpus_on_a_tall_terminal_get_a_line_per_link(snap_compare: Any) -> None:
    app, show = frozen_links_app(8, 8, nvlink=True)
    assert snap_compare(app, terminal_size=(160, 64), run_before=show)


def test_an_80x24_terminal_condenses_the_header_and_keeps_a_wide_chart(snap_compare: Any) -> None:
    app, show = frozen_links_app(4, 1)
    assert snap_compare(app, terminal_size=(80, 24), run_before=show)


def test_verdict_line_after_an_ab_experiment(snap_compare: Any) -> None:
    """The line under the header shows a finished A/B's verdict with its interval."""
    import numpy as np

    from tui.experiment.ab_experiment import Progress
    from tui.experiment.ab_stats import Block, analyse

    rng = np.random.default_rng(4)
    blocks, durs, epochs, classes = [], [], [], []
    for pair in range(6):
        for i, arm in enumerate("AB" if pair % 2 else "BA"):
            epoch = 10 + 2 * pair + i
            blocks.append(Block(epoch, arm, pair))
            durs.append(2700.0 * (1.05 if arm == "B" else 1.0) * np.exp(rng.normal(0, 0.02, 100)))
            epochs.append(np.full(100, epoch))
            classes.append(np.where(np.arange(100) < 60, 1, 2) if arm == "B" else np.zeros(100))
    coll = {"epoch": np.concatenate(epochs), "dur_us": np.concatenate(durs), "cls": np.concatenate(classes)}
    result = analyse(blocks, coll, a="mode=none", b="mode=overlap")
    app, show = frozen_app(2, iterations=1000)
    app.ab._final = Progress("done", 6, 12, 14.0, 14.0, "", result)
    assert snap_compare(app, terminal_size=(160, 20), run_before=show)


def test_help_screen_lists_every_key(snap_compare: Any) -> None:
    """The help screen draws its text (an auto-sized scroll container once drew an empty box)."""
    app, show = frozen_app(2)
    assert snap_compare(app, terminal_size=(120, 45), run_before=show, press=["question_mark"])


def frozen_job_app(select: tuple[str, str] | None = None) -> tuple[CommtopApp, Any]:
    """A user's job (tests/job_synth.py: 3 groups, 6 streams, steps, copies, a rank that lost 3
    collectives) fed through the real model at a fixed clock; ``select`` = (group, op) of the
    stream whose latency lines are drawn."""
    from job_synth import STEP_NS, T0, job_run

    from tui.model.run_model import RunModel
    from workers.wire.protocol import Bye

    now = T0 + 201 * STEP_NS
    model = RunModel(clock=lambda: now)
    for _, m in job_run(world=4, steps=200, lost={1: 3}, slow_rank=2):
        if not isinstance(m, Bye):
            model.apply(m, now)
    if select is not None:
        streams = model.snapshot(fresh_run_stats=True).streams
        model.select_stream(next(s.index for s in streams if (s.group, s.op) == select))
    snap = model.snapshot(fresh_run_stats=True)
    app = CommtopApp(title="commtop run", links=False)

    async def show(pilot: Any) -> None:
        pilot.app.post_message(SnapshotReady(snap))
        await pilot.pause()

    return app, show


def test_a_jobs_header_and_stream_table(snap_compare: Any) -> None:
    """A job's header names its script, groups, ops and steps/s (no synthetic settings); the
    stream table lists every stream with the step line above it; f is in the footer."""
    app, show = frozen_job_app()
    assert snap_compare(app, terminal_size=(160, 40), run_before=show)


def test_the_latency_lines_of_one_stream(snap_compare: Any) -> None:
    """With one stream selected the rank rows draw its latency only (ranks 0 and 1 are not in
    group 2) and the table marks it."""
    app, show = frozen_job_app(select=("2", "all_to_all"))
    assert snap_compare(app, terminal_size=(160, 40), run_before=show)
