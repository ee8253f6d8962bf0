"""SIGHUP while commtop runs and while it cleans up (tui.run.hangup): in a child process, since
the test sends the signal to the process it runs in."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.e2e  # starts processes

CHILD = textwrap.dedent(
    """
    import os, signal, sys, time
    from tui.run.hangup import ignore_hangup, on_hangup

    def cleanup():
        print("handler cleanup", flush=True)

    restore = on_hangup(cleanup)
    hung_up = ignore_hangup()  # the cleanup of a TUI that ended on its own is under way
    os.kill(os.getpid(), signal.SIGHUP)
    time.sleep(0.05)
    print("cleanup finished", flush=True)
    hung_up()
    assert signal.getsignal(signal.SIGHUP) not in (signal.SIG_DFL, signal.SIG_IGN)  # commtop's handler again
    restore()
    assert signal.getsignal(signal.SIGHUP) == signal.SIG_DFL
    if sys.argv[1] == "again":  # a hang-up after the cleanup: the default action
        os.kill(os.getpid(), signal.SIGHUP)
        time.sleep(1)
    print("exit", flush=True)
    """
)


def _child(arg: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", CHILD, arg], capture_output=True, text=True, timeout=60)


def test_a_hang_up_during_the_cleanup_neither_ends_commtop_nor_starts_a_second_cleanup() -> None:
    done = _child("once")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["cleanup finished", "exit"]


def test_after_the_cleanup_the_handler_from_before_is_back() -> None:
    done = _child("again")
    assert done.returncode == -1, (done.returncode, done.stderr)  # SIGHUP's default action
    assert done.stdout.splitlines() == ["cleanup finished"]


SLOW = textwrap.dedent(
    """
    import os, signal, time
    from tui.run.hangup import on_hangup

    def slow_stop():  # a job's stop that outlasts the deadline on a loaded machine
        time.sleep(30)

    on_hangup(slow_stop, lambda: print("never", flush=True), deadline_s=0.5, last=lambda: print("last", flush=True))
    os.kill(os.getpid(), signal.SIGHUP)
    time.sleep(30)
    """
)


def test_when_the_cleanup_outlasts_its_deadline_the_last_step_still_runs() -> None:
    """The run's folder goes even when stopping the job takes longer than the deadline."""
    done = subprocess.run([sys.executable, "-c", SLOW], capture_output=True, text=True, timeout=60)
    assert done.returncode == 129, (done.returncode, done.stderr)
    assert done.stdout.splitlines() == ["last"]
