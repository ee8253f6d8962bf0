"""Live settings, switched on every rank at the same iteration without a collective per step.

Why this shape: ``sync-barrier`` adds a barrier to a step, so two ranks that disagree on the
settings of a step would hang NCCL. The ranks must therefore agree on *when* a change
applies, and the agreement must cost the loop nothing in the common case.

Agreement (a two-phase commit over the torch.distributed Store that torchrun provides; a
separate TCPStore client per rank, keys under ``commtop/<session>/<restart>/``):

1. Rank 0's control thread hears the desired state ``{epoch, settings}`` from the collector
   (signed CTL_STATE on the ``control`` PUB endpoint, re-sent every 0.5 s: level-triggered).
   For an epoch newer than the last committed one it writes a proposal
   ``{epoch, settings, apply_at}``, ``apply_at`` a step boundary comfortably ahead of its own
   iteration, and bumps the proposal counter.
2. Every rank's control thread polls the counter (one ``add(key, 0)`` every ~50 ms). For a new
   proposal it *first* queues it locally as pending, *then* reads its loop's current step-start
   iteration, both under the lock the loop takes at every step boundary. If that iteration is
   below ``apply_at`` it acks ``ok``: from then on the loop cannot pass ``apply_at`` without
   seeing the pending proposal. Otherwise it acks ``late`` and drops it.
3. Rank 0 commits when all ranks acked ok and aborts on any late ack (or when acks do not come
   within a timeout); the decision is one store key, written once. An abort is followed by a
   re-issue of the same desired state with a doubled lead (later ``apply_at``), counted and
   reported, so a rank already past ``apply_at`` never silently diverges.
4. The loop, at the first step boundary ``>= apply_at`` of a pending proposal, waits for the
   decision (a local Event the control thread sets; it blocks only at that switch, and only
   if the decision has not arrived yet): commit applies the settings and epoch, abort keeps
   the old ones. Every rank saw the same proposal and the same decision, and the boundaries
   are the same sequence on every rank, so every rank switches at the same iteration.

The loop thread never talks to the store or a socket: per step it takes one uncontended lock
and compares two integers. All store and socket work happens in the control thread.
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import msgpack

from workers.wire import protocol
from workers.wire.settings import Settings, SettingsError, settings_from_wire

#: Seconds between store polls while nothing is in flight.
POLL_S = 0.05
#: Seconds between polls while a proposal awaits acks or a decision.
FAST_POLL_S = 0.005
#: Initial lead of apply_at over rank 0's iteration, in seconds of loop progress.
LEAD_S = 0.3
MAX_LEAD_S = 8.0
#: The least lead, in steps (also the lead before the loop's rate is known).
MIN_AHEAD_STEPS = 4
#: Rank 0's iteration rate is re-measured over windows of this length.
RATE_WINDOW_S = 0.25
#: Rank 0 aborts a proposal whose acks have not all come in after this long.
ACK_TIMEOUT_S = 5.0
#: A loop waiting at a switch checks that the control thread is still alive this often.
SWITCH_CHECK_S = 0.5
#: Refused control messages are logged to stderr at most this often.
LOG_S = 10.0


@dataclass(frozen=True)
class Proposal:
    """One attempt to switch every rank to ``settings`` (``epoch``) at ``apply_at``."""

    pid: int
    epoch: int
    settings: Settings
    apply_at: int

    def pack(self) -> bytes:
        return msgpack.packb({"e": self.epoch, "s": self.settings.as_dict(), "a": self.apply_at}, use_bin_type=True)

    @classmethod
    def unpack(cls, pid: int, raw: bytes) -> Proposal:
        data = msgpack.unpackb(raw, raw=False)
        return cls(pid=pid, epoch=int(data["e"]), settings=settings_from_wire(data["s"]), apply_at=int(data["a"]))


class StoreKeys:
    """Names of the agreement's keys; one namespace per session and torchrun restart."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix.rstrip("/") + "/"
        self.counter = self.prefix + "pid"

    def proposal(self, pid: int) -> str:
        return f"{self.prefix}p/{pid}"

    def ok(self, pid: int) -> str:
        return f"{self.prefix}ok/{pid}"

    def late(self, pid: int) -> str:
        return f"{self.prefix}late/{pid}"

    def why(self, pid: int) -> str:
        return f"{self.prefix}why/{pid}"

    def decision(self, pid: int) -> str:
        return f"{self.prefix}d/{pid}"


