"""The worker's heartbeat: run metadata and liveness every second, from its own thread.

Torch-free. The thread has its own PUSH socket (ZeroMQ sockets are not thread-safe), so a
TUI started late still learns who every rank is, and a silent rank can be told apart from
a slow one. The loop thread publishes what it is doing through :class:`WorkerStatus` with
plain attribute writes (atomic under the GIL; the heartbeat only reads).

The thread is also the worker's dead-man switch: if the torchrun agent that started us
disappears (SIGKILLed launcher), or a requested stop does not complete in time (a rank
blocked in a collective whose peer already left), it says Bye and ends the process hard,
so no orphan keeps a GPU busy.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import zmq

from workers.wire import protocol
from workers.wire.lifeline import write_stderr
from workers.wire.protocol import COLL, COPY, Bye, Hello
from workers.wire.settings import Settings

#: Overrides the host name a rank and its node sampler report (several "nodes" on one
#: machine in tests; a container whose hostname is not the node's name).
HOSTNAME_ENV = "COMMTOP_HOSTNAME"


def reported_hostname() -> str:
    """The host name this node reports: $COMMTOP_HOSTNAME, else the machine's."""
    return os.environ.get(HOSTNAME_ENV) or socket.gethostname()


@dataclass
class StopFlag:
    """Set by SIGTERM/SIGINT; the loop stops at the next step boundary."""

    requested: bool = False
    since_ns: int = 0
    reason: str = ""

    def request(self, reason: str) -> None:
        if not self.requested:
            self.since_ns = time.monotonic_ns()
            self.reason = reason
            self.requested = True


@dataclass
class WorkerStatus:
    """What the loop is doing: plain attribute writes (each field has one writer at a time: the
    loop thread, or a capture thread for ``iteration``, ``untimed`` and ``lost``)."""

    started_ns: int = field(default_factory=time.time_ns)
    iteration: int = 0
    settings: Settings = field(default_factory=Settings)
    epoch: int = 0
    pinned_bytes: int = 0
    untimed: int = 0
    #: The rank's process groups by code (workers.rank.groups.GroupTable publishes it here).
    groups: tuple[tuple[str, str, int], ...] = ()
    #: Collectives this rank issued and never recorded, cumulative (Hello.lost).
    lost: int = 0
    #: Control messages refused so far, by reason (workers.rank.live_control: LiveControl.rejected).
    rejected: Callable[[], dict[str, int]] | None = None
    finished: bool = False
    #: The blocking collective the job's threads are inside (Hello.inside; the first to enter).
    inside: tuple[int, int, int, int] | tuple[()] = ()
    #: The oldest collective still running on the GPU at the Flight Recorder's last read (its thread).
    gpu_inside: tuple[int, int, int, int] | tuple[()] = ()
    #: Optimizer steps the job took (Hello.steps; the capture's step hook); -1: not counted.
    steps: int = -1


@dataclass(frozen=True)
class RunInfo:
    """The parts of a Hello that never change during a run."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    host: str
    pid: int
    backend: str
    device: str
    device_index: int
    gpu_uuid: str
    torch_version: str
    nccl_version: str
    config: dict[str, Any]


class Counters:
    """Read-only view of the publisher's counters (seq per kind, dropped records)."""

    def __init__(self, publisher: Any) -> None:
        self.publisher = publisher

    def get(self) -> tuple[int, int, int]:
        seq = self.publisher.seq
        return seq[COLL], seq[COPY], self.publisher.dropped


def hello_body(session: str, info: RunInfo, status: WorkerStatus, counters: Counters) -> dict[str, Any]:
    seq_coll, seq_copy, dropped = counters.get()
    hello = Hello(
        rank=info.rank,
        world_size=info.world_size,
        local_rank=info.local_rank,
        local_world_size=info.local_world_size,
        host=info.host,
        pid=info.pid,
        backend=info.backend,
        device=info.device,
        device_index=info.device_index,
        gpu_uuid=info.gpu_uuid,
        torch_version=info.torch_version,
        nccl_version=info.nccl_version,
        config=info.config,
        settings=status.settings.as_dict(),
        epoch=status.epoch,
        iteration=status.iteration,
        pinned_bytes=status.pinned_bytes,
        t_ns=time.time_ns(),
        started_ns=status.started_ns,
        seq_coll=seq_coll,
        seq_copy=seq_copy,
        dropped=dropped,
        untimed=status.untimed,
        groups=status.groups,
        lost=status.lost,
        inside=status.inside or status.gpu_inside,
        steps=status.steps,
        rejected=status.rejected() if status.rejected is not None else {},
    )
    return protocol.hello_body(session, hello)


#: A collector is ready to take our messages (ZMQ_IMMEDIATE queues only after the handshake).
CONNECTED_EVENTS = getattr(zmq, "EVENT_HANDSHAKE_SUCCEEDED", zmq.EVENT_CONNECTED)


