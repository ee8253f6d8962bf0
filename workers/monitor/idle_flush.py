"""Records a rank finished go out while its job does something else.

The hooks hand finished collectives to the batcher from the job's own threads, at the next
collective or step. A job that then stops issuing them (blocked in a collective a peer never
joins, an evaluation pass, a checkpoint save, the job's own sleep) kept its last ones back: the
TUI showed 1 of 4 all_reduces for as long as the hang lasted, the very records that say where
each rank stopped. This thread harvests when nobody has for IDLE_S (Timers.harvest is made for
any thread: its rings are read under the timers' lock, the one every send takes).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

#: How long the job's threads may leave finished records unharvested before this thread does.
IDLE_S = 0.25


class IdleFlush(threading.Thread):
    """Calls ``harvest_if_idle`` every IDLE_S until :meth:`stop`; errors end the thread, never the job."""

    def __init__(self, harvest_if_idle: Callable[[], None], rank: int) -> None:
        super().__init__(name=f"commtop-idle-flush-{rank}", daemon=True)
        self.harvest_if_idle = harvest_if_idle
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.wait(IDLE_S):
            try:
                self.harvest_if_idle()
            except Exception:  # noqa: BLE001 - the job's own harvests go on
                return

    def stop(self) -> None:
        self._stop_event.set()
