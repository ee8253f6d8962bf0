"""``patch_distributed``: time every torch.distributed collective of a user's job.

The public collective functions of ``torch.distributed`` are replaced (in
``torch.distributed``, ``torch.distributed.distributed_c10d`` and every loaded module that
bound one at its import, torch's and the user's, :func:`rebind`; callers look them up at call
time: FSDP, DDP comm hooks, DTensor, user code) by thin wrappers that call the original
and hand ``(op, main tensor, bytes, group)`` to the active monitor. With no monitor, or a
disabled one, a wrapper costs one global read and one attribute read. Non-blocking
point-to-point (isend, irecv, batch_isend_irecv) is wrapped one level down, on the
ProcessGroup class (METHODS); the functional collectives (DTensor's) in their own module
(FUNCOL), their records ended by the job's own wait (workers.monitor.wait_hook).

Bytes follow nccl-tests (S = total gathered/reduced size for all_gather/reduce_scatter),
so busbw compares with nccl-tests and with the synthetic loop. A function user code keeps
elsewhere than in a module's globals (a table of ops made before patching) stays the original, and
collectives issued from C++ (DDP's built-in allreduce) are not seen: register DDP's
``allreduce_hook`` (it calls ``dist.all_reduce``), as examples/train_ddp.py does. While
torch.compile traces, a wrapper calls the original (compiled collectives are not timed). On gloo
groups what the wrappers did not see is counted as lost (workers.monitor.unseen).
"""

from __future__ import annotations

import functools
import inspect
import sys
import threading
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from workers.monitor import wait_hook
from workers.monitor.records import OP_INDEX

Args = tuple[Any, ...]
Kwargs = dict[str, Any]


class Hooks(Protocol):
    """What a wrapper calls on the active monitor; neither method may raise."""

    on: bool
    #: threads inside a timed collective: a call nested in it on the same thread (a deprecated
    #: alias, ProcessGroup.send under dist.send) is not timed again; another thread's call is
    #: (an asynchronous checkpoint's saver issues collectives beside the training loop)
    inside: set[int]

    def coll_begin(self, spec: OpSpec, args: Args, kwargs: Kwargs) -> Any: ...

    def coll_end(self, token: Any, result: Any) -> None: ...

    def coll_failed(self, token: Any) -> None: ...


def _arg(args: Args, kwargs: Kwargs, i: int, name: str) -> Any:
    return args[i] if len(args) > i else kwargs.get(name)


def _one(i: int, name: str) -> Callable[[Args, Kwargs], tuple[Any, int]]:
    def describe(args: Args, kwargs: Kwargs) -> tuple[Any, int]:
        t = _arg(args, kwargs, i, name)
        return t, t.nbytes

    return describe


def _all_gather_into(args: Args, kwargs: Kwargs) -> tuple[Any, int]:
    return _arg(args, kwargs, 1, "input_tensor"), _arg(args, kwargs, 0, "output_tensor").nbytes


def _all_gather_list(args: Args, kwargs: Kwargs) -> tuple[Any, int]:
    t = _arg(args, kwargs, 1, "tensor")
    return t, t.nbytes * len(_arg(args, kwargs, 0, "tensor_list"))


def _reduce_scatter_list(args: Args, kwargs: Kwargs) -> tuple[Any, int]:
    out = _arg(args, kwargs, 0, "output")
    return out, out.nbytes * len(_arg(args, kwargs, 1, "input_list"))


def _all_to_all_list(args: Args, kwargs: Kwargs) -> tuple[Any, int]:
    tensors = _arg(args, kwargs, 1, "input_tensor_list")
    return (tensors[0] if tensors else None), sum(t.nbytes for t in tensors)


def _no_tensor(args: Args, kwargs: Kwargs) -> tuple[Any, int]:
    return None, 0


#: torch.distributed function -> (op name in OPS, how to find its main tensor and bytes).
FUNCTIONS: dict[str, tuple[str, Callable[[Args, Kwargs], tuple[Any, int]]]] = {
    "all_reduce": ("all_reduce", _one(0, "tensor")),
    "all_gather_single": ("all_gather", _all_gather_into),  # torch >= 2.13's name
    "all_gather_into_tensor": ("all_gather", _all_gather_into),
    "all_gather": ("all_gather", _all_gather_list),
    "reduce_scatter_single": ("reduce_scatter", _one(1, "input")),
    "reduce_scatter_tensor": ("reduce_scatter", _one(1, "input")),
    "reduce_scatter": ("reduce_scatter", _reduce_scatter_list),
    "broadcast": ("broadcast", _one(0, "tensor")),
    "all_to_all_single": ("all_to_all", _one(1, "input")),
    "all_to_all": ("all_to_all", _all_to_all_list),
    "reduce": ("reduce", _one(0, "tensor")),
    "barrier": ("barrier", _no_tensor),
    "monitored_barrier": ("barrier", _no_tensor),  # gloo's barrier that names a late rank
    "gather": ("gather", _one(0, "tensor")),
    "scatter": ("scatter", _one(0, "tensor")),
    "send": ("send", _one(0, "tensor")),
    "recv": ("recv", _one(0, "tensor")),
}


