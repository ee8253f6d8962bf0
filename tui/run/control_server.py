"""The collector's half of live control: desired settings out, `ctl` requests in.

``ControlServer(connection)`` binds the run's ``control`` PUB endpoint (rank 0's control
thread subscribes) and its ``request`` ROUTER endpoint (`commtop ctl` connects). One thread
owns both sockets. It publishes the desired state ``{epoch, settings}``, signed, every
0.5 s and at once after a change: level-triggered, so a rank 0 that missed a message or a
collector that restarted converges without any handshake.

A restarted collector must not reset a running job: it publishes nothing until the workers
told it the settings in force (Hello carries settings and epoch), then adopts them as the
desired state (desired epoch = the highest seen). It also holds while the workers are
still switching to an epoch newer than what it knows (a change of the previous collector).

`ctl` requests are replay-proof: ``status`` is read-only; ``set`` must carry
``expect`` = desired epoch + 1, learned from a fresh ``status``, so a replayed ``set``
carries a stale epoch and is refused. Replies echo the request's nonce. Every refused
message is counted by reason and shown (``ControlView.rejected``).

`commtop ab --run` drives its blocks through the same ``set`` (with ``new_epoch``: a block is
exactly one epoch, also when nothing changes) and leaves its A/B marks in the run's recording
through ``mark`` (an ``ab`` dict of plain values, written by ``marks``, the recorder).
"""

from __future__ import annotations

import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import zmq

from tui.experiment.ab_stats import AB_MARK
from tui.ingest.interfaces import ControlView
from tui.ingest.sources import ipc_endpoint_in_use
from tui.model.changeable import UNKNOWN, Changeable
from tui.model.in_force import InForce, InForceTracker
from workers.wire import protocol
from workers.wire.connection import Connection
from workers.wire.control import EPOCH_HISTORY, ctl_reply_body, ctl_state_body
from workers.wire.settings import Settings, SettingsError, settings_from_wire
from workers.wire.telemetry import decode_caps

PUBLISH_S = 0.5
POLL_MS = 50
MAX_CHANGES = 32
MAX_NONCE = 64
NOTE_S = 15.0
#: An A/B mark (``mark`` request): at most this many fields, strings this long.
MAX_MARK_FIELDS = 16
MAX_MARK_STR = 200
#: Nodes whose Prometheus endpoints `ctl status` lists at most.
MAX_NODES = 1024


class ControlServerError(RuntimeError):
    """The control endpoints cannot be bound; one line meant for the user."""


def settings_from_hello(data: Any) -> Settings | None:
    """Settings a worker reports as in force (knobs as reported), or None if malformed."""
    try:
        return settings_from_wire(data)
    except SettingsError:
        return None


def ab_mark(value: Any) -> dict[str, Any]:
    """An A/B mark from a request, checked: an ``ab`` dict of a few plain values."""
    if not isinstance(value, dict) or value.get("k") != AB_MARK or len(value) > MAX_MARK_FIELDS:
        raise protocol.ProtocolError("mark", "not an A/B mark")
    for name, item in value.items():
        plain = (
            item is None
            or isinstance(item, (bool, int, float))
            or (isinstance(item, str) and len(item) <= MAX_MARK_STR)
        )
        if not isinstance(name, str) or len(name) > 32 or not plain:
            raise protocol.ProtocolError("mark", f"A/B mark field {str(name)[:32]!r} is not a plain value")
    return dict(value)


