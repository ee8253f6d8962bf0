"""One rank's session with commtop: what the synthetic loop and the user monitor share.

A :class:`RankSession` owns the rank's ZeroMQ context, its never-blocking record publisher,
the heartbeat thread (a Hello every second), the node sampler when this is local rank 0, the
run info the Hellos carry, and the teardown: a last Hello, a Bye with the exit code, a bounded
linger, the sampler stopped. How settings change (live control) stays with each user, since
the loop switches at an iteration and the monitor at a step.
"""

from __future__ import annotations

import subprocess
import time
from typing import Any

import zmq

from workers.export.tap import tap_endpoint
from workers.rank.heartbeat import Counters, Heartbeat, RunInfo, StopFlag, WorkerStatus, hello_body
from workers.rank.publisher import NullPublisher, RecordPublisher
from workers.telemetry import start_node_sampler
from workers.wire.connection import Connection
from workers.wire.protocol import Bye

#: At a clean exit, how long the queued tail of records may take to go out.
EXIT_LINGER_MS = 500
#: A node sampler that does not stop on SIGTERM within this long is killed.
SAMPLER_STOP_S = 1.0


class RankSession:
    """Publisher + heartbeat + node sampler + goodbye of one rank (``conn`` None: publish nothing).

    ``dead_man`` (a real worker process, not tests) lets the heartbeat end the process if the
    launcher vanishes or a requested stop does not complete within 5 s (after a Bye).
    ``sampler_gpus`` starts this node's sampler watching those GPUs (local rank 0 only).
    ``prometheus`` ([HOST:]PORT, needs ``conn``): that sampler serves the node's metrics, and the
    publisher pushes a copy of every batch to it (workers.export.tap).
    """

    def __init__(
        self,
        conn: Connection | None,
        info: RunInfo,
        status: WorkerStatus,
        *,
        stop: StopFlag | None = None,
        dead_man: bool = False,
        sampler_gpus: list[str] | None = None,
        prometheus: str = "",
    ) -> None:
        self.conn = conn
        self.status = status
        self.ctx: zmq.Context[Any] = zmq.Context()
        self.publisher: RecordPublisher | NullPublisher = NullPublisher()
        # a sampler that exports ends by itself after this rank, once $COMMTOP_PROMETHEUS_LINGER_S is over
        self.exporting = bool(prometheus) and conn is not None
        if conn is not None:
            tap = tap_endpoint(conn.session, info.host) if self.exporting else None
            self.publisher = RecordPublisher(conn.data, conn.key, conn.session, info.rank, ctx=self.ctx, tap=tap)
        self.counters = Counters(self.publisher)
        self.sampler: subprocess.Popen[bytes] | None = None
        if conn is not None and sampler_gpus is not None and info.local_rank == 0:
            self.sampler = start_node_sampler(str(conn.path), sampler_gpus, prometheus if self.exporting else "")
        self.heartbeat = Heartbeat(
            self.ctx,
            conn.data if conn is not None else None,
            conn.key if conn is not None else b"",
            conn.session if conn is not None else "",
            info,
            status,
            self.counters,
            stop=stop,
            stop_grace_s=5.0 if dead_man else None,
            watch_parent=dead_man,
            before_hard_exit=self.stop_sampler,
            tap=tap_endpoint(conn.session, info.host) if conn is not None and self.exporting else None,
        )
        self._closed = False

    @property
    def info(self) -> RunInfo:
        return self.heartbeat.info

    @info.setter
    def info(self, info: RunInfo) -> None:
        """A new frozen RunInfo (a plain attribute swap, GIL-atomic: the heartbeat reads it)."""
        self.heartbeat.info = info
        self.publisher.rank = info.rank

    def start_heartbeat(self) -> None:
        """Hellos start now (the collector adopts the first settings it hears as in force);
        without a connection the thread only keeps the dead-man watch."""
        if not self.heartbeat.is_alive():
            self.heartbeat.start()

    def close(self, exit_code: int, reason: str, linger_ms: int = EXIT_LINGER_MS, quiet: bool = False) -> None:
        """Stop the heartbeat, say a last Hello and Bye, let the tail go out (bounded), stop the
        sampler. Idempotent. ``quiet``: no Hello nor Bye (a process that was never a rank)."""
        if self._closed:
            return
        self._closed = True
        self.status.finished = True
        self.heartbeat.stop()
        if self.conn is not None and not quiet:
            self.publisher.send_body(hello_body(self.conn.session, self.heartbeat.info, self.status, self.counters))
            self.publisher.send_bye(Bye(self.heartbeat.info.rank, exit_code, reason, time.time_ns()))
        self.publisher.close(linger_ms=linger_ms if self.conn is not None else 0)
        self.stop_sampler()
        if self.heartbeat.is_alive():
            self.ctx.destroy(linger=0)
        else:
            self.ctx.term()

    def stop_sampler(self) -> None:
        proc = self.sampler
        if proc is None or proc.poll() is not None or self.exporting:
            return
        proc.terminate()
        try:
            proc.wait(timeout=SAMPLER_STOP_S)
        except subprocess.TimeoutExpired:
            proc.kill()
