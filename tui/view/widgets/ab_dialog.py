"""The A/B dialog (key ``a``): settings of arm A and arm B and how long to run.

It only collects the choice; the app starts a tui.experiment.ab_experiment.ABExperiment with it."""

from __future__ import annotations

from dataclasses import dataclass

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label

from tui.experiment.ab_experiment import parse_arm


@dataclass(frozen=True)
class ABChoice:
    a: dict[str, str]
    b: dict[str, str]
    duration_s: float


class ABDialog(ModalScreen[ABChoice | None]):
    """Enter starts, Escape cancels; a bad value is named in one line and nothing starts."""

    DEFAULT_CSS = """
    ABDialog { align: center middle; }
    ABDialog > Vertical { width: 72; height: auto; padding: 1 2; background: #161b22; border: solid #5fd7ff; }
    ABDialog Label { width: 100%; }
    ABDialog Input { margin-bottom: 1; }
    ABDialog #ab-error { color: #ff5f5f; height: auto; }
    ABDialog Horizontal { height: auto; align-horizontal: right; }
    """
    BINDINGS = [Binding("escape", "cancel", "cancel")]

    def __init__(self, a: str, b: str, duration_s: float = 30.0) -> None:
        super().__init__()
        self._a, self._b, self._duration = a, b, duration_s

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label("A/B experiment: A and B alternate in random AB/BA blocks; B/A with a 95 % interval")
            yield Label("arm A (name=value, ...)")
            yield Input(self._a, id="ab-a")
            yield Label("arm B")
            yield Input(self._b, id="ab-b")
            yield Label("seconds")
            yield Input(f"{self._duration:g}", id="ab-duration")
            yield Label("", id="ab-error")
            with Horizontal():
                yield Button("start", variant="primary", id="ab-start")
                yield Button("cancel", id="ab-cancel")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "ab-start":
            self._submit()
        else:
            self.dismiss(None)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self._submit()

    def action_cancel(self) -> None:
        self.dismiss(None)

    def _submit(self) -> None:
        try:
            a = parse_arm(self.query_one("#ab-a", Input).value)
            b = parse_arm(self.query_one("#ab-b", Input).value)
            duration = float(self.query_one("#ab-duration", Input).value)
            if not duration > 0:
                raise ValueError("seconds must be positive")
        except ValueError as exc:
            self.query_one("#ab-error", Label).update(str(exc))
            return
        self.dismiss(ABChoice(a, b, duration))
