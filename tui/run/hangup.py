"""SIGHUP: the terminal is gone (tmux kill-session, a closed window, a dropped SSH connection);
SIGTERM while commtop starts its job.

Python's default for SIGHUP ends the process on the spot: no `finally`, no job.stop(), the
run's folder left behind, the torchrun agent left to PR_SET_PDEATHSIG alone. Here a hang-up
runs the given cleanups in order (stop the job first: it holds the GPUs), each bounded and
each allowed to fail, then exits 129. There is no terminal to restore or to print to.

SIGTERM is the TUI's (it quits as `q` does) and the headless loop's once they run; before that
(torchrun started, the TUI still starting) its default would end commtop on the spot, leaving
the run's folder behind. :func:`on_terminate` raises :class:`Terminated` in the main thread
instead, so every `finally` runs: the job is stopped, the folder removed, and Textual's own
`finally` puts the terminal back if it had taken it.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from typing import Any

#: The most the cleanups may take before the process exits anyway (job.stop waits up to 5 s
#: for the job's graceful end before it SIGKILLs the rest).
HANGUP_DEADLINE_S = 10.0


def on_hangup(
    *cleanups: Callable[[], Any],
    deadline_s: float = HANGUP_DEADLINE_S,
    last: Callable[[], Any] | None = None,
) -> Callable[[], None]:
    """Install the SIGHUP handler (main thread only); returns a function restoring the old one.
    ``last`` (quick: remove the run's folder) also runs when the deadline cuts the cleanups short:
    on a loaded machine a job's stop can outlast it, and the folder must not stay behind."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def give_up(code: int) -> None:
        try:
            if last is not None:
                last()
        finally:
            os._exit(code)

    def handler(signum: int, _frame: Any) -> None:
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # a second hang-up must not cut this short
        guard = threading.Timer(deadline_s, give_up, args=(128 + signum,))
        guard.daemon = True
        guard.start()
        for cleanup in cleanups:
            try:
                cleanup()
            except BaseException:  # a closed terminal makes any print fail: go on regardless
                pass
        os._exit(128 + signum)

    previous = signal.signal(signal.SIGHUP, handler)

    def restore() -> None:
        signal.signal(signal.SIGHUP, previous)

    return restore


def ignore_hangup() -> Callable[[], None]:
    """SIGHUP ignored (main thread only) while commtop already does what a hang-up asks for: the
    job stopped, the run's folder removed. Restoring the handler from before :func:`on_hangup`
    at the start of that cleanup gave a hang-up arriving during it (a closed terminal ends the
    TUI as it sends SIGHUP) the default action, which ended commtop before the folder went.
    Returns a function restoring the handler before (supervised() instead ends the cleanup with
    on_hangup's own restore, which puts back the one from before both)."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)

    def restore() -> None:
        signal.signal(signal.SIGHUP, previous)

    return restore


class Terminated(SystemExit):
    """A SIGTERM before the TUI or the headless loop answers it: exit 143 through every `finally`."""


def on_terminate(*, ignore: bool = False) -> Callable[[], None]:
    """Install the SIGTERM handler (main thread only): raise :class:`Terminated`, or with
    ``ignore`` do nothing (during the cleanup that a SIGTERM asks for anyway). Returns a
    function restoring the handler before."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def handler(signum: int, _frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # one is enough: the cleanup is under way
        raise Terminated(128 + signum)

    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN if ignore else handler)

    def restore() -> None:
        signal.signal(signal.SIGTERM, previous)

    return restore
