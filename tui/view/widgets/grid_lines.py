"""What the rows view and the heat map share: the column header, fitting a line of Segments to
the width, the widget's base style combined once per style (:class:`Restyle`), and which ranks
failed."""

from __future__ import annotations

import math

from rich.segment import Segment
from rich.style import Style

from tui.model.snapshot import RankView
from tui.view.widgets.grid_cells import HEAT_LABEL_W, HOST_W, NUM_W, is_narrow
from tui.view.widgets.palette import CLIPPED, HEAT_RAMP, MODE_COLORS, MUTED, STRAGGLER, TEXT, style


class _Line:
    """A line of Segments built piece by piece (cheaper than rich Text + a Console)."""

    def __init__(self) -> None:
        self.segments: list[Segment] = []

    def append(self, text: str, st: object = None) -> _Line:
        self.segments.append(Segment(text, st))  # type: ignore[arg-type]
        return self


def column_header(
    width: int,
    top: float,
    k: int,
    view: str,
    n_ranks: int,
    per_host: int = 0,
    host_prefix: str = "",
    modes: bool = True,
) -> list[list[Segment]]:
    """Two header lines: column names, then units and the colour legend (the bars' colours by
    mode only where the run has modes: a user's job without a mode knob draws one colour)."""
    head = style(MUTED, bold=True)
    unit = style(MUTED)
    first, second = _Line(), _Line()
    if view == "heat":
        first.append(f"{'ranks':<{HEAT_LABEL_W}}", head)
        hosts = f"; hosts {host_prefix}…" if host_prefix else ""
        what = f" (max of ≤{per_host} ranks per host{hosts})" if per_host else ""
        first.append(f"latency heat map · {n_ranks} ranks × iterations{what} · {k} it/cell", head)
        second.append(" " * HEAT_LABEL_W).append("0 ms ", unit)
        for color in HEAT_RAMP:
            second.append("█", style(color))
        second.append(f" {_axis(top)} ms", unit)
        second.append("   █ above", style(CLIPPED))
        second.append("   v: rows", unit)
    else:
        narrow = is_narrow(width)
        cols = ("last", "p50", "p99", "busbw") if narrow else ("last", "p50", "p99", "busbw", "copy")
        host = "" if narrow else f"{'host:gpu':<{HOST_W}}"
        names = f"  {'rank':>5}  {host}" + "".join(f"{c:>{NUM_W}}" for c in cols)
        first.append(names + "  ", head)
        first.append(f"latency per iteration · 0–{_axis(top)} ms · {k} it/cell", head)
        second.append(" " * (2 + 5 + 2 + len(host)))
        second.append("".join(f"{u:>{NUM_W}}" for u in ("ms", "ms", "ms", "GB/s", "GB/s")[: len(cols)]) + "  ", unit)
        for mode, color in MODE_COLORS.items() if modes else ():
            second.append("■", style(color))
            second.append(f"{mode} ", unit)
        second.append("▲", style(TEXT, bold=True)).append("clipped ", unit)
        second.append("◀", style(STRAGGLER, bold=True)).append("straggler", unit)
    return [fit(first.segments, width), fit(second.segments, width)]


def _axis(top: float) -> str:
    return f"{top:g}" if math.isfinite(top) else "?"


def fit(segments: list[Segment], width: int, pad: Style | None = None) -> list[Segment]:
    """Crop or pad (with ``pad``'s style) a line to exactly ``width`` cells."""
    return Segment.adjust_line_length(segments, width, style=pad)


def fit_known(segments: list[Segment], length: int, width: int, pad: Style | None = None) -> list[Segment]:
    """:func:`fit` for a line whose cell length is known: pads as it does (with ``pad``'s
    style) without measuring every segment (only cropping needs that)."""
    if length < width:
        segments.append(Segment(" " * (width - length), pad))
        return segments
    return segments if length == width else fit(segments, width)


class Restyle:
    """``base + style`` for the styles of one widget's lines, each combination computed once.

    The grid's lines carry the widget's own style (background, text colour) under theirs.
    Combining per segment per frame (``Style.__add__`` costs ~4 us) was a third of a heat-map
    frame at 64 ranks; the combined styles are kept here, keyed by id (the entry holds the
    style, so its id stays its own), and the heat map's colour tables are built with them.
    """

    def __init__(self, base: Style | None = None) -> None:
        self.base = base
        self._combined: dict[int, tuple[Style, Style]] = {}
        #: The heat map's (chars, styles) tables, combined with ``base`` (see _heat_table).
        self.heat_tables: dict[tuple[bool, bool, bool], tuple[list[str], list[Style | None]]] = {}
        #: Heat-map segments by (table, code, run length): a heat line is mostly runs of one or
        #: two cells, and building ~100 Segments per line per frame cost more than drawing them.
        #: Segments are immutable; at most tables x codes x line width of them exist.
        self.heat_segments: dict[tuple[bool, bool, bool], dict[int, Segment]] = {}
        #: Bar styles by style key, per colour variant (0 = live, 1 = dimmed, 2 = failed), combined.
        self.spark_styles: tuple[dict[int, Style | None], ...] = ({}, {}, {})
        #: The rows view's number columns, fitted and combined, by the values they show: a rank's
        #: numbers change at 5 Hz (tui.model.snapshot_builder.TEXT_EVERY_S), its bars at 15.
        self.number_lines: dict[tuple[object, ...], list[Segment]] = {}

    def __call__(self, st: Style | None) -> Style | None:
        base = self.base
        if base is None:
            return st
        if st is None:
            return base
        entry = self._combined.get(id(st))
        if entry is None:
            if len(self._combined) > 4096:  # styles come from small tables; this is only a bound
                self._combined.clear()
            entry = self._combined[id(st)] = (st, base + st)
        return entry[1]

    def line(self, segments: list[Segment]) -> list[Segment]:
        """A line's segments with their styles combined (control segments left as they are)."""
        if self.base is None:
            return segments
        return [seg if seg.control else Segment(seg.text, self(seg.style)) for seg in segments]


#: No base style: segments as the views build them (tests, and widgets without a style).
PLAIN = Restyle()


def failed(r: RankView) -> bool:
    """Exited with a non-zero code (red); a clean exit (code 0) is only dimmed."""
    return r.state == "exited" and r.exit_code != 0
