"""What a side thread's hand-off costs a Textual app: a label updated 15 times a second, driven by
the app's own timer or by a side thread that wakes and posts a message (commtop's ingest thread
does the latter once per snapshot), optionally with the same small numpy job per tick.

    python benchmarks/probes/thread_handoff.py MODE [SECONDS]     MODE: timer, thread, timerw, threadw

Issue 28's question: would the 8-rank row cost less with one thread woken per frame instead of
two? (VM, 2026-12-06: timer 2.9-3.5 %, thread 2.9-3.9 %; with the job 4.3-5.1 % both: no.)
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time

import numpy as np
from textual.app import App, ComposeResult
from textual.message import Message
from textual.widgets import Static

HZ = 15.0
_DATA = np.random.default_rng(0).random(2000)


class Tick(Message):
    """Posted by the side thread, once per tick."""


class HandoffApp(App[None]):
    def __init__(self, mode: str) -> None:
        super().__init__()
        self.mode = mode
        self.updates = 0
        self._stop = threading.Event()

    def compose(self) -> ComposeResult:
        self.label = Static("0")
        yield self.label

    def on_mount(self) -> None:
        if self.mode.startswith("timer"):
            self.set_interval(1 / HZ, self._on_timer)
        else:
            threading.Thread(target=self._side, daemon=True).start()

    def on_unmount(self) -> None:
        self._stop.set()

    def _job(self) -> None:
        if self.mode.endswith("w"):
            for _ in range(20):
                np.sort(_DATA).sum()

    def _side(self) -> None:
        while not self._stop.wait(1 / HZ):
            self._job()
            self.post_message(Tick())

    def _on_timer(self) -> None:
        self._job()
        self._show()

    def on_tick(self, _: Tick) -> None:
        self._show()

    def _show(self) -> None:
        self.updates += 1
        self.label.update(str(self.updates))


async def measure(mode: str, seconds: float) -> str:
    app = HandoffApp(mode)
    async with app.run_test(size=(160, 50)):
        await asyncio.sleep(1.0)  # past start-up
        cpu0, wall0, n0 = time.process_time(), time.monotonic(), app.updates
        await asyncio.sleep(seconds)
        cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
        return f"{mode}: {100 * cpu / wall:.2f} % of a core, {(app.updates - n0) / wall:.1f} updates/s"


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else "thread"
    if mode not in ("timer", "thread", "timerw", "threadw"):
        raise SystemExit(f"thread_handoff: unknown mode {mode!r} (timer, thread, timerw, threadw)")
    print(asyncio.run(measure(mode, float(sys.argv[2]) if len(sys.argv) > 2 else 8.0)))


if __name__ == "__main__":
    main()
