"""The rows view of the rank grid as lists of rich Segments (no Textual here): per rank its
numbers on the left (window, whole run, counts, overlap classes) and its latency bars, coloured
by the mode in force, on one shared y-axis.

The grid widget builds a :class:`RowsView` (or a :class:`~tui.view.widgets.heat_map.HeatView`)
once per snapshot (or resize); its ``render_line`` asks the view for each visible line.
"""

from __future__ import annotations

import math

import numpy as np
from rich.cells import cell_len
from rich.segment import Segment
from rich.style import Style

from tui.model.snapshot import RankView, Snapshot
from tui.view.widgets.class_row import class_numbers
from tui.view.widgets.grid_cells import FIXED_W, HOST_W, NARROW_W, NUM_W, Cells, fixed_width, is_narrow
from tui.view.widgets.grid_lines import PLAIN, Restyle, failed, fit, fit_known
from tui.view.widgets.palette import (
    ACCENT,
    EXITED,
    LIVE,
    MUTED,
    SPARK_CHARS,
    STALE,
    STRAGGLER,
    TEXT,
    WARN,
    blend,
    fmt_bytes,
    fmt_gbps,
    fmt_ms,
    mode_color,
    style,
)
from workers.wire.protocol import MODES


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
        if r.exit_code is not None and r.exit_code < 0 and r.exit_reason:  # "killed by SIGTERM (...)"
            return f" {r.exit_reason} "
        why = f": {r.exit_reason}" if r.exit_reason else ""
        return f" exited ({r.exit_code}){why} "
    if r.state == "stale":
        what = {"stopped": "stopped (SIGSTOP?)", "gone": "process gone"}.get(proc or "", "silent")
        return f" {what} {r.silent_s:.0f}s "
    if r.state == "stalled" and r.inside:
        op, group, nbytes, seconds = r.inside
        return f" stalled inside {op} on {group} ({fmt_bytes(nbytes)}) for {seconds:.0f}s, heartbeat alive "
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

    def _segments(self, r: RankView, line: int) -> list[Segment]:
        """The number columns of line ``line`` of rank ``r``'s row, as drawn. :func:`_shown` lists
        every value they read (the key they are kept by): a value added to a line goes there too
        (tests/test_grid_lines.py changes each one and compares with lines drawn from scratch)."""
        if line == 0:
            return _numbers(self.snap, r, self.narrow)
        if line == 1:
            return _run_numbers(r, self.narrow, of_all=self.snap.selected_stream >= 0)
        if line == 2:
            return _counts(r, self.narrow)
        if line == 3 and r.copies:  # p50 per overlap class (tui.view.widgets.class_row); no copy, no class
            return class_numbers(r, fixed_width(self.width))
        return [Segment(" " * fixed_width(self.width))]

    def _fixed_columns(self, r: RankView, line: int, fixed: int) -> list[Segment]:
        """:meth:`_segments` fitted to the fixed columns with the line style, kept by the values
        the line shows: they change at 5 Hz, the frames come at 15, and building a line's
        Segments was most of a rows-view frame."""
        key = (line, fixed, self.narrow, *_shown(self.snap, r, line))
        cache = self.restyle.number_lines
        numbers = cache.get(key)
        if numbers is None:
            if len(cache) > 4096:  # a few lines per rank; only a bound
                cache.clear()
            numbers = cache[key] = self.restyle.line(fit(self._segments(r, line), fixed))
        return numbers

    def line(self, index: int) -> list[Segment]:
        i, line = divmod(index, self.row_h)
        r = self.snap.ranks[i]
        if not (self.cells.ms.ndim == 2 and self.cells.ms.shape[1]):
            return self.restyle.line(fit(self._segments(r, line), self.width))
        bands = self._bands.get(i)
        if bands is None:  # the bar lines of a block of ranks at once (numpy per block, not per line)
            self._spark_block(i)
            bands = self._bands[i]
        spark = bands[self.row_h - 1 - line]  # band 0 = the rank's bottom line (styles combined)
        fixed = fixed_width(self.width)
        numbers = self._fixed_columns(r, line, fixed)
        if _SPARK_NARROW and not (line == 0 and r.state != "live"):  # no note: every cell is one column
            return fit_known(numbers + spark, fixed + len(self.levels[i]), self.width, self.restyle(None))
        return fit(numbers + spark, self.width, self.restyle(None))


def _shown(snap: Snapshot, r: RankView, line: int) -> tuple[object, ...]:
    """Everything line ``line``'s number columns of rank ``r`` depend on (besides the width):
    equal tuples draw equal Segments. The values are the view's own objects, so a NaN of a
    view kept between snapshots is the same object and matches."""
    if line == 0:
        return (r.state, r.exit_code, r.rank, snap.straggler == r.rank, r.host, r.gpu, r.last_ms, r.p50_ms,
                r.p99_ms, r.busbw_gbps, r.copy_gbps)  # fmt: skip
    if line == 1:
        return (r.run, r.copy_run, snap.selected_stream >= 0)
    if line == 2:
        return (r.iter_rate, r.count, r.missing, r.drops, r.state == "stalled")
    if line == 3:
        return (tuple(r.run_by_class.items()), r.overlapped, bool(r.copies))
    return ()


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


def _run_numbers(r: RankView, narrow: bool = False, *, of_all: bool = False) -> list[Segment]:
    """Whole-run max, p50, p99, busbw and copy GB/s under the windowed ones (dim). ``of_all``:
    the windowed ones are of one stream (f), these still of every collective: the label says so."""
    dim = style(STALE)
    # "whole run" over all its columns; the first is the run's max (under "last"), so it says so.
    if narrow:  # no host column: "run" where the rank number stands
        lead = [Segment(f"{'all run':<7}" if of_all else f"  {'run':<5}", dim)]
    elif of_all:
        lead = [Segment(f"{'all colls, whole run':>{2 + 5 + 2 + HOST_W - 4}}", dim)]
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
    if r.state == "stalled":  # the window's rate is its last records': none come now
        rate = "0/s"
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


def _blanks_joined(keys: np.ndarray) -> np.ndarray:
    """``keys`` (lines x cells) with each blank cell (key 0) given the key of the cell before it on
    its line: a space shows only its background, which every spark style leaves to the line's,
    so a line is a run per change of colour, not one per gap between bars (the upper bands of a
    rank's bars are mostly gaps: ~10 runs a band, each a Segment to build and to render).
    Blanks that open a line keep key 0."""
    idx = np.where(keys != 0, np.arange(keys.shape[1], dtype=np.int32), 0)
    np.maximum.accumulate(idx, axis=1, out=idx)
    return np.take_along_axis(keys, idx, axis=1)


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
    flat = _blanks_joined(keys.reshape(-1, n))
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
