"""A live run's data feed: the collector re-publishes every message it accepted, so another
local process (`commtop ab --run RUN`) can see the run's records while the run's own collector
(`commtop run` / `watch`) keeps the one data socket the workers push to.

The collector binds a PUB socket at ``feed.sock`` in the run's folder (mode 0700, like the
other sockets) and forwards the frames exactly as the workers signed them: nothing is decoded
or re-encoded, and a send never blocks (no subscriber, or a slow one: ZeroMQ drops the
message). A subscriber verifies each frame with the run's key, as the collector did.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import zmq

from tui.ingest.interfaces import ResetModel
from tui.ingest.sources import MAX_PER_POLL, OVERSIZE_SLACK, drain_signed, ipc_endpoint_in_use
from workers.wire.connection import Connection
from workers.wire.protocol import MAX_BODY_BYTES, Message

FEED_NAME = "feed.sock"
#: Messages queued per subscriber before the collector drops for it (a batch carries many records).
FEED_HWM = 20000


class FeedError(RuntimeError):
    """The feed cannot be used; the message is one line meant for the user."""


def feed_path(connection: Connection) -> Path:
    return connection.run_dir / FEED_NAME


def feed_endpoint(connection: Connection) -> str:
    """Always ipc in the run's folder, also for a run that listens on TCP: the feed is for
    processes on the collector's host that can read the run's connection file."""
    return f"ipc://{feed_path(connection)}"


class FeedPublisher:
    """The collector's half: ``forward(frames)`` for every accepted message."""

    def __init__(self, connection: Connection, context: zmq.Context[Any] | None = None) -> None:
        self.endpoint = feed_endpoint(connection)
        self.dropped = 0
        ctx = context or zmq.Context.instance()
        sock = ctx.socket(zmq.PUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, FEED_HWM)
        if ipc_endpoint_in_use(self.endpoint):
            sock.close(0)
            raise FeedError(f"cannot publish the feed on {self.endpoint}: address already in use")
        try:
            sock.bind(self.endpoint)
        except zmq.ZMQError as exc:
            sock.close(0)
            raise FeedError(f"cannot publish the feed on {self.endpoint}: {exc.strerror}") from None
        self._sock = sock

    def forward(self, frames: list[bytes]) -> None:
        try:
            self._sock.send_multipart(frames, flags=zmq.NOBLOCK)
        except zmq.ZMQError:  # never block nor fail the collector's ingest
            self.dropped += 1

    def close(self) -> None:
        self._sock.close(0)


class FeedSource:
    """A Source (tui.ingest.interfaces) reading a live run's feed: verified, decoded messages
    from the moment it connected (no history: the run's Hellos came before)."""

    def __init__(self, connection: Connection, *, context: zmq.Context[Any] | None = None) -> None:
        path = feed_path(connection)
        if not ipc_endpoint_in_use(f"ipc://{path}"):
            raise FeedError(
                f"run {connection.run_id} has no live data feed ({path} is not served: its collector "
                "ended, or is an older commtop without one)"
            )
        self.rejected: Counter[str] = Counter()
        self.received = 0
        self._key = connection.key
        self._session = connection.session
        self._ctx = context or zmq.Context.instance()
        sock = self._ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.MAXMSGSIZE, MAX_BODY_BYTES + OVERSIZE_SLACK)
        sock.setsockopt(zmq.RCVHWM, FEED_HWM)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SUBSCRIBE, b"")
        sock.connect(feed_endpoint(connection))
        self._sock = sock
        self._poller = zmq.Poller()
        self._poller.register(sock, zmq.POLLIN)
        self._closed = False

    def poll(self, timeout_s: float) -> list[Message | ResetModel]:
        if self._closed:
            return []
        out, received = drain_signed(
            self._sock, self._poller, self._key, self._session, timeout_s, MAX_PER_POLL, self.rejected
        )
        self.received += received
        return out

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._sock.close(0)