def _tensor_list(args: Args, kwargs: Kwargs) -> tuple[Any, int]:
    """``ProcessGroup.send/recv(self, tensors, peer, tag)``: the first tensor, all their bytes."""
    tensors = args[1] if len(args) > 1 else kwargs.get("tensors", ())
    return (tensors[0] if tensors else None), sum(t.nbytes for t in tensors)


#: Non-blocking point-to-point, wrapped on the ProcessGroup class: ``isend``, ``irecv`` and
#: ``batch_isend_irecv`` reach a backend through these methods whatever function object the
#: job holds (``P2POp`` checks isend/irecv by identity: those functions stay torch's own). Their
#: Works finish only in the job's own wait() on gloo (no future; a second waiter would take the
#: job's completion: it hangs), so on the CPU a record ends when that wait returns
#: (workers.monitor.wait_hook); on a GPU the Python hooks leave them (the Flight Recorder counts
#: NCCL's). A blocking send/recv is timed by its function's wrapper: inside it (``inside``) the
#: method is not timed again.
METHODS: dict[str, str] = {"send": "send", "recv": "recv", "recv_anysource": "recv"}

#: torch.distributed._functional_collectives (DTensor's redistributions, tensor and sequence
#: parallelism): op -> the names its base function has had (the first found is wrapped; the
#: deprecated aliases call it). Each issues one c10d op and returns its output as an
#: AsyncCollectiveTensor that waits (``wait_tensor``) at its first use: on the CPU a record ends
#: when that wait returns (workers.monitor.wait_hook); on a GPU the Flight Recorder sees them.
FUNCOL: dict[str, tuple[str, ...]] = {
    "all_reduce": ("all_reduce",),
    "broadcast": ("broadcast",),
    "all_gather": ("all_gather_single", "all_gather_tensor"),
    "reduce_scatter": ("reduce_scatter_single", "reduce_scatter_tensor"),
    "all_to_all": ("all_to_all_single",),
}
FUNCOL_MODULE = "torch.distributed._functional_collectives"

#: OpSpec.at_wait: how a record of an always-asynchronous call ends (0: not one of those)
WORK_WAIT = 1  # the job's wait() on the returned Work (the ProcessGroup METHODS)
TENSOR_WAIT = 2  # the job's wait on the returned tensor (FUNCOL)


@dataclass(frozen=True)
class OpSpec:
    """One patched function: its op code and where its async_op and group arguments sit
    (``async_pos`` -1: it has none: it blocks (send, recv), or ``at_wait`` says it is always
    asynchronous and finished by the job's own wait (WORK_WAIT, TENSOR_WAIT))."""

    func: str
    op: str
    code: int
    describe: Callable[[Args, Kwargs], tuple[Any, int]]
    async_pos: int
    group_pos: int
    #: nccl-tests S is the described rank's bytes times the group's size (gather, scatter)
    times_group: bool = False
    at_wait: int = 0
    #: a functional collective's group (ranks, a DeviceMesh, a name, ...) -> its ProcessGroup
    resolve: Callable[[Any, Args, Kwargs], Any] | None = None

    def parse(self, args: Args, kwargs: Kwargs) -> tuple[Any, int, Any, bool]:
        """(main tensor or None, bytes, group, async_op) of one call: one pass, no binding."""
        tensor, nbytes = self.describe(args, kwargs)
        n = len(args)
        group = args[self.group_pos] if n > self.group_pos else kwargs.get("group")
        if self.resolve is not None:
            group = self.resolve(group, args[self.group_pos + 1 :], kwargs)
        if self.async_pos < 0:
            return tensor, nbytes, group, bool(self.at_wait)
        is_async = args[self.async_pos] if n > self.async_pos else kwargs.get("async_op", False)
        return tensor, nbytes, group, bool(is_async)


