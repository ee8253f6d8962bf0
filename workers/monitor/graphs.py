"""Collectives inside CUDA graphs, counted: NCCL only records a collective issued while its stream
is captured into a CUDA graph, and runs it again at every replay of the graph. torch's Flight
Recorder keeps no entry of it (``initWork`` records only what it enqueues) and no Python hook
sees a replay, so without this they were neither recorded nor counted.

Every c10d collective numbers itself on its process group, captured or not
(``ProcessGroup._get_sequence_number_for_group``). :class:`GraphCounter` wraps
``torch.cuda.CUDAGraph``'s ``capture_begin``, ``capture_end`` and ``replay``: the groups'
numbers moved by N during a capture means N collectives are in the graph, and each replay runs
those N. A capture runs nothing (NCCL records the launch), so the replays' count as lost (the
Hello's ``lost``, shown as missing: Timers reads :attr:`GraphCounter.lost`) and the capture's do
not: recorded + missing is what ran, and a function under ``torch.compile(mode="reduce-overhead")``
counts one collective per call (its second call captures, then replays). A wrapper costs a dict
lookup per replay; a capture reads each group's number twice.

Not counted: point-to-point sends and receives captured in a graph (numbered apart), and a
collective another thread issues on another stream while a graph is captured counts as the
graph's (its number moves too).
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any

log = logging.getLogger("commtop.monitor")

#: Graphs whose count is remembered (beyond: a replay of a forgotten graph counts nothing).
MAX_GRAPHS = 4096


class GraphCounter:
    """Counts the collectives of captures and replays (``captured``, ``replayed``), calling
    ``changed`` after each count. ``sequences`` gives the collective number of each of the rank's
    process groups by name; tests give stand-ins for both."""

    def __init__(self, changed: Callable[[], None], sequences: Callable[[], dict[str, int]] | None = None) -> None:
        self.changed = changed
        self.sequences = sequences or all_group_sequences
        self.captured = 0  # collectives issued while a graph was captured
        self.replayed = 0  # collectives graph replays issued again
        self.graphs = 0  # graphs captured with collectives in them
        #: group name -> collectives captured on it (workers.monitor.unseen leaves them to this count)
        self.captured_on: dict[str, int] = {}
        self._lock = threading.Lock()
        self._before: dict[int, dict[str, int]] = {}  # id(graph) -> the groups' numbers at capture_begin
        self._in_graph: dict[int, int] = {}  # id(graph) -> its collectives

    def begin(self, graph: Any) -> None:
        number = self.sequences()
        with self._lock:
            self._before[id(graph)] = number

    @property
    def capturing(self) -> bool:
        """A graph is being captured now (its collectives are numbered, not yet counted)."""
        return bool(self._before)

    def end(self, graph: Any) -> None:
        numbers = self.sequences()
        with self._lock:
            before = self._before.pop(id(graph), None) or {}
            moved = {name: n - before[name] for name, n in numbers.items() if n > before.get(name, n)}
            n = sum(moved.values())
            for name, m in moved.items():
                self.captured_on[name] = self.captured_on.get(name, 0) + m
            if n == 0:
                self._in_graph.pop(id(graph), None)
                return
            if len(self._in_graph) < MAX_GRAPHS:
                self._in_graph[id(graph)] = n
            self.captured += n
            self.graphs += 1
        self.changed()

    def replay(self, graph: Any) -> None:
        n = self._in_graph.get(id(graph), 0)
        if n:
            with self._lock:
                self.replayed += n
            self.changed()

    @property
    def lost(self) -> int:
        """Collectives graphs ran (their replays): none was recorded. A capture runs none."""
        return self.replayed

    def forget(self, graph: Any) -> None:
        """``reset()``: the graph's id may be reused by another object."""
        with self._lock:
            self._in_graph.pop(id(graph), None)


