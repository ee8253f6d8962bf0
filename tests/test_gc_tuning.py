"""tui.view.gc_tuning: the live view's process collects less often, and only when asked
(the CLI asks; apps built by tests and libraries leave the interpreter alone)."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator

import pytest

from tui.view.app import CommtopApp
from tui.view.gc_tuning import YOUNG_THRESHOLD, settle_garbage_collector


@pytest.fixture
def restored_gc() -> Iterator[None]:
    before = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*before)


def test_settle_freezes_what_is_alive_and_raises_the_young_threshold(restored_gc: None) -> None:
    gc.unfreeze()
    _, middle, old = gc.get_threshold()
    settle_garbage_collector()
    assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == (YOUNG_THRESHOLD, middle, old)
    assert gc.isenabled()  # collections still run, less often


def test_cycles_made_after_settling_are_still_collected(restored_gc: None) -> None:
    settle_garbage_collector()

    class Node:
        other: object = None

    a, b = Node(), Node()
    a.other, b.other = b, a
    del a, b
    assert gc.collect() >= 2


def test_only_an_app_that_asks_tunes_the_collector(restored_gc: None) -> None:
    gc.unfreeze()
    default = gc.get_threshold()
    seen: dict[str, tuple[tuple[int, int, int], int]] = {}

    async def mount(name: str, tune: bool) -> None:
        async with CommtopApp(title=name, tune_gc=tune).run_test(size=(100, 30)) as pilot:
            await pilot.pause()
            seen[name] = (gc.get_threshold(), gc.get_freeze_count())

    asyncio.run(mount("plain", False))
    assert seen["plain"] == (default, 0)
    asyncio.run(mount("cli", True))
    assert seen["cli"][0][0] == YOUNG_THRESHOLD and seen["cli"][1] > 0
