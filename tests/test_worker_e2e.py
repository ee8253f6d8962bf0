"""The worker as users start it: real torchrun, real gloo ranks, real ZeroMQ collector socket."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import zmq

from workers.wire import protocol
from workers.wire.protocol import COLL, MODES, Batch, Bye, Hello

pytestmark = pytest.mark.e2e  # starts processes

REPO = Path(__file__).resolve().parent.parent
SMALL = ["--shape", "16x64", "--collectives-per-step", "8", "--copies", "2", "--warmup", "2", "--batch-ms", "20"]


class Collector:
    """The collector's side of ``data``: a bound PULL socket that verifies and decodes."""

    def __init__(self, conn) -> None:
        self.conn = conn
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.PULL)
        self.sock.setsockopt(zmq.MAXMSGSIZE, protocol.MAX_BODY_BYTES)
        self.sock.setsockopt(zmq.RCVHWM, 100000)
        self.sock.bind(conn.data)
        self.msgs: list = []

    def pump(self, timeout_ms: int = 100) -> None:
        while self.sock.poll(timeout_ms):
            frames = self.sock.recv_multipart()
            self.msgs.append(protocol.decode(protocol.open_frames(self.conn.key, frames, self.conn.session)))
            timeout_ms = 0

    def run_until_exit(self, proc: subprocess.Popen, timeout_s: float) -> int:
        deadline = time.monotonic() + timeout_s
        while proc.poll() is None:
            if time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"worker did not finish within {timeout_s} s")
            self.pump()
        self.pump(300)
        return proc.returncode

    def iterations(self, rank: int) -> list[int]:
        batches = [m for m in self.msgs if isinstance(m, Batch) and m.kind == COLL and m.rank == rank]
        return np.concatenate([b.columns["iteration"] for b in batches]).tolist() if batches else []

    def of(self, kind: type) -> list:
        return [m for m in self.msgs if isinstance(m, kind)]

    def close(self) -> None:
        self.sock.close(linger=0)
        self.ctx.term()


@pytest.fixture
def collector(conn):
    c = Collector(conn)
    yield c
    c.close()


