"""The node exporter's files do not pile up, and its copy labels say what the records say.

The exporter binds an ipc socket (``prom-*.sock``) in the runtime root for its ranks' batches:
it removes it when it ends, and the viewer removes those of exporters that were killed. The
real exporter (prometheus_client's HTTP server, a real zmq socket), a real headless run, and
the real copy records of an H200 recording (pinned and pageable) through the real wire."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import zmq
from synthetic_ranks import REPO, SMALL_JOB, child_env, short_runtime_dir
from test_prometheus_metrics import KEY, SESSION, sample, scrape

from tui.recordings.reader import open_recording
from tui.run.run_dirs import prune_runs
from workers.export.metrics import NodeMetrics
from workers.export.server import NodeExporter
from workers.wire import connection as connections
from workers.wire import protocol as p

pytestmark = pytest.mark.timeout(180)
RECORDINGS = REPO / "recordings"


@pytest.fixture
def runtime(monkeypatch: pytest.MonkeyPatch):
    root = short_runtime_dir()
    monkeypatch.setenv("COMMTOP_RUNTIME_DIR", root)
    yield Path(root)
    shutil.rmtree(root, ignore_errors=True)


def taps(root: Path) -> list[str]:
    return sorted(path.name for path in root.glob("prom-*.sock"))


def test_the_exporter_removes_its_socket_file_when_it_closes(runtime: Path) -> None:
    conn = connections.create_run(label="tap")
    exporter = NodeExporter(conn, "node-a", "127.0.0.1:0")
    try:
        assert taps(runtime) == [Path(exporter.endpoint).name]
        with urllib.request.urlopen(exporter.url, timeout=10) as reply:  # a real scrape
            assert b"commtop_exporter_records_total" in reply.read()
    finally:
        exporter.close()
    assert taps(runtime) == []
    assert not exporter.url_file.exists()


def test_prune_removes_the_sockets_of_killed_exporters_only(runtime: Path) -> None:
    ctx = zmq.Context()
    live = ctx.socket(zmq.PULL)
    live.bind(f"ipc://{runtime / 'prom-live.sock'}")  # an exporter that still serves
    gone = zmq.Context()  # closed, not unbound: the files stay, as after a SIGKILLed sampler
    for name in ("prom-dead.sock", "prom-young.sock"):
        gone.socket(zmq.PULL).bind(f"ipc://{runtime / name}")
    gone.destroy(linger=0)
    (runtime / "prom-file.sock").write_text("not a socket")  # never ours to judge
    old = time.time() - 120
    for name in ("prom-live.sock", "prom-dead.sock", "prom-file.sock"):
        os.utime(runtime / name, (old, old), follow_symlinks=False)
    try:
        pruned = prune_runs()
        assert pruned.sockets == ["prom-dead.sock"]
        assert taps(runtime) == ["prom-file.sock", "prom-live.sock", "prom-young.sock"]
    finally:
        live.close(0)
        ctx.term()


@pytest.mark.e2e
def test_a_finished_run_leaves_no_exporter_socket_behind(runtime: Path) -> None:
    env = child_env(str(runtime), COMMTOP_PROMETHEUS_LINGER_S="0")
    argv = [sys.executable, "-m", "tui.cli", "run", "--headless", "--nproc", "2", "--prometheus", "127.0.0.1:0"]
    argv += ["--iters", "300", *SMALL_JOB]
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen: list[str] = []
    try:
        while proc.poll() is None and not seen:
            seen = taps(runtime)  # the node sampler's exporter is up
            time.sleep(0.02)
        _out, err = proc.communicate(timeout=150)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-2000:]
    assert len(seen) == 1, "the exporter never bound its socket"
    deadline = time.monotonic() + 20  # the node sampler ends with its rank, a moment after the run
    while taps(runtime) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert taps(runtime) == []


def test_copy_labels_follow_the_pinned_column_of_real_records() -> None:
    """An H200 run that switched host memory: 7,390 pinned and 550 pageable D2H copies."""
    with open_recording(RECORDINGS / "h200-nccl-1gpu-all_gather-modes.commtop") as rec:
        copies = [m for _, m in rec.messages() if isinstance(m, p.Batch) and m.kind == p.COPY]
        table = rec.tables().copy
    metrics = NodeMetrics("vm")
    for batch in copies:
        frames = p.seal(KEY, p.batch_body(p.COPY, SESSION, batch))
        metrics.add_message(p.decode(p.open_frames(KEY, frames, SESSION)))
    fams = scrape(metrics)["commtop_copy_bytes"]
    for flag, label in ((1, "true"), (0, "false")):
        want = float(table["nbytes"][table["pinned"] == flag].sum())
        assert want > 0
        got = sample(fams, "commtop_copy_bytes_total", rank="0", direction="d2h", pinned=label)
        assert got == want
    assert int(np.count_nonzero(table["pinned"])) == 7390