_target: Hooks | None = None
_originals: dict[str, Callable[..., Any]] = {}
_method_originals: dict[str, tuple[type, Any]] = {}
_funcol_originals: dict[str, Callable[..., Any]] = {}
#: Globals outside sys.modules that call torch's functions by their own names (:func:`add_globals`).
_extra_globals: list[dict[str, Any]] = []
#: commtop's own top-level packages: their bindings of torch's functions are never replaced.
OWN_PACKAGES = ("workers", "tui")


def set_target(hooks: Hooks | None) -> None:
    """The monitor the wrappers report to (None: wrappers only call the original)."""
    global _target
    _target = hooks


def patched() -> bool:
    """The wrappers are in (between :func:`patch` and :func:`unpatch`)."""
    return bool(_originals)


def _spec(func: str, original: Callable[..., Any]) -> OpSpec:
    op, describe = FUNCTIONS[func]
    names = list(inspect.signature(original).parameters)
    async_pos = names.index("async_op") if "async_op" in names else -1
    return OpSpec(func, op, OP_INDEX[op], describe, async_pos, names.index("group"), op in ("gather", "scatter"))


def method_spec(name: str) -> OpSpec:
    """The spec of a ProcessGroup method of METHODS: its group is ``self``."""
    op = METHODS[name]
    return OpSpec(f"ProcessGroup.{name}", op, OP_INDEX[op], _tensor_list, -1, 0, at_wait=WORK_WAIT)


def funcol_spec(op: str, func: str, original: Callable[..., Any]) -> OpSpec:
    """The spec of a functional collective: bytes of its input (times the group's size for an
    all_gather, nccl-tests' S), its group resolved to the ProcessGroup."""
    names = list(inspect.signature(original).parameters)
    return OpSpec(
        f"funcol.{func}",
        op,
        OP_INDEX[op],
        _one(0, "self"),
        -1,
        names.index("group"),
        op == "all_gather",
        at_wait=TENSOR_WAIT,
        resolve=_funcol_group,
    )


def _funcol_group(group: Any, rest: Args, kwargs: Kwargs) -> Any:
    """The ProcessGroup of a functional collective's group argument, as torch resolves it; -1
    (not a group: no record, like GroupMember.NON_GROUP_MEMBER) where torch cannot."""
    c10d = sys.modules["torch.distributed.distributed_c10d"]
    if isinstance(group, c10d.ProcessGroup):
        return group
    tag = rest[0] if rest else kwargs.get("tag", "")
    try:
        return _mesh_groups[group]  # a 1-D DeviceMesh seen before (DTensor's usual group): ~5 us less
    except (KeyError, TypeError):
        pass
    try:
        with warnings.catch_warnings():  # torch warns the job about a ranks list itself, once
            warnings.simplefilter("ignore")
            name = sys.modules[FUNCOL_MODULE]._resolve_group_name(group, tag)
        pg = c10d._resolve_process_group(name)
    except Exception:  # noqa: BLE001 - torch raises its own error when the call runs
        return -1
    if not tag and type(group).__name__ == "DeviceMesh":
        try:
            _mesh_groups[group] = pg
        except TypeError:  # not weakly referable or not hashable: resolved each time
            pass
    return pg


#: 1-D DeviceMesh -> its ProcessGroup, held weakly (a mesh that dies leaves; its id is never reused here)
_mesh_groups: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def _wrap(original: Callable[..., Any], spec: OpSpec, compiling: Callable[[], bool]) -> Callable[..., Any]:
    thread = threading.get_ident

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        hooks = _target
        if hooks is None or not hooks.on or compiling():  # torch.compile traces the original
            return original(*args, **kwargs)
        me, inside = thread(), hooks.inside
        if me in inside:
            return original(*args, **kwargs)
        token = hooks.coll_begin(spec, args, kwargs)
        inside.add(me)
        try:
            result = original(*args, **kwargs)  # the job's own errors propagate untouched
        except BaseException:
            hooks.coll_failed(token)  # torch refused it (a bad root, a dtype gloo lacks): nothing was issued
            raise
        finally:
            inside.discard(me)
        hooks.coll_end(token, result)
        return result

    wrapper.__commtop_original__ = original  # type: ignore[attr-defined]
    return wrapper


