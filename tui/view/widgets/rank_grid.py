"""One Line-API widget drawing every rank (rows with sparklines, or a heat map).

STYLE.md point 5: one ``render_line`` grid instead of a widget per rank. The lines are
built once per snapshot (or resize) by :mod:`tui.view.widgets.rank_rows` or
:mod:`tui.view.widgets.heat_map`; ``render_line`` only hands out the cached Strip for the
scrolled-to row.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from rich.segment import Segment
from rich.style import Style
from textual.filter import ANSIToTruecolor, LineFilter
from textual.geometry import Region, Size
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip
from textual.style import Style as VisualStyle
from textual.widget import Widget

from tui.model.snapshot import Snapshot
from tui.model.stats import AxisScale
from tui.view.time_axis import TimeAxis
from tui.view.widgets.grid_cells import HEAT_LABEL_W, MIN_SPARK, Cells, bucket, fixed_width, visible_top
from tui.view.widgets.grid_lines import Restyle, column_header
from tui.view.widgets.heat_map import HeatView
from tui.view.widgets.rank_rows import RowsView

#: Iterations per cell the grid may use; chosen so the screen covers ~ZOOM_TARGET_S.
ZOOMS = (1, 2, 4, 8, 16, 32)
ZOOM_TARGET_S = 10.0
ZOOM_HOLD_S = 3.0
#: The chart ends where every rank has reported, waiting at most this long for a rank's next
#: batch (ranks publish every 50-500 ms, workers.wire.config.MAX_SCALED_BATCH_MS; see
#: grid_cells.settled_last): a rank further behind shows its gap.
TAIL_WAIT_S = 1.0
#: Lines per rank when there is room (taller bars: 8 levels per line).
MAX_ROW_H = 6


class GridHeader(Widget):
    """The grid's two column-header lines (names + units/legend); fed by RankGrid."""

    DEFAULT_CSS = "GridHeader { height: 2; }"

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._lines: list[list[Segment]] = []

    def set_lines(self, lines: list[list[Segment]]) -> None:
        if lines != self._lines:
            self._lines = lines
            self.refresh()

    def render_line(self, y: int) -> Strip:
        if y < len(self._lines):
            return Strip(self._lines[y]).crop_extend(0, self.size.width, None).apply_style(self.rich_style)
        return Strip.blank(self.size.width, self.rich_style)


