"""Live message source: the collector's ZeroMQ PULL socket, verified and decoded.

Workers and node samplers connect PUSH to the run's ``data`` endpoint; the collector binds
it here. ``poll`` drains everything queued (NOBLOCK until EAGAIN, capped per call so the
ingest loop stays responsive under a flood) and never raises on bad input: refused frames
are counted by ``ProtocolError.reason`` in ``rejected``.
"""

from __future__ import annotations

import math
import os
import socket
from collections import Counter
from collections.abc import Callable
from typing import Any

import zmq

from tui.ingest.interfaces import ResetModel
from workers.wire.connection import Connection
from workers.wire.protocol import MAX_BODY_BYTES, Message, ProtocolError, decode, open_frames

#: Messages taken per ``poll`` at most; the rest stay queued for the next call.
MAX_PER_POLL = 2000
OVERSIZE_SLACK = 1024
#: Messages queued in the collector's socket before senders see EAGAIN (and count drops).
RCVHWM = 10000


class SourceError(RuntimeError):
    """The source cannot start; the message is one line meant for the user."""


def drain_signed(
    sock: Any,
    poller: Any,
    key: bytes,
    session: str,
    timeout_s: float,
    limit: int,
    rejected: Counter[str],
    accepted: Callable[[list[bytes]], object] | None = None,
) -> tuple[list[Message | ResetModel], int]:
    """(the signed messages ready on ``sock``, frames received): waits at most ``timeout_s`` for
    the first, then takes what is queued (NOBLOCK, at most ``limit``); a frame that fails its
    check or its decoding is counted in ``rejected`` by reason, never raised. ``accepted`` gets
    the frames of each message that passed (the collector's feed forwards them as they came)."""
    out: list[Message | ResetModel] = []
    received = 0
    if not poller.poll(max(0, math.ceil(timeout_s * 1000))):  # ms, rounded up: 0.4 ms is no busy poll
        return out, received
    for _ in range(limit):
        try:
            frames = sock.recv_multipart(flags=zmq.NOBLOCK, copy=True)
        except zmq.Again:
            break
        except zmq.ZMQError as exc:  # e.g. the context was terminated while closing
            rejected[f"zmq:{exc.errno}"] += 1
            break
        received += 1
        try:
            out.append(decode(open_frames(key, frames, session)))
        except ProtocolError as exc:
            rejected[exc.reason] += 1
            continue
        except Exception:  # a decoder bug must not kill ingest; count it
            rejected["decode"] += 1
            continue
        if accepted is not None:
            accepted(frames)
    return out, received


def ipc_endpoint_in_use(endpoint: str) -> bool:
    """libzmq silently replaces an ipc socket file that another process still listens on, so
    binders ask first (a stale file left by a crash is fine: nobody accepts on it)."""
    if not endpoint.startswith("ipc://"):
        return False
    path = endpoint[len("ipc://") :]
    if not os.path.exists(path):
        return False
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(0.2)
        probe.connect(path)
    except OSError:
        return False
    finally:
        probe.close()
    return True


class LiveSource:
    """Binds PULL at ``connection.data`` and yields decoded, verified messages."""

    def __init__(
        self,
        connection: Connection,
        *,
        context: zmq.Context[Any] | None = None,
        max_per_poll: int = MAX_PER_POLL,
        rcvhwm: int = RCVHWM,
    ) -> None:
        self.endpoint = connection.data
        self._feed: Any = None
        self.rejected: Counter[str] = Counter()
        self.received = 0
        self._key = connection.key
        self._session = connection.session
        self._max_per_poll = max_per_poll
        self._ctx = context or zmq.Context.instance()
        sock = self._ctx.socket(zmq.PULL)
        # libzmq drops a peer that sends a larger frame before we see it; a little slack
        # above the protocol's limit lets near-misses reach open_frames and count as "oversized".
        sock.setsockopt(zmq.MAXMSGSIZE, MAX_BODY_BYTES + OVERSIZE_SLACK)
        sock.setsockopt(zmq.RCVHWM, rcvhwm)
        sock.setsockopt(zmq.LINGER, 0)
        try:
            if ipc_endpoint_in_use(self.endpoint):
                raise SourceError("address already in use")
            sock.bind(self.endpoint)
        except (zmq.ZMQError, SourceError) as exc:
            sock.close(0)
            why = exc.strerror if isinstance(exc, zmq.ZMQError) else str(exc)
            raise SourceError(f"cannot listen on {self.endpoint}: {why} (is another commtop using it?)") from None
        self.endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)  # tcp://host:* -> the real port
        self._sock = sock
        self._poller = zmq.Poller()
        self._poller.register(sock, zmq.POLLIN)
        self._closed = False

    def attach_feed(self, feed: Any) -> None:
        """Hand every accepted message's frames to ``feed`` (a tui.ingest.feed.FeedPublisher,
        closed with this source), for `commtop ab --run`."""
        self._feed = feed

    def poll(self, timeout_s: float) -> list[Message | ResetModel]:
        """Messages ready now, waiting at most ``timeout_s`` for the first one."""
        if self._closed:
            return []
        feed = self._feed
        out, received = drain_signed(
            self._sock,
            self._poller,
            self._key,
            self._session,
            timeout_s,
            self._max_per_poll,
            self.rejected,
            None if feed is None else feed.forward,
        )
        self.received += received
        return out

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._sock.close(0)
            if self._feed is not None:
                self._feed.close()
