"""`commtop run` end to end on the CPU: real torchrun gloo ranks, real ZeroMQ, real app."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from workers.wire import connection

pytestmark = pytest.mark.e2e  # starts processes

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture()
def runtime_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    short = tempfile.mkdtemp(prefix="ct-", dir="/tmp")  # ipc paths must stay under 107 characters
    monkeypatch.setenv(connection.RUNTIME_DIR_ENV, short)
    monkeypatch.delenv(connection.CONNECTION_FILE_ENV, raising=False)
    env = dict(os.environ)
    env["CUDA_VISIBLE_DEVICES"] = ""  # CPU even where a GPU exists: deterministic
    yield env
    shutil.rmtree(short, ignore_errors=True)


def summary_rows(text: str) -> dict[int, list[str]]:
    rows = {}
    for line in text.splitlines():
        parts = line.split()
        if parts and parts[0].isdigit() and "cpu" in line:
            rows[int(parts[0])] = parts
    return rows


def test_headless_run_reports_every_iteration_of_both_ranks(runtime_env: dict[str, str]) -> None:
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "tui.cli", "run", "--headless", "--nproc", "2", "--iters", "50", "--shape", "256x256"],
        capture_output=True,
        text=True,
        timeout=120,
        env=runtime_env,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "running 2 gloo ranks on the CPU" in proc.stderr
    assert "gloo/cpu" in proc.stdout
    rows = summary_rows(proc.stdout)
    assert sorted(rows) == [0, 1], proc.stdout
    for parts in rows.values():
        header = proc.stdout.splitlines()[1].split()
        count = parts[header.index("count")]
        missing = parts[header.index("missing")]
        assert (count, missing) == ("50", "0"), proc.stdout
    assert time.monotonic() - started < 120
    # quitting leaves no worker behind
    left = subprocess.run(
        ["pgrep", "-f", "-m", "workers --connection-file " + str(runtime_env[connection.RUNTIME_DIR_ENV])],
        capture_output=True,
        text=True,
    )
    assert left.stdout.strip() == ""


def test_invalid_options_fail_before_any_rank_starts(runtime_env: dict[str, str]) -> None:
    for argv, needle in [
        (["--shape", "12xq"], "--shape"),
        (["--copies", "99"], "copies"),
        (["--shape", "100000x100000"], "memory"),
    ]:
        proc = subprocess.run(
            [sys.executable, "-m", "tui.cli", "run", "--headless", *argv],
            capture_output=True,
            text=True,
            timeout=60,
            env=runtime_env,
            cwd=ROOT,
        )
        assert proc.returncode == 2, (argv, proc.stderr)
        err = proc.stderr.strip().splitlines()
        assert err[-1].startswith("commtop run: error:") and needle in err[-1], err
        assert "torch.distributed.run" not in proc.stderr


def test_app_fed_by_real_workers_shows_two_rank_rows(runtime_env: dict[str, str]) -> None:
    from tui.view.build import build_app

    conn = connection.create_run(label="pilot")
    runtime_env[connection.CONNECTION_FILE_ENV] = conn.path
    app = build_app(connection=conn, title="pilot")
    job = None

    async def scenario() -> list[str]:
        nonlocal job
        async with app.run_test(size=(140, 40)) as pilot:
            job = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "torch.distributed.run",
                    "--standalone",
                    "--nproc-per-node=2",
                    "-m",
                    "workers",
                    "--connection-file",
                    conn.path,
                    "--shape",
                    "128x128",
                    "--iters",
                    "0",
                ],
                env=runtime_env,
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                await pilot.pause(0.25)
                snap = app.snapshot
                lines = app.query_one("RankGrid").line_texts()
                ready = snap is not None and len(snap.ranks) == 2 and all(r.count > 20 for r in snap.ranks)
                if ready and snap.backend and "\n".join(lines).count("cpu") >= 2:
                    break
            return lines

    try:
        lines = asyncio.run(scenario())
    finally:
        if job is not None:
            os.killpg(job.pid, 15)
            job.wait(20)
    snap = app.snapshot
    assert snap is not None and sorted(r.rank for r in snap.ranks) == [0, 1]
    assert all(r.count > 20 for r in snap.ranks)
    assert snap.backend == "gloo/cpu"
    text = "\n".join(lines)
    assert text.count("cpu") >= 2, text