def patch() -> list[str]:
    """Install the wrappers (idempotent); returns the functions patched."""
    import torch
    import torch.distributed.distributed_c10d as c10d

    compiler = getattr(torch, "compiler", None)
    compiling: Callable[[], bool] = getattr(compiler, "is_compiling", None) or (lambda: False)
    done = []
    for func in FUNCTIONS:
        current = getattr(c10d, func, None)
        if current is None:
            continue
        original = getattr(current, "__commtop_original__", current)
        if func not in _originals:
            _originals[func] = original
            rebind(func, (original, current), _wrap(original, _spec(func, original), compiling))
        done.append(func)
    return done + _patch_methods(c10d.ProcessGroup, compiling) + _patch_funcol(compiling)


def _patch_funcol(compiling: Callable[[], bool]) -> list[str]:
    """Wrap the functional collectives' base functions and their ``wait_tensor``."""
    try:
        import torch.distributed._functional_collectives as funcol
    except Exception:  # noqa: BLE001 - a torch without them: nothing to time
        return []
    done = []
    for op, names in FUNCOL.items():
        func = next((n for n in names if getattr(funcol, n, None) is not None), None)
        if func is None:
            continue
        key = f"funcol.{func}"
        current = getattr(funcol, func)
        original = getattr(current, "__commtop_original__", current)
        if key not in _funcol_originals:  # rebind sets it in the funcol module too (a torch module)
            _funcol_originals[key] = original
            rebind(func, (original,), _wrap(original, funcol_spec(op, func, original), compiling))
        done.append(key)
    if "funcol.wait_tensor" not in _funcol_originals and getattr(funcol, "wait_tensor", None) is not None:
        original = funcol.wait_tensor
        _funcol_originals["funcol.wait_tensor"] = original
        rebind("wait_tensor", (original,), wait_hook.wrap_wait_tensor(original))
    return done


def _patch_methods(pg_class: type, compiling: Callable[[], bool]) -> list[str]:
    done = []
    for name in METHODS:
        original = pg_class.__dict__.get(name)
        if original is None:
            continue
        if name not in _method_originals:
            _method_originals[name] = (pg_class, original)
            setattr(pg_class, name, _wrap(original, method_spec(name), compiling))
        done.append(f"ProcessGroup.{name}")
    return done


def unpatch() -> None:
    """Put the original functions back (tests; a job that wants to stop timing)."""
    wait_hook.unwrap()
    for name, (pg_class, original) in list(_method_originals.items()):
        setattr(pg_class, name, original)
        del _method_originals[name]
    for originals in (_funcol_originals, _originals):  # funcol's keys: "funcol.NAME"
        for key, original in list(originals.items()):
            func = key.removeprefix("funcol.")
            for namespace in _namespaces():
                if getattr(namespace.get(func), "__commtop_original__", None) is original:
                    namespace[func] = original
            del originals[key]


def rebind(name: str, old: tuple[Any, ...], new: Any) -> None:
    """Set ``name`` to ``new`` in every loaded module where it is one of ``old``: torch's own
    modules bind functions at their import (``torch.distributed.device_mesh`` holds its
    ``init_process_group``, DTensor's collective utils their ``broadcast``), and so do a user's
    script and libraries (``from torch.distributed import all_reduce``), so patching
    torch.distributed alone leaves them calling the original. commtop's own packages keep theirs."""
    for namespace in _namespaces():
        held = namespace.get(name)
        if held is not None and any(held is o for o in old):
            namespace[name] = new


def add_globals(fn: Any) -> None:
    """Rebind in ``fn``'s globals too (a partial's function's; once), from the next rebind on.
    A rank that multiprocessing spawned runs its script as ``__mp_main__`` from a copy of the
    script's globals: the functions it calls (the job's) see the original globals, which no
    module in sys.modules holds."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    namespace = getattr(inspect.unwrap(fn), "__globals__", None)
    if isinstance(namespace, dict) and not any(namespace is g for g in _extra_globals):
        _extra_globals.append(namespace)


def _namespaces() -> list[dict[str, Any]]:
    """The loaded modules' globals (commtop's left out) and those :func:`add_globals` added.
    Read through ``__dict__``: no module ``__getattr__`` (lazy imports, deprecation warnings) runs;
    an object in sys.modules without a plain ``__dict__`` is not a caller of torch's functions."""
    found = []
    for mod_name, module in list(sys.modules.items()):
        if module is None or mod_name.partition(".")[0] in OWN_PACKAGES:
            continue
        try:
            namespace = module.__dict__
        except Exception:  # noqa: BLE001, S112 - an odd object in sys.modules
            continue
        if isinstance(namespace, dict):
            found.append(namespace)
    return found + _extra_globals
