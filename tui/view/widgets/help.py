"""The help screen (? or F1): the keys from tui.view.keys this session can use, grouped; the
others (no controller, not a replay) named in one line, so a newcomer learns all of them."""

from __future__ import annotations

from collections.abc import Callable

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from tui.view.keys import KEYS
from tui.view.widgets.palette import ACCENT, MUTED, TEXT, WARN, style

GROUPS = ("view", "live settings", "replay", "app")
#: Width of the key column ("?/F1", "space"), right-aligned, two spaces in.
KEY_W = 8


def key_name(keys: str, display: str = "") -> str:
    if display:
        return display
    names = {"question_mark": "?", "space": "space", "equals_sign": "=", "minus": "-", "plus": "+"}
    first = keys.split(",")[0]
    return names.get(first, first)


def help_text(available: Callable[[str], bool], settings: str = "") -> Group:
    """The keys this session can use, grouped, each sentence wrapped under itself (a hanging
    indent, not back to column 0), with what this run can change above the live settings
    (``settings``: tui.model.changeable's words, "" without a controller); the others named in
    one line at the end, with where they work, so a newcomer learns them without being offered
    what does nothing here."""
    parts: list[RenderableType] = [
        Text.assemble(
            ("commtop keys", style(ACCENT, bold=True)),
            ("   (esc, q or ? closes · ctrl+p: every action by name)", style(MUTED)),
        )
    ]
    elsewhere: dict[str, list[str]] = {}
    for group in GROUPS:
        rows = Table.grid(padding=(0, 2))
        rows.add_column(justify="right", width=KEY_W, no_wrap=True)
        rows.add_column(ratio=1)
        for k in KEYS:
            if k.group != group or not (k.show or k.display):
                continue
            if available(k.action):
                rows.add_row(Text(key_name(k.keys, k.display), style(WARN, bold=True)), Text(k.help, style(TEXT)))
            else:
                where = "replay only" if group == "replay" else "not in this session"
                elsewhere.setdefault(where, []).append(key_name(k.keys, k.display))
        can = settings if group == "live settings" else ""
        if rows.row_count or can:
            parts.append(Text(f"\n{group}", style(ACCENT, bold=True)))
            if can:
                parts.append(Text(f"  this run can change: {can}", style(MUTED)))
            if rows.row_count:
                parts.append(rows)
    if elsewhere:
        lines = [f"{where}: {' '.join(names)}" for where, names in elsewhere.items()]
        parts.append(Text("\n" + "\n".join(lines), style(MUTED)))
    return Group(*parts)


class HelpScreen(ModalScreen[None]):
    """Every key of the app; any of esc, q, ?, F1 closes it."""

    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll {
        width: 108; max-width: 100%; height: 90%;
        padding: 1 2; border: round $accent; background: #161b22;
    }
    HelpScreen Static { width: 100%; height: auto; }
    """
    BINDINGS = [Binding("escape,q,question_mark,f1", "dismiss", "close")]

    def __init__(self, available: Callable[[str], bool], settings: str = "") -> None:
        super().__init__()
        self.available = available
        self.settings = settings

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(help_text(self.available, self.settings), id="help-text")
