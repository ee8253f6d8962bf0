"""The job's log pane (key l): the last lines of every rank and of torchrun, the first failing
rank's own error first, refreshed twice a second while open. Without it, what the job printed
was behind the TUI until it quit."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from tui.view.widgets.palette import ACCENT, EXITED, MUTED, TEXT, style

#: (title, is it the failing rank's error, lines)
LogSection = tuple[str, bool, list[str]]
REFRESH_S = 0.5
#: Lines asked for per section (the screen's height picks how many are shown).
KEPT_LINES = 200


@runtime_checkable
class JobLog(Protocol):
    """The job as the pane reads it (tui.run.launcher.JobProcess fits)."""

    @property
    def log_path(self) -> str:
        """Where the whole log is kept."""
        ...

    def log_sections(self, lines_per_rank: int) -> list[LogSection]:
        """The first failing rank's error (if any), then each rank's and torchrun's last lines."""
        ...


def job_log_of(watch: object) -> JobLog | None:
    """The app's process watch as a job log, if it is one."""
    return watch if isinstance(watch, JobLog) else None


def lines_per_rank(sections: int, height: int) -> int:
    """As many lines per section as fit the screen, at least 5."""
    return max(5, (height - 4) // max(1, sections) - 2)


def log_text(sections: list[LogSection], path: str) -> Text:
    t = Text()
    t.append("The job's output", style=style(ACCENT, bold=True))
    t.append(f"   (l, esc or q closes · the whole log: {path})\n", style=style(MUTED))
    if not sections:
        t.append("\nnothing printed yet\n", style=style(MUTED))
    for title, error, lines in sections:
        t.append(f"\n{title}\n", style=style(EXITED if error else ACCENT, bold=True))
        for line in lines:
            t.append(f"  {line}\n", style=style(EXITED if error else TEXT))
        if not lines:
            t.append("  (nothing)\n", style=style(MUTED))
    return t


class JobLogScreen(ModalScreen[None]):
    """Every rank's last lines; l, esc or q closes it."""

    DEFAULT_CSS = """
    JobLogScreen { align: center middle; }
    JobLogScreen > VerticalScroll {
        width: 100%; height: 100%;
        padding: 0 1; border: round $accent; background: #161b22;
    }
    JobLogScreen Static { width: 100%; height: auto; }
    """
    BINDINGS = [Binding("escape,q,l", "dismiss", "close")]

    def __init__(self, job: JobLog) -> None:
        super().__init__()
        self.job = job
        self._shown = ""

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static("", id="job-log-text")

    def on_mount(self) -> None:
        self.refresh_log()
        self.set_interval(REFRESH_S, self.refresh_log)

    def refresh_log(self) -> None:
        sections = self.job.log_sections(KEPT_LINES)
        n = lines_per_rank(len(sections), self.app.size.height)
        text = log_text(
            [(title, error, lines if error else lines[-n:]) for title, error, lines in sections], self.job.log_path
        )
        if text.plain != self._shown:
            self._shown = text.plain
            self.query_one("#job-log-text", Static).update(text)
