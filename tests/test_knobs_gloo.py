"""A job refuses what it has no knob for, end to end: real `commtop run --headless` subprocesses
(real torchrun, 2 gloo ranks, the real collector) driven by `commtop ctl` and `commtop ab` as a
user types them. Timing bounds are generous (the CI machine has 2 loaded cores)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tui import cli
from tui.run.ctl import CtlClient, CtlError
from workers.wire import connection

pytestmark = pytest.mark.e2e  # starts processes

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
LOOP = ["--collective", "all_reduce", "--shape", "256x256", "--collectives-per-step", "4", "--backend", "gloo"]


@pytest.fixture()
def runtime_dir(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    short = tempfile.mkdtemp(prefix="kg-", dir="/tmp")  # ipc paths must stay under 107 characters
    monkeypatch.setenv(connection.RUNTIME_DIR_ENV, short)
    monkeypatch.delenv(connection.CONNECTION_FILE_ENV, raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    yield short
    shutil.rmtree(short, ignore_errors=True)


def start(*argv: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tui.cli", "run", "--headless", "--nproc", "2", *argv],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=dict(os.environ) | (env or {}),
        start_new_session=True,
    )  # fmt: skip


def stop(run: subprocess.Popen[str]) -> str:
    """SIGINT (the summary is printed), its output."""
    if run.poll() is None:
        os.killpg(run.pid, signal.SIGINT)
    try:
        out, _ = run.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(run.pid, signal.SIGKILL)
        out, _ = run.communicate()
    return out


def wait_for_run(deadline_s: float = 120.0) -> tuple[connection.Connection, dict[str, Any]]:
    """The run, once both ranks report and it has said what it can change."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        for path in connection.list_runs():
            conn = connection.load(path)
            try:
                with CtlClient(conn, timeout_s=1.0) as client:
                    status = client.status()
            except CtlError:
                continue
            can = status.get("can_change") or {}
            if status.get("ranks", 0) >= 2 and can.get("kind") != "unknown" and can.get("settled", True):
                return conn, status
        time.sleep(0.3)
    raise AssertionError("the run never came up")


def ctl(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(["ctl", *argv])
    out, err = capsys.readouterr()
    return code, out, "\n".join(ln for ln in err.splitlines() if not ln.startswith("commtop ctl: run "))


@pytest.mark.timeout(240)
def test_an_unmodified_job_refuses_ctl_and_ab_and_no_epoch_starts(
    runtime_dir: str, capsys: pytest.CaptureFixture[str]
) -> None:
    run = start("--", "python", str(EXAMPLES / "train_ddp_plain.py"), "--steps", "1000000", "--hidden", "64")
    try:
        wait_for_run()
        for argv in (["mode", "sync"], ["set", "copies=3"], ["set", "knob.offload=sync"]):
            code, _, err = ctl(capsys, *argv)
            assert code == 2 and err.count("\n") == 0, (argv, err)
            assert err.startswith("commtop ctl: error: train_ddp_plain.py has no live knobs"), err
        code = cli.main(["ab", "--run", "newest", "--a", "mode=none", "--b", "mode=overlap"])
        err = capsys.readouterr().err.splitlines()[-1]
        assert code == 2 and "arm A (mode=none): train_ddp_plain.py has no live knobs" in err, err
        time.sleep(1.5)  # a Hello later: still epoch 0 everywhere
        code, out, _ = ctl(capsys, "status")
        assert code == 0 and "in force  (epoch 0): mode=none" in out and "requested (epoch 0): same" in out, out
        assert "can change: nothing (no knobs)" in out
    finally:
        summary = stop(run)
    assert "job train_ddp_plain.py" in summary, summary[-3000:]
    assert "verdict:" not in summary  # no epoch of identical settings to compare


@pytest.mark.timeout(240)
def test_a_monitored_job_takes_its_knob_and_ab_restores_it(
    runtime_dir: str, capsys: pytest.CaptureFixture[str]
) -> None:
    run = start("--", "python", str(EXAMPLES / "train_ddp.py"), "--seconds", "600")
    try:
        wait_for_run()
        # epoch 0: what is requested is what the job reports in force (its knob, declared after
        # its Hellos started), not mode=none
        code, out, _ = ctl(capsys, "status")
        assert "in force  (epoch 0): mode=overlap knob.offload=overlap" in out, out
        assert "requested (epoch 0): same" in out, out
        code, _, err = ctl(capsys, "set", "knob.offload=off")
        assert code == 2 and err == "commtop ctl: error: knob.offload=off: choices none, overlap, sync; nothing changed"
        code, _, err = ctl(capsys, "set", "copies=3")
        assert code == 2 and "train_ddp.py has no knob for copies" in err, err
        code = cli.main(
            ["ab", "--run", "newest", "--a", "knob.offload=overlap", "--b", "knob.offload=sync",
             "--duration", "5", "--block", "0.5", "--seed", "1"]
        )  # fmt: skip
        out, err = capsys.readouterr()
        assert code == 0, err
        assert "commtop ab: settings restored: knob.offload=overlap" in err, err
        code, out, _ = ctl(capsys, "status")
        assert "knob.offload=overlap" in out.split("\n")[1] and "requested" in out, out
        assert "refused control messages: collector 0; workers 0" in out, out  # no conflict at epoch 0
    finally:
        stop(run)


@pytest.mark.timeout(180)
def test_live_control_off_is_said_at_once(runtime_dir: str, capsys: pytest.CaptureFixture[str]) -> None:
    run = start(*LOOP, env={"COMMTOP_LIVE_CONTROL": "0"})
    try:
        wait_for_run()
        started = time.monotonic()
        code, _, err = ctl(capsys, "mode", "sync")
        assert code == 2 and time.monotonic() - started < 5.0, err  # not 20 s and "workers busy?"
        assert "live control is off in this run (COMMTOP_LIVE_CONTROL=0" in err, err
    finally:
        stop(run)


@pytest.mark.timeout(240)
def test_ab_refuses_a_knob_value_the_job_does_not_have_and_says_when_the_job_ends_first(
    runtime_dir: str, capsys: pytest.CaptureFixture[str]
) -> None:
    script = ["--", "python", str(EXAMPLES / "train_ddp.py")]
    started = time.monotonic()
    assert cli.main(["ab", "--nproc", "2", "--a", "knob.offload=off", "--b", "knob.offload=on", *script]) == 2
    err = capsys.readouterr().err
    assert (
        err.splitlines()[-1]
        == "commtop ab: error: arm A (knob.offload=off): knob.offload=off: choices none, overlap, sync"
    )
    assert time.monotonic() - started < 90  # once the job said its knobs, not after --duration
    code = cli.main(
        ["ab", "--nproc", "2", "--a", "knob.offload=none", "--b", "knob.offload=overlap", *script, "--steps", "5"]
    )
    out = capsys.readouterr().out
    assert code == 1 and "the job ended before" in out and "make it run longer than --duration 30 s" in out, out
