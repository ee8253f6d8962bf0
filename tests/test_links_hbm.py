"""HBM bandwidth utilisation (GPM DRAM_BW_UTIL) in the links panel: each GPU's title says it
where the sampler sent it, and nothing changes on a machine without GPM (absent field)."""

from __future__ import annotations

import numpy as np
from frozen_links import fixture_ticks

from tui.model.telemetry import TelemetryModel
from tui.view.widgets.links import LinksPanel
from workers.wire.telemetry import Caps, caps_body, tick_body

END = 1_800_000_000_000_000_000


def _panel_lines(hbm: float | None, layout_lines: int = 40) -> list[str]:
    model = TelemetryModel()
    for m in fixture_ticks("node-a", END, 1):  # the H200's recorded ticks (they predate the field)
        if isinstance(m, Caps):
            model.apply(caps_body("s", m))
            continue
        if hbm is not None:
            m.metrics["dram_bw_util_pct"] = np.array([hbm])
        model.apply(tick_body("s", m))
    snap = model.snapshot(END)
    panel = LinksPanel()
    panel.max_lines = layout_lines
    panel._snap = snap
    panel._rows = panel._arrange(snap, ())
    panel._build(200)
    return [panel.line_text(i) for i in range(len(panel._lines))]


def test_title_shows_hbm_bandwidth_where_gpm_gives_it() -> None:
    lines = _panel_lines(37.4)
    assert "HBM bw 37%" in lines[0], lines[0]
    assert "HBM 37%" in " ".join(_panel_lines(37.4, layout_lines=1))  # one line per GPU: short form


def test_without_gpm_nothing_new_is_shown() -> None:
    assert not any("HBM" in line for line in _panel_lines(None))