class Heartbeat(threading.Thread):
    """Sends a Hello every ``interval_s`` on its own socket; optionally watches the parent
    process and a pending stop, ending the process hard (after a Bye) if either goes wrong."""

    def __init__(
        self,
        ctx: zmq.Context,
        endpoint: str | None,
        key: bytes,
        session: str,
        info: RunInfo,
        status: WorkerStatus,
        counters: Counters,
        *,
        interval_s: float = 1.0,
        stop: StopFlag | None = None,
        stop_grace_s: float | None = None,
        watch_parent: bool = False,
        before_hard_exit: Callable[[], None] | None = None,
        tap: str | None = None,
    ) -> None:
        super().__init__(name=f"commtop-heartbeat-{info.rank}", daemon=True)
        self.ctx = ctx
        self.endpoint = endpoint
        self.key = key
        self.session = session
        self.info = info
        self.status = status
        self.counters = counters
        self.interval_s = interval_s
        self.stop_flag = stop
        self.stop_grace_ns = int(stop_grace_s * 1e9) if stop_grace_s is not None else None
        self.watch_parent = watch_parent
        self.before_hard_exit = before_hard_exit
        self.tap = tap  # the node exporter's endpoint (--prometheus): a copy of each Hello (its inside)
        self._tap: zmq.Socket | None = None
        self.sent = 0
        self._ppid = os.getppid()
        self._done = threading.Event()
        self._sock: zmq.Socket | None = None

    def run(self) -> None:
        if self.endpoint:
            self._sock = self.ctx.socket(zmq.PUSH)
            self._sock.setsockopt(zmq.SNDHWM, 4)
            self._sock.setsockopt(zmq.IMMEDIATE, 1)
            self._sock.setsockopt(zmq.LINGER, 0)
            self._sock.connect(self.endpoint)
            # A (re)started collector learns who this rank is at once, not up to a second
            # later: until then its rows have no host, GPU or settings.
            monitor = self._sock.get_monitor_socket(CONNECTED_EVENTS)
            if self.tap:
                self._tap = self.ctx.socket(zmq.PUSH)
                self._tap.setsockopt(zmq.SNDHWM, 4)
                self._tap.setsockopt(zmq.LINGER, 0)
                self._tap.connect(self.tap)
        else:
            monitor = None
        next_hello = time.monotonic()
        try:
            while not self._done.is_set():
                now = time.monotonic()
                if now >= next_hello:
                    self._send(hello_body(self.session, self.info, self.status, self.counters))
                    next_hello = now + self.interval_s
                self._check_dead_man()
                wait_s = min(0.2, max(0.0, next_hello - time.monotonic()))
                if monitor is None:
                    self._done.wait(wait_s)
                elif monitor.poll(int(wait_s * 1000)):
                    while monitor.poll(0):
                        monitor.recv_multipart()
                    next_hello = time.monotonic()
        finally:
            if self._sock is not None:
                if monitor is not None:
                    self._sock.disable_monitor()
                    monitor.close(linger=0)
                self._sock.close(linger=0)
            if self._tap is not None:
                self._tap.close(linger=0)

    def _send(self, body: dict[str, Any]) -> bool:
        if self._sock is None:
            return False
        frames = protocol.seal(self.key, body)
        if self._tap is not None:
            try:
                self._tap.send_multipart(frames, flags=zmq.NOBLOCK)
            except zmq.ZMQError:
                pass  # the exporter is behind or gone: it misses one Hello
        try:
            self._sock.send_multipart(frames, flags=zmq.NOBLOCK)
        except zmq.ZMQError:
            return False
        self.sent += 1
        return True

    def _check_dead_man(self) -> None:
        if self.watch_parent and os.getppid() != self._ppid:
            self._hard_exit(1, "launcher (torchrun agent) disappeared; exiting so no orphan is left")
        stop = self.stop_flag
        if (
            stop is not None
            and self.stop_grace_ns is not None
            and stop.requested
            and not self.status.finished
            and time.monotonic_ns() - stop.since_ns > self.stop_grace_ns
        ):
            self._hard_exit(0, f"{stop.reason}; the step did not finish in time (blocked in a collective?)")

    def _hard_exit(self, code: int, reason: str) -> None:
        """Say why, send a Bye, stop the sampler, and end the process whatever fails on the way:
        an orphaned rank's stderr is often the pipe of a closed terminal (a print there raised
        BrokenPipeError and ended this thread instead of the process, leaving the rank running)."""
        try:
            write_stderr(f"commtop worker rank {self.info.rank}: {reason}")
            self._send(protocol.bye_body(self.session, Bye(self.info.rank, code, reason, time.time_ns())))
            if self.before_hard_exit is not None:
                self.before_hard_exit()
            if self._sock is not None:
                self._sock.close(linger=200)
            time.sleep(0.2)  # let the IO thread hand the Bye over
        except BaseException:
            pass
        finally:  # os._exit itself: not the capture's wrapper (workers.capture.on_os_exit), which would wait
            getattr(os._exit, "__commtop_original__", os._exit)(code)

    def stop(self, timeout_s: float = 1.0) -> None:
        self._done.set()
        if self.is_alive():
            self.join(timeout_s)
