"""The wrappers time a collective on each of the job's threads: one thread blocked inside a
collective (a gloo all_reduce waiting for a slow peer) no longer hides another thread's calls
(an asynchronous checkpoint's saver beside the training loop lost about half its records),
while a call nested in a timed one on the same thread (``ProcessGroup.send`` under
``dist.send``) is still timed once. No process group: a recording stand-in for the monitor
(FakeHooks) and a stand-in collective that blocks until told."""

from __future__ import annotations

import threading
from typing import Any

from workers.monitor import patch
from workers.monitor.patch import Args, Kwargs, OpSpec


class FakeHooks:
    """Records what the wrappers hand the monitor, per thread."""

    def __init__(self) -> None:
        self.on = True
        self.inside: set[int] = set()
        self.begun: list[tuple[str, int]] = []
        self.ended: list[tuple[str, Any]] = []
        self.failed: list[str] = []

    def coll_begin(self, spec: OpSpec, args: Args, kwargs: Kwargs) -> Any:
        self.begun.append((args[0], threading.get_ident()))
        return args[0]

    def coll_end(self, token: Any, result: Any) -> None:
        self.ended.append((token, result))

    def coll_failed(self, token: Any) -> None:
        self.failed.append(token)


SPEC = patch.OpSpec("all_reduce", "all_reduce", 0, lambda a, k: (None, 0), -1, 1)


def wrapped(original: Any) -> Any:
    return patch._wrap(original, SPEC, lambda: False)


def test_another_threads_collective_is_timed_while_one_thread_is_inside_one() -> None:
    hooks = FakeHooks()
    entered, release = threading.Event(), threading.Event()

    def collective(name: str, group: Any = None) -> str:
        if name == "slow":
            entered.set()
            assert release.wait(10)
        return f"{name} done"

    wrapper = wrapped(collective)
    patch.set_target(hooks)
    try:
        slow = threading.Thread(target=wrapper, args=("slow",))
        slow.start()
        assert entered.wait(10)
        assert wrapper("saver") == "saver done"  # while the other thread is inside its own
        release.set()
        slow.join(10)
    finally:
        patch.set_target(None)
    assert [name for name, _ in hooks.begun] == ["slow", "saver"]
    assert hooks.begun[0][1] != hooks.begun[1][1]
    assert sorted(hooks.ended) == [("saver", "saver done"), ("slow", "slow done")]
    assert hooks.inside == set()


def test_a_call_nested_in_a_timed_one_on_the_same_thread_is_not_timed_again() -> None:
    hooks = FakeHooks()
    inner = wrapped(lambda name, group=None: f"{name} inner")
    outer = wrapped(lambda name, group=None: inner(name) + " outer")
    patch.set_target(hooks)
    try:
        assert outer("send") == "send inner outer"
    finally:
        patch.set_target(None)
    assert [name for name, _ in hooks.begun] == ["send"] and hooks.ended == [("send", "send inner outer")]


def test_a_refused_call_leaves_its_thread_free_for_the_next() -> None:
    hooks = FakeHooks()

    def refuse(name: str, group: Any = None) -> None:
        raise ValueError("bad root")

    wrapper = wrapped(refuse)
    patch.set_target(hooks)
    try:
        for _ in range(2):
            try:
                wrapper("bad")
            except ValueError:
                pass
    finally:
        patch.set_target(None)
    assert hooks.failed == ["bad", "bad"] and hooks.inside == set()
