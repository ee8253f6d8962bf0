"""The job's own output is never lost: `commtop run [--headless] -- python train.py` with real
gloo ranks under torchrun. Its lines pass through as they come, each with its rank's prefix;
its log is kept (not in the run's folder); a failure ends with the first failing rank's own
error; a rank ended by a signal says which; the TUI's log pane (l) shows every rank's last
lines, the failing rank's error first; a progress line on a terminal, none in a pipe."""

from __future__ import annotations

import asyncio
import os
import pty
import re
import select
import shutil
import subprocess
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich_text import plain
from synthetic_ranks import PY, REPO, child_env, short_runtime_dir

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]  # starts processes
COMMTOP = [PY, "-m", "tui.cli"]

#: Prints a token every step (a real DDP-like step: all_reduce of the grads, an optimizer step).
TOKEN_JOB = """
import sys, time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
model = torch.nn.Linear(8, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
token, steps, pause = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
for step in range(steps):
    model(torch.ones(4, 8)).sum().backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
    opt.step()
    opt.zero_grad()
    print(f"{token} step {step}", flush=True)
    time.sleep(pause)
dist.destroy_process_group()
"""
#: Rank 1 raises after a few steps; rank 0 is then in a collective with it.
BOOM_JOB = """
import time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(4)
for step in range(4):
    dist.all_reduce(t)
    time.sleep(0.05)
if dist.get_rank() == 1:
    raise ValueError("boom on rank 1")
dist.all_reduce(t)
time.sleep(30)
"""
#: Rank 1 is SIGKILLed (as the OOM killer would); rank 0 sleeps until torchrun stops it.
KILLED_JOB = """
import os, signal, time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(4)
for step in range(4):
    dist.all_reduce(t)
if dist.get_rank() == 1:
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(60)
"""


@pytest.fixture
def rt(tmp_path: Path) -> Iterator[tuple[Path, dict[str, str], Path]]:
    root = short_runtime_dir()
    env = child_env(root)
    yield Path(root), env, tmp_path
    shutil.rmtree(root, ignore_errors=True)


def _script(tmp: Path, name: str, text: str) -> str:
    path = tmp / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def _kept_log(stderr: str) -> Path:
    m = re.search(r"output is in (\S+)", stderr)
    assert m, stderr[-2000:]
    return Path(m.group(1))


def _last_lines(text: str, n: int) -> list[str]:
    return [ln for ln in text.splitlines() if ln.strip()][-n:]