def env() -> dict[str, str]:
    e = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    e["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), e.get("PYTHONPATH", "")) if p)
    return e


def torchrun(*args: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--standalone",
        "-m",
        "workers",
        *args,
    ]


def test_torchrun_two_ranks_report_every_iteration(conn, collector):
    proc = subprocess.Popen(
        torchrun("--iters", "50", *SMALL, "--connection-file", conn.path),
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    rc = collector.run_until_exit(proc, timeout_s=45)
    out, err = proc.communicate()
    assert rc == 0, err[-2000:]
    hellos = collector.of(Hello)
    assert {h.rank for h in hellos} == {0, 1}
    assert {(h.world_size, h.local_world_size, h.backend, h.device) for h in hellos} == {(2, 2, "gloo/cpu", "cpu")}
    assert {h.rank: h.local_rank for h in hellos} == {0: 0, 1: 1}
    for rank in (0, 1):
        assert collector.iterations(rank) == list(range(50))
        last = max((h for h in hellos if h.rank == rank), key=lambda h: h.t_ns)
        assert last.iteration == 50 and last.dropped == 0 and last.config["shape"] == [16, 64]
    byes = collector.of(Bye)
    assert sorted((b.rank, b.exit_code, b.reason) for b in byes) == [(0, 0, "finished"), (1, 0, "finished")]
    assert conn.key_hex not in out + err
    assert out.count("commtop-summary ") == 2


def test_sigterm_stops_every_rank_cleanly(conn, collector):
    proc = subprocess.Popen(
        torchrun("--iters", "0", *SMALL, "--connection-file", conn.path),
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 40
    while not (collector.iterations(0) and collector.iterations(1)):
        assert proc.poll() is None and time.monotonic() < deadline, "no records from both ranks"
        collector.pump()
    proc.send_signal(signal.SIGTERM)  # what torchrun's own shutdown sends its workers
    collector.run_until_exit(proc, timeout_s=30)
    proc.communicate()
    byes = sorted(collector.of(Bye), key=lambda b: b.rank)
    assert [b.rank for b in byes] == [0, 1]
    for b in byes:
        assert b.exit_code == 0 and b.reason.startswith("stopped by SIGTERM"), b
    for rank in (0, 1):
        its = collector.iterations(rank)
        assert its == list(range(len(its))) and len(its) > 0


def test_connect_without_a_key_is_one_line_and_exit_2(tmp_path):
    e = env() | {"COMMTOP_RUNTIME_DIR": str(tmp_path / "rt")}
    e.pop("COMMTOP_CONNECTION_FILE", None)
    res = subprocess.run(
        [sys.executable, "-m", "workers", "--connect", "tcp://127.0.0.1:5599"],
        env=e,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "--connection-file" in lines[0] and "tcp://127.0.0.1:5599" in lines[0]


def test_bad_connection_file_is_one_line_and_exit_2(tmp_path):
    bad = tmp_path / "conn.json"
    bad.write_text("{not json")
    bad.chmod(0o600)
    res = subprocess.run(
        [sys.executable, "-m", "workers", "--connection-file", str(bad)],
        env=env(),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert res.returncode == 2
    assert len(res.stderr.strip().splitlines()) == 1 and str(bad) in res.stderr


LAUNCHER = textwrap.dedent(
    """
    import subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-m", "workers", "--iters", "0", *sys.argv[1:]])
    print(child.pid, flush=True)
    time.sleep(600)
    """
)


def test_worker_exits_when_its_launcher_is_killed(conn, collector):
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, *SMALL, "--connection-file", conn.path],
        env=env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    worker_pid = int(launcher.stdout.readline())
    deadline = time.monotonic() + 30
    while not collector.iterations(0):
        assert time.monotonic() < deadline, "worker never reported"
        collector.pump()
    launcher.kill()  # SIGKILL: the launcher cannot pass anything on
    launcher.wait()
    deadline = time.monotonic() + 10
    while _alive(worker_pid):
        assert time.monotonic() < deadline, "orphaned worker kept running"
        collector.pump()
    collector.pump(300)
    (bye,) = collector.of(Bye)
    assert bye.exit_code == 1 and "launcher" in bye.reason


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


@pytest.mark.parametrize("runtime_dir", ["set", "unset"])
def test_selfcheck_runs_every_mode_and_sees_every_iteration_and_leaves_no_run_folder(runtime_dir):
    short = Path(tempfile.mkdtemp(prefix="sc-", dir="/tmp"))  # ipc paths must stay under 107 characters
    try:
        _selfcheck(short, runtime_dir == "set")
    finally:
        shutil.rmtree(short, ignore_errors=True)


def _selfcheck(short: Path, runtime_dir: bool) -> None:
    child = env()
    child["TMPDIR"] = str(short / "t")  # where it makes a runtime folder when none is set
    os.makedirs(child["TMPDIR"])
    if runtime_dir:
        child["COMMTOP_RUNTIME_DIR"] = str(short / "rt")
    else:
        child.pop("COMMTOP_RUNTIME_DIR", None)
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "workers.synthetic.selfcheck",
            "--iters",
            "24",
            "--shape",
            "32x32",
            "--collectives-per-step",
            "8",
        ],
        env=child,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    left = [p for p in short.rglob("*") if p.is_dir() and (p / "connection.json").exists()]
    assert left == [] and os.listdir(child["TMPDIR"]) == [], (left, os.listdir(child["TMPDIR"]))
    rows = {line.split()[0]: line.split() for line in res.stdout.splitlines()[2:] if line.split()[0] in MODES}
    assert set(rows) == set(MODES)
    for mode, cols in rows.items():
        assert cols[1] == "24" and cols[-1] == "0"  # 24 collectives recorded, exit code 0
        assert cols[6] == ("0" if mode == "none" else "15")  # 3 steps x 5 copies
