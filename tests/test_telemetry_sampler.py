"""End to end on CPU: a real `python -m workers.telemetry` process pushes signed TELEM and
TELEM_CAPS to a real zmq PULL socket, reports worker process states, and exits with its parent."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
import zmq

from workers.telemetry import start_node_sampler
from workers.wire import connection, protocol
from workers.wire.telemetry import Caps, Tick, decode_caps, decode_tick

pytestmark = pytest.mark.e2e  # starts processes

WORKER = """
import sys, time
from workers.telemetry import start_node_sampler
proc = start_node_sampler(sys.argv[1], [])
print(proc.pid if proc else -1, flush=True)
time.sleep(120)
"""


@pytest.fixture
def run(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[connection.Connection, zmq.Socket]]:
    short = tempfile.mkdtemp(prefix="ctt")  # ipc:// paths must stay under 107 characters
    monkeypatch.setenv(connection.RUNTIME_DIR_ENV, short)
    conn = connection.create_run(label="t")
    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    try:
        pull.setsockopt(zmq.MAXMSGSIZE, protocol.MAX_BODY_BYTES)
        pull.setsockopt(zmq.LINGER, 0)
        pull.bind(conn.data)
        yield conn, pull
    finally:
        pull.close(0)
        ctx.term()
        shutil.rmtree(short, ignore_errors=True)


def _until(
    pull: zmq.Socket, conn: connection.Connection, pred: Callable[[Tick | Caps], bool], timeout: float = 8.0
) -> Tick | Caps:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if not pull.poll(100):
            continue
        body = protocol.open_frames(conn.key, pull.recv_multipart(), conn.session)
        msg = decode_tick(body) if body["k"] == protocol.TELEM else decode_caps(body)
        if pred(msg):
            return msg
    raise AssertionError("expected telemetry did not arrive in time")


def _exited(pid: int, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def _status(tick: Tick, pid: int) -> str | None:
    return next((p.status for p in tick.procs if p.pid == pid), None)


def test_sampler_process_end_to_end(run: tuple[connection.Connection, zmq.Socket]) -> None:
    conn, pull = run
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    worker = subprocess.Popen([sys.executable, "-c", WORKER, conn.path], stdout=subprocess.PIPE, text=True, env=env)
    sibling = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    sampler_pid = -1
    try:
        sampler_pid = int(worker.stdout.readline())
        assert sampler_pid > 0
        tick = _until(pull, conn, lambda m: isinstance(m, Tick) and _status(m, sibling.pid) is not None)
        assert isinstance(tick, Tick)
        assert tick.nvml == "NVML not available" and tick.uuids == ()
        assert tick.mem_total_bytes > 0 and 0 <= tick.cpu_pct <= 100 and tick.cost_us > 0
        assert _status(tick, worker.pid) in ("running", "sleeping")
        caps = _until(pull, conn, lambda m: isinstance(m, Caps))
        assert caps.nvml == "NVML not available" and caps.interval_s == pytest.approx(0.1)

        os.kill(sibling.pid, signal.SIGSTOP)  # a stalled rank
        _until(pull, conn, lambda m: isinstance(m, Tick) and _status(m, sibling.pid) == "stopped")
        os.kill(sibling.pid, signal.SIGCONT)
        sibling.kill()
        sibling.wait()  # a lost rank
        _until(pull, conn, lambda m: isinstance(m, Tick) and _status(m, sibling.pid) == "gone")

        worker.kill()  # the parent dies: the sampler must follow
        worker.wait()
        assert _exited(sampler_pid, 5.0), "sampler outlived its parent"
    finally:
        for p in (worker, sibling):
            if p.poll() is None:
                p.kill()
                p.wait()
        if sampler_pid > 0 and psutil.pid_exists(sampler_pid):
            try:
                os.kill(sampler_pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_sampler_stops_on_sigterm(run: tuple[connection.Connection, zmq.Socket]) -> None:
    conn, pull = run
    proc = start_node_sampler(conn.path, [])
    assert proc is not None
    try:
        _until(pull, conn, lambda m: isinstance(m, Tick))
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=5) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_sampler_serving_prometheus_says_its_endpoint_closed_as_it_ends(
    run: tuple[connection.Connection, zmq.Socket],
) -> None:
    """`ctl status` lists the endpoints the samplers named until a sampler's last Caps names none."""
    conn, pull = run
    proc = start_node_sampler(conn.path, [], prometheus="127.0.0.1:0")
    assert proc is not None
    try:
        served = _until(pull, conn, lambda m: isinstance(m, Caps))
        assert isinstance(served, Caps) and served.prometheus.startswith("http://127.0.0.1:")
        proc.send_signal(signal.SIGTERM)
        last = _until(pull, conn, lambda m: isinstance(m, Caps) and not m.prometheus)
        assert isinstance(last, Caps) and last.host == served.host
        assert proc.wait(timeout=5) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_bad_connection_file_is_one_line_error(tmp_path: Path) -> None:
    env = {**os.environ, connection.CONNECTION_FILE_ENV: str(tmp_path / "missing.json")}
    res = subprocess.run(
        [sys.executable, "-m", "workers.telemetry"], env=env, capture_output=True, text=True, timeout=30
    )
    assert res.returncode == 2
    assert res.stderr.count("\n") == 1 and "cannot read connection file" in res.stderr
