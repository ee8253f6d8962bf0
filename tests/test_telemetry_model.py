"""TelemetryModel + LinksPanel, fed with the ticks commtop's own sampler produced on an H200
(tests/fixtures/nvml/h200_nvml.json) and with a real NVML-less sampler on this machine."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path

import numpy as np
import pynvml
from textual.app import App, ComposeResult

from tui.model.telemetry import TelemetryModel, TelemetrySnapshot
from tui.view.time_axis import TimeAxis
from tui.view.widgets.links import LinksPanel, RankGpu
from workers.telemetry import nvml
from workers.telemetry.sampler import NodeSampler
from workers.wire import protocol
from workers.wire.telemetry import Caps, GpuCaps, ProcInfo, Tick, caps_body, tick_body

FIXTURE = Path(__file__).parent / "fixtures" / "nvml" / "h200_nvml.json"
HOST = "h200"


def fixture_messages(phase: str = "d2h") -> tuple[list[Tick], Caps]:
    """The sampler ticks and capabilities recorded on the H200, as wire records."""
    cap = json.loads(FIXTURE.read_text())
    s = cap["sampler"]
    uuids = tuple(s["uuids"])
    ticks = []
    for i, t in enumerate(s[phase]):
        ticks.append(
            Tick(
                host=HOST,
                pid=1,
                seq=i,
                t_ns=t["t_ns"],
                cost_us=t["cost_us"],
                uuids=uuids,
                metrics={k: np.array([math.nan if x is None else x for x in v]) for k, v in t["metrics"].items()},
                gpu_cost_us=np.array(t["gpu_cost_us"]),
                pcie_peak_gbps=np.array(t["pcie_peak_gbps"]),
                nvlink_peak_gbps=np.full(len(uuids), math.nan),
                cpu_pct=t["cpu_pct"],
                mem_used_bytes=1 << 30,
                mem_total_bytes=8 << 30,
                procs=(ProcInfo(1234, "running", 99.0, 1 << 30),),
            )
        )
    gpus = tuple(
        GpuCaps(g["uuid"], i, "NVIDIA H200", 5, 16, g["pcie_peak"], 0, math.nan, g["sources"], g["na"])
        for i, g in enumerate(s["caps"]["gpus"])
    )
    caps = Caps(HOST, 1, ticks[0].t_ns, 0.1, s["caps"]["nvml"], cap["driver"]["ok"], gpus, tuple(s["caps"]["notes"]))
    return ticks, caps


def fixture_snapshot(phase: str = "d2h") -> TelemetrySnapshot:
    ticks, caps = fixture_messages(phase)
    model = TelemetryModel()
    model.apply(caps_body("s", caps))
    for t in ticks:
        model.apply(tick_body("s", t))  # through the wire encoding, as the ingest thread does
    return model.snapshot(ticks[-1].t_ns)


def test_snapshot_from_h200_ticks() -> None:
    cap = json.loads(FIXTURE.read_text())
    snap = fixture_snapshot("d2h")
    assert snap.nvml_note == ""
    (row,) = snap.gpus
    assert row.value("nvlink_tx_gbps") is None and row.reason("nvlink_tx_gbps") == "no NVLink"
    tx = row.value("pcie_tx_gbps")
    assert (
        tx is not None
        and abs(tx - cap["copy"]["d2h_sampler"]["gbps_mean"]) / cap["copy"]["d2h_sampler"]["gbps_mean"] < 0.15
    )
    assert 50 < row.pct("pcie_tx_gbps") <= 100
    assert len(row.times_ns) == len(cap["sampler"]["d2h"]) and np.all(np.diff(row.times_ns) > 0)
    assert row.sources["pcie_tx_gbps"] == "gpm"
    assert snap.proc_status(HOST, 1234) == "running" and snap.proc_status(HOST, 999) is None
    line = snap.host_line()
    assert line.startswith(f"{HOST}: cpu ") and "GiB" in line and "tick" in line


def test_ring_buffer_is_bounded_and_stale_detected() -> None:
    from tui.model import telemetry as telemetry_model

    ticks, caps = fixture_messages("d2h")
    model = TelemetryModel()
    model.apply(caps)
    step = ticks[1].t_ns - ticks[0].t_ns
    for i in range(telemetry_model.HISTORY + 50):
        t = ticks[i % len(ticks)]
        model.apply(Tick(**{**t.__dict__, "t_ns": ticks[0].t_ns + i * step, "seq": i}))
    snap = model.snapshot(ticks[0].t_ns + (telemetry_model.HISTORY + 50) * step)
    row = snap.gpus[0]
    assert len(row.times_ns) == telemetry_model.HISTORY and np.all(np.diff(row.times_ns) > 0)
    later = model.snapshot(row.t_ns + int((telemetry_model.STALE_S + 1) * 1e9))
    assert later.gpus[0].stale and later.hosts[0].stale and "(stale)" in later.host_line()


def test_throttle_and_replay_changes_are_highlighted() -> None:
    ticks, caps = fixture_messages("d2h")
    model = TelemetryModel()
    model.apply(caps)
    model.apply(ticks[0])
    power_cap = float(pynvml.nvmlClocksEventReasonSwPowerCap)
    metrics = {k: v.copy() for k, v in ticks[1].metrics.items()}
    metrics["throttle_reasons"][0] = power_cap
    metrics["pcie_replay_count"][0] = ticks[0].metrics["pcie_replay_count"][0] + 3
    model.apply(Tick(**{**ticks[1].__dict__, "metrics": metrics}))
    snap = model.snapshot(ticks[1].t_ns)
    kinds = {e.kind: e.text for e in snap.events}
    assert kinds["throttle"] == "clocks: SW power cap" and kinds["replay"] == "PCIe replay +3"
    assert snap.gpus[0].highlight and snap.gpus[0].throttle == ("SW power cap",)
    assert model.snapshot(ticks[1].t_ns + int(60e9)).gpus[0].highlight == ""


def test_malformed_body_is_counted_not_raised() -> None:
    model = TelemetryModel()
    model.apply({"v": 1, "k": protocol.TELEM, "s": "x", "uuids": 3})
    assert model.rejected == 1 and model.snapshot(0).nvml_note == "no telemetry yet"


class PanelApp(App[None]):
    def compose(self) -> ComposeResult:
        yield LinksPanel(id="links")


async def _rendered(snap: TelemetrySnapshot, size: tuple[int, int] = (180, 10), order=(), max_lines=8) -> list[str]:
    """The panel alone, on a time axis of 100 columns of 20 ms ending at the last tick."""
    t1 = snap.t_ns
    axis = TimeAxis(60, t1 - 2_000_000_000 + 20_000_000 * np.arange(101, dtype=np.int64))
    app = PanelApp()
    async with app.run_test(size=size) as pilot:
        panel = app.query_one(LinksPanel)
        panel.update_snapshot(snap, axis, order, max_lines=max_lines)
        await pilot.pause()
        return [panel.render_line(y).text for y in range(panel.size.height)]


def test_panel_says_nvml_not_available_on_this_machine() -> None:
    nvml._reset_for_tests()
    sampler = NodeSampler([])
    try:
        model = TelemetryModel()
        model.apply(caps_body("s", sampler.caps()))
        tick = sampler.tick()
        model.apply(tick_body("s", tick))
    finally:
        sampler.close()
    lines = asyncio.run(_rendered(model.snapshot(tick.t_ns)))
    assert len(lines) == 1 and "NVML not available" in lines[0]


def test_panel_shows_h200_row_with_no_nvlink() -> None:
    lines = asyncio.run(_rendered(fixture_snapshot("d2h"), max_lines=8))
    text = "\n".join(lines)
    assert lines[0].startswith(f"{HOST}:0  NVIDIA H200") and "NVIDIA H200" in lines[0] and "PCIe Gen5 x16" in lines[0]
    assert "TX" in text and "RX" in text and "GB/s" in text and " W" in lines[0]
    assert any(ch in text for ch in "▁▂▃▄▅▆▇█")
    nvl = [line for line in lines if "NVLink" in line]
    assert len(nvl) == 1 and "n/a: no NVLink" in nvl[0]  # one line saying why, never a row of zeros
    assert not any(ch in nvl[0] for ch in "▁▂▃▄▅▆▇█")


def test_panel_rows_follow_rank_order() -> None:
    snap = fixture_snapshot("h2d")
    gpu = snap.gpus[0]
    order = [RankGpu("r0", HOST, gpu.uuid), RankGpu("r1", HOST, str(gpu.index)), RankGpu("r2", "elsewhere", "0")]
    lines = asyncio.run(_rendered(snap, order=order, max_lines=3))  # room for one line per GPU only
    assert [line[:3] for line in lines] == ["r0 ", "r1 ", "r2 "]
    assert "PCIe" in lines[0] and "↑" in lines[0] and "PCIe" in lines[1]
    assert "no telemetry for this GPU" in lines[2]
