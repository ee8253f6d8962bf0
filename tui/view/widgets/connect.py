"""How to connect workers to this `commtop watch`: shown until the first rank arrives, and
again on `i`. Before, these lines were printed to the terminal and hidden by the TUI."""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual.widget import Widget

from tui.view.widgets.palette import ACCENT, MUTED, TEXT, style


def connect_text(lines: Sequence[str]) -> Text:
    t = Text()
    t.append("How to connect workers to this run", style=style(ACCENT, bold=True))
    t.append("   (shown until the first rank arrives · i hides / shows it)\n", style=style(MUTED))
    for line in lines:
        label, sep, rest = line.partition(": ")
        if sep:
            t.append(f"\n{label}:\n", style=style(MUTED))
            t.append(f"  {rest}\n", style=style(TEXT, bold=True))
        else:
            t.append(f"\n{line}\n", style=style(TEXT))
    return t


class ConnectPanel(Widget):
    """The connection file and the commands that reach this run (from tui.run.connect_help)."""

    DEFAULT_CSS = """
    ConnectPanel { height: auto; padding: 1 2; margin: 1 2; border: round $accent; }
    """

    def __init__(self, lines: Sequence[str], *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.lines = list(lines)

    def render(self) -> Text:
        return connect_text(self.lines)
