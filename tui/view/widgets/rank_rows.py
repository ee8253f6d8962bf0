"""Rank rows and the latency heat map as lists of rich Segments (no Textual here).

The grid widget builds a :class:`RowsView` or a :class:`HeatView` once per snapshot (or
resize); its ``render_line`` asks the view for each visible line. Latency
cells are bucketed by iteration (aligned to multiples of the bucket size, so the picture
does not shimmer as new iterations arrive) and share one y-axis across ranks.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

import numpy as np
from rich.cells import cell_len
from rich.segment import Segment
from rich.style import Style

from tui.model.history import NO_MODE
from tui.model.snapshot import History, RankView, Snapshot
from tui.view.time_axis import iteration_edges
from tui.view.widgets.class_row import class_numbers
from tui.view.widgets.palette import (
    ACCENT,
    CLIPPED,
    EXITED,
    HEAT_RAMP,
    LIVE,
    MODE_COLORS,
    MUTED,
    SPARK_CHARS,
    STALE,
    STRAGGLER,
    TEXT,
    WARN,
    blend,
    fmt_gbps,
    fmt_ms,
    mode_color,
    style,
)
from workers.wire.protocol import MODES
from workers.wire.stats import percentile

#: Fixed columns left of the sparkline: state, rank, host:gpu, last, p50, p99, busbw, copy.
HOST_W = 15
NUM_W = 8
FIXED_W = 2 + 5 + 2 + HOST_W + 5 * NUM_W + 2
HEAT_LABEL_W = 8
MIN_SPARK = 8
#: Without host:gpu and copy columns (terminals narrower than NARROW_BELOW): more chart columns.
NARROW_W = 2 + 5 + 2 + 4 * NUM_W + 2
NARROW_BELOW = FIXED_W + 40


def is_narrow(width: int) -> bool:
    """An 80-column terminal drops host:gpu and copy: 14 chart columns become 37."""
    return 0 < width < NARROW_BELOW


def fixed_width(width: int) -> int:
    """Columns left of the latency chart at this terminal width."""
    return NARROW_W if is_narrow(width) else FIXED_W


@dataclass(frozen=True)
class Cells:
    """Latency (ms) and mode per (rank, cell); cell j covers ``k`` iterations."""

    ms: np.ndarray  # (ranks, cells) float, NaN = no data
    mode: np.ndarray  # (ranks, cells) int, -1 = no data
    k: int
    first_iteration: int  # iteration of the first cell's first column
    first_start_ns: int  # host time of the first visible iteration (0 = unknown)
    #: Host time where each cell starts, plus the end of the last (cells + 1; empty = unknown).
    edges_ns: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))


def bucket(history: History, cells: int, k: int) -> Cells:
    """The last ``cells`` buckets of ``k`` iterations, max latency per bucket.

    Max, not mean: a profiler should show the spike, not average it away.
    """
    n_ranks, n_cols = history.ms.shape
    cells = max(0, cells)
    if n_cols == 0 or cells == 0:
        return Cells(np.full((n_ranks, cells), np.nan), np.full((n_ranks, cells), -1), k, history.first_iteration, 0)
    last = history.first_iteration + n_cols - 1
    start_it = (last // k - cells + 1) * k
    lo, hi = max(start_it, history.first_iteration), last
    src = slice(lo - history.first_iteration, hi - history.first_iteration + 1)
    # Only the cells the history reaches are computed (the screen usually spans more
    # iterations than the history holds: the rest stays NaN / -1 without being touched).
    j_lo, j_hi = (lo - start_it) // k, (hi - start_it) // k
    part_it = start_it + j_lo * k  # first iteration of the first computed cell
    width = (j_hi - j_lo + 1) * k
    ms = np.full((n_ranks, width), np.nan, dtype=np.float32)
    mode = np.full((n_ranks, width), -1, dtype=np.int16)
    dst = slice(lo - part_it, hi - part_it + 1)
    ms[:, dst] = history.ms[:, src]
    m = history.mode[:, src].astype(np.int16)
    mode[:, dst] = np.where(m == NO_MODE, -1, m)
    out_ms = np.full((n_ranks, cells), np.nan, dtype=np.float32)
    out_mode = np.full((n_ranks, cells), -1, dtype=np.int16)
    if n_ranks:
        # fmax skips NaN (all-NaN -> NaN) without nanmax's copy of the array.
        out_ms[:, j_lo : j_hi + 1] = _bucket_max(ms.reshape(n_ranks, -1, k), np.fmax)
        out_mode[:, j_lo : j_hi + 1] = _bucket_max(mode.reshape(n_ranks, -1, k), np.maximum)
    first_start = 0
    if len(history.start_ns):
        visible = history.start_ns[src]
        nz = visible[visible > 0]
        first_start = int(nz[0]) if len(nz) else 0
    edges = iteration_edges(history.start_ns, history.first_iteration, start_it, cells, k)
    return Cells(out_ms, out_mode, k, start_it, first_start, edges)


def _bucket_max(cells: np.ndarray, op: np.ufunc) -> np.ndarray:
    """``op``-reduction over the last axis (the k iterations of a cell) as k whole-array steps:
    a numpy reduction over a short last axis runs its inner loop once per cell (10 ms for
    512 ranks x 1024 iterations), k element-wise passes take well under 1 ms."""
    out = cells[..., 0].copy()
    for j in range(1, cells.shape[-1]):
        op(out, cells[..., j], out=out)
    return out


def visible_top(cells: Cells) -> float:
    """The latency the y-axis should cover: the 99th percentile of the visible cells, so
    one spike is drawn clipped instead of flattening every other rank."""
    finite = cells.ms[np.isfinite(cells.ms)]
    if len(finite) == 0:
        return math.nan
    return _percentile_by_partition(finite, 99)


def _percentile_by_partition(values: np.ndarray, q: float) -> float:
    """``workers.wire.stats.percentile`` (numpy's linear method, bit for bit) from the two
    order statistics it needs, found with a partition instead of a sort (512 ranks x 150
    cells: 0.5 ms, not 4). Zeros at the interpolation points take the sorting path, which
    reproduces numpy's handling of signed zeros."""
    n = len(values)
    v = (n - 1) * (q / 100)
    prev = -1 if v >= n - 1 else math.floor(v)
    a, b = (n - 1, n - 1) if prev < 0 else (prev, prev + 1)
    part = np.partition(values, (a, b) if a != b else a)
    lo, hi = float(part[a]), float(part[b])
    if lo == 0 or hi == 0:
        return percentile(values, q)
    t = v - prev
    diff = hi - lo
    return hi - diff * (1 - t) if t >= 0.5 else lo + diff * t


# --------------------------------------------------------------------------- rows


class _Line:
    """A line of Segments built piece by piece (cheaper than rich Text + a Console)."""

    def __init__(self) -> None:
        self.segments: list[Segment] = []

    def append(self, text: str, st: object = None) -> _Line:
        self.segments.append(Segment(text, st))  # type: ignore[arg-type]
        return self


def column_header(
    width: int, top: float, k: int, view: str, n_ranks: int, per_host: int = 0, host_prefix: str = ""
) -> list[list[Segment]]:
    """Two header lines: column names, then units and the colour legend."""
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
        for mode, color in MODE_COLORS.items():
            second.append("■", style(color))
            second.append(f"{mode} ", unit)
        second.append("▲", style(TEXT, bold=True)).append("clipped ", unit)
        second.append("◀", style(STRAGGLER, bold=True)).append("straggler", unit)
    return [_fit(first.segments, width), _fit(second.segments, width)]


def _axis(top: float) -> str:
    return f"{top:g}" if math.isfinite(top) else "?"


def _fit(segments: list[Segment], width: int, pad: Style | None = None) -> list[Segment]:
    """Crop or pad (with ``pad``'s style) a line to exactly ``width`` cells."""
    return Segment.adjust_line_length(segments, width, style=pad)


def _fit_known(segments: list[Segment], length: int, width: int, pad: Style | None = None) -> list[Segment]:
    """:func:`_fit` for a line whose cell length is known: pads as it does (with ``pad``'s
    style) without measuring every segment (only cropping needs that)."""
    if length < width:
        segments.append(Segment(" " * (width - length), pad))
        return segments
    return segments if length == width else _fit(segments, width)


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


def _state_glyph(r: RankView) -> tuple[str, str]:
    if r.state == "exited" and not failed(r):
        return ("✓", MUTED)
    return {
        "live": ("●", LIVE),
        "stale": ("◌", WARN),
        "stalled": ("◑", WARN),
        "exited": ("✗", EXITED),
        "waiting": ("○", MUTED),
    }.get(r.state, ("?", MUTED))


def _row_text_color(r: RankView) -> str:
    if r.state == "exited":
        return EXITED if failed(r) else STALE
    return {"stale": STALE, "waiting": MUTED}.get(r.state, TEXT)


def state_note(r: RankView, proc: str | None) -> str:
    """What to write over the empty end of a row whose rank stopped reporting."""
    if r.state == "exited":
        why = f": {r.exit_reason}" if r.exit_reason else ""
        return f" exited ({r.exit_code}){why} "
    if r.state == "stale":
        what = {"stopped": "stopped (SIGSTOP?)", "gone": "process gone"}.get(proc or "", "silent")
        return f" {what} {r.silent_s:.0f}s "
    if r.state == "stalled":
        return f" stalled: no collective for {r.idle_s:.0f}s, heartbeat alive "
    if r.state == "waiting":
        return " waiting for data "
    return ""


class RowsView:
    """Lines of the rows view, built on demand (only the visible ranks are ever drawn,
    which keeps 512 ranks cheap): ``row_h`` lines per rank, numbers on the left, the
    latency bars coloured by the mode in force, ``row_h`` x 8 levels high."""

    def __init__(
        self,
        snap: Snapshot,
        cells: Cells,
        top: float,
        width: int,
        procs: dict[int, str | None] | None = None,
        row_h: int = 1,
        restyle: Restyle = PLAIN,
    ) -> None:
        self.snap, self.cells, self.width, self.procs = snap, cells, width, procs or {}
        self.restyle = restyle
        self.row_h = max(1, row_h)
        self.narrow = is_narrow(width)
        self.levels = _levels(cells.ms, top, 8 * self.row_h)
        self.n_lines = len(snap.ranks) * self.row_h
        self._bands: dict[int, list[list[Segment]]] = {}  # rank row -> its bar lines, bottom first

    def _spark_block(self, first: int) -> None:
        """The bars of ranks ``first`` .. ``first + SPARK_BLOCK`` (the visible ones, mostly)."""
        ranks = self.snap.ranks[first : first + SPARK_BLOCK]
        end = first + len(ranks)
        notes = [state_note(r, self.procs.get(r.rank)) for r in ranks]
        block = _spark_bands(
            self.levels[first:end], self.cells.mode[first:end], list(ranks), notes, self.row_h, self.restyle
        )
        for i, bands in enumerate(block, start=first):
            self._bands.setdefault(i, bands)

    def line(self, index: int) -> list[Segment]:
        i, line = divmod(index, self.row_h)
        r = self.snap.ranks[i]
        if line == 0:
            segs = _numbers(self.snap, r, self.narrow)
        elif line == 1:
            segs = _run_numbers(r, self.narrow)
        elif line == 2:
            segs = _counts(r, self.narrow)
        elif line == 3:  # p50 per overlap class (tui.view.widgets.class_row)
            segs = class_numbers(r, fixed_width(self.width))
        else:
            segs = [Segment(" " * fixed_width(self.width))]
        if not (self.cells.ms.ndim == 2 and self.cells.ms.shape[1]):
            return self.restyle.line(_fit(segs, self.width))
        bands = self._bands.get(i)
        if bands is None:  # the bar lines of a block of ranks at once (numpy per block, not per line)
            self._spark_block(i)
            bands = self._bands[i]
        spark = bands[self.row_h - 1 - line]  # band 0 = the rank's bottom line (styles combined)
        fixed = fixed_width(self.width)
        numbers = self.restyle.line(_fit(segs, fixed))
        if _SPARK_NARROW and not (line == 0 and r.state != "live"):  # no note: every cell is one column
            return _fit_known(numbers + spark, fixed + len(self.levels[i]), self.width, self.restyle(None))
        return _fit(numbers + spark, self.width, self.restyle(None))


def _numbers(snap: Snapshot, r: RankView, narrow: bool = False) -> list[Segment]:
    glyph, gcolor = _state_glyph(r)
    color = _row_text_color(r)
    num = style(color)
    straggler = snap.straggler == r.rank
    where = f"{r.host}:{r.gpu}" if r.host else "?"
    if len(where) > HOST_W - 1:
        where = "…" + where[-(HOST_W - 2) :]
    return [
        Segment(f"{glyph} ", style(gcolor)),
        Segment(f"{r.rank:>5}", style(STRAGGLER if straggler else color, bold=True)),
        Segment("◀ " if straggler else "  ", style(STRAGGLER, bold=True)),
        *([] if narrow else [Segment(f"{where:<{HOST_W}}", style(MUTED if r.state == "live" else color))]),
        Segment(fmt_ms(r.last_ms, NUM_W), style(color, bold=r.state == "live")),
        Segment(fmt_ms(r.p50_ms, NUM_W) + fmt_ms(r.p99_ms, NUM_W), num),
        Segment(fmt_gbps(r.busbw_gbps, NUM_W), style(ACCENT if r.state == "live" else color)),
        *([] if narrow else [Segment(fmt_gbps(r.copy_gbps, NUM_W), num)]),
        Segment("  "),
    ]


def _run_numbers(r: RankView, narrow: bool = False) -> list[Segment]:
    """Whole-run max, p50, p99, busbw and copy GB/s under the windowed ones (dim)."""
    dim = style(STALE)
    # "whole run" over all its columns; the first is the run's max (under "last"), so it says so.
    if narrow:  # no host column: "run" where the rank number stands
        lead = [Segment(f"  {'run':<5}", dim)]
    else:
        lead = [Segment(" " * (2 + 5 + 2)), Segment(f"{'whole run':>{HOST_W - 4}}", dim)]
    copy = "" if narrow else fmt_gbps(r.copy_run.busbw_gbps, NUM_W)
    return [
        *lead,
        Segment(f"{'max ' + fmt_ms(r.run.max_ms, 0):>{NUM_W + (4 if not narrow else 2)}}", dim),
        Segment(fmt_ms(r.run.p50_ms, NUM_W) + fmt_ms(r.run.p99_ms, NUM_W), dim),
        Segment(fmt_gbps(r.run.busbw_gbps, NUM_W) + copy, dim),
        Segment("  "),
    ]


def _counts(r: RankView, narrow: bool = False) -> list[Segment]:
    """Collectives received, rate, missing and dropped records of one rank (dim)."""
    rate = f"{r.iter_rate:,.0f}/s" if math.isfinite(r.iter_rate) else "-/s"
    text = f"{r.count:,} it · {rate} · missing {r.missing:,} · drops {r.drops:,}"
    room = (NARROW_W if narrow else FIXED_W) - 11
    if narrow:
        text = f"{r.count:,} it · {rate} · miss {r.missing:,} · drop {r.drops:,}"
    bad = r.missing or r.drops
    return [
        Segment(" " * (2 + 5 + 2)),
        Segment(f"{text[:room]:>{room}}", style(WARN if bad else STALE)),
        Segment("  "),
    ]


def _levels(ms: np.ndarray, top: float, steps: int = 8) -> np.ndarray:
    """0 = no data, 1..steps = bar height, steps + 1 = above the axis top (clipped)."""
    if ms.size == 0 or not top > 0:
        return np.zeros(ms.shape, dtype=np.int16)
    with np.errstate(invalid="ignore"):
        lv = np.ceil(ms / top * steps)
    lv = np.nan_to_num(lv, nan=0.0)
    lv = np.clip(lv, 1, steps + 1)
    lv[~np.isfinite(ms)] = 0
    return lv.astype(np.int16)


#: Spark cells: a character index into _SPARK_GLYPHS (0 = blank, 1..8 = SPARK_CHARS, 9 = the
#: clipped marker) and a style key (0 = blank, else 1 + mode slot * 2 + bold; mode slot 0 = no
#: mode, 1.. = MODES, last = unknown; -1 = the state note).
_SPARK_GLYPHS = np.array([" ", *SPARK_CHARS, "▲"])
#: Whether every bar character is one terminal cell wide (then a row's length is known).
_SPARK_NARROW = all(cell_len(ch) == 1 for ch in _SPARK_GLYPHS)


def _spark_style(key: int, variant: int) -> Style:
    """The style of one spark style key (what the per-cell loop drew)."""
    if key == 0:
        return style(None)
    slot, bold = divmod(key - 1, 2)
    color = mode_color(slot - 1)
    if variant == 2:
        color = blend(EXITED, amount=0.45)
    elif variant == 1:
        color = blend(color)
    return style(color, bold=bool(bold))


#: The spark glyphs as code points: a block's text is one array decoded at once.
_SPARK_CODES = np.array([ord(ch) for ch in _SPARK_GLYPHS.tolist()], dtype="<u4")
#: Ranks whose bars are computed together (one set of numpy calls for all, not per rank).
SPARK_BLOCK = 64


def _spark_bands(
    levels: np.ndarray,
    modes: np.ndarray,
    ranks: list[RankView],
    notes: list[str],
    bands: int,
    restyle: Restyle = PLAIN,
) -> list[list[list[Segment]]]:
    """Every line of the bars of a block of ranks (``levels`` and ``modes``: ranks x cells),
    per rank bottom band first: characters and styles of all ranks and bands computed at once
    with numpy, the text decoded once, then one Segment per run of equal style per band (a
    Python loop per run, not per cell). ``notes[i]`` goes over the tail of rank i's top band.
    Styles come combined by ``restyle``."""
    n_ranks, n = levels.shape
    if n == 0:
        return [[[] for _ in range(bands)] for _ in range(n_ranks)]
    lv = levels.astype(np.int32)
    floors = 8 * np.arange(bands, dtype=np.int32)[:, None]
    part = np.minimum(8, lv[:, None, :] - floors)  # ranks x bands x cells
    clipped = lv == 8 * bands + 1
    blank = (lv == 0)[:, None, :] | (part <= 0)
    chars = np.maximum(part, 1)
    top = bands - 1  # the clipped marker and the note go on the top band
    chars[:, top] = np.where(clipped, len(SPARK_CHARS) + 1, chars[:, top])
    chars[blank] = 0
    keys = np.empty(chars.shape, dtype=np.int32)
    keys[:] = (1 + (np.clip(modes.astype(np.int32), -1, len(MODES)) + 1) * 2 + clipped)[:, None, :]
    keys[blank] = 0
    # Notes (ranks that stopped): written over the empty tail (where newer iterations would be).
    placed: dict[int, tuple[int, str, Style | None]] = {}
    for i, (r, note) in enumerate(zip(ranks, notes, strict=True)):
        if not note or r.state == "live":
            continue
        filled = np.flatnonzero(lv[i] != 0)
        tail = n - 1 - int(filled[-1]) if len(filled) else n
        note = note[: max(0, n)]
        start = max(0, n - len(note) if tail < len(note) else n - tail)
        keys[i, top, start : start + len(note)] = -1
        note_style = restyle(style(EXITED if failed(r) else MUTED if r.state == "exited" else WARN, bold=True))
        placed[i * bands + top] = (start, note, note_style)
    text = _SPARK_CODES[chars].tobytes().decode("utf-32-le")
    flat = keys.reshape(-1, n)
    row_of, col_of = np.nonzero(flat[:, 1:] != flat[:, :-1])
    counts = np.bincount(row_of, minlength=len(flat)).tolist()
    bounds_all = (col_of + 1).tolist()
    keys_all = flat[row_of, col_of + 1].tolist()
    first_keys = flat[:, 0].tolist()
    variants = [2 if failed(r) else 1 if r.state in ("stale", "exited") else 0 for r in ranks]
    out: list[list[list[Segment]]] = []
    at = 0
    for row, count in enumerate(counts):
        i, band = divmod(row, bands)
        line = text[row * n : row * n + n]
        note_at = placed.get(row)
        if note_at is not None:
            start, note, note_style = note_at
            line = line[:start] + note + line[start + len(note) :]
        variant = variants[i]
        table = restyle.spark_styles[variant]
        segs: list[Segment] = []
        a, key, current = 0, first_keys[row], None
        for b, nxt in zip([*bounds_all[at : at + count], n], [*keys_all[at : at + count], 0], strict=True):
            if key < 0:
                st = note_at[2] if note_at is not None else None
            else:
                st = table.get(key)
                if st is None:
                    st = table[key] = restyle(_spark_style(key, variant))
            if st is current and segs:  # two keys of one style (e.g. blended colours): one run
                segs[-1] = Segment(segs[-1].text + line[a:b], st)
            else:
                segs.append(Segment(line[a:b], st))
                current = st
            a, key = b, nxt
        at += count
        if band == 0:
            out.append([])
        out[-1].append(segs)
    return out


# --------------------------------------------------------------------------- heat map


class HeatView:
    """Lines of the heat map (ranks x time, colour = latency), built on demand. Two ranks
    share a line (upper/lower half block) when one per line would not fit in ``max_lines``;
    when even that does not fit and ranks span several hosts, one line per host shows the
    worst (max) latency of its ranks. Line 0 shows the mode in force per column."""

    def __init__(
        self, snap: Snapshot, cells: Cells, top: float, width: int, max_lines: int, restyle: Restyle = PLAIN
    ) -> None:
        self.snap, self.cells, self.width, self.restyle = snap, cells, width, restyle
        n = len(snap.ranks)
        room = max(1, max_lines - 1)
        groups = _host_groups(snap.ranks) if (n + 1) // 2 > room else []
        #: Ranks per line when aggregated per host (0: one or two ranks per line).
        self.per_host = max(len(g) for _, g in groups) if 1 < len(groups) < n else 0
        #: Common prefix cut from host labels so that two fit one line ("node07-node08" -> "07-08").
        self.host_prefix = ""
        if self.per_host:
            self.step = 2 if len(groups) > room else 1
            names = [_short_host(host) for host, _ in groups]
            if self.step == 2:
                self.host_prefix = os.path.commonprefix([host.split(".", 1)[0] for host, _ in groups])
                names = [host.split(".", 1)[0][len(self.host_prefix) :] or "?" for host, _ in groups]
            self.rows = [(name, [snap.ranks[i] for i in idx]) for name, (_host, idx) in zip(names, groups, strict=True)]
            ms = np.stack([np.fmax.reduce(cells.ms[idx], axis=0) for _, idx in groups]) if cells.ms.size else cells.ms
            self.heat = _heat_index(ms, top)
        else:
            self.rows = [(str(r.rank), [r]) for r in snap.ranks]
            self.heat = _heat_index(cells.ms, top)
            self.step = 2 if n > room else 1
        self.n_lines = 1 + (len(self.rows) + self.step - 1) // self.step
        self._runs: tuple[list[int], list[int]] | None = None

    def line(self, index: int) -> list[Segment]:
        snap = self.snap
        if index == 0:
            mode_row = self.cells.mode.max(axis=0) if snap.ranks else np.zeros(0, dtype=np.int16)
            segs = [Segment(f"{'mode':<{HEAT_LABEL_W}}", style(MUTED))]
            segs += _mode_segments(mode_row)
            return self.restyle.line(_fit(segs, self.width))
        i = (index - 1) * self.step
        top_label, top_ranks = self.rows[i]
        low = self.rows[i + 1] if self.step == 2 and i + 1 < len(self.rows) else None
        label = top_label if low is None else f"{top_label}-{low[0]}"
        members = top_ranks + (low[1] if low is not None else [])
        marked = snap.straggler is not None and any(x.rank == snap.straggler for x in members)
        states = {x.state for x in members}
        bad = any(failed(x) for x in members)
        label_color = (
            STRAGGLER if marked else EXITED if bad else WARN if states & {"stale", "stalled", "exited"} else TEXT
        )
        restyle = self.restyle
        segs = [
            Segment(
                f"{label[-(HEAT_LABEL_W - 2) :]:>{HEAT_LABEL_W - 2}}{'◀' if marked else ' '} ",
                restyle(style(label_color, bold=marked)),
            )
        ]
        up_dim = _dims(_worst(top_ranks))
        down_dim = _dims(_worst(low[1])) if low is not None else False
        segs += _heat_run_segments(self._line_runs(index - 1), up_dim, down_dim, low is not None, restyle)
        if _HEAT_NARROW:  # every heat cell is one terminal cell: no need to measure them
            return _fit_known(segs, segs[0].cell_length + self.heat.shape[1], self.width, restyle(None))
        return restyle.line(_fit(segs, self.width))

    def _line_runs(self, k: int) -> list[int]:
        """The runs of heat line ``k`` (0 = the first rank line) as ``code << 16 | length``. The
        codes and runs of every line are found at once, with one set of numpy calls."""
        if self._runs is None:
            self._runs = _all_runs(_heat_codes(self.heat, self.step))
        offsets, keys = self._runs
        return keys[offsets[k] : offsets[k + 1]]


def _host_groups(ranks: tuple[RankView, ...]) -> list[tuple[str, list[int]]]:
    """Row indices of the ranks of each host, hosts in order of their first rank."""
    groups: dict[str, list[int]] = {}
    for i, r in enumerate(ranks):
        groups.setdefault(r.host or "?", []).append(i)
    return list(groups.items())


def _short_host(host: str) -> str:
    """A host's name as it fits a heat-map label: no domain, its distinguishing tail."""
    name = host.split(".", 1)[0] or "?"
    return name[-(HEAT_LABEL_W - 2) :]


def _worst(ranks: list[RankView]) -> RankView:
    """The rank whose state colours a host's line: failed, then silent, else the first."""
    for pred in (failed, lambda r: r.state in ("stale", "stalled", "exited")):
        for r in ranks:
            if pred(r):
                return r
    return ranks[0]


def _heat_index(ms: np.ndarray, top: float) -> np.ndarray:
    """-1 = no data, 0..len(HEAT_RAMP)-1 = colour, len(HEAT_RAMP) = above the top."""
    if ms.size == 0 or not top > 0:
        return np.full(ms.shape, -1, dtype=np.int16)
    steps = len(HEAT_RAMP)
    with np.errstate(invalid="ignore"):
        idx = np.floor(ms / top * steps)
    idx = np.clip(np.nan_to_num(idx, nan=-1.0), -1, steps)
    idx[~np.isfinite(ms)] = -1
    return idx.astype(np.int16)


def _dims(r: RankView) -> bool:
    """Whether a rank's heat cells are drawn dimmed (blended toward the background)."""
    return r.state in ("stale", "exited")


#: Heat colours by code: 0 = no data, 1..len(HEAT_RAMP) = ramp, len(HEAT_RAMP) + 1 = clipped.
_HEAT_CODES = len(HEAT_RAMP) + 2
_HEAT_COLORS: tuple[str | None, ...] = (None, *HEAT_RAMP, CLIPPED)
_HEAT_COLORS_DIM: tuple[str | None, ...] = (None, *(blend(c) for c in (*HEAT_RAMP, CLIPPED)))


def _heat_table(
    up_dim: bool, down_dim: bool, halves: bool, codes: list[int], restyle: Restyle = PLAIN
) -> tuple[list[str], list[Style | None]]:
    """The character and style of each heat cell code (as HeatView.line drew them per cell),
    with the styles of ``codes`` filled in, combined by ``restyle`` (one table per (up dimmed,
    down dimmed, halves) per ``restyle``)."""
    key = (up_dim, down_dim, halves)
    table = restyle.heat_tables.get(key)
    if table is None:
        ups = _HEAT_COLORS_DIM if up_dim else _HEAT_COLORS
        chars = [("▀" if halves else "█" if ups[c % _HEAT_CODES] else " ") for c in range(_HEAT_CODES * _HEAT_CODES)]
        table = restyle.heat_tables[key] = (chars, [None] * (_HEAT_CODES * _HEAT_CODES))
    styles = table[1]
    for code in codes:
        if styles[code] is None:
            if halves:
                up = (_HEAT_COLORS_DIM if up_dim else _HEAT_COLORS)[code // _HEAT_CODES]
                down = (_HEAT_COLORS_DIM if down_dim else _HEAT_COLORS)[code % _HEAT_CODES]
                styles[code] = restyle(style(up or "#000000", down))
            else:
                styles[code] = restyle(style((_HEAT_COLORS_DIM if up_dim else _HEAT_COLORS)[code]))
    return table


def _runs(codes: np.ndarray) -> tuple[list[int], list[int]]:
    """Length and value of each run of equal values in ``codes`` (1-D, non-empty)."""
    starts = np.concatenate(([0], np.flatnonzero(np.diff(codes)) + 1))
    lengths = np.diff(np.append(starts, len(codes)))
    return lengths.tolist(), codes[starts].tolist()


#: Whether the heat map's characters are one terminal cell wide each.
_HEAT_NARROW = all(cell_len(ch) == 1 for ch in "█▀ ")
#: Whether distinct heat codes always get distinct styles (then runs of equal code are
#: already the longest runs of equal style, and need no merging).
_HEAT_DISTINCT = len(set(_HEAT_COLORS)) == len(set(_HEAT_COLORS_DIM)) == _HEAT_CODES and "#000000" not in (
    _HEAT_COLORS + _HEAT_COLORS_DIM
)


def _heat_codes(heat: np.ndarray, step: int) -> np.ndarray:
    """The cell codes of every heat line (lines x cells): 0 = no data, 1.. = ramp, last =
    clipped; with ``step`` 2 two rows share a line (upper code * _HEAT_CODES + lower code),
    but an odd last row has its line alone (its plain code)."""
    one = np.clip(heat.astype(np.int32) + 1, 0, _HEAT_CODES - 1)
    if step == 1 or len(one) == 0:
        return one
    pairs = len(one) // 2
    codes = np.empty(((len(one) + 1) // 2, one.shape[1]), dtype=np.int32)
    codes[:pairs] = one[0 : 2 * pairs : 2] * _HEAT_CODES + one[1 : 2 * pairs : 2]
    if len(one) % 2:
        codes[pairs] = one[-1]
    return codes


def _all_runs(codes: np.ndarray) -> tuple[list[int], list[int]]:
    """The runs of equal codes of every line (lines x cells) at once, each as ``code << 16 |
    length``, all lines' runs in one list; line k's are ``runs[offsets[k] : offsets[k + 1]]``."""
    n_lines, n = codes.shape
    if n == 0:
        return [0] * (n_lines + 1), []
    first = np.ones(codes.shape, dtype=bool)
    np.not_equal(codes[:, 1:], codes[:, :-1], out=first[:, 1:])
    row, col = np.nonzero(first)
    end = np.empty_like(col)
    end[:-1] = col[1:]
    end[np.append(row[1:] != row[:-1], True)] = n  # a line's last run ends at the line's end
    offsets = np.zeros(n_lines + 1, dtype=np.int64)
    np.cumsum(np.bincount(row, minlength=n_lines), out=offsets[1:])
    return offsets.tolist(), (codes[row, col].astype(np.int64) << 16 | (end - col)).tolist()


def _heat_run_segments(
    runs: list[int], up_dim: bool, down_dim: bool, halves: bool, restyle: Restyle = PLAIN
) -> list[Segment]:
    """One heat-map line's cells given as runs (``code << 16 | length``), one Segment per run:
    full blocks for one rank per line, upper half blocks (upper rank fg, lower rank bg) for
    two. The Segments are kept by run: a line of ~130 runs is one lookup each."""
    made = restyle.heat_segments.setdefault((up_dim, down_dim, halves), {})
    if _HEAT_DISTINCT:
        try:
            return list(map(made.__getitem__, runs))
        except KeyError:  # a run not drawn before
            pass
    chars, styles = _heat_table(up_dim, down_dim, halves, [run >> 16 for run in runs], restyle)
    if not _HEAT_DISTINCT:
        return _merge([(chars[run >> 16] * (run & 0xFFFF), styles[run >> 16]) for run in runs])
    for run in runs:
        if run not in made:
            made[run] = Segment(chars[run >> 16] * (run & 0xFFFF), styles[run >> 16])
    return list(map(made.__getitem__, runs))


def _mode_segments(mode_row: np.ndarray) -> list[Segment]:
    """The mode line of the heat map: an upper half block per column in the mode's colour."""
    if len(mode_row) == 0:
        return []
    lengths, values = _runs(mode_row.astype(np.int32))
    return _merge(
        [
            ("▀" * n, style(mode_color(m))) if m >= 0 else (" " * n, style(None))
            for n, m in zip(lengths, values, strict=True)
        ]
    )


def _merge(runs: list[tuple[str, object]]) -> list[Segment]:
    """Segments of (text, style) runs, neighbours of the same style (identical object) joined."""
    out: list[Segment] = []
    text, current = "", None
    for t, st in runs:
        if st is current and out:
            text += t
            out[-1] = Segment(text, current)  # type: ignore[arg-type]
        else:
            text, current = t, st
            out.append(Segment(t, st))  # type: ignore[arg-type]
    return out
