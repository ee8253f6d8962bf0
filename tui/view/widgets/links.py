"""The links panel: one line per GPU with PCIe / NVLink sparklines, clocks and power.

Line API (``render_line``): one widget draws every GPU row, so 8-64 rows at 10+ Hz stay
cheap (STYLE.md point 5). Sparklines are scaled to the link's peak, not to the data, so the
axis never jitters; columns are time bins over the same window as the rank rows.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from rich.segment import Segment
from rich.style import Style
from textual.geometry import Size
from textual.strip import Strip
from textual.widget import Widget

from tui.model.telemetry import GpuRow, TelemetrySnapshot

BARS = "▁▂▃▄▅▆▇█"
DEFAULT_SPAN_S = 30.0

LABEL = Style(bold=True)
DIM = Style(dim=True)
TX = Style(color="cyan")
RX = Style(color="magenta")
HOT = Style(bold=True, color="bright_red")
NA_STYLE = Style(dim=True, italic=True)
ALERT = Style(bold=True, color="black", bgcolor="yellow")
NOTE = Style(italic=True)


def spark(times_ns: np.ndarray, values: np.ndarray, t0: int, t1: int, width: int, top: float) -> str:
    """Max of each time bin of [t0, t1) as a bar scaled to ``top``; blank where no sample."""
    if width <= 0:
        return ""
    edges = np.linspace(t0, t1, width + 1).astype(np.int64)
    idx = np.searchsorted(times_ns, edges)
    out = []
    for c in range(width):
        chunk = values[idx[c] : idx[c + 1]]
        chunk = chunk[~np.isnan(chunk)] if len(chunk) else chunk
        if not len(chunk) or not top > 0:
            out.append(" ")
            continue
        frac = min(1.0, max(0.0, float(chunk.max()) / top))
        out.append(BARS[min(len(BARS) - 1, int(frac * (len(BARS) - 1) + 0.5))])
    return "".join(out)


def _gbps(row: GpuRow, metric: str) -> tuple[str, Style]:
    v = row.value(metric)
    if v is None:
        return f"n/a: {row.reason(metric)}", NA_STYLE
    pct = row.pct(metric)
    text = f"{v:5.1f} GB/s" + (f" {pct:3.0f}%" if pct is not None else "")
    return text, HOT if pct is not None and pct >= 80 else Style()


class LinksPanel(Widget):
    """GPU link throughput, clocks and power for every GPU of the run, from a TelemetrySnapshot."""

    DEFAULT_CSS = """
    LinksPanel { height: auto; }
    """

    def __init__(self, span_s: float = DEFAULT_SPAN_S, *, name: str | None = None, id: str | None = None) -> None:
        super().__init__(name=name, id=id)
        self._snap = TelemetrySnapshot()
        self._window: tuple[int, int] | None = None
        self.span_s = span_s
        self._cache: dict[tuple[int, int], Strip] = {}
        self._rows: list[tuple[str, GpuRow | None]] = []

    def update_snapshot(
        self,
        snap: TelemetrySnapshot,
        window: tuple[int, int] | None = None,
        order: Sequence[tuple[str, str, str]] | None = None,
    ) -> None:
        """Show ``snap``; ``window`` = (t0_ns, t1_ns) of the rank rows' time axis (default:
        the last ``span_s`` seconds up to the snapshot time). ``order`` = (label, host, gpu)
        per rank row, gpu being a GPU UUID or NVML index, so GPU rows line up with rank rows;
        GPUs no rank names follow. Call on the UI thread only."""
        old_rows = self._row_count()
        self._snap = snap
        self._window = window
        self._rows = self._arrange(snap, order)
        self._cache.clear()
        self.refresh(layout=self._row_count() != old_rows)

    @staticmethod
    def _arrange(
        snap: TelemetrySnapshot, order: Sequence[tuple[str, str, str]] | None
    ) -> list[tuple[str, GpuRow | None]]:
        rows: list[tuple[str, GpuRow | None]] = []
        used: set[tuple[str, str]] = set()
        for label, host, gpu in order or ():
            match = next((g for g in snap.gpus if g.host == host and gpu in (g.uuid, str(g.index))), None)
            if match is not None:
                used.add((match.host, match.uuid))
            rows.append((label, match))
        for g in snap.gpus:
            if (g.host, g.uuid) not in used:
                host = g.host if len(g.host) <= 8 else g.host[:7] + "…"
                rows.append((f"{host}:{g.index if g.index >= 0 else '?'}", g))
        return rows

    @property
    def snapshot(self) -> TelemetrySnapshot:
        return self._snap

    def _row_count(self) -> int:
        return max(1, len(self._rows)) if self._snap.gpus else 1

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return self._row_count()

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        key = (y, width)
        strip = self._cache.get(key)
        if strip is None:
            strip = Strip(self.line_segments(y, width)).crop_extend(0, width, self.rich_style)
            self._cache[key] = strip
        return strip

    def line_text(self, y: int, width: int) -> str:
        """The plain text of row ``y`` at ``width`` (what the terminal shows, without styles)."""
        return "".join(seg.text for seg in self.line_segments(y, width))

    def line_segments(self, y: int, width: int) -> list[Segment]:
        snap = self._snap
        if not snap.gpus:
            if y != 0:
                return []
            note = snap.nvml_note or "no GPUs"
            return [Segment("links: ", LABEL), Segment(note, NOTE)]
        if y >= len(self._rows):
            return []
        label, row = self._rows[y]
        if row is None:
            return [Segment(f"{label:<11} ", LABEL), Segment("no telemetry for this GPU", NOTE)]
        return self._gpu_line(label, row, width)

    def _gpu_line(self, label: str, row: GpuRow, width: int) -> list[Segment]:
        t1 = self._window[1] if self._window else self._snap.t_ns
        t0 = self._window[0] if self._window else t1 - int(self.span_s * 1e9)
        has_nvlink = row.value("nvlink_tx_gbps") is not None or row.value("nvlink_rx_gbps") is not None
        n_sparks = 4 if has_nvlink else 2
        fixed = 12 + n_sparks * 24 + 44 + (0 if has_nvlink else 24)
        sw = max(3, min(40, (width - fixed) // n_sparks))
        segs: list[Segment] = [Segment(f"{label:<11} ", DIM if row.stale else LABEL)]
        links = [("PCIe", "pcie_tx_gbps", "pcie_rx_gbps", row.pcie_peak_gbps)]
        if has_nvlink:
            links.append(("NVL", "nvlink_tx_gbps", "nvlink_rx_gbps", row.nvlink_peak_gbps))
        for name, tx, rx, peak in links:
            segs.append(Segment(f"{name} "))
            for metric, tag, style in ((tx, "TX", TX), (rx, "RX", RX)):
                text, vstyle = _gbps(row, metric)
                if row.value(metric) is not None:
                    segs.append(Segment(f"{tag} ", DIM))
                    segs.append(Segment(spark(row.times_ns, row.series[metric], t0, t1, sw, peak), style))
                    segs.append(Segment(f" {text}  ", vstyle))
                else:
                    segs.append(Segment(f"{tag} {text}  ", vstyle))
        if not has_nvlink:
            reason = row.reason("nvlink_tx_gbps")
            segs.append(Segment(f"NVLink n/a: {reason}  ", NA_STYLE))
        segs.append(Segment(self._clocks(row)))
        if row.highlight:
            segs.append(Segment(f" {row.highlight} ", ALERT))
        elif row.throttle:
            segs.append(Segment(" " + ",".join(row.throttle), Style(color="yellow")))
        if row.stale:
            segs.append(Segment(" (stale)", DIM))
        return segs

    @staticmethod
    def _clocks(row: GpuRow) -> str:
        def num(metric: str, fmt: str) -> str:
            v = row.value(metric)
            return "n/a" if v is None or math.isnan(v) else format(v, fmt)

        return (
            f"SM {num('sm_clock_mhz', '.0f')}/MEM {num('mem_clock_mhz', '.0f')} MHz  "
            f"{num('power_w', '.0f')}/{num('power_limit_w', '.0f')} W  util {num('gpu_util_pct', '.0f')}%"
        )