class ControlServer:
    """interfaces.ControllerLike (TUI keys) and interfaces.Sink (fed by the ingest thread)."""

    def __init__(
        self,
        connection: Connection,
        *,
        in_force: InForceTracker | None = None,
        context: zmq.Context[Any] | None = None,
        publish_s: float = PUBLISH_S,
    ) -> None:
        """``in_force``: the run model's tracker (the collector passes it, so the header and
        ``ctl status`` read one fact); without one the server keeps and feeds its own."""
        self._key = connection.key
        self._session = connection.session
        self._publish_s = publish_s
        self._lock = threading.Lock()
        self._desired: tuple[int, Settings] | None = None
        self._in_force = in_force if in_force is not None else InForceTracker()
        self._feeds_in_force = in_force is None
        self._hellos: dict[int, tuple[int, Settings | None, int]] = {}  # rank -> (epoch, settings, rejected)
        self._ended: set[int] = set()  # ranks whose Bye came (and no Hello since: a restart)
        self._headers: dict[int, tuple[int, int, int]] = {}  # rank -> (epoch in force, pending, apply_at)
        self._apply_at_seen: dict[int, int] = {}  # pending epoch -> latest apply_at seen
        #: What the run can change (tui.model.changeable), from its Hellos.
        self._can = Changeable()
        #: Each node's Prometheus endpoint, as its sampler says (host -> URL; `ctl status`).
        self._prometheus: dict[str, str] = {}
        self.rejected: Counter[str] = Counter()
        self.reissues = 0
        #: where ``mark`` requests go (the collector sets it to its recorder's ``write``)
        self.marks: Callable[[dict[str, Any]], None] | None = None
        self._note = ""
        self._note_until = 0.0
        self._kick = False
        # Its own context by default: close() terminates it, so the endpoints are free again
        # when close() returns (a restarted collector can bind them at once).
        self._own_ctx = context is None
        self._ctx = context or zmq.Context()
        self._pub = self._ctx.socket(zmq.PUB)
        self._router = self._ctx.socket(zmq.ROUTER)
        for sock in (self._pub, self._router):
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.MAXMSGSIZE, protocol.MAX_BODY_BYTES + 1024)
        self._pub.setsockopt(zmq.SNDHWM, 64)
        self._router.setsockopt(zmq.RCVHWM, 256)
        self._router.setsockopt(zmq.SNDHWM, 256)
        try:
            for sock, endpoint in ((self._pub, connection.control), (self._router, connection.request)):
                if ipc_endpoint_in_use(endpoint):
                    raise ControlServerError(
                        f"cannot listen on {endpoint}: address already in use (is another commtop using it?)"
                    )
                try:
                    sock.bind(endpoint)
                except zmq.ZMQError as exc:
                    raise ControlServerError(f"cannot listen on {endpoint}: {exc.strerror}") from None
        except ControlServerError:
            self._pub.close(0)
            self._router.close(0)
            if self._own_ctx:
                self._ctx.term()
            raise
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="commtop-control-server", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ ControllerLike

    def request(self, changes: dict[str, Any], *, new_epoch: bool = False) -> str:
        """Ask for a change (TUI keys); "" if accepted, else a one-line reason."""
        with self._lock:
            return self._apply(changes, expect=None, new_epoch=new_epoch)[1]

    def in_force(self) -> InForce:
        """The settings in force and the pending change, as the run model sees them."""
        return self._in_force.state()

    def view(self) -> ControlView:
        with self._lock:
            requested = self._desired[1] if self._desired else None
            note = self._note if time.monotonic() < self._note_until else ""
            if self._desired is None:
                note = note or "waiting for the workers to report the settings in force"
            return ControlView(
                requested=requested,
                rejected=sum(self.rejected.values()),  # workers' refusals come in their Hello
                note=note,
                can_change=self._can,
            )

    def rejected_by_reason(self) -> dict[str, int]:
        """Refused control messages: this collector's (ctl requests) by reason."""
        with self._lock:
            return dict(self.rejected)

    @property
    def desired(self) -> tuple[int, Settings] | None:
        with self._lock:
            return self._desired

    # ------------------------------------------------------------------ Sink

    def write(self, message: protocol.Message) -> None:
        """Learn what is in force from Hello and batch headers (called on the ingest thread)."""
        if self._feeds_in_force:
            self._in_force.note(message)
        if isinstance(message, protocol.Hello):
            settings = settings_from_hello(message.settings)
            rejected = sum(v for v in message.rejected.values() if isinstance(v, int) and v > 0)
            can = Changeable.from_hello(message.config, message.world_size)
            with self._lock:
                if message.rank == 0 or self._can.kind == UNKNOWN:  # rank 0 speaks for the job
                    self._can = can
                self._hellos[message.rank] = (message.epoch, settings, rejected)
                self._ended.discard(message.rank)
                if settings is not None:
                    self._adopt(message.epoch, settings)
        elif isinstance(message, protocol.Batch):
            with self._lock:
                self._headers[message.rank] = (message.epoch_in_force, message.pending_epoch, message.apply_at)
                self._note_reissue(message.pending_epoch, message.apply_at)
        elif isinstance(message, protocol.Bye):
            with self._lock:
                self._headers.pop(message.rank, None)
                self._ended.add(message.rank)
        elif isinstance(message, dict) and message.get("k") == protocol.TELEM_CAPS:
            self._note_prometheus(message)

    def _note_prometheus(self, body: dict[str, Any]) -> None:
        try:
            caps = decode_caps(body)
        except protocol.ProtocolError:
            return
        with self._lock:
            if not caps.prometheus:  # none, or its exporter closed (the sampler's last word)
                self._prometheus.pop(caps.host, None)
            elif caps.host in self._prometheus or len(self._prometheus) < MAX_NODES:
                self._prometheus[caps.host] = caps.prometheus

    # ------------------------------------------------------------------ state (lock held)

    def _adopt(self, epoch: int, settings: Settings) -> None:
        """Desired state = the newest state in force we heard of, unless ours is newer. Epoch 0
        is the workers' own: a monitored job declares its knobs after its Hellos started, so
        what is requested there follows what they report in force."""
        if self._desired is None or epoch > self._desired[0] or epoch == self._desired[0] == 0:
            self._desired = (epoch, settings)
            self._kick = True

    def _note_reissue(self, pending: int, apply_at: int) -> None:
        if pending < 0 or apply_at < 0:
            return
        seen = self._apply_at_seen.get(pending)
        if seen is not None and apply_at > seen:
            self.reissues += 1
            self._set_note(
                f"re-issued: a rank was past iteration {seen}; epoch {pending} now switches at iteration {apply_at}"
            )
        if seen is None or apply_at > seen:
            self._apply_at_seen[pending] = apply_at
            if len(self._apply_at_seen) > EPOCH_HISTORY:
                del self._apply_at_seen[min(self._apply_at_seen)]

    def _set_note(self, text: str) -> None:
        self._note = text
        self._note_until = time.monotonic() + NOTE_S

    def _workers_ahead(self) -> int:
        """The newest epoch the workers run or switch to (-1 if none heard)."""
        heard = [h[0] for h in self._hellos.values()]
        heard += [max(h[0], h[1]) for h in self._headers.values()]
        return max(heard, default=-1)

    def _apply(self, changes: Any, expect: int | None, new_epoch: bool = False) -> tuple[int, str]:
        """Validate and apply a change; returns (new epoch or -1, "" or a reason). A change that
        changes nothing starts no epoch: it returns the desired epoch as it is."""
        if self._desired is None:
            return -1, "the workers have not reported their settings yet; try again in a moment"
        epoch, current = self._desired
        if self._workers_ahead() > epoch:
            return -1, "the workers are still switching to an earlier change; try again in a moment"
        if expect is not None and expect != epoch + 1:
            return -1, f"stale request: settings epoch is {epoch}, request expected {expect - 1}; try again"
        if not isinstance(changes, dict) or not changes or len(changes) > MAX_CHANGES:
            return -1, f"expected 1..{MAX_CHANGES} settings to change"
        try:  # what this run can change (tui.model.changeable): nothing it would ignore
            settings = self._can.updated(current, {str(k): v for k, v in changes.items()})
        except SettingsError as exc:
            return -1, str(exc)
        # nothing changes (`set pinned=false` while pageable): no new epoch, unless asked for one
        # (an A/B block is exactly one epoch, also when both arms are the same: tui.experiment.ab_experiment)
        if settings == current and not new_epoch:
            return epoch, ""
        self._desired = (epoch + 1, settings)
        self._in_force.note_settings(epoch + 1, settings)
        self._kick = True
        return epoch + 1, ""

    # ------------------------------------------------------------------ thread

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._router, zmq.POLLIN)
        next_publish = 0.0
        try:
            while not self._stop.is_set():
                if poller.poll(POLL_MS):
                    self._drain_requests()
                now = time.monotonic()
                with self._lock:
                    kick, self._kick = self._kick, False
                if kick or now >= next_publish:
                    self._publish()
                    next_publish = now + self._publish_s
        except zmq.ZMQError as exc:
            if not self._stop.is_set():
                print(f"commtop: control server stopped: {exc.strerror}", file=sys.stderr)
        finally:
            self._pub.close(0)
            self._router.close(0)

    def _publish(self) -> None:
        with self._lock:
            desired = self._desired
            if desired is None or desired[0] == 0 or self._workers_ahead() > desired[0]:
                # never publish a state older than what the workers already have; epoch 0 is
                # where they start, and only their Hellos say what it holds
                return
        frames = protocol.seal(self._key, ctl_state_body(self._session, desired[0], desired[1]))
        try:
            self._pub.send_multipart(frames, flags=zmq.NOBLOCK)
        except zmq.Again:
            pass

    def _drain_requests(self) -> None:
        for _ in range(256):
            try:
                frames = self._router.recv_multipart(flags=zmq.NOBLOCK)
            except zmq.Again:
                return
            if len(frames) < 2:
                continue
            identity, rest = frames[0], frames[1:]
            reply = self._handle(rest)
            if reply is not None:
                try:
                    self._router.send_multipart([identity, *protocol.seal(self._key, reply)], flags=zmq.NOBLOCK)
                except zmq.ZMQError:
                    pass

    def _handle(self, frames: list[bytes]) -> dict[str, Any] | None:
        """One ctl request -> the reply body (None: refused silently, counted)."""
        try:
            body = protocol.open_frames(self._key, frames, self._session)
            if body.get("k") != protocol.CTL_REQ:
                raise protocol.ProtocolError("kind", f"{body.get('k')!r} on the request channel")
            op = protocol.get_str(body, "op")
            nonce = protocol.get_str(body, "nonce", "")[:MAX_NONCE]
            expect = protocol.get_int(body, "expect", 0, 2**31 - 1) if op == "set" else None
            mark = ab_mark(body.get("mark")) if op == "mark" else None
        except protocol.ProtocolError as exc:
            with self._lock:
                self.rejected[exc.reason] += 1
            return None
        reply = ctl_reply_body(self._session, nonce)
        if mark is not None:
            marks = self.marks
            if marks is not None:
                marks(mark)
            reply.update(ok=True, error="", recorded=marks is not None)
            return reply
        with self._lock:
            if op == "set":
                epoch, error = self._apply(body.get("changes"), expect, new_epoch=body.get("new_epoch") is True)
                if error.startswith("stale request"):
                    self.rejected["replay"] += 1
                reply.update(ok=not error, error=error, epoch=epoch)
            elif op != "status":
                self.rejected["op"] += 1
                reply.update(ok=False, error=f"unknown request {op[:32]!r}")
            else:
                reply.update(ok=True, error="")
            reply.update(self._status_fields())
        return reply

    def _status_fields(self) -> dict[str, Any]:
        in_force = self._in_force.state()
        note = self._note if time.monotonic() < self._note_until else ""
        return {
            "desired_epoch": self._desired[0] if self._desired else -1,
            "requested": self._desired[1].as_dict() if self._desired else {},
            "in_force": in_force.wire(),
            "epoch_in_force": in_force.epoch,
            "pending_epoch": in_force.pending_epoch,
            "apply_at": in_force.apply_at,
            "in_force_since": self._apply_at_seen.get(in_force.epoch, -1),
            "ranks": len(self._hellos.keys() - self._ended),
            "exited": len(self._ended),
            "rejected": dict(self.rejected),
            "worker_rejected": sum(r for _, _, r in self._hellos.values()),
            "reissues": self.reissues,
            "note": note,
            "can_change": self._can.wire(),
            "prometheus": [f"{host}: {url}" for host, url in sorted(self._prometheus.items())],
        }

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2.0)
        if self._own_ctx and not self._thread.is_alive():
            self._ctx.term()