def say_lost(rank: int, counter: GraphCounter | None, hooks_captured: int) -> None:
    """The rank's one line at its end about the collectives of its CUDA graphs (none: nothing).
    ``hooks_captured``: what the hooks saw issued during captures, where no counter was in."""
    if counter is not None and counter.lost:
        log.warning(
            "commtop monitor: rank %d: %d collectives run by the replays of %d CUDA graph(s) (%d captured in them; "
            "a capture runs none): not timed (NCCL runs them inside the graph), counted as missing",
            rank,
            counter.replayed,
            counter.graphs,
            counter.captured,
        )
    elif counter is None and hooks_captured:
        log.warning(
            "commtop monitor: rank %d: %d collectives were issued while a CUDA graph was captured: not timed "
            "(counted as missing); each replay of the graph runs them again, unseen by commtop",
            rank,
            hooks_captured,
        )


def all_group_sequences() -> dict[str, int]:
    """The collective number of every process group this rank is in, by name: its CUDA
    backend's (NCCL's: what a graph captures) where it has one, else the group's default."""
    import torch
    import torch.distributed.distributed_c10d as c10d

    return _sequences(dict(c10d._world.pg_names).items(), torch.device("cuda"))


def _sequences(groups: Iterable[tuple[Any, str]], cuda: Any) -> dict[str, int]:
    numbers: dict[str, int] = {}
    for pg, name in groups:
        try:
            try:
                backend = pg._get_backend(cuda)
            except Exception:  # noqa: BLE001 - a CPU-only group: its own number
                backend = pg
            numbers[name] = int(backend._get_sequence_number_for_group())
        except Exception:  # noqa: BLE001 - a group that cannot say (destroyed, a fake backend)
            continue
    return numbers


_target: GraphCounter | None = None
#: class -> {method name: (its method, whether the class itself defined it)}, per class wrapped
#: (torch.cuda.CUDAGraph; tests' stand-ins)
_originals: dict[Any, dict[str, tuple[Any, bool]]] = {}
_HOOKS = (("capture_begin", "begin"), ("capture_end", "end"), ("replay", "replay"), ("reset", "forget"))


def install(counter: GraphCounter, graph_class: Any = None) -> bool:
    """Count into ``counter`` from now on (wrapping ``graph_class``, torch.cuda.CUDAGraph by
    default, once). False where there is no such class."""
    global _target
    if graph_class is None:
        try:
            import torch.cuda.graphs as torch_graphs
        except Exception:  # noqa: BLE001 - a torch without CUDA graphs
            return False
        graph_class = getattr(torch_graphs, "CUDAGraph", None)
        if graph_class is None:
            return False
    if graph_class not in _originals:
        kept = _originals[graph_class] = {}
        for name, hook in _HOOKS:
            original = getattr(graph_class, name, None)  # its own, or its C++ base's (replay)
            if original is None:
                continue
            kept[name] = (original, name in graph_class.__dict__)
            setattr(graph_class, name, _wrap(original, hook, before=name != "capture_end"))
    _target = counter
    return True


def stop(counter: GraphCounter) -> None:
    """``counter`` counts no more (its monitor closed); the wrappers stay, passing through."""
    global _target
    if _target is counter:
        _target = None


def uninstall() -> None:
    """Stop counting and put the classes' own methods back (tests)."""
    global _target
    _target = None
    for graph_class, kept in list(_originals.items()):
        for name, (original, own) in kept.items():
            if own:
                setattr(graph_class, name, original)
            else:
                delattr(graph_class, name)  # the base's method shows through again
    _originals.clear()


def _wrap(original: Callable[..., Any], hook: str, before: bool) -> Callable[..., Any]:
    """``hook`` of the counter before the method (the numbers at capture_begin, a replay) or
    after it (capture_end: the captured collectives are all issued)."""

    @functools.wraps(original)
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        counter = _target
        if counter is not None and before:
            _call(counter, hook, self)
        result = original(self, *args, **kwargs)
        if counter is not None and not before:
            _call(counter, hook, self)
        return result

    return method


def _call(counter: GraphCounter, hook: str, graph: Any) -> None:
    try:
        getattr(counter, hook)(graph)
    except Exception:  # noqa: BLE001 - never into the job
        pass
