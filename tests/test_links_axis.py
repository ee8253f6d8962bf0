"""The links panel shares the latency chart's time axis: one mapping (tui.view.time_axis)
from chart columns to wall-clock intervals, used by the rank grid and the links panel."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import numpy as np
from frozen_links import fixture_ticks, gpu_uuid
from frozen_run import T0, frozen_coll, frozen_hello

from tui.model.run_model import RunModel
from tui.view.app import CommtopApp
from tui.view.messages import SnapshotReady
from tui.view.time_axis import MAX_HOLD_NS, iteration_edges, resample
from tui.view.widgets.links import LinksPanel
from tui.view.widgets.rank_grid import RankGrid
from workers.wire.telemetry import Caps, caps_body, tick_body

MS = 1_000_000


def test_edges_come_from_iteration_starts_and_extrapolate_at_the_iteration_rate() -> None:
    start = T0 + 10 * MS * np.arange(100, dtype=np.int64)  # iterations 50..149, 10 ms apart
    edges = iteration_edges(start, 50, 40, 30, 4)  # columns of 4 iterations from iteration 40
    assert len(edges) == 31
    assert edges[3] == start[52 - 50]  # column 3 starts at iteration 40 + 3 * 4 = 52
    assert edges[25] == start[140 - 50]
    assert np.all(np.diff(edges) == 40 * MS)  # before the first known start and after the last too
    assert iteration_edges(start[:1], 50, 40, 30, 4).size == 0  # one start time says no rate


def test_resample_holds_each_sample_over_the_interval_it_measured() -> None:
    times = np.array([100, 200, 300]) * MS
    values = np.array([1.0, 5.0, 2.0])
    edges = np.arange(0, 400, 50) * MS  # 7 columns of 50 ms
    got = resample(times, values, edges)
    # (0,100] -> 1; (100,200] -> 5; (200,300] -> 2; after the last sample: nothing yet.
    assert got[:6].tolist() == [1.0, 1.0, 5.0, 5.0, 2.0, 2.0] and math.isnan(got[6])
    # A column several samples wide shows their max; one far before its covering sample, none.
    assert resample(times, values, np.array([0, 400]) * MS).tolist() == [5.0]
    far = resample(np.array([MAX_HOLD_NS * 3]), np.array([7.0]), np.array([0, MS]))
    assert math.isnan(far[0])


def _spike_run(spike_it: int, iterations: int = 600) -> Any:
    """One rank on an H200 at 100 it/s; iteration ``spike_it`` takes 40 ms; one NVML tick
    reads a PCIe burst over the 100 ms around it and every other tick reads idle."""
    model = RunModel(clock=lambda: T0)
    model.apply(frozen_hello(0, 1, backend="nccl", gpu_uuid=gpu_uuid(0)))
    its = np.arange(iterations)
    dur = np.where(its == spike_it, 40_000.0, 2_000.0)
    model.apply(frozen_coll(0, 0, its, dur, world=1))
    end = T0 + (iterations - 1) * 10 * MS
    burst_t = T0 + (spike_it + 5) * 10 * MS  # this tick measured (burst_t - 100 ms, burst_t]
    for m in fixture_ticks("node-a", end, 1):
        if isinstance(m, Caps):
            model.apply(caps_body("s", m))
            continue
        tx = 50.0 if burst_t <= m.t_ns < burst_t + 100 * MS else 0.0
        m.metrics["pcie_tx_gbps"][:] = tx
        m.metrics["pcie_rx_gbps"][:] = 0.0
        model.apply(tick_body("s", m))
    return model.snapshot(end + MS)


def test_a_pcie_burst_is_drawn_in_the_column_of_the_collective_it_overlapped() -> None:
    async def run() -> tuple[int, list[int]]:
        app = CommtopApp(title="commtop run")
        async with app.run_test(size=(160, 40)) as pilot:
            snap = _spike_run(spike_it=450)
            app.post_message(SnapshotReady(snap))
            await pilot.pause()
            app.post_message(SnapshotReady(snap))  # after the panel took its height
            await pilot.pause()
            grid = app.query_one(RankGrid)
            spike_line = grid.line_texts()[0]
            spike_col = spike_line.index("▲") if "▲" in spike_line else -1
            panel = app.query_one(LinksPanel)
            tall = sorted({x for ln in panel.line_texts() for x, ch in enumerate(ln) if ch == "█"})
            return spike_col, tall

    spike_col, tall = asyncio.run(run())
    assert spike_col > 0
    # The burst tick covers 100 ms = 10 iterations; the spike's column is among its columns.
    assert tall and spike_col in tall and max(tall) - min(tall) <= 10


def test_the_panel_never_asks_for_more_lines_than_it_may_use() -> None:
    """Every layout fits ``max_lines`` (or says how many GPUs it left out): full sparklines,
    one line per link, one line per GPU."""
    from frozen_run import frozen_snapshot

    from tui.view.time_axis import TimeAxis

    snap = frozen_snapshot(world=8, gpus=8, nvlink=True)
    axis = TimeAxis(59, snap.telemetry.t_ns - 2 * 10**9 + 20 * MS * np.arange(101))
    seen = set()
    for budget in (4, 8, 12, 23, 24, 25, 40, 41, 80):
        panel = LinksPanel()
        panel.max_lines = budget
        panel._snap, panel.axis = snap.telemetry, axis
        panel._rows = panel._arrange(snap.telemetry, [])
        panel._build(200)
        seen.add(panel.layout_name)
        assert len(panel._lines) <= budget, (budget, panel.layout_name, len(panel._lines))
        if len(panel._lines) == budget and panel.layout_name == "gpu" and budget < 8:
            assert "more GPUs" in "".join(seg.text for seg in panel._lines[-1])
    assert seen == {"full", "links", "gpu"}
