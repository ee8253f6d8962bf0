"""Helpers for tests that drive the real app with Textual's Pilot, and for replays on a clock
the test moves (no pytest async plugin: each async test runs in its own event loop)."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from typing import Any


def run_async(fn: Any) -> Any:
    """Run an async test body with asyncio.run."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        asyncio.run(fn(*args, **kwargs))

    return wrapper


async def wait_for(pilot: Any, cond: Callable[[], object], timeout_s: float = 15.0) -> None:
    """Let the app run until ``cond()`` holds; fail after ``timeout_s`` of wall time."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out waiting for the app"
        await pilot.pause(0.05)


class FrozenClock:
    """A monotonic clock (seconds) the test moves by hand: a replay's pace without waiting."""

    def __init__(self, now: float = 10.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
