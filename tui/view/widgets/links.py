"""The links panel: each GPU's PCIe and NVLink TX/RX as sparklines under the latency chart
(and, in each GPU's title, its HBM bandwidth utilisation where GPM gives it).

The sparklines share the latency chart's time axis (:class:`~tui.view.time_axis.TimeAxis`):
the same terminal column is the same wall-clock interval in both, so a copy burst in the PCIe
row sits right under the collectives it slowed. Bars are scaled to the link's peak (PCIe from
NVML's current generation x width, NVLink from links x speed), never to the data, so the axis
does not jitter and the numbers read as "% of what the link can do".

Heights follow the room the rank rows leave (``max_lines``): several lines per sparkline when
there is space, one line per link, or one line per GPU at 8+ GPUs on a small terminal.
Line API (``render_line``): one widget draws every row (STYLE.md point 5).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
from rich.segment import Segment
from rich.style import Style
from textual.geometry import Size
from textual.strip import Strip
from textual.widget import Widget

from tui.model.telemetry import GpuRow, TelemetrySnapshot
from tui.view.time_axis import TimeAxis, resample

BARS = "▁▂▃▄▅▆▇█"
#: Most lines one sparkline may use (taller says no more).
MAX_SPARK_H = 8

LABEL = Style(bold=True)
DIM = Style(dim=True)
TX = Style(color="cyan")
RX = Style(color="magenta")
ZERO = Style(color="grey39")
HOT = Style(bold=True, color="bright_red")
NA_STYLE = Style(dim=True, italic=True)
ALERT = Style(bold=True, color="black", bgcolor="yellow")
NOTE = Style(italic=True)


class RankGpu(NamedTuple):
    """One rank row's GPU, so the GPU rows follow the rank rows' order and name."""

    label: str  # "r0"
    host: str
    gpu: str  # GPU UUID or NVML index
    copy_gbps: float = math.nan  # the rank's offload copy rate (windowed)


class _Link(NamedTuple):
    name: str  # "PCIe" / "NVLink"
    tx: str
    rx: str
    peak: float


def _links(row: GpuRow) -> list[_Link]:
    return [
        _Link("PCIe", "pcie_tx_gbps", "pcie_rx_gbps", row.pcie_peak_gbps),
        _Link("NVLink", "nvlink_tx_gbps", "nvlink_rx_gbps", row.nvlink_peak_gbps),
    ]


def hbm_text(row: GpuRow, short: bool = False) -> str:
    """ "  HBM bw 37%": HBM bandwidth used vs its theoretical maximum (GPM DRAM_BW_UTIL), beside
    the links, since copies may slow collectives through HBM rather than the links (FACTS.md).
    "" without GPM (the sampler's notes say why), so machines without it show nothing new."""
    v = row.value("dram_bw_util_pct")
    if v is None:
        return ""
    return f"  HBM {v:.0f}%" if short else f"  HBM bw {v:.0f}%"


def _has(row: GpuRow, link: _Link) -> bool:
    return row.value(link.tx) is not None or row.value(link.rx) is not None


def _rate(row: GpuRow, metric: str) -> tuple[str, Style]:
    """ "46.3 GB/s  74%" (red from 80 % of peak), or the reason it is n/a (never a 0)."""
    v = row.value(metric)
    if v is None:
        return f"n/a: {row.reason(metric)}", NA_STYLE
    pct = row.pct(metric)
    text = f"{v:5.1f} GB/s" + (f" {pct:3.0f}%" if pct is not None else "")
    return text, HOT if pct is not None and pct >= 80 else Style()


def bar_levels(values: np.ndarray, peak: float, lines: int) -> np.ndarray:
    """0 = no sample, 1..8*lines = bar height (a sample of 0 GB/s is level 1, drawn dim)."""
    steps = 8 * lines
    if not peak > 0:
        finite = values[np.isfinite(values)]
        peak = float(finite.max()) if len(finite) and finite.max() > 0 else 1.0
    finite = np.isfinite(values)
    with np.errstate(invalid="ignore"):
        lv = np.ceil(np.clip(np.where(finite, values, 0.0) / peak, 0.0, 1.0) * steps)
    return np.where(finite, np.clip(lv, 1, steps), 0).astype(np.int16)


_CHARS = np.array([" ", *BARS])
_BLANK = Style()
_STYLES = (_BLANK, TX, RX, ZERO)


def spark_segments(levels: np.ndarray, colours: np.ndarray, values: np.ndarray, band: int) -> list[Segment]:
    """One line (``band`` from the bottom) of bars; ``colours`` picks TX (0) or RX (1) per
    column. Vectorised: one Segment per run of one style."""
    if len(levels) == 0:
        return []
    part = np.minimum(8, levels.astype(np.int32) - 8 * band)
    drawn = (levels > 0) & ((part > 0) | (band == 0))
    char = np.where(drawn, np.maximum(1, part), 0)
    code = np.where(drawn, np.where(values == 0, 3, np.where(colours > 0, 2, 1)), 0)
    starts = np.concatenate(([0], np.flatnonzero(np.diff(code)) + 1, [len(code)]))
    text = "".join(_CHARS[char].tolist())
    return [Segment(text[a:b], _STYLES[int(code[a])]) for a, b in zip(starts[:-1], starts[1:], strict=True)]


class _Series(NamedTuple):
    """What one sparkline draws: the max of TX and RX per column (coloured by the larger)."""

    values: np.ndarray
    colours: np.ndarray
    peak: float


def _series(row: GpuRow, metrics: Sequence[str], axis: TimeAxis, peak: float) -> _Series:
    cols = [resample(row.times_ns, row.series[m], axis.edges_ns) for m in metrics]
    if len(cols) == 1:
        return _Series(cols[0], np.full(len(cols[0]), 1 if metrics[0].endswith("rx_gbps") else 0), peak)
    stack = np.vstack(cols)
    filled = np.where(np.isnan(stack), -1.0, stack)
    values = np.where(np.all(np.isnan(stack), axis=0), np.nan, filled.max(axis=0))
    return _Series(values, filled.argmax(axis=0), peak)


def layout_lines(n_gpus: int, nvlink: Sequence[bool], h: int) -> int:
    """Lines of the full layout at sparkline height ``h``: per GPU, a title line, then TX and
    RX of PCIe (and of NVLink where present; one "n/a" line where not)."""
    return sum(1 + 2 * h + (2 * h if nv else 1) for nv in nvlink[:n_gpus])


def _split_leading_spaces(line: list[Segment]) -> list[Segment]:
    """Leading blanks as their own segment: SVG screenshots drop spaces that start a text run."""
    out: list[Segment] = []
    for seg in line:
        text = seg.text
        body = text.lstrip(" ")
        if body and body != text:
            out.append(Segment(text[: len(text) - len(body)]))
            out.append(Segment(body, seg.style))
        else:
            out.append(seg)
    return out


class LinksPanel(Widget):
    """GPU link throughput (and clocks, power) for every GPU of the run, from a TelemetrySnapshot."""

    DEFAULT_CSS = """
    LinksPanel { height: auto; }
    """

    def __init__(self, *, name: str | None = None, id: str | None = None) -> None:
        super().__init__(name=name, id=id)
        self._snap = TelemetrySnapshot()
        self.axis = TimeAxis()
        self.max_lines = 4
        self._rows: list[tuple[RankGpu, GpuRow | None]] = []
        self._lines: list[list[Segment]] = []
        #: "full" (TX and RX each a sparkline), "links" (one line per link) or "gpu" (one per GPU).
        self.layout_name = "full"
        self.spark_h = 1

    # ----------------------------------------------------------------------- inputs

    def update_snapshot(
        self,
        snap: TelemetrySnapshot,
        axis: TimeAxis | None = None,
        order: Sequence[RankGpu] = (),
        max_lines: int | None = None,
    ) -> None:
        """Show ``snap`` on ``axis`` (the latency chart's), GPUs in rank-row ``order`` (GPUs no
        rank names follow), in at most ``max_lines`` lines. UI thread only."""
        old, old_max = self._lines, self.max_lines
        self._snap = snap
        if axis is not None:
            self.axis = axis
        if max_lines is not None:
            self.max_lines = max(1, max_lines)
        self._rows = self._arrange(snap, order)
        self._build(self.size.width)
        # Unchanged lines are not repainted (no GPUs, or telemetry that did not move): a panel
        # repainted at every snapshot also made Textual redraw every widget between it and the grid.
        if self._lines != old or self.max_lines != old_max:
            self.refresh(layout=len(self._lines) != len(old) or self.max_lines != old_max)

    @staticmethod
    def _arrange(snap: TelemetrySnapshot, order: Sequence[RankGpu]) -> list[tuple[RankGpu, GpuRow | None]]:
        rows: list[tuple[RankGpu, GpuRow | None]] = []
        used: set[tuple[str, str]] = set()
        for who in order:
            match = next((g for g in snap.gpus if g.host == who.host and who.gpu in (g.uuid, str(g.index))), None)
            if match is not None:
                used.add((match.host, match.uuid))
            rows.append((who, match))
        for g in snap.gpus:
            if (g.host, g.uuid) not in used:
                host = g.host if len(g.host) <= 8 else g.host[:7] + "…"
                rows.append((RankGpu(f"{host}:{g.index if g.index >= 0 else '?'}", g.host, g.uuid), g))
        return rows

    @property
    def snapshot(self) -> TelemetrySnapshot:
        return self._snap

    def on_resize(self) -> None:
        self._build(self.size.width)
        self.refresh(layout=True)

    # ----------------------------------------------------------------------- layout

    def _choose(self) -> tuple[str, int]:
        gpus = [row for _, row in self._rows]
        nvlink = [row is not None and _has(row, _links(row)[1]) for row in gpus]
        for h in range(MAX_SPARK_H, 0, -1):
            if layout_lines(len(gpus), nvlink, h) <= self.max_lines:
                return "full", h
        if 3 * len(gpus) <= self.max_lines:  # a title line, a PCIe line, an NVLink line
            return "links", 1
        return "gpu", 1

    def _build(self, width: int) -> None:
        snap = self._snap
        if width <= 0:
            self._lines = []
            return
        if not snap.gpus:
            note = snap.nvml_note or "no GPUs"
            what = " · each GPU's PCIe and NVLink TX/RX show here, on the latency chart's time axis"
            self._lines = [[Segment("links: ", LABEL), Segment(note, NOTE), Segment(what, DIM)]]
            return
        self.layout_name, self.spark_h = self._choose()
        lines: list[list[Segment]] = []
        for i, (who, row) in enumerate(self._rows):
            if self.layout_name == "gpu" and len(lines) >= self.max_lines - 1 and i < len(self._rows) - 1:
                lines.append([Segment(f"… {len(self._rows) - i} more GPUs (a taller terminal shows them)", NOTE)])
                break
            if row is None:
                lines.append([Segment(f"{who.label:<4}", LABEL), Segment("no telemetry for this GPU", NOTE)])
                continue
            lines += self._gpu_lines(who, row, width)
        self._lines = [_split_leading_spaces(line) for line in lines]

    def _x0(self) -> int:
        return self.axis.x0 if self.axis.cells else 0

    def _chart(self, left: list[Segment], series: _Series | None, lines: int, width: int) -> list[list[Segment]]:
        """``lines`` lines: ``left`` text in the label columns (first line), bars in the chart's
        columns. Text longer than the label columns pushes the bars right: the columns they
        would have had (the oldest) are left out, the others keep their place."""
        x0 = self._x0()
        used = sum(seg.cell_length for seg in left)
        start = max(x0, used + 1)
        skip = start - x0
        out: list[list[Segment]] = []
        levels = bar_levels(series.values, series.peak, lines) if series is not None else None
        for line in range(lines):
            segs = list(left) if line == 0 else []
            pad = start - (used if line == 0 else 0)
            if series is None or levels is None or self.axis.cells == 0:
                out.append(segs)
                continue
            segs.append(Segment(" " * pad))
            band = lines - 1 - line
            segs += spark_segments(levels[skip:], series.colours[skip:], series.values[skip:], band)
            out.append(segs)
        return out

    def _gpu_lines(self, who: RankGpu, row: GpuRow, width: int) -> list[list[Segment]]:
        where = f"{row.host}:{row.index if row.index >= 0 else '?'}"
        name = who.label if ":" in who.label else f"{who.label} {where}"
        pcie, nvlink = _links(row)
        if self.layout_name == "gpu":
            left = [Segment(f"{who.label:<4}", DIM if row.stale else LABEL)]
            for link in (pcie, nvlink):
                left.append(Segment("PCIe " if link is pcie else "  NVL ", DIM))
                left += self._arrows(row, link)
            left += self._copy(who, row, short=True)
            if hbm_text(row):
                left.append(Segment(hbm_text(row, short=True), DIM))
            return self._chart(left, _series(row, (pcie.tx, pcie.rx), self.axis, pcie.peak), 1, width)
        out: list[list[Segment]] = [self._title(name, who, row)]
        for link in (pcie, nvlink):
            if not _has(row, link):
                out.append([Segment(f"  {link.name:<7}", DIM), Segment(f"n/a: {row.reason(link.tx)}", NA_STYLE)])
                continue
            if self.layout_name == "links":
                left = [Segment(f"  {link.name:<7}", DIM)] + self._rates(row, link)
                out += self._chart(left, _series(row, (link.tx, link.rx), self.axis, link.peak), 1, width)
                continue
            for metric, tag, st in ((link.tx, "TX", TX), (link.rx, "RX", RX)):
                text, vstyle = _rate(row, metric)
                left = [Segment(f"  {link.name:<7}", DIM), Segment(f"{tag} ", st), Segment(text, vstyle)]
                series = _series(row, (metric,), self.axis, link.peak) if row.value(metric) is not None else None
                out += self._chart(left, series, self.spark_h, width)
        return out

    def _rates(self, row: GpuRow, link: _Link, short: bool = False) -> list[Segment]:
        segs: list[Segment] = []
        for metric, tag, st in ((link.tx, "TX", TX), (link.rx, "RX", RX)):
            v = row.value(metric)
            pct = row.pct(metric)
            if v is None:
                segs += [Segment(f"{tag} ", st), Segment("n/a ", NA_STYLE)]
                continue
            text = f"{v:.1f}" if short else f"{v:5.1f} GB/s"
            if pct is not None:
                text += f" {pct:.0f}%"
            segs += [Segment(f"{tag} ", st), Segment(text + " ", HOT if pct is not None and pct >= 80 else Style())]
        return segs

    @staticmethod
    def _arrows(row: GpuRow, link: _Link) -> list[Segment]:
        """ "3.5↑ 59.3↓ 94%": TX and RX GB/s and the busier direction's share of the peak."""
        if not _has(row, link):
            return [Segment(f"n/a: {row.reason(link.tx)}", NA_STYLE)]
        segs: list[Segment] = []
        for metric, arrow, st in ((link.tx, "↑", TX), (link.rx, "↓", RX)):
            v = row.value(metric)
            segs += [Segment("n/a" if v is None else f"{v:.1f}"), Segment(f"{arrow} ", st)]
        pcts = [p for p in (row.pct(link.tx), row.pct(link.rx)) if p is not None]
        if pcts:
            segs.append(Segment(f"{max(pcts):.0f}%", HOT if max(pcts) >= 80 else Style()))
        return segs

    @staticmethod
    def _copy(who: RankGpu, row: GpuRow, short: bool = False) -> list[Segment]:
        """The rank's offload copy rate as a share of the PCIe peak (what the copies get)."""
        if not math.isfinite(who.copy_gbps) or who.copy_gbps <= 0:
            return []
        peak = row.pcie_peak_gbps
        pct = f" = {100 * who.copy_gbps / peak:.0f}% of PCIe peak" if peak > 0 else ""
        if short:
            return [
                Segment("  copy ", DIM),
                Segment(f"{100 * who.copy_gbps / peak:.0f}%" if peak > 0 else f"{who.copy_gbps:.1f}"),
            ]
        return [Segment("  copy ", DIM), Segment(f"{who.copy_gbps:.1f} GB/s{pct}")]

    def _title(self, name: str, who: RankGpu, row: GpuRow) -> list[Segment]:
        segs = [Segment(name, DIM if row.stale else LABEL)]
        if row.name:
            segs.append(Segment(f"  {row.name}", DIM))
        if row.pcie_gen > 0 and row.pcie_width > 0:
            peak = f" {row.pcie_peak_gbps:.1f} GB/s peak" if row.pcie_peak_gbps > 0 else ""
            segs.append(Segment(f"  PCIe Gen{row.pcie_gen} x{row.pcie_width}{peak}", DIM))
        segs += self._copy(who, row)
        segs.append(Segment("  " + self._clocks(row), DIM))
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
            + hbm_text(row)
        )

    # ----------------------------------------------------------------------- drawing

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return max(1, min(len(self._lines), self.max_lines))

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        if y < len(self._lines):
            return Strip(self._lines[y]).crop_extend(0, width, None).apply_style(self.rich_style)
        return Strip.blank(width, self.rich_style)

    def line_text(self, y: int, width: int | None = None) -> str:
        """The plain text of line ``y`` (what the terminal shows, without styles)."""
        if width is not None and width != self.size.width:
            self._build(width)
        if y >= len(self._lines):
            return ""
        return "".join(seg.text for seg in self._lines[y])

    def line_texts(self) -> list[str]:
        return [self.line_text(i) for i in range(len(self._lines))]
