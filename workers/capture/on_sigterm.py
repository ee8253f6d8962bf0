"""A watched rank stopped by SIGTERM sends what it timed first, then ends by SIGTERM as before.

`commtop run` stops a job (Ctrl-C, ``q``, SIGTERM) as torchrun does: SIGTERM to every process.
Python's default for SIGTERM ends the process on the spot, so a rank's records since its last
send were lost without a count (a sweep of unseen jobs: 47 of 239 collectives per rank, all 21
of a slow job). Where the script has no SIGTERM handler of its own, the bootstrap installs
this one. The handler, on the main thread, marks the monitor to stop the job's thread at its
next collective hook and starts a thread that sends the rank's records and its Bye (at most
FLUSH_LIMIT_S), then restores the default action in C (Python's ``signal.signal`` is for the
main thread only) and sends SIGTERM again: the rank ends by SIGTERM, as torchrun and the
script's parent expect. A handler the script installs later replaces this one: its own SIGTERM
handling then runs as written.

Where SIGTERM found the job's own code (or torch's) running, the handler then parks the main
thread until the process ends: the job stops where SIGTERM's default action would have ended it,
so nothing it issues comes after the flush's last count. Without that, a job whose collectives
are not hooked (the Flight Recorder capture) ran on through the flush: on an H100, 150-300
collectives per stop that no read saw or counted, and a settle that never saw the ring go quiet.
Where SIGTERM found commtop's own code (a hook, a wrapper, the monitor), the handler returns as
before, so the flush never waits on a lock that code holds; the job's thread then stops at its
next collective hook (HOLD_WAIT_S at most).
"""

from __future__ import annotations

import ctypes
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

#: The longest a stopping rank spends sending what it timed before it ends: the monitor's close
#: may wait 1 s for async Works and 1 s for GPU events, then lingers 0.5 s; `commtop run` kills
#: what is left of the job 5 s after its SIGTERM (tui.run.launcher.STOP_GRACE_S).
FLUSH_LIMIT_S = 3.0
#: The longest the sender waits for the job's thread to stop at a collective hook (a thread in a
#: long computation, or a job whose collectives are not hooked, never does: it sends anyway).
HOLD_WAIT_S = 0.25
#: Where commtop's code lives (this package's parent folder).
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def install(flush: Callable[[], None], hold: Callable[[], threading.Event] | None = None) -> bool:
    """Send ``flush``'s records before a SIGTERM ends this process; ``hold`` (called in the
    handler) stops the job's thread at its next collective hook and returns the event that says
    it did, so no record comes after the flush. False (nothing installed) where SIGTERM is not at
    its default (the script or its launcher chose) or off the main thread."""
    if threading.current_thread() is not threading.main_thread():
        return False
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return False
    started: list[threading.Thread] = []

    def on_sigterm(_signum: int, frame: FrameType | None) -> None:
        if started:  # a second SIGTERM while flushing changes nothing
            return
        held = _quietly(hold) if hold is not None else None
        park = not in_commtop(frame)
        if park and held is not None:
            held.set()  # the job's thread stops here, not at a hook: the flush need not wait for one
        started.append(
            threading.Thread(target=_flush_then_end, args=(flush, held), name="commtop-sigterm", daemon=True)
        )
        started[0].start()
        if park:
            threading.Event().wait()  # until the flush ends the process

    signal.signal(signal.SIGTERM, on_sigterm)
    return True


def in_commtop(frame: FrameType | None) -> bool:
    """Whether the interrupted thread is inside commtop's code (``workers/``), up to where the
    script was started (``runpy``): code that may hold a lock the flush needs."""
    while frame is not None:
        if frame.f_code.co_filename.startswith(_PACKAGE):
            return True
        if frame.f_globals.get("__name__") == "runpy":  # (a frozen module: no file name to match)
            return False
        frame = frame.f_back
    return False


def _flush_then_end(flush: Callable[[], None], held: threading.Event | None) -> None:
    if held is not None:
        held.wait(HOLD_WAIT_S)
    sender = threading.Thread(target=_quietly, args=(flush,), name="commtop-sigterm-flush", daemon=True)
    sender.start()
    sender.join(FLUSH_LIMIT_S)  # a flush stuck behind a dead peer does not hold the stop
    end_by_sigterm()


def _quietly(call: Callable[[], Any]) -> Any:
    try:
        return call()
    except Exception:  # noqa: BLE001 - the process ends either way
        return None


def end_by_sigterm() -> None:
    """SIGTERM's default action back (in C: any thread may call it), then SIGTERM to this process."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.signal.restype = ctypes.c_void_p
    libc.signal.argtypes = [ctypes.c_int, ctypes.c_void_p]
    libc.signal(int(signal.SIGTERM), 0)  # SIG_DFL
    os.kill(os.getpid(), signal.SIGTERM)
