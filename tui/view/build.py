"""The app for a run's session, or for a connection alone: what the CLI starts.

:class:`Session` says what the app reads of a session; tui.run.session's LiveSession and
ReplaySession fit it, so the view does not import the run layer (a sibling).
"""

from __future__ import annotations

from typing import Any, Protocol

from tui.ingest.interfaces import ControllerLike, ProcessWatch, RecorderLike, Sink, Source
from tui.model.run_model import RunModel
from tui.view.app import CommtopApp
from workers.wire.connection import Connection


class Session(Protocol):
    """What the app reads of a run's session (tui.run.session's LiveSession and ReplaySession fit)."""

    @property
    def source(self) -> Source: ...
    @property
    def model(self) -> RunModel: ...
    @property
    def sinks(self) -> list[Sink]:
        """Get every accepted message after the model (control server, recorder)."""
        ...

    @property
    def controller(self) -> ControllerLike | None: ...
    @property
    def recorder(self) -> RecorderLike | None: ...
    @property
    def job(self) -> ProcessWatch | None:
        """The job this process started (exit code, error lines), if any."""
        ...


def build_app(
    session: Session | None = None,
    *,
    connection: Connection | None = None,
    title: str = "commtop",
    **kwargs: Any,
) -> CommtopApp:
    """The app for a run's session (source, model, sinks, controller, recorder, job), or for
    a connection alone (binds a LiveSource on ``connection.data``; the app closes it)."""
    if session is not None:
        return CommtopApp(
            session.source,
            session.model,
            sinks=session.sinks,
            controller=session.controller,
            recorder=session.recorder,
            process_watch=session.job,
            title=title,
            **kwargs,
        )
    if connection is None:
        raise ValueError("build_app needs a session or a connection")
    from tui.ingest.sources import LiveSource

    return CommtopApp(LiveSource(connection), RunModel(), title=title, owns_source=True, **kwargs)
