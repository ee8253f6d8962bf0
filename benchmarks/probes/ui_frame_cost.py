"""The UI thread's CPU per frame with nothing else running: the real app (headless) shown a
fixed sequence of snapshots of a frozen 8-rank run at 15 Hz, each followed by the screen
update that paints it; no publishers, no ingest thread, so two trees compare on their view code.

    python benchmarks/probes/ui_frame_cost.py [RANKS] [FRAMES] [HZ]     (default 8, 300, 15)

Prints the main thread's CPU (time.thread_time) per frame, median and p90 over the frames after
the first 30, and the % of a core at HZ. Paced, not back to back: on the 2-core VM a step run
right after a sleep costs several times its warm time (benchmarks/probes/wake_tax.py), and the
app sleeps between frames. Run from the tree being measured (PYTHONPATH=. and tests/ for the
frozen run); alternate two trees for a before/after.
"""

from __future__ import annotations

import asyncio
import platform
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path.cwd()
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "benchmarks" / "standing")]


def snapshots(ranks: int, frames: int) -> list[Any]:
    """One snapshot per frame, every rank one batch further than in the frame before."""
    from frozen_run import frozen_run

    from tui.model.run_model import RunModel
    from workers.wire.protocol import Batch

    per_frame = 25  # ~370 records/s a rank at 15 Hz
    messages = frozen_run(world=ranks, iterations=per_frame * (frames + 40), batch=per_frame)
    clock = [0]
    model = RunModel(clock=lambda: clock[0])
    out = []
    pending = 0
    for m in messages:
        if isinstance(m, Batch):
            clock[0] = max(clock[0], int(m.t_ns))
        model.apply(m)
        if isinstance(m, Batch) and m.kind == "coll" and m.rank == ranks - 1:
            pending += 1
            if pending > 40:  # a history first, as a running app has
                out.append(model.snapshot())
    return out[:frames]


async def run(ranks: int, frames: int, hz: float) -> tuple[float, float, int]:
    """(main thread CPU seconds, wall seconds, frames painted) over the frames after the first 30."""
    from _tui_probe import FrameMeter  # Textual's update timed, escape codes made as for a terminal

    from tui.view.app import CommtopApp

    snaps = snapshots(ranks, frames)
    app = CommtopApp(links=False)
    meter = FrameMeter(app)
    async with app.run_test(size=(160, 50)) as pilot:
        await pilot.pause()
        period = 1.0 / hz
        due = time.monotonic()
        for i, snap in enumerate(snaps):
            if i == 30:
                meter.reset()
                cpu0, wall0 = time.thread_time(), time.monotonic()
            due += period
            app.show_snapshot(snap)
            await asyncio.sleep(max(0.0, due - time.monotonic()))  # Textual paints meanwhile
        cpu, wall = time.thread_time() - cpu0, time.monotonic() - wall0
    return cpu, wall, len(meter.frame_ms)


def main() -> int:
    ranks = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    frames = int(sys.argv[2]) if len(sys.argv) > 2 else 300
    hz = float(sys.argv[3]) if len(sys.argv) > 3 else 15.0
    cpu, wall, painted = asyncio.run(run(ranks, frames, hz))
    print(
        f"{platform.node()} {platform.python_version()} ranks {ranks}, {painted} frames in {wall:.1f} s: "
        f"UI thread {cpu / max(1, painted) * 1e3:.3f} ms a frame, {100 * cpu / wall:.2f} % of a core"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
