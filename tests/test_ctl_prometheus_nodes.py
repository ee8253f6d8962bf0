"""`commtop ctl status` lists every node's Prometheus endpoint: two torchrun "nodes" on this
machine (``--nnodes 2``, told apart by COMMTOP_HOSTNAME) each given its own copy of the run's
connection file, as README's multi-node steps say, so each node's sampler writes its URL file
beside its copy and not in the collector's run folder; the collector learns the endpoints from
the nodes' telemetry and `ctl status` names both."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path

import pytest
from synthetic_ranks import SMALL_JOB, child_env, open_tcp_collector, short_runtime_dir, start_job

from tui import cli
from tui.ingest.loop import IngestLoop
from tui.run.control_server import ControlServer
from tui.run.run_dirs import lock_run
from workers.wire import connection as connections
from workers.wire.telemetry import Caps, caps_body

pytestmark = pytest.mark.timeout(180)


def test_status_lists_endpoints_told_by_the_nodes_and_those_beside_the_file(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv(connections.RUNTIME_DIR_ENV, str(tmp_path / "rt"))
    monkeypatch.delenv(connections.CONNECTION_FILE_ENV, raising=False)
    conn = connections.create_run(label="test")
    (conn.run_dir / "prometheus-head.json").write_text(json.dumps({"host": "head", "url": "http://h:1/metrics"}))
    lock = lock_run(conn.run_dir)
    server = ControlServer(conn)
    try:
        caps = Caps(
            host="node-b",
            pid=1,
            t_ns=0,
            interval_s=0.1,
            nvml="",
            driver="",
            gpus=(),
            prometheus="http://b:9400/metrics",
        )
        server.write(caps_body(conn.session, caps))
        server.write(
            caps_body(conn.session, Caps(host="node-c", pid=2, t_ns=0, interval_s=0.1, nvml="", driver="", gpus=()))
        )
        assert cli.main(["ctl", "status"]) == 0
    finally:
        server.close()
        os.close(lock)
    out = capsys.readouterr().out
    assert "prometheus node-b: http://b:9400/metrics" in out and "prometheus head: http://h:1/metrics" in out
    assert "node-c" not in out  # it serves none


@pytest.mark.e2e
def test_two_nodes_with_their_own_connection_files_are_both_listed(monkeypatch, capsys, tmp_path) -> None:
    rt = short_runtime_dir()
    monkeypatch.setenv("COMMTOP_RUNTIME_DIR", rt)
    monkeypatch.delenv(connections.CONNECTION_FILE_ENV, raising=False)
    conn, collector, rdzv = open_tcp_collector()
    loop = IngestLoop(collector.source, collector.model, sinks=collector.sinks)
    loop.start()
    jobs = []
    try:
        for node, host in enumerate(("node-a", "node-b")):
            copy = tmp_path / host / "connection.json"  # "copy the connection file there"
            copy.parent.mkdir()
            copy.write_text(json.dumps(json.loads(Path(conn.path).read_text()) | {"prometheus": "127.0.0.1:0"}))
            copy.chmod(0o600)
            launch = f"--nnodes 2 --node-rank {node} --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:{rdzv} --rdzv-id pn"
            env = child_env(rt, COMMTOP_HOSTNAME=host)
            jobs.append(start_job(str(copy), env, *SMALL_JOB, "--connect", conn.data, nproc=1, node=launch))
        deadline = time.monotonic() + 120
        out = ""
        while time.monotonic() < deadline:
            assert cli.main(["ctl", "--run", conn.run_id, "status"]) == 0
            out = capsys.readouterr().out
            if "prometheus node-a: http://127.0.0.1:" in out and "prometheus node-b: http://127.0.0.1:" in out:
                break
            time.sleep(0.5)
        assert "prometheus node-a: http://127.0.0.1:" in out and "prometheus node-b: http://127.0.0.1:" in out, out
        assert not list(conn.run_dir.glob("prometheus-*.json"))  # none of them beside the head's file
    finally:
        for job in jobs:
            job.signal(signal.SIGTERM)
        for job in jobs:
            try:
                job.wait(30)
            finally:
                job.kill_all()
        loop.stop()
        loop.join(2)
        collector.close()
        shutil.rmtree(rt, ignore_errors=True)
