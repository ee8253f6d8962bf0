"""The instrumented loop in-process at world size 1: real gloo, real ZeroMQ, real records."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch.distributed as dist
import zmq

from workers.rank.control import StaticControl
from workers.rank.heartbeat import StopFlag
from workers.synthetic.loop import CONNECT_WAIT_S, Runtime, run_worker
from workers.wire import protocol
from workers.wire.busbw import bus_factor, collective_bytes
from workers.wire.config import LoopConfig
from workers.wire.protocol import COLL, COLLECTIVES, COPY, DIRECTIONS, MODES, Batch, Bye, Hello
from workers.wire.settings import Settings

SHAPE = (32, 64)
TENSOR_BYTES = 32 * 64 * 4
RT = Runtime(rank=0, world_size=1, local_rank=0, local_world_size=1, cuda=False, backend="gloo/cpu")


@pytest.fixture(scope="module", autouse=True)
def process_group(tmp_path_factory):
    store = dist.FileStore(str(tmp_path_factory.mktemp("pg") / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.fixture
def collector(conn):
    """The collector's PULL socket, read on a thread while the worker runs (like the ingest
    thread), so the worker's bounded queue never fills because the test is not reading."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PULL)
    sock.setsockopt(zmq.MAXMSGSIZE, protocol.MAX_BODY_BYTES)
    sock.bind(conn.data)
    msgs: list = []
    done = threading.Event()

    def pump() -> None:
        while not done.is_set():
            if sock.poll(20):
                msgs.append(protocol.decode(protocol.open_frames(conn.key, sock.recv_multipart(), conn.session)))

    thread = threading.Thread(target=pump, daemon=True)
    thread.start()

    def drain() -> list:
        """Everything up to the worker's Bye (or 300 ms of quiet when none comes)."""
        deadline = time.monotonic() + 5
        last = -1
        while time.monotonic() < deadline and not any(isinstance(m, Bye) for m in msgs):
            if len(msgs) == last:
                break
            last = len(msgs)
            time.sleep(0.3)
        return list(msgs)

    yield drain
    done.set()
    thread.join()
    sock.close(linger=0)
    ctx.term()


def config(**kw) -> LoopConfig:
    base = dict(shape=SHAPE, dtype="float32", iters=40, warmup=2, collectives_per_step=8, copies=2, batch_ms=5.0)
    return LoopConfig(**(base | kw))


def split(msgs: list) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], list[Hello], list[Bye]]:
    def cat(kind: str) -> dict[str, np.ndarray]:
        batches = [m for m in msgs if isinstance(m, Batch) and m.kind == kind]
        schema = protocol.COLL_COLUMNS if kind == COLL else protocol.COPY_COLUMNS
        return {c: np.concatenate([b.columns[c] for b in batches] or [np.zeros(0, d)]) for c, d in schema.items()}

    hellos = [m for m in msgs if isinstance(m, Hello)]
    byes = [m for m in msgs if isinstance(m, Bye)]
    return cat(COLL), cat(COPY), hellos, byes


