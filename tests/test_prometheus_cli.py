"""`--prometheus` on the command lines: a bad address is one line and exit 2 before anything
starts; binding wider than loopback says so in one line; `commtop --version`."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import version

import pytest
from synthetic_ranks import REPO, child_env, short_runtime_dir

from tui.cli import prometheus_setting
from workers.wire.config import ConfigError


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    env = child_env(short_runtime_dir())
    return subprocess.run([sys.executable, *argv], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.e2e
@pytest.mark.parametrize("command", [("-m", "tui.cli", "run"), ("-m", "tui.cli", "watch"), ("-m", "workers")])
def test_a_bad_address_is_one_line_and_exit_2(command: tuple[str, ...]) -> None:
    proc = (
        run(*command, "--prometheus", "nine:4x00", "--iters", "1")
        if command[-1] == "run"
        else run(*command, "--prometheus", "nine:4x00")
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "--prometheus must look like [HOST:]PORT" in lines[0], proc.stderr


@pytest.mark.e2e
def test_the_worker_needs_a_connection_file_to_export() -> None:
    proc = run("-m", "workers", "--prometheus", "0")
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "commtop worker: --prometheus needs the run's connection file (its key signs the ranks' records)"
    )


def test_binding_wider_warns_once_and_loopback_says_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    assert prometheus_setting("9400") == "9400"
    assert capsys.readouterr().err == ""
    assert prometheus_setting("0.0.0.0:9400") == "0.0.0.0:9400"
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("commtop: warning: --prometheus 0.0.0.0:9400 serves")
    with pytest.raises(ConfigError):
        prometheus_setting("host:")


@pytest.mark.e2e
def test_a_port_in_use_is_one_line_and_exit_2_before_the_job_starts() -> None:
    """Before, the node sampler's "Address already in use" went to its own log, deleted with the
    run: the job ran with no endpoint and nothing said."""
    import socket

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        proc = run("-m", "tui.cli", "run", "--headless", "--prometheus", str(port), "--iters", "1")
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and f"port {port} is already in use on 127.0.0.1" in lines[0], proc.stderr
    assert prometheus_setting(str(port)) == str(port)  # `watch`: the ranks' nodes may be others


@pytest.mark.e2e
def test_version() -> None:
    proc = run("-m", "tui.cli", "--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"commtop {version('commtop')}"


def test_ctl_status_lists_the_endpoints_the_node_samplers_wrote(monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from tui.run.ctl import format_status
    from workers.wire import connection as connections

    monkeypatch.setenv("COMMTOP_RUNTIME_DIR", short_runtime_dir())
    conn = connections.create_run(label="status", prometheus="0")
    assert connections.load(conn.path).prometheus == "0"  # the setting travels in the connection file
    for host, port in (("node-a", 9400), ("node-b", 9401)):
        url = {"url": f"http://127.0.0.1:{port}/metrics", "host": host, "pid": 1}
        (conn.run_dir / f"prometheus-{host}.json").write_text(json.dumps(url))
    (conn.run_dir / "prometheus-broken.json").write_text("{")  # a half-written file is skipped
    lines = format_status(conn, {"ranks": 2}).splitlines()
    assert lines[-2:] == [
        "prometheus node-a: http://127.0.0.1:9400/metrics",
        "prometheus node-b: http://127.0.0.1:9401/metrics",
    ]
