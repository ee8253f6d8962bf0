"""A rank or sampler never outlives its parent (issue 16, item 1), checked on small real
processes (no torch): the parent-death signal asked through the environment, the race where
the parent is gone before it is armed, and a rank's heartbeat whose stderr is the pipe of a
dead reader (that print raised and left the rank running before)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from workers.wire.lifeline import DIE_WITH_PARENT_ENV, PARENT_PID_ENV

REPO = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]  # starts processes


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return False


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


#: The parent: starts CHILD (its pid on stdout once the child is ready), then waits forever.
PARENT = """
import os, subprocess, sys, time
from workers.wire.lifeline import env_for_child
env = env_for_child(dict(os.environ), direct=True) if sys.argv[1] == "ask" else dict(os.environ)
child = subprocess.Popen([sys.executable, "-c", sys.argv[2]], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
print(child.pid, child.stdout.readline().decode().strip(), flush=True)
time.sleep(600)
"""

ARMED_CHILD = """
import time
from workers.wire.lifeline import arm_from_env
print("armed" if arm_from_env() else "not armed", flush=True)
time.sleep(600)
"""


def _family(mode: str, child_code: str) -> tuple[subprocess.Popen[str], int, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop(DIE_WITH_PARENT_ENV, None)
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, mode, child_code], env=env, cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    assert parent.stdout is not None
    pid, state = parent.stdout.readline().split(maxsplit=1)
    return parent, int(pid), state.strip()


def test_an_armed_child_dies_with_its_sigkilled_parent() -> None:
    parent, child, state = _family("ask", ARMED_CHILD)
    try:
        assert state == "armed"
        parent.kill()
        parent.wait()
        assert _gone_within(child, 10), "the child outlived its SIGKILLed parent"
    finally:
        _kill(child)


def test_without_the_request_nothing_is_armed() -> None:
    """The control: a child not asked to die with its parent survives it (so the test above
    measures the request, not something else ending the child)."""
    parent, child, state = _family("plain", ARMED_CHILD)
    try:
        assert state == "not armed"
        parent.kill()
        parent.wait()
        assert not _gone_within(child, 1.0)
    finally:
        _kill(child)


def test_a_parent_gone_before_arming_ends_the_child_at_once() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), DIE_WITH_PARENT_ENV: "1", PARENT_PID_ENV: "999999999"}
    proc = subprocess.run(
        [sys.executable, "-c", ARMED_CHILD], env=env, cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.strip() == "commtop: parent process 999999999 is gone; exiting"


#: A rank's heartbeat watching its parent, its stderr the pipe of that parent (like torchrun's).
HEARTBEAT_CHILD = """
import os, threading, time, zmq
from workers.rank.heartbeat import Counters, Heartbeat, RunInfo, WorkerStatus

class Publisher:
    seq = {"coll": 0, "copy": 0}
    dropped = 0

info = RunInfo(0, 1, 0, 1, "h", os.getpid(), "gloo/cpu", "cpu", -1, "", "x", "", {})
hb = Heartbeat(zmq.Context.instance(), None, b"k" * 32, "s", info, WorkerStatus(), Counters(Publisher()),
               watch_parent=True)
hb.start()
print("ready", flush=True)
while True:  # the loop goes on (it held the GPUs at 70 % CPU in the issue)
    time.sleep(0.01)
"""


def test_an_orphaned_ranks_heartbeat_exits_even_when_its_stderr_pipe_is_broken() -> None:
    parent, child, state = _family("plain", HEARTBEAT_CHILD)
    try:
        assert state == "ready"
        parent.kill()  # its end of the child's stdout/stderr pipes closes with it
        parent.wait()
        assert _gone_within(child, 10), "the rank outlived its launcher (its hard exit died on a broken pipe)"
    finally:
        _kill(child)
