"""The verdict line under the header: the latest answer (an A/B's, with its interval), a
running A/B's progress, or the two newest epochs compared (marked: no interval)."""

from __future__ import annotations

from rich.text import Text
from textual.widget import Widget

from tui.ingest.interfaces import ReplayPosition
from tui.view.widgets.palette import ACCENT, MUTED, TEXT, WARN, style


def replay_idle_text(position: ReplayPosition) -> str:
    """What the line says in a replay before two epochs can be compared: a replay cannot switch
    settings or run an A/B, so it points at the recording's own changes instead."""
    if not position.changes_s:
        return "verdict: this recording ran one settings epoch: nothing to compare"
    if any(c > position.position_s for c in position.changes_s):
        return "verdict: one settings epoch so far · n: the next settings change"
    return "verdict: too few collectives here to compare two settings epochs"


class VerdictLine(Widget):
    """One line; the text comes from tui.experiment.verdict.verdict_text."""

    DEFAULT_CSS = "VerdictLine { height: 1; }"

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._text = ""

    def show(self, text: str) -> None:
        if text != self._text:
            self._text = text
            self.refresh()

    def render(self) -> Text:
        text = self._text
        t = Text(no_wrap=True, overflow="ellipsis")
        if not text:  # nothing to say (a job without modes, before any A/B)
            return t
        if text.startswith("A/B running"):
            t.append("◔ ", style=style(WARN, bold=True))
            t.append(text, style=style(TEXT))
        elif text.startswith("A/B failed"):
            t.append("✗ ", style=style(WARN, bold=True))
            t.append(text, style=style(WARN))
        elif text.startswith("A/B "):
            t.append("◆ ", style=style(ACCENT, bold=True))
            t.append(text, style=style(ACCENT, bold=True))
        else:
            head, sep, tail = text.partition("  (")
            t.append("≈ ", style=style(MUTED))
            t.append(head, style=style(TEXT))
            if sep:
                t.append("  (" + tail, style=style(MUTED))
        return t
