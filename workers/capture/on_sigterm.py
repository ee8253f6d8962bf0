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
next collective hook or at the end of the step hook it was in (the flush waits HOLD_WAIT_S at most).

A Python handler runs only when the main thread runs Python: one stuck in a C call (a device
sync waiting on a collective that a peer, parked first, never issued; a blocking gloo call)
would never flush, and `commtop run` SIGKILLs it 5 s later with its last count and Bye unsent.
So a watcher thread reads Python's signal wake-up fd (written by the C-level handler whatever
the main thread does) and, when the main thread has not run the handler within MAIN_WAIT_S,
begins the same stop itself. A forked child (a DataLoader worker) gets SIGTERM's default back:
it is not the rank, and the rank's flush is not its to send.
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
#: When the wake-up watcher saw SIGTERM: how long the main thread has to run the handler (and park
#: the job) before the watcher begins the stop without it (the main thread is stuck in a C call).
MAIN_WAIT_S = 0.5
#: Where commtop's code lives (this package's parent folder).
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def install(flush: Callable[[], None], hold: Callable[[], threading.Event] | None = None) -> bool:
    """Send ``flush``'s records before a SIGTERM ends this process; ``hold`` (called when the stop
    begins) stops the job's thread at its next collective hook and returns the event that says
    it did, so no record comes after the flush. False (nothing installed) where SIGTERM is not at
    its default (the script or its launcher chose) or off the main thread."""
    if threading.current_thread() is not threading.main_thread():
        return False
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return False
    stop = _Stop(flush, hold)
    signal.signal(signal.SIGTERM, stop.on_signal)
    stop.watch_wakeups()
    # A child is forked with SIGTERM blocked until its hook has let go of the rank's wake-up pipe:
    # a SIGTERM in between (a Pool's terminate of a worker it had just forked) would write its
    # byte down the rank's pipe, and the rank's watcher would end the rank.
    os.register_at_fork(before=_block_sigterm, after_in_parent=_unblock_sigterm, after_in_child=stop.forget_in_child)
    return True


def _block_sigterm() -> None:
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # this thread only (the forking one)


def _unblock_sigterm() -> None:
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})


class _Stop:
    """One stop of this process, begun once: by the handler on the main thread, or by the
    wake-up watcher when the main thread is stuck in a C call (a device sync waiting for a
    collective its stopped peer never issued, a blocking collective) and cannot run it."""

    def __init__(self, flush: Callable[[], None], hold: Callable[[], threading.Event] | None) -> None:
        self.flush = flush
        self.hold = hold
        self.main_ran = threading.Event()  # the main thread ran the handler
        self._lock = threading.Lock()
        self._begun = False
        self._wakeup: tuple[int, int] | None = None  # (read, write) ends of the wake-up pipe

    def on_signal(self, _signum: int, frame: FrameType | None) -> None:
        """The Python handler (main thread): begin the stop, then park where SIGTERM found the
        job's code. A second SIGTERM while parked parks again; inside commtop's code, returns."""
        park = not in_commtop(frame)
        self.main_ran.set()
        self.begin(park)
        if park:
            threading.Event().wait()  # until the flush ends the process

    def begin(self, parked: bool) -> None:
        with self._lock:
            if self._begun:
                return
            self._begun = True
        held = _quietly(self.hold) if self.hold is not None else None
        if parked and held is not None:
            held.set()  # the job's thread stops here, not at a hook: the flush need not wait for one
        threading.Thread(target=_flush_then_end, args=(self.flush, held), name="commtop-sigterm", daemon=True).start()

    def watch_wakeups(self) -> None:
        """Learn of SIGTERM from Python's signal wake-up fd (written by the C-level handler on
        whichever thread the signal lands), where nobody else uses it (asyncio may)."""
        r, w = os.pipe()
        os.set_blocking(w, False)
        try:
            old = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        except (ValueError, OSError):
            old = None
        if old != -1:  # taken (or refused): leave it as it was; the handler alone begins the stop
            if old is not None:
                signal.set_wakeup_fd(old)
            os.close(r)
            os.close(w)
            return
        self._wakeup = (r, w)
        threading.Thread(target=self._watch, args=(r,), name="commtop-sigwatch", daemon=True).start()

    def _watch(self, fd: int) -> None:
        while True:
            try:
                signals = os.read(fd, 64)
            except OSError:
                return
            if not signals:
                return
            if signal.SIGTERM.value not in signals or signal.getsignal(signal.SIGTERM) != self.on_signal:
                continue  # another signal, or the script took SIGTERM over: its handler runs as written
            if not self.main_ran.wait(MAIN_WAIT_S):
                self.begin(parked=False)

    def forget_in_child(self) -> None:
        """A forked child (a DataLoader or Pool worker) is not the rank: SIGTERM ends it as it
        would have, and its signals are not the rank's (its wake-up byte would go down the rank's
        pipe, and the rank's watcher would end the rank). SIGTERM was blocked from the fork
        (:func:`install`) until here."""
        try:
            if signal.getsignal(signal.SIGTERM) == self.on_signal:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
            if self._wakeup is not None:
                r, w = self._wakeup
                self._wakeup = None
                old = signal.set_wakeup_fd(-1)
                if old not in (w, -1):
                    signal.set_wakeup_fd(old)  # someone else's: theirs to keep
                os.close(r)
                os.close(w)
        except (ValueError, OSError):  # forked off the main thread: nothing to undo from here
            pass
        _unblock_sigterm()  # a SIGTERM that came meanwhile lands now, with SIGTERM's default


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
