"""Bottom lines: the replay progress bar, and worker / ingest errors."""

from __future__ import annotations

from rich.text import Text
from textual.widget import Widget

from tui.ingest.interfaces import ReplayPosition
from tui.view.widgets.palette import ACCENT, EXITED, MUTED, TEXT, WARN, fmt_duration, style


def replay_text(pos: ReplayPosition, width: int) -> Text:
    """``▶ 1:02 ━━━━━╋━━━━◆━━━ 4:10  x2.0`` with settings changes marked ◆."""
    state = "‖" if pos.paused else ("■" if pos.finished else "▶")
    left = f" {state} {fmt_duration(pos.position_s)} "
    right = f" {fmt_duration(pos.duration_s)}  ×{pos.speed:g} "
    bar_w = max(0, width - len(left) - len(right))
    t = Text(no_wrap=True)
    t.append(left, style=style(ACCENT, bold=True))
    if bar_w:
        frac = pos.position_s / pos.duration_s if pos.duration_s > 0 else 0.0
        done = min(bar_w, int(round(frac * bar_w)))
        marks = {min(bar_w - 1, int(c / pos.duration_s * bar_w)) for c in pos.changes_s} if pos.duration_s else set()
        for i in range(bar_w):
            if i in marks:
                t.append("◆", style=style(WARN, bold=True))
            elif i < done:
                t.append("━", style=style(ACCENT))
            elif i == done:
                t.append("╸", style=style(TEXT))
            else:
                t.append("─", style=style(MUTED))
    t.append(right, style=style(TEXT))
    return t


class ReplayBar(Widget):
    """Position / duration of a replay with its settings changes; hidden when live."""

    DEFAULT_CSS = "ReplayBar { height: 1; }"

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.pos: ReplayPosition | None = None

    def show(self, pos: ReplayPosition) -> None:
        if pos != self.pos:
            self.pos = pos
            self.refresh()

    def render(self) -> Text:
        return replay_text(self.pos, self.size.width) if self.pos else Text("")


class StatusLine(Widget):
    """Worker exit codes and error lines, ingest/sink errors; a hint when all is well."""

    DEFAULT_CSS = "StatusLine { height: auto; max-height: 4; }"

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._text = Text("")

    def show(self, errors: list[str], hint: str = "") -> None:
        t = Text(no_wrap=True, overflow="ellipsis")
        if errors:
            for i, line in enumerate(errors[-3:]):
                if i:
                    t.append("\n")
                t.append("✗ " if i == 0 else "  ", style=style(EXITED, bold=True))
                t.append(line, style=style(EXITED if i == 0 else TEXT))
        elif hint:
            t.append(hint, style=style(MUTED))
        if t.plain != self._text.plain:
            self._text = t
            self.refresh(layout=True)

    def render(self) -> Text:
        return self._text
