"""A rank's records go out from a thread of commtop's, never from the job's.

The hooks hand finished collectives on from the job's own threads (a deque append; every
HARVEST_EVERY records a move into the batcher, which keeps the CUDA event rings from filling).
Encoding and sending a batch cost 0.2-0.9 ms on the 2-core VM, more when the caches went cold
while the job computed: done at the job's first collective after each batch interval, that was
inside the very call commtop timed, and outside its record (a user's own timer read ~0.6 ms more
after each idle gap). This thread sends every batch interval instead, also while the job issues
nothing (blocked in a collective a peer never joins, an evaluation, a checkpoint save): the TUI
then shows every rank's last collectives. ``Timers.harvest`` is made for any thread: its rings
are read under the timers' lock, the one every send takes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class FlushThread(threading.Thread):
    """Calls ``harvest`` every ``period_s`` until :meth:`stop`; errors end the thread, never the job."""

    def __init__(self, harvest: Callable[[], None], rank: int, period_s: float) -> None:
        super().__init__(name=f"commtop-flush-{rank}", daemon=True)
        self.harvest = harvest
        self.period_s = period_s
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.wait(self.period_s):
            try:
                self.harvest()
            except Exception:  # noqa: BLE001 - nothing of the job's depends on it
                return

    def stop(self) -> None:
        self._stop_event.set()
