"""Live control end to end: real torchrun gloo ranks, real sockets, `commtop ctl` in-process.

The test collector is the real one minus the TUI: tui.ingest.sources.LiveSource (PULL) feeding the
real ControlServer (its Sink side), plus a record keeper that checks exactness from the
records themselves: for every iteration index, every rank reports the same epoch.
"""

from __future__ import annotations

import random
import sys
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
import pytest

from tui import cli
from tui.ingest.sources import LiveSource
from tui.run.control_server import ControlServer
from tui.run.launcher import JobProcess, torchrun_argv
from workers.rank import live_control
from workers.wire import connection as connections
from workers.wire import protocol
from workers.wire.config import LoopConfig
from workers.wire.settings import COPY_SCALES, MAX_COPIES, Settings

pytestmark = pytest.mark.e2e  # starts processes

STEP = 8


@dataclass
class Records:
    """Columns of every collective/copy record received, per rank, plus the latest Hellos."""

    coll: dict[int, list[dict[str, np.ndarray]]] = field(default_factory=lambda: defaultdict(list))
    copy: dict[int, list[dict[str, np.ndarray]]] = field(default_factory=lambda: defaultdict(list))
    hellos: dict[int, protocol.Hello] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, message: object) -> None:
        with self.lock:
            if isinstance(message, protocol.Batch) and len(message):
                (self.coll if message.kind == protocol.COLL else self.copy)[message.rank].append(message.columns)
            elif isinstance(message, protocol.Hello):
                self.hellos[message.rank] = message

    def column(self, kind: str, rank: int, name: str) -> np.ndarray:
        with self.lock:
            parts = [c[name] for c in (self.coll if kind == "coll" else self.copy)[rank]]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    def last_iteration(self) -> int:
        with self.lock:
            return max((int(c[-1]["iteration"][-1]) for c in self.coll.values() if c), default=-1)


class TestCollector:
    """LiveSource + ControlServer + a thread between them (what `commtop run --headless` wires)."""

    __test__ = False

    def __init__(self, conn: connections.Connection, records: Records) -> None:
        self.source = LiveSource(conn)
        self.server = ControlServer(conn)
        self.records = records
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for message in self.source.poll(0.02):
                self.records.add(message)
                self.server.write(message)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.server.close()
        self.source.close()


def start_job(conn: connections.Connection, nproc: int) -> JobProcess:
    config = LoopConfig(
        shape=(64, 64), dtype="float32", backend="gloo", collectives_per_step=STEP, warmup=2, copies=2, iters=0
    )
    return JobProcess(torchrun_argv(nproc, config.to_argv(), conn), conn)