COMMIT = b"commit"
ABORT = b"abort"


@dataclass
class _Pending:
    """A proposal this rank acked ok; the loop applies it at ``apply_at`` once decided."""

    proposal: Proposal
    decided: threading.Event = field(default_factory=threading.Event)
    commit: bool = False


@dataclass(frozen=True)
class ControlStats:
    """Counters for the batch headers, Hello and tests."""

    proposals: int
    commits: int
    aborts: int
    reissues: int
    late_acks: int
    switch_waits: int  # switches at which the loop had to wait for the decision
    note: str


class LiveControl:
    """The :class:`workers.rank.control.Control` that follows the collector's desired settings.

    ``store`` is a torch.distributed Store client used only by the control thread.
    ``desired`` (rank 0 only) is a :class:`DesiredListener`. ``step`` is the number of
    iterations per step (proposals are rounded up to a step boundary).
    """

    def __init__(
        self,
        store: Any,
        *,
        rank: int,
        world_size: int,
        settings: Settings,
        prefix: str,
        step: int = 1,
        desired: DesiredListener | None = None,
        poll_s: float = POLL_S,
        lead_s: float = LEAD_S,
        ack_timeout_s: float = ACK_TIMEOUT_S,
        start: bool = True,
    ) -> None:
        self.rank = rank
        self.world_size = world_size
        self.step = max(1, int(step))
        self.keys = StoreKeys(prefix)
        self._store = store
        self._desired = desired
        self._poll_s = poll_s
        self._lock = threading.Lock()
        self._iteration = -1  # step-start iteration of the loop's current step
        self._settings = settings
        self._epoch = 0
        self._queue: list[_Pending] = []  # acked-ok proposals, in apply_at order
        self._last_pid = 0
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._failure: BaseException | None = None
        self._switch_waits = 0
        self._late_acks = 0
        self._coordinator = _Coordinator(self, lead_s=lead_s, ack_timeout_s=ack_timeout_s) if rank == 0 else None
        self._thread = threading.Thread(target=self._run, name=f"commtop-control-r{rank}", daemon=True)
        if start:
            self._thread.start()

    # ------------------------------------------------------------------ loop thread

    def begin_step(self, iteration: int) -> tuple[Settings, int]:
        """Settings for the step starting at ``iteration`` (one lock, no I/O, unless a switch)."""
        with self._lock:
            self._iteration = iteration
            if not self._queue or iteration < self._queue[0].proposal.apply_at:
                return self._settings, self._epoch
        return self._switch(iteration)

    def _switch(self, iteration: int) -> tuple[Settings, int]:
        """At or past a pending proposal's apply_at: wait for its decision, then apply it."""
        while True:
            with self._lock:
                if not self._queue or iteration < self._queue[0].proposal.apply_at:
                    return self._settings, self._epoch
                head = self._queue[0]
            if not head.decided.is_set():
                self._switch_waits += 1
                self._wake.set()
                while not head.decided.wait(SWITCH_CHECK_S):
                    if self._failure is not None or not self._thread.is_alive():
                        raise RuntimeError(
                            f"commtop live control stopped while rank {self.rank} waited to switch at "
                            f"iteration {head.proposal.apply_at}: {self._failure!r}"
                        )
            with self._lock:
                if self._queue and self._queue[0] is head:
                    self._queue.pop(0)
                if head.commit:
                    self._settings = head.proposal.settings
                    self._epoch = head.proposal.epoch

    # ------------------------------------------------------------------ any thread

    def status(self) -> tuple[int, int, int]:
        """(epoch in force, pending epoch or -1, apply_at or -1) for batch headers."""
        outstanding = self._coordinator.outstanding if self._coordinator is not None else None
        with self._lock:
            epoch = self._epoch
            head = self._queue[0] if self._queue else None
        if head is not None and (head.commit or outstanding is None or outstanding.pid <= head.proposal.pid):
            return epoch, head.proposal.epoch, head.proposal.apply_at
        if outstanding is not None:  # rank 0: a newer proposal supersedes an undecided (aborted) head
            return epoch, outstanding.epoch, outstanding.apply_at
        return epoch, -1, -1

    def in_force(self) -> tuple[Settings, int]:
        """Settings and epoch the loop runs with now (for Hello)."""
        with self._lock:
            return self._settings, self._epoch

    def rejected(self) -> dict[str, int]:
        """Control messages refused so far, by reason (for Hello.rejected)."""
        return dict(self._desired.rejected) if self._desired is not None else {}

    def stats(self) -> ControlStats:
        c = self._coordinator
        return ControlStats(
            proposals=c.proposals if c else 0,
            commits=c.commits if c else 0,
            aborts=c.aborts if c else 0,
            reissues=c.reissues if c else 0,
            late_acks=self._late_acks,
            switch_waits=self._switch_waits,
            note=c.note if c else "",
        )

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=2.0)
        if self._desired is not None:
            self._desired.close()

    # ------------------------------------------------------------------ control thread

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                busy = self.poll_once()
                wait = FAST_POLL_S if busy else self._poll_s
                if self._desired is not None:
                    self._desired.poll(wait)
                else:
                    self._wake.wait(wait)
                    self._wake.clear()
        except BaseException as exc:  # noqa: BLE001 - reported to the loop, which must not hang
            self._failure = exc
            if not self._stop.is_set():
                print(f"commtop: rank {self.rank}: live control stopped: {exc!r}", file=sys.stderr)

    def poll_once(self) -> bool:
        """One round of store work; True while something is in flight (poll faster)."""
        busy = self._poll_decisions()
        busy |= self._poll_proposals()
        if self._coordinator is not None:
            busy |= self._coordinator.tick()
        return busy

    def _poll_decisions(self) -> bool:
        with self._lock:
            undecided = [p for p in self._queue if not p.decided.is_set()]
        for pending in undecided:
            key = self.keys.decision(pending.proposal.pid)
            if not self._store.check([key]):
                continue
            commit = bytes(self._store.get(key)) == COMMIT
            with self._lock:
                pending.commit = commit
                if not commit and pending in self._queue:
                    self._queue.remove(pending)
            pending.decided.set()
        return bool(undecided)

    def _poll_proposals(self) -> bool:
        newest = int(self._store.add(self.keys.counter, 0))
        while self._last_pid < newest:
            self._last_pid += 1
            self._consider(self._last_pid)
        return False

    def _consider(self, pid: int) -> None:
        if self._store.check([self.keys.decision(pid)]):
            return  # decided without this rank's ack: necessarily an abort
        proposal = Proposal.unpack(pid, bytes(self._store.get(self.keys.proposal(pid))))
        pending = _Pending(proposal)
        with self._lock:
            # Queue first, then read the iteration: once we ack ok, the loop cannot pass
            # apply_at without finding this proposal at the head of the queue.
            self._queue.append(pending)
            self._queue.sort(key=lambda p: p.proposal.apply_at)
            iteration = self._iteration
            ok = iteration < proposal.apply_at
            if not ok:
                self._queue.remove(pending)
        if ok:
            self._store.add(self.keys.ok(pid), 1)
        else:
            self._late_acks += 1
            self._store.set(self.keys.why(pid), msgpack.packb([self.rank, iteration]))
            self._store.add(self.keys.late(pid), 1)

    def loop_iteration(self) -> int:
        with self._lock:
            return self._iteration


