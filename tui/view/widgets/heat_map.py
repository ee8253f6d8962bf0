"""The heat map of the rank grid as lists of rich Segments (no Textual here): ranks x time,
colour = latency; two ranks per line (half blocks) or one line per host when ranks are many.
Lines are built from runs of equal cells, found for all lines at once with numpy."""

from __future__ import annotations

import os

import numpy as np
from rich.cells import cell_len
from rich.segment import Segment
from rich.style import Style

from tui.model.snapshot import RankView, Snapshot
from tui.view.widgets.grid_cells import HEAT_LABEL_W, Cells
from tui.view.widgets.grid_lines import PLAIN, Restyle, failed, fit, fit_known
from tui.view.widgets.palette import CLIPPED, EXITED, HEAT_RAMP, MUTED, STRAGGLER, TEXT, WARN, blend, mode_color, style


class HeatRows:
    """What the heat map's lines show of the ranks themselves: which ranks share a line (two per
    line, or one line per host), and each line's label and dimming. These read only the
    snapshot's rank views, which stay the same object between two text ticks
    (tui.model.snapshot_builder.TEXT_EVERY_S) while the history moves at every snapshot: so
    a frame reuses them (:meth:`fits`) and builds only the cells. At 512 ranks that was most of a
    heat-map frame's Python (grouping 512 ranks by host, 64 labels with their states)."""

    def __init__(self, snap: Snapshot, max_lines: int, restyle: Restyle = PLAIN) -> None:
        self.ranks, self.straggler, self.max_lines, self.restyle = snap.ranks, snap.straggler, max_lines, restyle
        n = len(snap.ranks)
        room = max(1, max_lines - 1)
        groups = _host_groups(snap.ranks) if (n + 1) // 2 > room else []
        #: Ranks per line when aggregated per host (0: one or two ranks per line).
        self.per_host = max(len(g) for _, g in groups) if 1 < len(groups) < n else 0
        #: Common prefix cut from host labels so that two fit one line ("node07-node08" -> "07-08").
        self.host_prefix = ""
        #: Per host line: the rows of its ranks in host order, and where each host's rows start.
        self.host_order: np.ndarray | None = None
        self.host_starts: np.ndarray | None = None
        if self.per_host:
            self.step = 2 if len(groups) > room else 1
            names = [_short_host(host) for host, _ in groups]
            if self.step == 2:
                self.host_prefix = os.path.commonprefix([host.split(".", 1)[0] for host, _ in groups])
                names = [host.split(".", 1)[0][len(self.host_prefix) :] or "?" for host, _ in groups]
            self.rows = [(name, [snap.ranks[i] for i in idx]) for name, (_host, idx) in zip(names, groups, strict=True)]
            self.host_order = np.array([i for _, idx in groups for i in idx], dtype=np.intp)
            self.host_starts = np.cumsum([0] + [len(idx) for _, idx in groups[:-1]])
        else:
            self.rows = [(str(r.rank), [r]) for r in snap.ranks]
            self.step = 2 if n > room else 1
        self.n_lines = 1 + (len(self.rows) + self.step - 1) // self.step
        self._labels: dict[int, tuple[Segment, bool, bool, bool]] = {}

    def fits(self, snap: Snapshot, max_lines: int, restyle: Restyle) -> bool:
        """Whether these rows are the ones ``snap`` would make (the same rank views, straggler,
        height and line style)."""
        return (
            snap.ranks is self.ranks
            and snap.straggler == self.straggler
            and max_lines == self.max_lines
            and restyle is self.restyle
        )

    def heat_ms(self, ms: np.ndarray) -> np.ndarray:
        """The latency each line's row shows: per host its ranks' worst (max) per cell."""
        if self.host_order is None or self.host_starts is None or not ms.size:
            return ms
        return np.fmax.reduceat(ms[self.host_order], self.host_starts, axis=0)

    def label(self, k: int) -> tuple[Segment, bool, bool, bool]:
        """Rank line ``k``'s (label segment, upper dimmed, lower dimmed, two rows on it)."""
        made = self._labels.get(k)
        if made is not None:
            return made
        i = k * self.step
        top_label, top_ranks = self.rows[i]
        low = self.rows[i + 1] if self.step == 2 and i + 1 < len(self.rows) else None
        label = top_label if low is None else f"{top_label}-{low[0]}"
        members = top_ranks + (low[1] if low is not None else [])
        marked = self.straggler is not None and any(x.rank == self.straggler for x in members)
        states = {x.state for x in members}
        bad = any(failed(x) for x in members)
        label_color = (
            STRAGGLER if marked else EXITED if bad else WARN if states & {"stale", "stalled", "exited"} else TEXT
        )
        segment = Segment(
            f"{label[-(HEAT_LABEL_W - 2) :]:>{HEAT_LABEL_W - 2}}{'◀' if marked else ' '} ",
            self.restyle(style(label_color, bold=marked)),
        )
        up_dim = _dims(_worst(top_ranks))
        down_dim = _dims(_worst(low[1])) if low is not None else False
        made = self._labels[k] = (segment, up_dim, down_dim, low is not None)
        return made


class HeatView:
    """Lines of the heat map (ranks x time, colour = latency), built on demand. Two ranks
    share a line (upper/lower half block) when one per line would not fit in ``max_lines``;
    when even that does not fit and ranks span several hosts, one line per host shows the
    worst (max) latency of its ranks. Line 0 shows the mode in force per column.

    ``layout``: the previous frame's :class:`HeatRows`, reused when they still fit the snapshot."""

    def __init__(
        self,
        snap: Snapshot,
        cells: Cells,
        top: float,
        width: int,
        max_lines: int,
        restyle: Restyle = PLAIN,
        layout: HeatRows | None = None,
    ) -> None:
        self.snap, self.cells, self.width, self.restyle = snap, cells, width, restyle
        if layout is None or not layout.fits(snap, max_lines, restyle):
            layout = HeatRows(snap, max_lines, restyle)
        self.layout = layout
        self.heat = _heat_index(layout.heat_ms(cells.ms), top)
        self._runs: tuple[list[int], list[int]] | None = None

    @property
    def per_host(self) -> int:
        return self.layout.per_host

    @property
    def host_prefix(self) -> str:
        return self.layout.host_prefix

    @property
    def step(self) -> int:
        return self.layout.step

    @property
    def n_lines(self) -> int:
        return self.layout.n_lines

    def line(self, index: int) -> list[Segment]:
        if index == 0:
            mode_row = self.cells.mode.max(axis=0) if self.snap.ranks else np.zeros(0, dtype=np.int16)
            segs = [Segment(f"{'mode':<{HEAT_LABEL_W}}", style(MUTED))]
            segs += _mode_segments(mode_row)
            return self.restyle.line(fit(segs, self.width))
        label, up_dim, down_dim, halves = self.layout.label(index - 1)
        restyle = self.restyle
        segs = [label]
        segs += _heat_run_segments(self._line_runs(index - 1), up_dim, down_dim, halves, restyle)
        if _HEAT_NARROW:  # every heat cell is one terminal cell: no need to measure them
            return fit_known(segs, segs[0].cell_length + self.heat.shape[1], self.width, restyle(None))
        return restyle.line(fit(segs, self.width))

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