def wait_for(predicate, timeout_s: float, what: str, job: JobProcess | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if job is not None and job.exit_code() is not None:
            pytest.fail(f"the job exited ({job.exit_code()}) while waiting for {what}:\n" + "\n".join(job.lines()))
        if time.monotonic() > deadline:
            tail = "\n".join(job.lines()[-30:]) if job else ""
            pytest.fail(f"timed out waiting for {what}\n{tail}")
        time.sleep(0.05)


def random_change(rng: random.Random) -> dict[str, str]:
    choices = {
        "mode": lambda: rng.choice(protocol.MODES),
        "copies": lambda: str(rng.randint(0, MAX_COPIES)),
        "copy_scale": lambda: str(rng.choice(COPY_SCALES)),
        "pinned": lambda: rng.choice(("true", "false")),
        "direction": lambda: rng.choice(protocol.DIRECTIONS),
    }
    names = rng.sample(sorted(choices), rng.randint(1, 3))
    return {name: choices[name]() for name in names}


def assert_exact(records: Records, ranks: int, wanted: dict[int, Settings], min_common: int = 1000) -> dict[int, int]:
    """Every iteration index has one epoch on every rank; each epoch ran its settings' mode.
    Returns the first iteration of each epoch (on rank 0)."""
    iters = {r: records.column("coll", r, "iteration") for r in range(ranks)}
    epochs = {r: records.column("coll", r, "epoch") for r in range(ranks)}
    modes = {r: records.column("coll", r, "mode") for r in range(ranks)}
    for r in range(ranks):
        assert len(iters[r]) > 0, f"no records from rank {r}"
        order = np.argsort(iters[r], kind="stable")
        assert np.all(np.diff(epochs[r][order]) >= 0), f"rank {r}: epochs go backwards"
        for epoch in np.unique(epochs[r]):
            expected = protocol.MODES.index(wanted[int(epoch)].mode)
            assert np.all(modes[r][epochs[r] == epoch] == expected), f"rank {r} epoch {epoch}: wrong mode"
    for r in range(1, ranks):
        common, i0, ir = np.intersect1d(iters[0], iters[r], return_indices=True)
        assert len(common) > min_common, f"rank {r}: too few common iterations ({len(common)})"
        bad = np.nonzero(epochs[0][i0] != epochs[r][ir])[0]
        assert len(bad) == 0, (
            f"rank {r} disagrees with rank 0 at iterations {common[bad][:5].tolist()}: "
            f"{epochs[0][i0][bad][:5].tolist()} vs {epochs[r][ir][bad][:5].tolist()}"
        )
    first: dict[int, int] = {}
    for epoch in np.unique(epochs[0]):
        at = int(iters[0][epochs[0] == epoch].min())
        first[int(epoch)] = at
        if at > int(iters[0].min()):  # a switch seen in the records (not where they begin)
            assert at % STEP == 0, f"epoch {epoch} started mid-step at iteration {at}"
    return first


def test_random_ctl_changes_switch_every_rank_at_the_same_iteration(conn, capsys):
    ranks = 4
    records = Records()
    collector = TestCollector(conn, records)
    job = start_job(conn, ranks)
    rng = random.Random(20)
    try:
        wait_for(lambda: len(records.hellos) == ranks and records.last_iteration() > 200, 90, "all ranks", job)
        current = Settings(copies=2)
        wanted = {0: current}
        epoch = 0
        for _ in range(20):
            time.sleep(rng.uniform(0.0, 0.4))
            change = random_change(rng)
            args = ["--run", conn.path, "--wait", "30", "set", *(f"{k}={v}" for k, v in change.items())]
            code = cli.main(["ctl", *args])
            assert code == 0, (change, capsys.readouterr().err, "\n".join(job.lines()[-20:]))
            new = current.updated(change)
            if new != current:  # a change that changes nothing starts no epoch
                epoch += 1
                wanted[epoch] = new
            current = new
            assert collector.server.desired == (epoch, current)
        # the run goes on after the last change
        last = records.last_iteration()
        wait_for(lambda: records.last_iteration() > last + 10 * STEP, 20, "progress after the changes", job)
        assert job.exit_code() is None
    finally:
        job.stop()
        time.sleep(0.3)
        collector.close()
    first = assert_exact(records, ranks, wanted)
    assert epoch >= 15 and sorted(first) == list(range(epoch + 1)), "every accepted change took effect"
    # copies ran with their epoch's direction, size and count per step
    tensor_bytes = 64 * 64 * 4
    for r in range(ranks):
        cepoch = records.column("copy", r, "epoch")
        cstep = records.column("copy", r, "step")
        nbytes = records.column("copy", r, "nbytes")
        direction = records.column("copy", r, "direction")
        assert np.all(records.column("copy", r, "pinned") == 0), "CPU host memory cannot be pinned"
        for epoch in np.unique(cepoch):
            s = wanted[int(epoch)]
            sel = cepoch == epoch
            assert s.mode != "none" and s.copies > 0, f"rank {r}: copies in epoch {epoch} ({s})"
            assert np.all(direction[sel] == protocol.DIRECTIONS.index(s.direction)), f"rank {r} epoch {epoch}"
            assert np.all(nbytes[sel] == int(tensor_bytes * s.copy_scale)), f"rank {r} epoch {epoch}: size"
            per_step = np.unique(cstep[sel], return_counts=True)[1]
            assert per_step.max() == s.copies, f"rank {r} epoch {epoch}: {per_step.max()} copies/step"
    print(f"switch iterations: {first}", file=sys.stderr)


def test_collector_restart_learns_the_mode_in_force_and_rogue_publisher_changes_nothing(conn, capsys):
    ranks = 2
    records = Records()
    collector = TestCollector(conn, records)
    job = start_job(conn, ranks)
    try:
        wait_for(lambda: len(records.hellos) == ranks and records.last_iteration() > 100, 90, "all ranks", job)
        assert cli.main(["ctl", "--run", conn.path, "set", "mode=sync-barrier", "copies=3"]) == 0, capsys.readouterr()
        in_force = Settings(mode="sync-barrier", copies=3)
        old_valid = protocol.seal(conn.key, _state(conn, 1, in_force))
        collector.close()  # the collector dies; the workers go on

        # a rogue takes the control endpoint: no key, wrong key, bit flipped, replay of an old state
        import zmq

        from workers.wire.control import ctl_state_body

        ctx = zmq.Context()
        rogue = ctx.socket(zmq.PUB)
        rogue.setsockopt(zmq.LINGER, 0)
        rogue.bind(conn.control)
        unsigned = [b"", protocol.seal(conn.key, ctl_state_body(conn.session, 9, Settings(mode="none")))[1]]
        wrong_key = protocol.seal(bytes(32), ctl_state_body(conn.session, 9, Settings(mode="none")))
        flipped = protocol.seal(conn.key, ctl_state_body(conn.session, 9, Settings(mode="none")))
        flipped[1] = flipped[1].replace(b"none", b"nonf")
        old_state = protocol.seal(conn.key, ctl_state_body(conn.session, 0, Settings(copies=2)))
        deadline = time.monotonic() + 2.5
        while time.monotonic() < deadline:
            for frames in (unsigned, wrong_key, flipped, old_state, old_valid):
                rogue.send_multipart(frames)
            time.sleep(0.1)
        rogue.close(0)
        ctx.term()  # the endpoint is free once term returns
        before_restart = records.last_iteration()

        records2 = Records()
        started = time.monotonic()
        collector = TestCollector(conn, records2)
        # both what is in force and what was requested are learned from the ranks (on a loaded machine
        # not always from the same message): wait for both, then check them
        wait_for(
            lambda: (
                collector.server.in_force().mode == "sync-barrier" and collector.server.view().requested == in_force
            ),
            5,
            "the mode in force and the request",
            job,
        )
        learned_s = time.monotonic() - started
        view, now_in_force = collector.server.view(), collector.server.in_force()
        # the ranks say Hello as soon as they connect (else every 1 s): 4 s allows for a loaded machine
        assert learned_s < 4.0, f"took {learned_s:.2f} s to learn the mode in force"
        assert view.requested == in_force == now_in_force.settings
        assert now_in_force.epoch == 1
        wait_for(lambda: records2.last_iteration() > before_restart + 50 * STEP, 20, "workers going on", job)

        # rank 0 counted the rogue's messages by reason: in Hello.rejected (every heartbeat) and in the
        # job's log (a burst is logged when it starts and again at most LOG_S later, when it has grown)
        def hello_rejected() -> dict[str, int]:
            with records2.lock:
                hello = records2.hellos.get(0)
            return hello.rejected if hello is not None else {}

        wait_for(lambda: hello_rejected().get("signature", 0) >= 3, 5, "Hello.rejected", job)
        counts = hello_rejected()
        assert counts["signature"] >= 3 and counts["replay"] >= 1, counts
        assert set(counts) <= {"signature", "replay"}, counts

        def logged() -> dict[str, int]:
            lines = [ln for ln in job.lines() if "rank 0 refused control messages" in ln]
            return (
                {k: int(v) for k, v in (kv.split("=") for kv in lines[-1].rsplit("so far: ", 1)[1].split())}
                if lines
                else {}
            )

        wait_for(lambda: logged() == counts, live_control.LOG_S + 5, f"the log to say {counts}", job)
        # still controllable through the new collector
        assert cli.main(["ctl", "--run", conn.path, "mode", "none"]) == 0, capsys.readouterr()
        assert collector.server.in_force().mode == "none"
    finally:
        job.stop()
        collector.close()
    wanted = {0: Settings(copies=2), 1: in_force, 2: Settings(mode="none", copies=3)}
    # A loaded 2-core CI machine may run only a few hundred iterations per collector here.
    assert sorted(assert_exact(records, ranks, wanted, min_common=100)) == [0, 1]
    assert sorted(assert_exact(records2, ranks, wanted, min_common=100)) == [1, 2], "the rogue changed nothing"


def _state(conn: connections.Connection, epoch: int, settings: Settings) -> dict:
    from workers.wire.control import ctl_state_body

    return ctl_state_body(conn.session, epoch, settings)