class _Coordinator:
    """Rank 0's half: turns desired states into proposals and decides them."""

    def __init__(self, control: LiveControl, *, lead_s: float, ack_timeout_s: float) -> None:
        self.c = control
        self.base_lead_s = lead_s
        self.lead_s = lead_s
        self.ack_timeout_s = ack_timeout_s
        self.committed_epoch = 0
        self.last_apply_at = -1
        self.late_iteration = -1  # furthest iteration a rank reported in a late ack
        self.outstanding: Proposal | None = None
        self.proposed_at = 0.0
        self.next_pid = 1
        self.proposals = self.commits = self.aborts = self.reissues = 0
        self.note = ""
        self._rate = 0.0  # iterations per second of rank 0's loop
        self._sample: tuple[float, int] | None = None

    def tick(self) -> bool:
        self._measure_rate()
        if self.outstanding is not None:
            self._decide(self.outstanding)
        desired = self.c._desired.desired if self.c._desired is not None else None
        if self.outstanding is None and desired is not None and desired[0] > self.committed_epoch:
            self._propose(*desired)
        return self.outstanding is not None

    def _measure_rate(self) -> None:
        now, it = time.monotonic(), self.c.loop_iteration()
        if self._sample is None or it < self._sample[1]:
            self._sample = (now, it)
            return
        t0, i0 = self._sample
        if now - t0 >= RATE_WINDOW_S:
            rate = (it - i0) / (now - t0)
            self._rate = rate if self._rate == 0.0 else 0.5 * self._rate + 0.5 * rate
            self._sample = (now, it)

    def _propose(self, epoch: int, settings: Settings) -> None:
        step = self.c.step
        here = max(self.c.loop_iteration(), self.late_iteration, 0)
        # the lead in loop progress; before the rate is known, in steps (doubling on re-issues too)
        ahead = max(int(MIN_AHEAD_STEPS * step * self.lead_s / self.base_lead_s), math.ceil(self._rate * self.lead_s))
        apply_at = max(here + ahead, self.last_apply_at + step)
        apply_at = int(math.ceil(apply_at / step)) * step
        proposal = Proposal(self.next_pid, epoch, settings, apply_at)
        store, keys = self.c._store, self.c.keys
        store.set(keys.proposal(proposal.pid), proposal.pack())
        self.outstanding = proposal
        self.proposed_at = time.monotonic()
        self.proposals += 1
        newest = int(store.add(keys.counter, 1))
        if newest != proposal.pid:
            raise RuntimeError(f"two coordinators under {keys.prefix}: proposal {newest} != {proposal.pid}")
        self.next_pid += 1

    def _decide(self, proposal: Proposal) -> None:
        store, keys = self.c._store, self.c.keys
        late = int(store.add(keys.late(proposal.pid), 0))
        ok = int(store.add(keys.ok(proposal.pid), 0))
        if late == 0 and ok >= self.c.world_size:
            store.set(keys.decision(proposal.pid), COMMIT)
            self.outstanding = None
            self.commits += 1
            self.committed_epoch = proposal.epoch
            self.last_apply_at = proposal.apply_at
            self.lead_s = self.base_lead_s
            return
        timed_out = time.monotonic() - self.proposed_at > self.ack_timeout_s
        if late == 0 and not timed_out:
            return
        store.set(keys.decision(proposal.pid), ABORT)
        self.outstanding = None
        self.aborts += 1
        self.reissues += 1  # the desired state is proposed again on the next tick
        self.last_apply_at = max(self.last_apply_at, proposal.apply_at)
        self.lead_s = min(MAX_LEAD_S, self.lead_s * 2)
        if late:
            rank, iteration = msgpack.unpackb(bytes(store.get(keys.why(proposal.pid))))
            self.late_iteration = max(self.late_iteration, int(iteration))
            why = f"rank {rank} was at iteration {iteration}"
        else:
            why = f"only {ok} of {self.c.world_size} ranks answered in {self.ack_timeout_s:g} s"
        self.note = f"re-issued epoch {proposal.epoch}: {why}, past iteration {proposal.apply_at}"