class RankGrid(ScrollView):
    """All ranks: one row each (``rows`` view) or a ranks x time heat map (``heat`` view)."""

    DEFAULT_CSS = "RankGrid { height: 1fr; }"

    view_mode: reactive[str] = reactive("auto", init=False)
    """"auto" (rows while they fit, else heat map), "rows" or "heat" (chosen with `v`)."""

    def __init__(self, header: GridHeader | None = None, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.header = header
        self.snapshot: Snapshot | None = None
        self.axis = AxisScale(min_interval_s=1.0)
        self.k = 1
        self._k_changed_s = -math.inf
        #: The stream drawn and the newest iteration the chart drew (it never scrolls back; another
        #: stream's iterations are another count).
        self._chart_last = (-1, -1)
        self._view: RowsView | HeatView | None = None
        self._strips: dict[int, Strip] = {}
        #: The segments of each visible line as last drawn, and what they were drawn for.
        self._lines: dict[int, list[Segment]] = {}
        self._layout: tuple[object, ...] = ()
        self.shown_view = "rows"
        self.top = math.nan
        self.row_h = 1
        self._built_width = 0
        self._line_style: Style | None = None  # the widget's rich_style, read once per rebuild
        #: The views build their lines with this line style under theirs (combined once per style).
        self._restyle = Restyle()
        #: Which wall-clock interval each chart column covers (the links panel uses the same).
        self.time_axis = TimeAxis()
        self._fast_lines = False  # render_lines last bypassed Textual's styles cache

    # ----------------------------------------------------------------------- inputs

    def show(self, snap: Snapshot) -> None:
        """Take a new snapshot (called on the UI thread, once per SnapshotReady)."""
        self.snapshot = snap
        self._rebuild()

    def toggle_view(self) -> None:
        self.view_mode = "heat" if self.shown_view == "rows" else "rows"

    def watch_view_mode(self, _old: str, _new: str) -> None:
        self._rebuild()

    def on_resize(self) -> None:
        self._rebuild()

    # ----------------------------------------------------------------------- layout

    def _effective_view(self) -> str:
        if self.view_mode != "auto":
            return self.view_mode
        n = len(self.snapshot.ranks) if self.snapshot else 0
        return "heat" if n > max(1, self.size.height) else "rows"

    def _choose_k(self, snap: Snapshot, cells: int, now_s: float) -> int:
        """Iterations per cell so the screen spans ~ZOOM_TARGET_S, changed at most every
        ZOOM_HOLD_S (a jumping time scale is as bad as a jumping y-axis)."""
        have = snap.history.ms.shape[1]
        rate = snap.iter_rate if math.isfinite(snap.iter_rate) else 0.0
        want_iters = min(have, max(cells, rate * ZOOM_TARGET_S))
        # The largest zoom whose cells are all filled by the history we have.
        want = max((z for z in ZOOMS if z * max(1, cells) <= want_iters), default=ZOOMS[0])
        if want != self.k and now_s - self._k_changed_s >= ZOOM_HOLD_S:
            self.k, self._k_changed_s = want, now_s
        return self.k

    def _rebuild(self) -> None:
        snap = self.snapshot
        width = self.size.width
        if snap is None or width <= 0:
            return
        view = self._effective_view()
        if view != self.shown_view or width != self._built_width:
            self._k_changed_s = -math.inf  # a new layout may pick its zoom at once
        self.shown_view = view
        self._built_width = width
        label_w = HEAT_LABEL_W if view == "heat" else fixed_width(width)
        n_cells = max(0, width - label_w - self.scrollbar_size_vertical)
        if view == "rows" and n_cells < MIN_SPARK:
            n_cells = 0
        now_s = snap.now_ns / 1e9
        k = self._choose_k(snap, n_cells, now_s)
        wait_its = math.ceil(snap.iter_rate * TAIL_WAIT_S) if math.isfinite(snap.iter_rate) else 0
        drawn, last = self._chart_last
        cells: Cells = bucket(snap.history, n_cells, k, wait_its, last if drawn == snap.selected_stream else -1)
        self._chart_last = (snap.selected_stream, cells.last_iteration)
        self.time_axis = TimeAxis(label_w, cells.edges_ns) if n_cells else TimeAxis(label_w)
        self.top = self.axis.update(visible_top(cells), now_s)
        procs = self._proc_states(snap)
        # Once per rebuild, not once per line: Textual computes rich_style afresh on every read.
        line_style = self.rich_style
        if line_style != self._line_style or self._restyle.base is None:
            self._restyle = Restyle(line_style)
        self._line_style = line_style
        if view == "heat":
            kept_rows = self._view.layout if isinstance(self._view, HeatView) else None
            self._view = HeatView(snap, cells, self.top, width, self.size.height, self._restyle, kept_rows)
        else:
            n = max(1, len(snap.ranks))
            self.row_h = max(1, min(MAX_ROW_H, self.size.height // n))
            self._view = RowsView(snap, cells, self.top, width, procs, self.row_h, self._restyle)
        if self.header is not None:
            heat = self._view if isinstance(self._view, HeatView) else None
            per_host, prefix = (heat.per_host, heat.host_prefix) if heat is not None else (0, "")
            modes = snap.job.has_modes
            self.header.set_lines(column_header(width, self.top, k, view, len(snap.ranks), per_host, prefix, modes))
        self.virtual_size = Size(width, self._view.n_lines)
        self._repaint_changed_lines(view, width)

    def _repaint_changed_lines(self, view: str, width: int) -> None:
        """Repaint only the visible lines whose segments changed since the last snapshot.

        Most of a frame is Textual turning lines into strips and escape codes; a rank's lower
        bar lines (full blocks of one colour) and whole-run numbers rarely change between two
        snapshots, so they keep their strips and Textual's line cache. A new layout (view,
        size, scroll position, line style) repaints everything."""
        top = int(self.scroll_offset.y)
        height = self.size.height
        assert self._view is not None
        n_lines = self._view.n_lines
        layout = (view, width, height, n_lines, top, id(self._restyle))
        same_layout = layout == self._layout
        self._layout = layout
        changed: list[int] = []
        visible = range(top, min(n_lines, top + height))
        # Lines drawn while scrolled elsewhere since the last snapshot would be stale there.
        lines = {i: seg for i, seg in self._lines.items() if i in visible} if same_layout else {}
        self._strips = {i: strip for i, strip in self._strips.items() if i in visible}
        for index in visible:
            segments = self._view.line(index)
            if lines.get(index) != segments:
                lines[index] = segments
                changed.append(index)
        self._lines = lines
        if not same_layout:
            self._strips.clear()
            self.refresh()
            return
        # One region per run of adjacent changed lines, all in one refresh: Textual's
        # refresh_lines per run read the widget's size, scroll offset and content offset and
        # cleared its caches once per run (~8 runs a frame at 8 ranks).
        regions: list[Region] = []
        start = None
        for i, index in enumerate(changed):
            self._strips.pop(index, None)
            if start is None:
                start = index
            if i + 1 == len(changed) or changed[i + 1] != index + 1:
                regions.append(Region(0, start - top, width, index - start + 1))
                start = None
        if regions:
            self.refresh(*regions)

    @staticmethod
    def _proc_states(snap: Snapshot) -> dict[int, str | None]:
        """Process state of silent ranks from the node sampler (stopped vs gone)."""
        tel = snap.telemetry
        lookup = getattr(tel, "proc_status", None)
        if lookup is None:
            return {}
        out: dict[int, str | None] = {}
        for r in snap.ranks:
            if r.state == "stale" and r.pid:
                try:
                    out[r.rank] = lookup(r.host, r.pid)
                except Exception:
                    out[r.rank] = None
        return out

    # ----------------------------------------------------------------------- drawing

    def get_line_filters(self) -> Sequence[LineFilter]:
        """The app's line filters but ANSI-to-truecolor: every colour the grid draws is already
        truecolor and none is dim, so that filter would only copy every segment of every line
        unchanged (a third of a heat-map frame at 64 ranks; tests/test_render_cost.py checks the
        premise). The others (NO_COLOR's monochrome, TEXTUAL_FILTERS=dim) still apply."""
        return [f for f in super().get_line_filters() if not isinstance(f, ANSIToTruecolor)]

    def _plain_box(self) -> bool:
        """No border, padding, outline, tint, hatch or opacity: Textual's per-line styling would
        hand back each line's segments as they are (only copied into a new Strip)."""
        st = self.styles
        return (
            not self.BLANK
            and not any(st.gutter)
            and not any(edge for edge, _ in st.outline)
            and not st.tint.a
            and st.text_opacity == 1.0
            and self.opacity == 1.0
            and not (st.has_rule("hatch") and st.hatch != "none")
            and not (self.auto_links and self.hover_style._link_id)
        )

    def render_lines(self, crop: Region) -> list[Strip]:
        """The grid's strips as render_line made them (its own per-line cache), the line filters
        applied and cropped as Textual's styles cache would: that cache re-styled every changed
        line into a new Strip (~25 us a line, ~40 changed lines a frame) for a box without any
        style of its own to add. With a border, padding, tint, ... Textual's path is taken."""
        if not self._plain_box():
            if self._fast_lines:  # its cache missed every line drawn meanwhile
                self._styles_cache.clear()
                self._fast_lines = False
            return super().render_lines(crop)
        self._fast_lines = True
        content_width = self.content_region.width
        scroll_y, width = int(self.scroll_offset.y), self.size.width  # once, not once per line
        strips = [self._line_strip(y + scroll_y, width) for y in crop.line_range]
        if any(strip.cell_length != content_width for strip in strips):  # as Textual pads a line
            base, background = self.background_colors
            inner = VisualStyle(background=base + background).rich_style
            strips = [strip.adjust_cell_length(content_width, inner) for strip in strips]
        filters = self.get_line_filters()
        if filters:
            background = self.background_colors[1]
            for line_filter in filters:
                strips = [strip.apply_filter(line_filter, background) for strip in strips]
        x1, x2 = crop.column_span
        if (x1, x2) != (0, self.region.width):
            strips = [strip.crop(x1, x2) for strip in strips]
        return strips

    def render_line(self, y: int) -> Strip:
        return self._line_strip(y + int(self.scroll_offset.y), self.size.width)

    def _line_strip(self, index: int, width: int) -> Strip:
        """Line ``index`` of the view (scroll offset added) as a Strip ``width`` cells wide."""
        strip = self._strips.get(index)
        if strip is None:
            line_style = self._line_style if self._line_style is not None else self.rich_style
            view = self._view
            if view is not None and 0 <= index < view.n_lines:
                segments = self._lines.get(index)
                if segments is None:  # scrolled to a line the last snapshot did not draw
                    segments = self._lines[index] = view.line(index)
                if view.width == width:  # the view's lines are already fitted (and styled) to this width
                    strip = Strip(segments, width)
                else:
                    strip = Strip(segments).crop_extend(0, width, line_style)
            else:
                strip = Strip.blank(width, line_style)
            if len(self._strips) < 4096:
                self._strips[index] = strip
        return strip

    def line_texts(self) -> list[str]:
        """The grid's lines as plain text (tests and debugging)."""
        view = self._view
        if view is None:
            return []
        return ["".join(seg.text for seg in view.line(i)) for i in range(view.n_lines)]
