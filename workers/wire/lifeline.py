"""Die with the parent: no rank or sampler may outlive the process that started it.

A rank whose torchrun agent vanished (SIGKILLed, OOM-killed, or dead of a write to the pipe of
a closed terminal) would go on running collectives with its peers, holding GPUs, with parent 1.
Two independent guards end it:

* ``PR_SET_PDEATHSIG``: the kernel signals the child when its parent *thread* ends. Only safe
  when that thread lives as long as the parent process, so the parent says so in the
  environment (``COMMTOP_DIE_WITH_PARENT=1``): `commtop run` for torchrun's ranks (torchrun's
  agent starts them from its main thread), a rank for its sampler when started from its main
  thread. The value is never trusted blindly: if the parent is already gone when the child
  arms it (the race the kernel cannot close), the child exits at once.
* A parent-pid watch (the rank's heartbeat thread, the sampler's loop) that ends the process
  when ``getppid()`` changes, for children started without the variable.

Plain Python (ctypes), torch- and zmq-free: imported before torch in every rank.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

DIE_WITH_PARENT_ENV = "COMMTOP_DIE_WITH_PARENT"
#: The parent's pid, when the parent knows it is the direct parent (a rank starting its sampler).
PARENT_PID_ENV = "COMMTOP_PARENT_PID"
PR_SET_PDEATHSIG = 1


def set_parent_death_signal(sig: int = signal.SIGTERM) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent thread ends (Linux)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def arm_from_env(sig: int = signal.SIGTERM) -> bool:
    """Arm the parent-death signal if the parent asked for it; exit at once (code 1) if the
    parent is already gone (reparented: to init, or to the pid ``COMMTOP_PARENT_PID`` is not).
    Returns whether it was armed."""
    if os.environ.get(DIE_WITH_PARENT_ENV) != "1":
        return False
    armed = set_parent_death_signal(sig)
    if parent_gone():  # it died before the signal was armed: nobody will ever signal us
        write_stderr(f"commtop: parent process {os.environ.get(PARENT_PID_ENV, '')} is gone; exiting")
        os._exit(1)
    return armed


def parent_gone() -> bool:
    """Whether this process was reparented (its parent asked to be outlived by nobody)."""
    expected = os.environ.get(PARENT_PID_ENV, "")
    ppid = os.getppid()
    return ppid != int(expected) if expected.isdigit() else ppid == 1


def env_for_child(env: dict[str, str], *, direct: bool) -> dict[str, str]:
    """``env`` asking the child to die with its parent; ``direct``: this process is that parent
    (its pid goes along), else a launcher in between is (torchrun for the ranks). Not asked
    from a thread other than the main one: a thread may end before its process does, and the
    kernel signals on the death of the thread that forked."""
    import threading

    out = dict(env)
    out.pop(PARENT_PID_ENV, None)
    if threading.current_thread() is threading.main_thread():
        out[DIE_WITH_PARENT_ENV] = "1"
        if direct:
            out[PARENT_PID_ENV] = str(os.getpid())
    else:
        out.pop(DIE_WITH_PARENT_ENV, None)
    return out


def write_stderr(text: str) -> None:
    """One line to stderr that never raises: a closed terminal's pipe must not stop an exit."""
    try:
        sys.stderr.write(text + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
