"""The end of a gloo ``isend`` / ``irecv`` or functional collective: the job's own wait returning.

gloo's point-to-point Works have no future (``get_future`` raises) and stay incomplete until
someone calls ``wait()``; a second waiter (the monitor's waiter thread) would take the job's
completion and hang it. So their record ends where the job learns they finished: ``wait``
of the Work's class is wrapped once, at the first such Work, and a Work the monitor
:func:`expect`\\ s ends its record when its own ``wait()`` returns. The wrapper costs one dict
read when nothing is expected; Works are held weakly (a pipeline's Work keeps its activations
alive: holding it would hold them), and a Work dropped without ``wait()`` is forgotten, so
its record never comes (its iteration shows as missing, as it should: it was never seen to
finish).

A functional collective (DTensor's) returns an AsyncCollectiveTensor whose first use calls
``wait_tensor`` on the op's output: :func:`expect_tensor` ends its record when
``wait_tensor`` returns for a tensor of the same storage (a view of the output, as a gather
on another dimension returns, waits on that view). The storage is held weakly too: while the
tensor lives its storage cannot be reused by another.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import Any

#: Works awaited at most (a job that issues this many without waiting on any: the rest go untimed).
MAX_EXPECTED = 65_536

Registry = dict[int, tuple[weakref.ref[Any], Callable[[], None]]]  # key -> (the object, weakly; its end)
_expected: Registry = {}  # by id of the Work
_expected_storage: Registry = {}  # by storage address
#: class -> its own wait (None: it inherited wait; unwrap then removes the wrapper, not sets it)
_wrapped: dict[type, Callable[..., Any] | None] = {}


def expect(work: Any, on_done: Callable[[], None]) -> bool:
    """Call ``on_done`` (on the waiting thread, after ``work.wait()`` returned; it must not
    raise) when the job waits on ``work``. False when the work cannot be followed (no
    weak reference, too many outstanding): its record goes untimed."""
    cls = type(work)
    if len(_expected) >= MAX_EXPECTED or (cls not in _wrapped and not _wrap(cls)):
        return False
    return _register(_expected, id(work), work, on_done)


def expect_tensor(tensor: Any, on_done: Callable[[], None]) -> bool:
    """Call ``on_done`` when ``wait_tensor`` (wrapped by :func:`wrap_wait_tensor`) returns for
    a tensor of ``tensor``'s storage. False when it cannot be followed."""
    if len(_expected_storage) >= MAX_EXPECTED:
        return False
    try:
        key = tensor.untyped_storage().data_ptr()
    except Exception:  # noqa: BLE001 - a tensor without storage (a fake, a meta tensor)
        return False
    return _register(_expected_storage, key, tensor, on_done)


def _register(registry: Registry, key: int, obj: Any, on_done: Callable[[], None]) -> bool:
    """Hold ``obj`` weakly under ``key``; it leaves the registry when it dies un-waited."""

    def forget(ref: weakref.ref[Any], key: int = key) -> None:
        entry = registry.get(key)
        if entry is not None and entry[0] is ref:
            del registry[key]

    try:
        registry[key] = (weakref.ref(obj, forget), on_done)
    except TypeError:  # no weak references
        return False
    return True


def outstanding() -> int:
    """Works and tensors expected and not waited on yet."""
    return len(_expected) + len(_expected_storage)


def wrap_wait_tensor(original: Callable[..., Any]) -> Callable[..., Any]:
    """``wait_tensor`` that ends the record expected for its tensor's storage once it returned."""

    @functools.wraps(original)
    def wait_tensor(tensor: Any) -> Any:
        done = original(tensor)  # the job's errors propagate untouched
        if _expected_storage:
            try:
                key = tensor.untyped_storage().data_ptr()
            except Exception:  # noqa: BLE001
                return done
            entry = _expected_storage.pop(key, None)
            if entry is not None and entry[0]() is not None:
                entry[1]()
        return done

    wait_tensor.__commtop_original__ = original  # type: ignore[attr-defined]
    return wait_tensor


def _wrap(cls: type) -> bool:
    original = getattr(cls, "wait", None)
    if original is None:
        return False
    own = cls.__dict__.get("wait")

    @functools.wraps(original)
    def wait(self: Any, *args: Any, **kwargs: Any) -> Any:
        done = original(self, *args, **kwargs)  # the job's errors and timeouts propagate untouched
        if _expected:
            entry = _expected.pop(id(self), None)
            if entry is not None and entry[0]() is self:
                entry[1]()
        return done

    try:
        cls.wait = wait  # type: ignore[attr-defined]
    except (AttributeError, TypeError):  # a class that refuses new attributes
        return False
    _wrapped[cls] = own
    return True


def unwrap() -> None:
    """Put every wrapped ``wait`` back and forget what was expected (tests; ``patch.unpatch``)."""
    for cls, own in list(_wrapped.items()):
        if own is None:
            delattr(cls, "wait")
        else:
            cls.wait = own  # type: ignore[attr-defined]
        del _wrapped[cls]
    _expected.clear()
    _expected_storage.clear()