def test_headless_passes_every_ranks_lines_through_as_they_come_and_keeps_the_log(rt) -> None:
    root, env, tmp = rt
    token = f"TOKEN-{uuid.uuid4().hex[:12]}"
    job = _script(tmp, "tokens.py", TOKEN_JOB)
    proc = subprocess.Popen(
        [*COMMTOP, "run", "--headless", "--record", str(tmp / "run.commtop"), "--", "python", job, token, "30", "0.1"],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stderr is not None
    errors: list[str] = []
    reader = threading.Thread(target=lambda: errors.append(proc.stderr.read()), daemon=True)  # type: ignore[union-attr]
    reader.start()
    first = proc.stdout.readline()
    while first and token not in first:
        first = proc.stdout.readline()
    running = proc.poll() is None  # the first token came while the job ran, not at its end
    out = first + proc.stdout.read()  # (communicate() would read past what readline() buffered)
    proc.wait(180)
    reader.join(30)
    err = errors[0]
    assert proc.returncode == 0, err[-3000:]
    assert running and first.startswith(("[rank0]: ", "[rank1]: ")), first
    for rank in (0, 1):
        for step in (0, 29):
            assert f"[rank{rank}]: {token} step {step}\n" in out, out[-2000:]
    assert "commtop summary" in out and "\r" not in out + err  # no progress line in a pipe
    log = _kept_log(err)
    assert log == tmp / "run.log" and (tmp / "run.commtop").is_file()  # beside the recording
    kept = log.read_text()
    assert f"[rank1]: {token} step 29" in kept and f"[rank0]: {token} step 0" in kept
    assert list(root.iterdir()) == []  # the run's folder went; the log stays
    state = Path(os.environ["XDG_STATE_HOME"], "commtop", "logs")
    assert list(state.iterdir()) == []  # its scratch files went too


def _run_headless(job: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`commtop run --headless -- python JOB`, its output captured."""
    return subprocess.run(
        [*COMMTOP, "run", "--headless", "--", "python", job],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_a_failing_rank_ends_the_output_with_its_own_error_and_its_rank(rt) -> None:
    _root, env, tmp = rt
    job = _script(tmp, "boom.py", BOOM_JOB)
    res = _run_headless(job, env)
    assert res.returncode != 0
    last = _last_lines(res.stderr, 5)
    assert last[-1] == "  [rank1]: ValueError: boom on rank 1", "\n".join(last)
    assert last[-2] == '  [rank1]:     raise ValueError("boom on rank 1")'
    assert "commtop: rank 1 failed first (exit code 1):" in res.stderr
    assert re.search(r"commtop: rank 0: .*after rank 1 failed", res.stderr), res.stderr[-3000:]
    assert "ChildFailedError" not in res.stderr  # torchrun's wrapper stays in the log only
    assert "ChildFailedError" in _kept_log(res.stderr).read_text()


def test_a_rank_ended_by_a_signal_says_which(rt) -> None:
    _root, env, tmp = rt
    job = _script(tmp, "killed.py", KILLED_JOB)
    res = _run_headless(job, env)
    assert res.returncode != 0
    assert _last_lines(res.stderr, 1) == ["commtop: rank 1 failed first: killed by SIGKILL"], res.stderr[-3000:]
    assert "commtop: rank 0: killed by SIGTERM (stopped by torchrun after rank 1 failed)" in res.stderr
    states = {ln.split()[0]: ln for ln in res.stdout.splitlines() if ln[:2] in ("0 ", "1 ")}
    assert states["1"].endswith("killed by SIGKILL") and states["0"].endswith("killed by SIGTERM"), res.stdout


def test_the_log_pane_shows_every_rank_the_failing_ranks_error_first(rt) -> None:
    """The app under run_test on a real job (BOOM_JOB, ended before the pane opens)."""
    from tui.run import log_store
    from tui.run.job_plan import script_argv
    from tui.run.launcher import JobProcess
    from tui.view.app import CommtopApp
    from workers.wire import connection as connections

    root, env, tmp = rt
    os.environ["COMMTOP_RUNTIME_DIR"] = str(root)
    try:
        conn = connections.create_run(label="pane")
    finally:
        os.environ.pop("COMMTOP_RUNTIME_DIR")
    logs = log_store.for_run(conn.run_id)
    job = JobProcess(script_argv(["python", _script(tmp, "boom.py", BOOM_JOB)], 2, logs), conn, env=env, logs=logs)
    assert job.wait(180) != 0

    async def scenario() -> tuple[dict[str, str], str, bool, str]:
        app = CommtopApp(None, process_watch=job, links=False)
        async with app.run_test(size=(120, 50)) as pilot:
            await pilot.pause()
            footer = {
                k: b.binding.action for k, b in app.screen.active_bindings.items() if b.binding.show and b.enabled
            }
            await pilot.press("l")
            await pilot.pause(0.3)
            shown = str(app.screen.query_one("#job-log-text").render())
            await pilot.press("escape")
            await pilot.pause()
            closed = type(app.screen).__name__ != "JobLogScreen"
            await pilot.press("question_mark")
            await pilot.pause()
            help_text = plain(app.screen.query_one("#help-text").content)
            return footer, shown, closed, help_text

    footer, shown, closed, help_text = asyncio.run(scenario())
    assert footer.get("l") == "job_log", footer
    lines = [ln.strip() for ln in shown.splitlines() if ln.strip()]
    assert lines[1] == "rank 1 failed first: ValueError: boom on rank 1", lines[:4]
    assert lines[2:4] == [
        "[rank1]: Traceback (most recent call last):",
        f'[rank1]:   File "{tmp}/boom.py", line 10, in <module>',
    ]
    assert any(ln.startswith("rank 0 · ") and "after rank 1 failed" in ln for ln in lines), lines
    assert any(ln.startswith("rank 1 · ") for ln in lines) and "torchrun" in lines
    assert closed and "l The job's output: every rank's last lines" in " ".join(help_text.split())


def _on_a_terminal(argv: list[str], env: dict[str, str]) -> tuple[int, str, float]:
    """(exit code, everything written, seconds) of commtop run on a pseudo-terminal."""
    master, slave = pty.openpty()
    started = time.monotonic()
    proc = subprocess.Popen(argv, env=env, cwd=REPO, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave)
    os.close(slave)
    chunks: list[bytes] = []
    while True:
        ready, _, _ = select.select([master], [], [], 1.0)
        if ready:
            try:
                data = os.read(master, 65536)
            except OSError:
                break
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            break
    proc.wait(30)
    os.close(master)
    return proc.returncode, b"".join(chunks).decode(errors="replace"), time.monotonic() - started


def test_on_a_terminal_headless_rewrites_one_progress_line(rt) -> None:
    _root, env, tmp = rt
    token = f"TOKEN-{uuid.uuid4().hex[:12]}"
    job = _script(tmp, "tokens.py", TOKEN_JOB)
    code, text, seconds = _on_a_terminal([*COMMTOP, "run", "--headless", "--", "python", job, token, "40", "0.1"], env)
    assert code == 0, text[-3000:]
    progress = re.findall(r"\r\x1b\[Kcommtop: (step \d+[^\r\n]*|starting[^\r\n]*)", text)
    assert any(re.match(r"step \d+ · [\d.]+ steps/s · ranks 2/2 · 0:\d\d$", p) for p in progress), progress[-5:]
    assert len(progress) <= 2 * seconds + 2, (len(progress), seconds)  # at most ~2 Hz
    assert f"[rank0]: {token} step 39" in text  # the job's lines still pass through, above it


#: Rank 0 draws a progress bar as tqdm does (stderr, \r, no newline until the bar is done).
BAR_JOB = """
import sys, time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(4)
for i in range(1, 31):
    dist.all_reduce(t)
    if dist.get_rank() == 0:
        sys.stderr.write(f"\\rtraining: {i}/30 it")
        sys.stderr.flush()
    time.sleep(0.1)
if dist.get_rank() == 0:
    sys.stderr.write("\\n")
dist.destroy_process_group()
"""


def test_on_a_terminal_a_progress_bar_the_job_draws_shows_live_in_the_progress_line(rt) -> None:
    """A tqdm bar ends its line only when it is done: until then the progress line shows its
    latest state before commtop's own; the finished bar then passes through as a line."""
    _root, env, tmp = rt
    job = _script(tmp, "bar.py", BAR_JOB)
    code, text, _seconds = _on_a_terminal([*COMMTOP, "run", "--headless", "--", "python", job], env)
    assert code == 0, text[-3000:]
    live = re.findall(r"\r\x1b\[K\[rank0\]: training: (\d+)/30 it │ commtop: ", text)
    assert len({int(i) for i in live if int(i) < 30}) >= 2, text[-3000:]  # seen moving, before its end
    assert "[rank0]: training: 30/30 it\n" in text.replace("\r\n", "\n")