class DesiredListener:
    """Rank 0's SUB socket on the collector's ``control`` endpoint.

    Keeps the newest verified desired state. Frames are verified before they are unpacked;
    unsigned, wrongly signed, foreign-session, malformed, invalid and replayed (older epoch)
    messages are ignored and counted by reason.
    """

    def __init__(
        self,
        endpoint: str,
        key: bytes,
        session: str,
        *,
        knob_choices: Mapping[str, tuple[str, ...]] | None = None,
        context: Any = None,
    ) -> None:
        import zmq

        self._zmq = zmq
        self._key = key
        self._session = session
        self._knob_choices = knob_choices
        self._ctx = context or zmq.Context.instance()
        self.sock = self._ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.MAXMSGSIZE, protocol.MAX_BODY_BYTES + 1024)
        self.sock.setsockopt(zmq.RCVHWM, 64)
        self.sock.setsockopt(zmq.SUBSCRIBE, b"")
        self.sock.connect(endpoint)
        self.desired: tuple[int, Settings] | None = None
        self.rejected: Counter[str] = Counter()
        self.accepted = 0
        self._logged = 0
        self._logged_at = -LOG_S

    def poll(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for messages, then handle every one queued."""
        zmq = self._zmq
        if not self.sock.poll(int(timeout_s * 1000), zmq.POLLIN):
            self._log_rejections()  # a burst that ended inside LOG_S is still logged, LOG_S later
            return
        while True:
            try:
                frames = self.sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            self.handle(frames)
        self._log_rejections()

    def _log_rejections(self) -> None:
        """Refusals go to the job's log too (at most every LOG_S), not only into Hello."""
        total = sum(self.rejected.values())
        now = time.monotonic()
        if total == self._logged or now - self._logged_at < LOG_S:
            return
        self._logged, self._logged_at = total, now
        counts = " ".join(f"{k}={v}" for k, v in sorted(self.rejected.items()))
        print(f"commtop: rank 0 refused control messages so far: {counts}", file=sys.stderr, flush=True)

    def handle(self, frames: list[bytes]) -> None:
        try:
            body = protocol.open_frames(self._key, frames, self._session)
            if body.get("k") != protocol.CTL_STATE:
                raise protocol.ProtocolError("kind", f"{body.get('k')!r} on the control channel")
            epoch = protocol.get_int(body, "epoch", 0, 2**31 - 1)
            try:
                settings = settings_from_wire(body.get("settings"), self._knob_choices)
            except SettingsError as exc:
                raise protocol.ProtocolError("invalid", str(exc)) from None
        except protocol.ProtocolError as exc:
            self.rejected[exc.reason] += 1
            return
        current = self.desired
        if current is not None and epoch < current[0]:
            self.rejected["replay"] += 1
            return
        if current is not None and epoch == current[0]:
            if settings != current[1]:
                self.rejected["conflict"] += 1
            return
        self.desired = (epoch, settings)
        self.accepted += 1

    def note_in_force(self, epoch: int, settings: Settings) -> None:
        """Start from the settings in force: an older desired epoch is a replay."""
        if self.desired is None or epoch > self.desired[0]:
            self.desired = (epoch, settings)

    def close(self) -> None:
        self.sock.close(linger=0)


def store_prefix(session: str) -> str:
    """Keys of one session and one torchrun restart (a restarted job starts clean)."""
    return f"commtop/{session}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"


def connect_store(timeout_s: float = 60.0) -> Any:
    """A new TCPStore client to the store torchrun provides (MASTER_ADDR/MASTER_PORT); without
    those (ranks a script started itself with a tcp:// or file:// init), the store the job's
    default process group shares."""
    from torch.distributed import TCPStore

    host = os.environ.get("MASTER_ADDR")
    port = os.environ.get("MASTER_PORT")
    if not host or not port:
        from torch.distributed import distributed_c10d as c10d

        try:
            return c10d._get_default_store()
        except Exception as exc:  # noqa: BLE001 - said in the caller's one line
            raise RuntimeError(
                "live control needs MASTER_ADDR and MASTER_PORT (run the workers under torchrun) or a process group"
            ) from exc
    return TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=timeout_s), wait_for_workers=False)


def make_live_control(
    connection: Any,
    settings: Settings,
    *,
    rank: int,
    world_size: int,
    step: int,
    store: Any = None,
) -> LiveControl:
    """The live control of one rank of a run described by ``connection`` (a workers.wire.connection.Connection)."""
    desired = None
    if rank == 0:
        desired = DesiredListener(connection.control, connection.key, connection.session)
        desired.note_in_force(0, settings)
    return LiveControl(
        store if store is not None else connect_store(),
        rank=rank,
        world_size=world_size,
        settings=settings,
        prefix=store_prefix(connection.session),
        step=step,
        desired=desired,
    )
