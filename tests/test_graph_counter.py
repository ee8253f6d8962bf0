"""Collectives in CUDA graphs are counted (workers.monitor.graphs): NCCL records a collective
issued while a graph is captured and runs it at each replay; torch's Flight Recorder keeps no
entry of it and no hook sees a replay (on the H100 a job that captured one all_gather and
replayed it 7 times had 6 of its 13 runs recorded and missing 0). The replays count; a capture
runs nothing. CI has no GPU: the graph class and
the groups' collective numbers are stand-ins (FakeGraph, a counter the test moves), through the
same wrappers that go on torch.cuda.CUDAGraph."""

from __future__ import annotations

from typing import Any

import pytest

from workers.monitor import graphs


class FakeGraph:
    """What commtop wraps of torch.cuda.CUDAGraph; a capture issues ``issue`` collectives."""

    numbers = [0]  # the rank's groups' collective numbers, summed

    def __init__(self, issue: int) -> None:
        self.issue = issue

    def capture_begin(self, *args: Any, **kwargs: Any) -> None:
        pass

    def capture_end(self) -> None:
        pass

    def replay(self) -> None:
        pass

    def reset(self) -> None:
        pass


def capture(graph: FakeGraph) -> None:
    """As torch.cuda.graph(g) does: begin, the collectives issued into the graph, end."""
    graph.capture_begin()
    FakeGraph.numbers[0] += graph.issue
    graph.capture_end()


@pytest.fixture
def counter() -> Any:
    changes: list[int] = []
    c = graphs.GraphCounter(lambda: changes.append(1), sequences=lambda: {"0": FakeGraph.numbers[0], "1": 7})
    assert graphs.install(c, graph_class=FakeGraph)
    yield c
    graphs.uninstall()
    assert FakeGraph.replay.__name__ == "replay" and not hasattr(FakeGraph.replay, "__wrapped__")


def test_a_graphs_collectives_count_at_each_replay_not_at_its_capture(counter) -> None:
    g, empty = FakeGraph(issue=2), FakeGraph(issue=0)
    capture(g)
    capture(empty)
    FakeGraph.numbers[0] += 5  # eager collectives between: not the graphs'
    for _ in range(7):
        g.replay()
    empty.replay()
    assert (counter.captured, counter.replayed, counter.graphs, counter.lost) == (2, 14, 1, 14)  # what ran
    assert counter.captured_on == {"0": 2} and not counter.capturing  # by group, for workers.monitor.unseen


def test_a_reset_graph_counts_nothing_more_and_a_stopped_counter_nothing_at_all(counter) -> None:
    g = FakeGraph(issue=1)
    capture(g)
    g.replay()
    g.reset()
    g.replay()
    assert counter.lost == 1
    graphs.stop(counter)
    capture(FakeGraph(issue=3))
    assert counter.lost == 1
