"""The end of a gloo ``isend`` / ``irecv`` or functional collective: the job's own wait returning.

gloo's point-to-point Works have no future (``get_future`` raises) and stay incomplete until
someone calls ``wait()``; a second waiter (the monitor's waiter thread) would take the job's
completion and hang it. So their record ends where the job learns they finished: ``wait``
of the Work's class is wrapped once, at the first such Work, and a Work the monitor
:func:`expect`\\ s ends its record when its own ``wait()`` returns. The wrapper costs one dict
read when nothing is expected; Works are held weakly (a pipeline's Work keeps its activations
alive: holding it would hold them). A Work dropped without ``wait()``, or whose ``wait()``
raised (a peer gone, a timeout), never ends its record: the first is kept in a bounded list
and, with the Works still un-waited at the end, counted as missing where no later record
shows it as a gap (:func:`unwaited`); the second counts as failed (``fail``), and as missing
the same way (a job that catches the error and goes on leaves a gap: counted once).

A functional collective (DTensor's) returns an AsyncCollectiveTensor whose first use calls
``wait_tensor`` on the op's output: :func:`expect_tensor` ends its record when
``wait_tensor`` returns for a tensor of the same storage (a view of the output, as a gather
on another dimension returns, waits on that view). The storage is held weakly too: while the
tensor lives its storage cannot be reused by another.
"""

from __future__ import annotations

import functools
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

#: Works awaited at most (a job that issues this many without waiting on any: the rest go untimed).
MAX_EXPECTED = 65_536
#: Records of Works dropped un-waited kept for the count at the end (the newest: only those after
#: the last record can be missed by the gap count).
MAX_DROPPED = 4096


class Awaited(Protocol):
    """What ends a record: ``done()`` once the job's wait returned, ``fail(exc)`` when it raised."""

    def done(self) -> None: ...

    def fail(self, exc: BaseException) -> None: ...


Registry = dict[int, tuple[weakref.ref[Any], Awaited]]  # key -> (the object, weakly; its record's end)
_expected: Registry = {}  # by id of the Work
_expected_storage: Registry = {}  # by storage address
_dropped: deque[Awaited] = deque(maxlen=MAX_DROPPED)  # their object died un-waited
#: class -> its own wait (None: it inherited wait; unwrap then removes the wrapper, not sets it)
_wrapped: dict[type, Callable[..., Any] | None] = {}


def expect(work: Any, end: Awaited) -> bool:
    """Call ``end.done()`` (on the waiting thread, after ``work.wait()`` returned; it must not
    raise) when the job waits on ``work``, ``end.fail(exc)`` when that wait raised. False when
    the work cannot be followed (no weak reference, too many outstanding): its record goes
    untimed."""
    cls = type(work)
    if len(_expected) >= MAX_EXPECTED or (cls not in _wrapped and not _wrap(cls)):
        return False
    return _register(_expected, id(work), work, end)


def expect_tensor(tensor: Any, end: Awaited) -> bool:
    """Call ``end.done()`` when ``wait_tensor`` (wrapped by :func:`wrap_wait_tensor`) returns for
    a tensor of ``tensor``'s storage, ``end.fail(exc)`` when it raised. False when it cannot be
    followed."""
    if len(_expected_storage) >= MAX_EXPECTED:
        return False
    try:
        key = tensor.untyped_storage().data_ptr()
    except Exception:  # noqa: BLE001 - a tensor without storage (a fake, a meta tensor)
        return False
    return _register(_expected_storage, key, tensor, end)


def _register(registry: Registry, key: int, obj: Any, end: Awaited) -> bool:
    """Hold ``obj`` weakly under ``key``; when it dies un-waited, its end moves to the dropped."""

    def forget(ref: weakref.ref[Any], key: int = key) -> None:
        entry = registry.get(key)
        if entry is not None and entry[0] is ref:
            del registry[key]
            _dropped.append(entry[1])

    try:
        registry[key] = (weakref.ref(obj, forget), end)
    except TypeError:  # no weak references
        return False
    return True


def outstanding() -> int:
    """Works and tensors expected and not waited on yet."""
    return len(_expected) + len(_expected_storage)


def unwaited() -> list[Awaited]:
    """The ends of records whose Work or tensor the job never waited on: still alive, or
    dropped (the newest MAX_DROPPED). Their records never come (read at the end)."""
    alive = [
        end for registry in (_expected, _expected_storage) for ref, end in list(registry.values()) if ref() is not None
    ]
    return alive + list(_dropped)


def _failed(registry: Registry, key: int, obj: Any, exc: BaseException) -> None:
    """The job's wait on ``obj`` raised: its record counts as failed (never raises)."""
    entry = registry.pop(key, None)
    if entry is not None and entry[0]() is obj:
        try:
            entry[1].fail(exc)
        except Exception:  # noqa: BLE001 - the job's own error is what propagates
            pass


def _tensor_failed(tensor: Any, exc: BaseException) -> None:
    """``wait_tensor`` raised for ``tensor``: the record expected for its storage counts as failed."""
    try:
        key = tensor.untyped_storage().data_ptr()
    except Exception:  # noqa: BLE001 - the job's own error is what propagates
        return
    entry = _expected_storage.get(key)
    if entry is not None:
        _failed(_expected_storage, key, entry[0](), exc)


def wrap_wait_tensor(original: Callable[..., Any]) -> Callable[..., Any]:
    """``wait_tensor`` that ends the record expected for its tensor's storage once it returned."""

    @functools.wraps(original)
    def wait_tensor(tensor: Any) -> Any:
        try:
            done = original(tensor)  # the job's errors propagate untouched
        except BaseException as exc:
            if _expected_storage:
                _tensor_failed(tensor, exc)
            raise
        if _expected_storage:
            try:
                key = tensor.untyped_storage().data_ptr()
            except Exception:  # noqa: BLE001
                return done
            entry = _expected_storage.pop(key, None)
            if entry is not None and entry[0]() is not None:
                entry[1].done()
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
        try:
            done = original(self, *args, **kwargs)  # the job's errors and timeouts propagate untouched
        except BaseException as exc:
            if _expected:
                _failed(_expected, id(self), self, exc)
            raise
        if _expected:
            entry = _expected.pop(id(self), None)
            if entry is not None and entry[0]() is self:
                entry[1].done()
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
    _dropped.clear()
