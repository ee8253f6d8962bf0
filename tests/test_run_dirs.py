"""Run folders do not pile up and `ctl` talks to live runs only (issue 16, item 3).

Real `commtop watch --headless` collectors in subprocesses, real locks; the dead runs are
folders whose owner process really ended (a child that took the lock and exited).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from synthetic_ranks import PY, REPO

from tui import cli
from tui.run import ctl
from tui.run.run_dirs import LOCK_NAME, has_live_collector, lock_run, prune_runs
from workers.wire.connection import FILE_NAME, create_run, load

pytestmark = pytest.mark.timeout(120)
COMMTOP = [PY, "-m", "tui.cli"]


def _age(run_dir: Path, seconds: float) -> None:
    old = time.time() - seconds
    os.utime(run_dir / FILE_NAME, (old, old))


def _dead_owner_run(label: str) -> Path:
    """A run whose collector took the lock and then ended (as a SIGKILLed `commtop run` does)."""
    conn = create_run(label=label)
    code = f"from pathlib import Path; from tui.run.run_dirs import lock_run; lock_run(Path({str(conn.run_dir)!r}))"
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=60)
    assert (conn.run_dir / LOCK_NAME).read_text().isdigit()
    return conn.run_dir


def _watch(env: dict[str, str]) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [*COMMTOP, "watch", "--headless"], env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stderr is not None
    line = proc.stderr.readline()  # printed once it listens
    assert "connection file" in line, line
    return proc, line.rsplit(" ", 1)[-1].strip()


@pytest.mark.e2e
def test_prune_removes_runs_whose_owner_is_gone_and_keeps_live_and_young_ones(rt) -> None:
    root, _env = rt
    dead_locked = _dead_owner_run("deadlock")
    _age(dead_locked, 120)
    no_lock = create_run(label="nolock").run_dir  # its creator (a pid that is gone) never locked it
    crashed = no_lock.with_name(no_lock.name.replace(f"-{os.getpid()}-", "-999999999-"))
    no_lock.rename(crashed)
    _age(crashed, 120)
    live = create_run(label="live").run_dir
    fd = lock_run(live)  # this process is its collector
    _age(live, 120)
    young_dead = _dead_owner_run("young")  # a `commtop run` SIGKILLed seconds after it started: goes at once
    locking = create_run(label="locking").run_dir  # its creator (alive) made the lock file, no pid in it yet
    (locking / LOCK_NAME).touch()
    unlocked = create_run(label="unlocked").run_dir  # its creator (alive) has not locked it yet
    (root / "not-a-run").mkdir()  # no connection file: never ours to remove
    try:
        pruned = prune_runs()
        assert sorted(pruned.removed) == sorted([dead_locked.name, crashed.name, young_dead.name])
        kept = [live.name, locking.name, unlocked.name, "not-a-run"]
        assert sorted(p.name for p in root.iterdir()) == sorted(kept)
        assert has_live_collector(live) and not has_live_collector(locking)
    finally:
        os.close(fd)
    assert not has_live_collector(live)


@pytest.mark.e2e
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_run_folder_goes_when_its_collector_ends(rt, sig: int) -> None:
    root, env = rt
    proc, path = _watch(env)
    try:
        assert Path(path).is_file()
        proc.send_signal(sig)
        proc.wait(30)
    finally:
        proc.kill()
        proc.wait()
    assert list(root.iterdir()) == [], f"left after {signal.Signals(sig).name}: {list(root.iterdir())}"


@pytest.mark.e2e
def test_ctl_chooses_the_newest_live_run_says_which_and_prunes_dead_ones(rt, capsys) -> None:
    root, env = rt
    proc, path = _watch(env)
    live_id = Path(path).parent.name
    try:
        newer_silent = create_run(label="nocollector")  # newer, but nobody collects it
        dead = _dead_owner_run("dead")
        _age(dead, 120)
        assert cli.main(["ctl", "status", "--timeout", "5"]) == 0
        out = capsys.readouterr()
        assert f"run {live_id}: 0 rank(s) reporting" in out.out
        assert out.err.strip() == f"commtop ctl: run {live_id} (collector pid {proc.pid})"
        assert not dead.exists() and newer_silent.run_dir.exists()  # young: maybe not locked yet
    finally:
        proc.terminate()
        proc.wait(30)
    assert sorted(p.name for p in root.iterdir()) == [newer_silent.run_id]
    assert cli.main(["ctl", "status"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("commtop ctl: error: no running commtop run of yours"), err


def test_ctl_options_work_before_and_after_the_subcommand() -> None:
    parser = cli.build_parser()
    after = parser.parse_args(["ctl", "mode", "sync", "--no-wait", "--run", "abc", "--json"])
    before = parser.parse_args(["ctl", "--no-wait", "--run", "abc", "--json", "mode", "sync"])
    neither = parser.parse_args(["ctl", "mode", "sync"])
    for ns in (after, before):
        assert (ns.no_wait, ns.run, ns.json, ns.mode) == (True, "abc", True, "sync")
    assert (neither.no_wait, neither.run, neither.json, neither.timeout) == (False, None, False, ctl.REPLY_TIMEOUT_S)


@pytest.mark.e2e
def test_a_folder_with_a_lingering_prometheus_exporter_stays_until_it_ends(rt) -> None:
    """`--prometheus` exporters serve a last scrape after the run: their folder waits for them."""
    import json

    from tui.run.run_dirs import remove_run
    from workers.wire.exporter_address import URL_FILE

    root, _env = rt
    run_dir = _dead_owner_run("prom")  # its commtop has ended; its exporter (this process) has not
    conn = load(run_dir / FILE_NAME)
    url_file = run_dir / URL_FILE.format(host="h")
    url_file.write_text(json.dumps({"url": "http://127.0.0.1:1/metrics", "host": "h", "pid": os.getpid()}))
    remove_run(conn)
    _age(run_dir, 120)
    assert prune_runs().removed == [] and run_dir.exists()
    url_file.unlink()  # what the exporter does when it ends
    assert prune_runs().removed == [run_dir.name] and list(root.iterdir()) == []


@pytest.mark.e2e
def test_after_a_sigkilled_commtop_run_ctl_status_removes_its_folder(rt) -> None:
    """README: folders of runs whose commtop was killed are removed by the next `ctl`. A real
    `commtop run --headless` (torchrun, 2 gloo ranks), SIGKILLed once its ranks report."""
    from synthetic_ranks import SMALL_JOB

    root, env = rt
    proc = subprocess.Popen(
        [*COMMTOP, "run", "--headless", "--nproc", "2", "--iters", "0", *SMALL_JOB],
        env=env,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:  # the sampler writes its log once rank 0 runs
            runs = [p for p in root.iterdir() if (p / FILE_NAME).exists()]
            if runs and list(runs[0].glob("*.log")) and (runs[0] / LOCK_NAME).exists():
                break
            time.sleep(0.2)
        else:
            pytest.fail(f"the run never started: {list(root.iterdir())}")
        proc.kill()
        proc.wait(30)
        time.sleep(1.0)  # torchrun gets its parent-death signal
        res = subprocess.run([*COMMTOP, "ctl", "status"], env=env, cwd=REPO, capture_output=True, text=True, timeout=60)
    finally:
        proc.kill()
        proc.wait()
    assert res.returncode == 2 and "removed 1 folder(s) of ended runs" in res.stderr, res.stderr
    assert [p for p in root.iterdir() if (p / FILE_NAME).exists()] == []
