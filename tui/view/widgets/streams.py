"""The streams panel under the rank grid: the step line, which collectives the latency lines
draw (every one, or one stream), and a table of the run's streams (process group, op, dtype,
size: count, p50, p99, busbw, share of the ranks' time), as nccl-tests and NCCL Inspector
list them. Shown for a user's job and for any run of several streams (the synthetic loop runs
one: its rank rows say it all). The selection key (``f``) is the app's (the model picks the next
stream: :meth:`tui.model.streams.StreamTable.after`); the panel marks the stream the snapshot's
lines are of."""

from __future__ import annotations

import math
from collections.abc import Sequence

from rich.text import Text
from textual.widget import Widget

from tui.model.snapshot import Snapshot
from tui.model.streams import OTHER, UNNAMED, StreamView
from tui.report.views_text import size_cell, step_line
from tui.view.widgets.palette import ACCENT, MUTED, TEXT, WARN, style

#: Stream rows the panel shows at most (the selected one always among them).
MAX_ROWS = 8
_COLUMNS = ("group", "op", "dtype", "size", "count", "p50 ms", "p99 ms", "busbw", "share")


def selectable(streams: Sequence[StreamView]) -> list[StreamView]:
    """The streams the key steps through (named ones: not "other", not a group not named yet)."""
    return [s for s in streams if s.index not in (OTHER, UNNAMED)]


def shows_streams(snap: Snapshot) -> bool:
    """Whether the panel is worth its lines: a user's job, or several streams."""
    return snap.job.is_job or len(snap.streams) > 1


def _ms(v: float) -> str:
    return "-" if not math.isfinite(v) else f"{v:.3f}" if v < 10 else f"{v:.1f}"


def _cells(s: StreamView) -> tuple[str, ...]:
    approx = "" if s.exact else "~"
    return (
        s.group_text,
        s.op,
        s.dtype or "-",
        "-" if s.index == OTHER else size_cell(s.nbytes),
        f"{s.count:,}",
        approx + _ms(s.p50_ms),
        approx + _ms(s.p99_ms),
        "-" if not math.isfinite(s.busbw_gbps) else f"{s.busbw_gbps:.2f}",
        "-" if not math.isfinite(s.share) else f"{s.share * 100:.1f} %",
    )


def panel_text(snap: Snapshot, max_rows: int = MAX_ROWS) -> Text:
    """The panel's lines; pure (tested without an app)."""
    t = Text(no_wrap=True, overflow="ellipsis")
    steps = step_line(snap.steps, beside_live_rate=True)
    if steps:
        t.append(steps, style=style(TEXT))
        t.append("\n")
    selected = snap.selected
    t.append("lines: ", style=style(MUTED))
    if selected is None:
        t.append("every collective", style=style(ACCENT, bold=True))
    else:
        name = f"{selected.group_text} {selected.op} {selected.dtype} {size_cell(selected.nbytes)}"
        t.append(name, style=style(WARN, bold=True))
    if len(selectable(snap.streams)) > 1:
        t.append("  ")  # (a space that opens a styled span is not drawn: its own span)
        t.append("f: next stream", style=style(MUTED))
    streams = list(snap.streams)
    shown = streams[:max_rows]
    if selected is not None and selected not in shown:
        shown = [*streams[: max_rows - 1], selected]
    rows = [_cells(s) for s in shown]
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(_COLUMNS)] if rows else []
    if rows:
        t.append("\n  ")
        t.append(_line(_COLUMNS, widths), style=style(MUTED))
    for s, cells in zip(shown, rows, strict=True):
        mark = s.index == snap.selected_stream
        t.append("\n")
        t.append("▶ " if mark else "  ", style=style(WARN, bold=True))
        t.append(_line(cells, widths), style=style(WARN if mark else TEXT, bold=mark))
    if len(streams) > len(shown):
        more = len(streams) - len(shown)
        t.append(
            f"\n  … {more} more stream{'' if more == 1 else 's'} (commtop report lists every one)", style=style(MUTED)
        )
    return t


def _line(cells: Sequence[str], widths: Sequence[int]) -> str:
    return "  ".join(c.ljust(w) if i < 3 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True)))


class StreamPanel(Widget):
    """The streams panel; ``show`` with each snapshot (hidden when not worth its lines)."""

    DEFAULT_CSS = """
    StreamPanel {
        height: auto; max-height: 13; padding: 0 1; border-top: solid #30363d;
        text-wrap: nowrap; text-overflow: ellipsis;
    }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._text = Text("")
        self.display = False  # until a snapshot of a job or of several streams

    def show(self, snap: Snapshot) -> bool:
        """Take a snapshot; returns whether there are streams to choose from (two or more)."""
        wanted = shows_streams(snap)
        if wanted != self.display:
            self.display = wanted
        if wanted:
            text = panel_text(snap)
            if text.plain != self._text.plain or text.spans != self._text.spans:
                lines_changed = text.plain.count("\n") != self._text.plain.count("\n")
                self._text = text
                self.refresh(layout=lines_changed)
        return len(selectable(snap.streams)) > 1

    def render(self) -> Text:
        return self._text
