"""How the app ends by a signal: SIGTERM and ctrl+c quit it as q does, from the event loop (so
Textual's driver puts the terminal back: alternate screen, mouse, raw mode), and the signal is
kept so the command exits 128 + it (130 after ctrl+c, 143 after SIGTERM), as a shell reports a
command a signal stopped; q leaves it 0."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from typing import Any, cast


class SignalStop:
    """Mixin of the app (an ``App``: ``exit``)."""

    #: The signal that ended the app (SIGINT: ctrl+c, SIGTERM), 0 when q did.
    stopped_by = 0
    _sigterm_set = False

    def catch_sigterm(self) -> None:
        """On the main thread's event loop (where there is one): SIGTERM stops the app."""
        if threading.current_thread() is not threading.main_thread():
            return
        try:
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, self.stop_by, signal.SIGTERM)
        except (NotImplementedError, RuntimeError, ValueError):  # no signals here (not the main loop)
            return
        self._sigterm_set = True

    def release_sigterm(self) -> None:
        if self._sigterm_set:
            with contextlib.suppress(Exception):
                asyncio.get_running_loop().remove_signal_handler(signal.SIGTERM)
            self._sigterm_set = False

    def stop_by(self, signum: int) -> None:
        self.stopped_by = int(signum)
        cast(Any, self).exit()  # the App's

    def action_interrupt(self) -> None:
        """ctrl+c: quit as q does, with the exit code of a command Ctrl-C stopped (130)."""
        self.stop_by(signal.SIGINT)
