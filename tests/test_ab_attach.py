"""`commtop ab --run RUN` attaches to a run that is already going: a real `commtop run --headless`
subprocess with real gloo ranks; the experiment switches its blocks through the run's control
channel, reads the records from the collector's data feed, leaves its marks in the run's
recording, and restores the settings in force before it. Timing bounds are generous (the CI
machine has 2 loaded cores)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tui import cli
from tui.run.control_server import ab_mark
from tui.run.ctl import CtlClient, CtlError
from workers.wire import connection
from workers.wire.protocol import ProtocolError

LOOP = ["--collective", "all_reduce", "--shape", "256x256", "--collectives-per-step", "4", "--backend", "gloo"]


@pytest.fixture(autouse=True)
def cpu_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """The runs these tests start are gloo ranks on the CPU."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")


def _wait_for_run(deadline_s: float) -> connection.Connection:
    """The run started by the subprocess, once its collector answers and both ranks report."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        for path in connection.list_runs():
            conn = connection.load(path)
            try:
                with CtlClient(conn, timeout_s=1.0) as client:
                    status = client.status()
            except CtlError:
                continue
            if status.get("ranks", 0) >= 2 and status.get("epoch_in_force", -1) >= 0:
                return conn
        time.sleep(0.3)
    raise AssertionError("the run never came up")


@pytest.mark.e2e
@pytest.mark.timeout(240)
def test_ab_attaches_to_a_live_run_restores_its_settings_and_marks_its_recording(
    runtime_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    recording = tmp_path / "live.commtop"
    run = subprocess.Popen(
        [sys.executable, "-m", "tui.cli", "run", "--headless", "--nproc", "2", "--record", str(recording),
         *LOOP, "--offload", "sync", "--copies", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=dict(os.environ), start_new_session=True,
    )  # fmt: skip
    try:
        conn = _wait_for_run(90)
        code = cli.main(
            ["ab", "--run", conn.run_id, "--a", "mode=none", "--b", "mode=overlap", "--duration", "8",
             "--block", "0.4", "--seed", "3", "--json"]
        )  # fmt: skip
        out, err = capsys.readouterr()
        assert code == 0, err
        doc = json.loads(out)
        assert doc["state"] == "done" and doc["pairs"] >= 2, doc
        assert f"attached to run {conn.run_id}" in err and "settings restored: mode=sync" in err, err
        assert doc["a"] == "mode=none" and doc["b"] == "mode=overlap"
        # the run goes on with the settings it had before the experiment, in force on the workers
        with CtlClient(conn) as client:
            status = client.status()
        assert status["in_force"]["mode"] == "sync" and status["epoch_in_force"] == status["desired_epoch"]
        # each block was one epoch: the experiment switched at least 2 pairs of epochs
        assert status["epoch_in_force"] >= 2 * doc["pairs"]
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGINT)
        try:
            run.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
    # the run's own recording holds the A/B marks: `commtop report` reproduces the verdict
    assert cli.main(["report", str(recording), "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [x["verdict"] for x in report["ab"]] == [doc["verdict"]]


def test_attach_refuses_what_does_not_fit_in_one_line(runtime_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for argv, message in (
        (["--run", "nope"], "no run 'nope'"),
        (["--run", "nope", "--record", "x.commtop"], "--record with --run"),
        (["--run", "nope", "--nproc", "2"], "--nproc with --run"),
        (["--run", "nope", "--b", "mode=bogus"], "mode must be one of"),
    ):
        args = ["ab", "--a", "mode=none", "--b", "mode=overlap", *argv]
        assert cli.main(args) == 2
        err = capsys.readouterr().err
        assert err.startswith("commtop ab: error: ") and message in err and err.count("\n") == 1, err


def test_attach_to_a_run_without_a_feed_says_so(runtime_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A collector that answers but serves no feed (an older commtop): one line, nothing changed."""
    from tui.run.control_server import ControlServer

    conn = connection.create_run(label="old")
    server = ControlServer(conn)
    try:
        assert cli.main(["ab", "--run", conn.run_id, "--a", "mode=none", "--b", "mode=overlap"]) == 2
    finally:
        server.close()
    err = capsys.readouterr().err
    assert "has no live data feed" in err and err.count("\n") == 1, err


def test_marks_from_requests_are_checked() -> None:
    assert ab_mark({"k": "ab", "event": "block", "epoch": 3, "arm": "A", "pair": 0}) == {
        "k": "ab", "event": "block", "epoch": 3, "arm": "A", "pair": 0,
    }  # fmt: skip
    for bad in (
        {"k": "hello"},
        {"k": "ab", "x": [1, 2]},
        {"k": "ab", "x": "y" * 500},
        "ab",
        {"k": "ab", **{str(i): i for i in range(20)}},
    ):
        with pytest.raises(ProtocolError):
            ab_mark(bad)
