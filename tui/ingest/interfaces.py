"""The contracts between the TUI's parts, so each can be built and tested alone.

Plain Python (no Textual, no torch). A *message* here is what ``workers.wire.protocol.decode``
returns: a ``Batch`` (COLL/COPY), a ``Hello``, a ``Bye``, or a plain dict for TELEM,
TELEM_CAPS and CTL_* kinds. Live and replay feed the same model through a ``Source``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from tui.model.changeable import Changeable
from workers.wire.protocol import Message
from workers.wire.settings import Settings


@runtime_checkable
class Source(Protocol):
    """Where messages come from: live ZeroMQ sockets, or a recording being replayed."""

    @property
    def rejected(self) -> Counter[str]:
        """Frames refused so far, by ProtocolError.reason ("signature", "malformed", ...)."""
        ...

    def poll(self, timeout_s: float) -> list[Message | ResetModel]:
        """Every message ready now (waiting at most ``timeout_s`` for the first one).
        Must drain what is queued without blocking once something arrived."""
        ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class ReplayPosition:
    position_s: float
    duration_s: float
    speed: float
    paused: bool
    #: Seconds from the start of the recording at which settings changed (epoch changes).
    changes_s: tuple[float, ...] = ()
    finished: bool = False


@runtime_checkable
class ReplayControls(Protocol):
    """What a replay source offers beyond ``Source`` (the app binds keys to it)."""

    def toggle_pause(self) -> None: ...

    def set_speed(self, factor: float) -> None:
        """0.25x .. 64x."""
        ...

    def seek(self, delta_s: float) -> None:
        """Relative seek; seeking backwards rebuilds the model from the start (the source
        signals it by returning a ``ResetModel`` marker from ``poll`` first)."""
        ...

    def jump_change(self, direction: int) -> None:
        """To the next (+1) or previous (-1) settings change."""
        ...

    def position(self) -> ReplayPosition: ...


@dataclass(frozen=True)
class ResetModel:
    """Returned by a Source's poll when the consumer must clear its model (replay seek back)."""


class Sink(Protocol):
    """Receives every accepted message after the model applied it (the recorder is one)."""

    def write(self, message: Message) -> None:
        """Must not block for long: called on the ingest thread."""
        ...


@dataclass(frozen=True)
class RecordingStatus:
    active: bool
    path: str = ""
    bytes_written: int = 0
    elapsed_s: float = 0.0
    error: str = ""  # e.g. "No space left on device: recording stopped"


class RecorderLike(Sink, Protocol):
    def start(self, path: str | None = None) -> str:
        """Start recording (default path under recordings/); returns the path."""
        ...

    def stop(self) -> None: ...

    def status(self) -> RecordingStatus: ...


@dataclass(frozen=True)
class ControlView:
    """What the header shows about live control beyond the snapshot: the settings requested
    (the snapshot says which are in force), refusals and the latest note."""

    requested: Settings | None  # None: the workers have not reported the settings in force yet
    rejected: int = 0  # control/telemetry messages refused (bad signature, replay, ...)
    note: str = ""  # e.g. "re-issued: rank 3 was past iteration 640"
    #: What the run can change (keys, A/B arms); UNKNOWN until a worker said Hello.
    can_change: Changeable = field(default_factory=Changeable)


class ControllerLike(Protocol):
    """Changes the settings of a running job (implemented by the control server)."""

    def request(self, changes: dict[str, Any], *, new_epoch: bool = False) -> str:
        """Ask for a change; returns "" if accepted, else a one-line error. ``new_epoch``: start a
        settings epoch also when nothing changes (an A/B block is exactly one epoch)."""
        ...

    def view(self) -> ControlView: ...


class ProcessWatch(Protocol):
    """The launched job as the app sees it (tui.run.launcher.JobProcess fits): for the status line."""

    def lines(self) -> list[str]:
        """Recent output lines of the job (stderr/stdout of torchrun and its ranks)."""
        ...

    def exit_code(self) -> int | None:
        """None while running."""
        ...