@pytest.mark.parametrize("op", COLLECTIVES)
def test_every_collective_reports_every_iteration(op, conn, collector):
    cfg = config(collective=op)
    result = run_worker(cfg, RT, conn, StaticControl(cfg.initial_settings()))
    assert result.exit_code == 0 and result.iterations == 40
    coll, copy, hellos, byes = split(collector())
    assert coll["iteration"].tolist() == list(range(40))
    assert coll["step"].tolist() == [i // 8 for i in range(40)]
    assert (coll["op"] == COLLECTIVES.index(op)).all()
    assert (coll["nbytes"] == collective_bytes(op, TENSOR_BYTES, 1)).all()
    assert (coll["mode"] == MODES.index("overlap")).all()
    np.testing.assert_allclose(coll["algbw"], coll["nbytes"] / coll["dur_us"].astype(float) / 1e3, rtol=1e-5)
    np.testing.assert_allclose(coll["busbw"], coll["algbw"] * bus_factor(op, 1), rtol=1e-5)
    assert (coll["dur_us"] > 0).all()
    assert (coll["start_ns"] >= result_started(hellos)).all()
    assert len(copy["step"]) == 5 * 2  # 5 steps x 2 copies, on the copier thread
    assert hellos and hellos[-1].iteration == 40 and hellos[-1].backend == "gloo/cpu"
    assert hellos[-1].config["collective"] == op and hellos[-1].seq_coll >= 1
    assert [(b.rank, b.exit_code, b.reason) for b in byes] == [(0, 0, "finished")]


def result_started(hellos: list[Hello]) -> int:
    return min(h.started_ns for h in hellos)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("copies", [0, 3])
def test_offload_modes_copy_records(mode, copies, conn, collector):
    cfg = config(offload=mode, copies=copies, direction="h2d", copy_scale=0.5, pinned=False)
    result = run_worker(cfg, RT, conn, StaticControl(cfg.initial_settings()))
    assert result.exit_code == 0
    coll, copy, _, byes = split(collector())
    assert coll["iteration"].tolist() == list(range(40))
    assert (coll["mode"] == MODES.index(mode)).all()
    want = 5 * copies if mode != "none" else 0
    assert len(copy["step"]) == want
    if want:
        assert sorted(copy["step"].tolist()) == sorted([s for s in range(5) for _ in range(copies)])
        assert (copy["nbytes"] == TENSOR_BYTES // 2).all()
        assert (copy["direction"] == DIRECTIONS.index("h2d")).all()
        assert (copy["pinned"] == 0).all()  # no CUDA: host memory cannot be pinned
        assert (copy["gbps"] > 0).all()
    assert byes and byes[0].exit_code == 0


class FakeScriptedControl:
    """Switches to sync mode with 1 copy at iteration 16 (a deterministic live change)."""

    def __init__(self, first: Settings) -> None:
        self.first = first
        self.second = first.updated({"mode": "sync", "copies": 1})
        self.calls: list[int] = []

    def begin_step(self, iteration: int) -> tuple[Settings, int]:
        self.calls.append(iteration)
        return (self.first, 0) if iteration < 16 else (self.second, 1)

    def status(self) -> tuple[int, int, int]:
        return (0, 1, 16) if len(self.calls) < 3 else (1, -1, -1)

    def close(self) -> None:
        pass


def test_settings_are_read_at_every_step_boundary(conn, collector):
    cfg = config(offload="overlap", copies=2)
    control = FakeScriptedControl(cfg.initial_settings())
    run_worker(cfg, RT, conn, control)
    assert control.calls == [0, 8, 16, 24, 32]
    msgs = collector()
    coll, copy, hellos, _ = split(msgs)
    assert (coll["epoch"] == (coll["iteration"] >= 16)).all()
    assert (coll["mode"] == np.where(coll["iteration"] >= 16, MODES.index("sync"), MODES.index("overlap"))).all()
    assert sorted(copy["step"].tolist()) == [0, 0, 1, 1, 2, 3, 4]
    assert hellos[-1].epoch == 1 and hellos[-1].settings["mode"] == "sync"
    batches = [m for m in msgs if isinstance(m, Batch)]
    assert {(b.epoch_in_force, b.pending_epoch, b.apply_at) for b in batches} <= {(0, 1, 16), (1, -1, -1)}


def test_stop_flag_finishes_the_current_step(conn, collector):
    stop = StopFlag()

    class FakeStoppingControl(StaticControl):
        def begin_step(self, iteration: int) -> tuple[Settings, int]:
            if iteration == 16:
                stop.request("stopped by SIGTERM")
            return super().begin_step(iteration)

    cfg = config(iters=0)  # run until stopped
    result = run_worker(cfg, RT, conn, FakeStoppingControl(cfg.initial_settings()), stop=stop)
    assert result.exit_code == 0 and result.iterations == 24
    coll, _, _, byes = split(collector())
    assert coll["iteration"].tolist() == list(range(24))
    assert byes[0].reason == "stopped by SIGTERM" and byes[0].exit_code == 0


def test_bare_loop_publishes_nothing(conn, collector):
    cfg = config()
    result = run_worker(cfg, RT, conn, StaticControl(cfg.initial_settings()), bare=True)
    assert result.exit_code == 0 and result.iterations == 40
    assert result.summary["bare"] and result.summary["steps"] == 5
    assert collector() == []


def test_failure_says_bye_with_the_reason(conn, collector):
    cfg = config()

    class FakeBrokenControl(StaticControl):
        def begin_step(self, iteration: int) -> tuple[Settings, int]:
            if iteration >= 8:
                raise RuntimeError("control exploded")
            return super().begin_step(iteration)

    result = run_worker(cfg, RT, conn, FakeBrokenControl(cfg.initial_settings()))
    assert result.exit_code == 1 and "control exploded" in result.reason
    coll, _, _, byes = split(collector())
    assert coll["iteration"].tolist() == list(range(8))  # what ran before the failure is kept
    assert byes[0].exit_code == 1 and "RuntimeError: control exploded" in byes[0].reason


def test_no_collector_ever_bound_drops_everything_and_exits_promptly(conn):
    cfg = config()
    t0 = time.monotonic()
    result = run_worker(cfg, RT, conn, StaticControl(cfg.initial_settings()))
    elapsed = time.monotonic() - t0
    assert result.exit_code == 0 and result.iterations == 40
    assert result.summary["sent"] == 0 and result.summary["dropped"] == 40 + 5 * 2
    # bounded waits only: 1 s for a collector at start-up, nothing queued at exit (IMMEDIATE)
    assert elapsed < CONNECT_WAIT_S + 2.0
