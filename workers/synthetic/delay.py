"""A straggler on demand: one rank (or every rank, each by a different amount) waits before
each collective, so the forum's 110 ms first all_gather (ranks that finished their offload at
different times) can be reproduced, watched and measured with `commtop ab`.

The wait happens on the host (``time.sleep``: the rank *issues* its collective late) or on
the GPU (``torch.cuda._sleep`` on the collective's stream: issued on time, *starts* late).
On a CPU-only rank "gpu" falls back to the host.
"""

from __future__ import annotations

import time
from typing import Any

from workers.wire.settings import Settings

#: Spin cycles used once to measure the GPU's cycles per second for ``torch.cuda._sleep``.
CALIBRATION_CYCLES = 20_000_000


def delay_s(settings: Settings, rank: int, world_size: int) -> float:
    """Seconds this rank waits before each collective under ``settings``.

    ``delay_rank`` >= 0: only that rank waits ``delay_ms``. ``delay_rank`` = -1: every rank
    waits, rank r ``delay_ms * r / (n - 1)`` (rank 0 not at all, the last rank the most)."""
    ms = settings.delay_ms
    if ms <= 0:
        return 0.0
    if settings.delay_rank >= 0:
        return ms / 1e3 if rank == settings.delay_rank else 0.0
    return ms / 1e3 * (rank / (world_size - 1) if world_size > 1 else 1.0)


class Delayer:
    """Waits on the host or on the GPU; the GPU's clock is measured once, at first use."""

    def __init__(self, torch: Any = None, cuda: bool = False) -> None:
        self.torch = torch
        self.cuda = cuda
        self._cycles_per_s = 0.0

    def wait(self, seconds: float, on: str) -> None:
        if seconds <= 0:
            return
        if on == "gpu" and self.cuda:
            self.torch.cuda._sleep(int(seconds * self.cycles_per_s()))
        else:
            time.sleep(seconds)

    def cycles_per_s(self) -> float:
        """One timed ``_sleep`` when the GPU delay is first asked for (a single host sync at a
        settings change, never again in the loop)."""
        if self._cycles_per_s <= 0:
            cuda = self.torch.cuda
            start, end = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)
            start.record()
            cuda._sleep(CALIBRATION_CYCLES)
            end.record()
            end.synchronize()
            self._cycles_per_s = CALIBRATION_CYCLES / max(start.elapsed_time(end) / 1e3, 1e-6)
        return self._cycles_per_s
