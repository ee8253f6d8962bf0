"""How the worker loop learns which settings to run each step with.

The loop calls :meth:`Control.begin_step` at every step boundary (before the step's
copies). Implementations must make that call cheap: no collective, no host sync, no
network round trip in the common case. :class:`StaticControl` never changes anything;
the live, agreed-on-every-rank implementation is in ``workers.rank.live_control``.
"""

from __future__ import annotations

import os
from typing import Protocol

from workers.wire.settings import Settings


class Control(Protocol):
    def begin_step(self, iteration: int) -> tuple[Settings, int]:
        """Settings and their epoch for the step that starts at ``iteration``."""
        ...

    def status(self) -> tuple[int, int, int]:
        """(epoch in force, pending epoch or -1, iteration it applies at or -1)."""
        ...

    def close(self) -> None: ...


class StaticControl:
    """Settings fixed for the whole run (no TUI, or control disabled)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def begin_step(self, iteration: int) -> tuple[Settings, int]:
        return self.settings, 0

    def status(self) -> tuple[int, int, int]:
        return 0, -1, -1

    def close(self) -> None:
        pass


def live_control_off() -> bool:
    """``COMMTOP_LIVE_CONTROL=0``: the settings stay as they start (to measure what live control costs)."""
    return os.environ.get("COMMTOP_LIVE_CONTROL") == "0"
