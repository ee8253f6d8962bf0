"""Textual messages of the app, as dataclasses in one place (posted from the ingest thread)."""

from __future__ import annotations

from dataclasses import dataclass

from textual.message import Message

from tui.model.snapshot import Snapshot


@dataclass
class SnapshotReady(Message):
    """A new frozen Snapshot is ready; the app applies it in one ``batch_update()``."""

    snapshot: Snapshot


@dataclass
class IngestError(Message):
    """A sink, callback or source failed on the ingest thread (one line)."""

    text: str
