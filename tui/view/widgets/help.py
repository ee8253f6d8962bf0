"""The help screen (? or F1): every key from tui.view.keys, grouped, with the ones this
session cannot use (no controller, not a replay) marked, so a newcomer learns all of them."""

from __future__ import annotations

from collections.abc import Callable

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from tui.view.keys import KEYS
from tui.view.widgets.palette import ACCENT, MUTED, TEXT, WARN, style

GROUPS = ("view", "live settings", "replay", "app")


def key_name(keys: str, display: str = "") -> str:
    if display:
        return display
    names = {"question_mark": "?", "space": "space", "equals_sign": "=", "minus": "-", "plus": "+"}
    first = keys.split(",")[0]
    return names.get(first, first)


def help_text(available: Callable[[str], bool], settings: str = "") -> Text:
    """Every key; of the live settings only those this run offers, under what it can change
    (``settings``: tui.model.changeable's words, "" without a controller)."""
    t = Text()
    t.append("commtop keys", style=style(ACCENT, bold=True))
    t.append("   (esc, q or ? closes · ctrl+p: every action by name)\n", style=style(MUTED))
    for group in GROUPS:
        keys = [k for k in KEYS if k.group == group and (k.show or k.display)]
        if group == "live settings" and settings:
            keys = [k for k in keys if available(k.action)]
        if not keys and not (group == "live settings" and settings):
            continue
        t.append(f"\n{group}\n", style=style(ACCENT, bold=True))
        if group == "live settings" and settings:
            t.append(f"  this run can change: {settings}\n", style=style(MUTED))
        for k in keys:
            ok = available(k.action)
            t.append(f"  {key_name(k.keys, k.display):>6}  ", style=style(WARN if ok else MUTED, bold=ok))
            t.append(k.help, style=style(TEXT if ok else MUTED))
            if not ok:
                why = "replay only" if group == "replay" else "not in this session"
                t.append(f"  ({why})", style=style(MUTED))
            t.append("\n")
    return t


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
