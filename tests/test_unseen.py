"""What torch issues on a gloo group out of the Python hooks' sight counts as lost (workers.monitor.unseen).

In one process on real gloo (world size 1): DDP's constructor, ``all_reduce_coalesced`` and a
functional collective's backward issue collectives no wrapper sees; the reference is
torch.profiler's count of the ``c10d::`` ops the dispatcher ran, never commtop's. The rules that
keep the count from ever exceeding what was missed are checked on named fakes.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.distributed import distributed_c10d as c10d

from workers import monitor
from workers.monitor.unseen import Unseen, kinds_of, only_gloo, say_missed
from workers.rank.groups import GroupTable
from workers.wire import connection as connections
from workers.wire.protocol import MAX_GROUPS


@pytest.fixture(scope="module", autouse=True)
def world_of_one() -> Iterator[None]:
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.fixture()
def mon(conn: connections.Connection, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    m = monitor.start(conn.path, sampler=False)
    monitor.patch_distributed()
    yield m
    monitor.stop()
    monitor.unpatch_distributed()


def c10d_ops(prof: Any) -> int:
    """The collectives the dispatcher ran (waits are not collectives)."""
    names = collections.Counter(e.name for e in prof.events() if e.name.startswith("c10d::"))
    return sum(n for name, n in names.items() if "wait" not in name)


def out_of_sight(steps: int) -> None:
    """A job's steps with collectives the wrappers see and ones torch issues underneath."""
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4))  # its set-up: C++
    for _ in range(steps):
        model(torch.randn(2, 4)).sum().backward()  # the bucket's all_reduce: a comm hook (seen)
        dist.all_reduce(torch.ones(8))  # seen
        dist.reduce_scatter(torch.empty(4), [torch.ones(4)])  # seen
        dist.all_reduce_coalesced([torch.ones(3), torch.ones(2)])  # not wrapped
        x = torch.ones(4, requires_grad=True)
        funcol.all_reduce(x, "sum", dist.group.WORLD).sum().backward()  # forward seen, backward not


def test_what_torch_issued_out_of_sight_is_counted_lost_beside_what_was_recorded(mon) -> None:
    from workers.capture import fallback

    fallback.patch_ddp()  # as `commtop run` does on gloo: DDP's buckets through a comm hook
    steps = 3
    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
    with prof:
        out_of_sight(steps)
    mon.count_unseen()
    issued = c10d_ops(prof)
    recorded = mon.timers.iteration
    assert mon.status.lost == issued - recorded
    assert mon.status.lost >= 2 * steps + 1  # a coalesced all_reduce and a backward per step, DDP's set-up
    name = c10d._get_process_group_name(dist.group.WORLD)
    assert mon.timers.unseen.missed == {name: mon.status.lost}


def test_a_refused_call_and_a_coalescing_block_never_count_as_lost(mon) -> None:
    """torch refuses a call before numbering it: its count is given back. In a coalescing block
    the hooks see two all_reduces where gloo issues one: a lower read keeps the higher count."""
    dist.all_reduce_coalesced([torch.ones(3)])  # one out of sight
    mon.count_unseen()
    assert mon.status.lost == 1
    with pytest.raises((RuntimeError, ValueError)):
        dist.broadcast(torch.ones(4), src=7)
    for _ in range(3):
        with c10d._coalescing_manager(async_ops=True) as block:
            dist.all_reduce(torch.ones(4))
            dist.all_reduce(torch.ones(4))
        block.wait()
    mon.close()  # the last read, at close
    assert mon.status.lost == 1


def test_a_call_that_failed_after_torch_issued_it_counts_as_failed_not_as_unseen(mon, caplog) -> None:
    """A peer gone or a timeout fails a call torch already numbered; a bad root is refused before.
    gloo's all_to_all_single with splits that do not add up is numbered, then fails its own check
    (deterministic in one process, as a dead peer is not): lost 1, said as failed, not unseen."""
    with pytest.raises((RuntimeError, ValueError)):
        dist.broadcast(torch.ones(4), src=7)  # refused: not numbered, not counted
    mon.count_unseen()
    assert mon.status.lost == 0
    with pytest.raises(RuntimeError):
        dist.all_to_all_single(torch.empty(3), torch.ones(4), [3], [4])
    dist.all_reduce(torch.ones(2))
    with caplog.at_level(logging.WARNING):
        mon.close()
    assert mon.status.lost == 1 and mon.timers.unseen.total == 0 and mon.timers.failed[0] == 1
    assert "1 collective failed inside torch once issued (the last: RuntimeError:" in caplog.text
    assert "not seen by the Python hooks" not in caplog.text


def test_only_what_comes_while_the_hooks_are_in_is_compared(mon) -> None:
    """Unpatched, every number torch gives would read as missed: no read happens; patched again,
    what came before is nobody's miss (a script that starts the monitor after collectives)."""
    monitor.unpatch_distributed()
    for _ in range(4):
        dist.all_reduce(torch.ones(4))
        dist.all_reduce_coalesced([torch.ones(2)])
    mon.count_unseen()
    assert mon.status.lost == 0
    monitor.patch_distributed()
    mon.count_unseen()
    assert mon.status.lost == 0
    dist.all_reduce_coalesced([torch.ones(2)])
    mon.count_unseen()
    assert mon.status.lost == 1


class ProcessGroupGloo:
    """Fake gloo backend (only its class name is read)."""


class FakeNcclBackend:
    """Fake backend of a kind the count does not read (only its class name is read)."""


class ProcessGroupNCCL:
    """Fake NCCL backend: its own number (the CUDA side of a mixed group)."""

    def __init__(self, issued: int = 0) -> None:
        self.issued = issued

    def _get_sequence_number_for_group(self) -> int:
        return self.issued


class FakeGroup:
    """Fake process group: torch's number of what it issued, set by the test."""

    def __init__(self, backend: object, issued: int = 0) -> None:
        self.backend = backend
        self.issued = issued
        self._device_types = ["cpu"]

    def _get_backend(self, _device: object) -> object:
        return self.backend

    def _get_sequence_number_for_group(self) -> int:
        return self.issued


@pytest.fixture()
def fake_c10d(monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    """A fake torch.distributed.distributed_c10d holding the fake groups by name."""
    world = SimpleNamespace(pg_names={})
    fake = SimpleNamespace(_world=world, _get_process_group_name=lambda pg: world.pg_names[pg])
    monkeypatch.setitem(__import__("sys").modules, "torch.distributed.distributed_c10d", fake)
    return fake


def test_a_read_while_a_call_is_in_flight_counts_nothing_and_a_group_only_grows(fake_c10d) -> None:
    gloo, nccl = FakeGroup(ProcessGroupGloo()), FakeGroup(FakeNcclBackend(), issued=50)
    fake_c10d._world.pg_names.update({gloo: "g", nccl: "n"})
    groups = GroupTable()
    code = groups.code("g", "", 2)
    unseen = Unseen(groups)
    assert only_gloo(gloo) and not only_gloo(nccl)
    unseen.seen[code] += 1  # a hook counted its call; torch has not numbered it yet
    assert unseen.read() == 0
    gloo.issued = 1 + 3  # that call, and three out of sight
    assert unseen.read() == 3
    unseen.seen[code] += 2  # two the hooks saw that gloo issued as one
    gloo.issued += 1
    assert unseen.read() == 3 and unseen.missed == {"g": 3}  # the NCCL group is never read


def a_gloo_group_of_three(fake_c10d: SimpleNamespace) -> tuple[FakeGroup, GroupTable, int, Unseen]:
    """A fake gloo group named "g" (3 ranks), its code in a new table, and an Unseen over it."""
    gloo = FakeGroup(ProcessGroupGloo())
    fake_c10d._world.pg_names[gloo] = "g"
    groups = GroupTable()
    return gloo, groups, groups.code("g", "", 3), Unseen(groups)


def test_the_first_call_on_a_group_measures_what_one_call_issues(fake_c10d) -> None:
    gloo, groups, code, unseen = a_gloo_group_of_three(fake_c10d)
    pending = unseen.calibrate("monitored_barrier", code, gloo)
    unseen.seen[code] += 1  # what Timers.coll_begin counts before the call
    assert pending is not None
    gloo.issued += 4  # rank 0 of three: two receives, two sends
    unseen.calibrated(pending)
    assert unseen.issued["monitored_barrier"][code] == 4 and unseen.seen[code] == 4
    assert unseen.read() == 0
    nccl = FakeGroup(FakeNcclBackend())
    fake_c10d._world.pg_names[nccl] = "n"
    assert unseen.calibrate("all_reduce", groups.code("n", "", 2), nccl) is None  # 1 a call, unread
    assert len(unseen.issued["all_reduce"]) == MAX_GROUPS + 1


def test_under_the_flight_recorder_capture_every_gloo_collective_counts(mon) -> None:
    """The Flight Recorder capture times NCCL's collectives with no hook in: a gloo side group's
    (CPU object collectives, a checkpointer's group) are all counted, beside what it lost itself."""
    monitor.unpatch_distributed()  # as workers.capture.bootstrap leaves it on that path
    mon.gloo_untimed()
    for _ in range(3):
        dist.all_reduce(torch.ones(4))
    mon.capture_lost(2)
    mon.count_unseen()
    assert mon.status.lost == 3 + 2


def test_a_read_while_a_first_call_is_measured_leaves_its_group_as_it_was(fake_c10d) -> None:
    """Under the Flight Recorder capture reads come from the capture thread: one in the middle of a
    call being measured (gloo has numbered part of a monitored_barrier's ops, the hooks counted
    1) must not count the rest as missed."""
    gloo, groups, code, unseen = a_gloo_group_of_three(fake_c10d)
    pending = unseen.calibrate("monitored_barrier", code, gloo)
    unseen.seen[code] += 1
    gloo.issued += 3  # three of its four ops so far
    assert pending is not None and unseen.read() == 0
    gloo.issued += 1
    unseen.calibrated(pending)
    gloo.issued += 2  # two out of sight
    assert unseen.read() == 2
    again = unseen.calibrate("barrier", code, gloo)
    assert again is not None
    unseen.abandon(again)  # the call raised: measured again at its next call
    assert unseen.issued["barrier"][code] == 0 and unseen.read() == 2


def test_nccl_groups_count_while_the_hooks_time_them_and_a_mixed_group_sums_its_backends(fake_c10d) -> None:
    """Under the Python hooks on NCCL (forced, or no Flight Recorder) DDP's C++ collectives and
    compiled ones are numbered by NCCL and never seen: counted. Under the Flight Recorder capture
    NCCL's are its ring's: never read."""
    nccl = FakeGroup(ProcessGroupNCCL(), issued=4)
    mixed = FakeGroup(ProcessGroupGloo(), issued=-1)  # the group's own number is not read: its backends'
    mixed._device_types = ["cpu", "cuda"]
    gloo_side, cuda_side = ProcessGroupGloo(), ProcessGroupNCCL(issued=2)
    gloo_side._get_sequence_number_for_group = lambda: 3  # type: ignore[attr-defined]
    mixed._get_backend = lambda device: gloo_side if device.type == "cpu" else cuda_side  # type: ignore[method-assign]
    fake_c10d._world.pg_names.update({nccl: "n", mixed: "m"})
    assert kinds_of(nccl) == ("nccl",) and kinds_of(mixed) == ("gloo", "nccl")
    groups = GroupTable()
    n_code, m_code = groups.code("n", "", 1), groups.code("m", "", 1)
    unseen = Unseen(groups)
    unseen.baseline()  # what they issued before the hooks went in: nobody's miss
    nccl.issued += 5  # DDP's set-up and buckets: out of sight
    unseen.seen[n_code] += 1  # one the hooks saw ...
    nccl.issued += 1  # ... NCCL numbered
    cuda_side.issued += 2  # two on the CUDA side out of sight, one on the CPU side seen
    gloo_side._get_sequence_number_for_group = lambda: 4  # type: ignore[attr-defined]
    unseen.seen[m_code] += 1
    assert unseen.read() == 5 + 2 and unseen.missed == {"n": 5, "m": 2}
    assert unseen.numbered_apart(n_code, nccl) and not unseen.is_gloo(n_code, nccl)

    flight_recorder = Unseen(groups)
    flight_recorder.nccl_too = False  # Monitor.time_gloo_groups: NCCL's are the Flight Recorder's
    flight_recorder.baseline()
    nccl.issued += 9
    assert flight_recorder.read() == 0 and flight_recorder.missed == {}


def test_collectives_a_cuda_graph_captured_are_the_graph_counters_not_missed(fake_c10d) -> None:
    """A collective issued while a graph is captured moves its group's number, seen by a hook
    or not: it is the graph counter's (which counts its replays: a capture runs nothing), never
    missed; no read is taken meanwhile."""
    from workers.monitor.graphs import GraphCounter

    nccl = FakeGroup(ProcessGroupNCCL())
    fake_c10d._world.pg_names[nccl] = "n"
    groups = GroupTable()
    code = groups.code("n", "", 1)
    counter = GraphCounter(lambda: None, sequences=lambda: {"n": nccl.issued})
    unseen = Unseen(groups)
    unseen.graphs = counter
    graph = object()
    counter.begin(graph)
    nccl.issued += 3  # three captured (a hook saw none: it takes no count on a capturing stream)
    assert counter.capturing and unseen.read() == 0 and unseen.missed == {}
    counter.end(graph)
    assert counter.captured == 3 and unseen.read() == 0
    nccl.issued += 2  # two eager ones out of sight
    assert unseen.seen[code] == 0 and unseen.read() == 2 and counter.lost + unseen.total == 0 + 2
    counter.replay(graph)  # its three run
    assert unseen.read() == 2 and counter.lost + unseen.total == 3 + 2


def test_groups_made_again_after_destroy_count_from_zero_and_keep_what_the_gone_ones_missed(fake_c10d, caplog) -> None:
    """``destroy_process_group()`` then ``init_process_group()`` (an evaluation phase, a test
    harness): torch names the new default group "0" again and its number starts at 0. Phase 1's
    count of the hooks on that name hid phase 2's misses (QA: 21 + 0 of 25, all_reduce_coalesced)."""
    phase1 = FakeGroup(ProcessGroupGloo())
    fake_c10d._world.pg_names[phase1] = "0"
    groups = GroupTable()
    code = groups.code("0", "default_pg", 2)
    unseen = Unseen(groups)
    unseen.seen[code] += 9  # phase 1: nine the hooks saw
    phase1.issued = 9 + 2  # and two out of sight
    assert unseen.read() == 2
    fake_c10d._world.pg_names.clear()  # destroy_process_group(): every group goes, after that read
    unseen.forget_groups()
    phase2 = FakeGroup(ProcessGroupGloo())
    fake_c10d._world.pg_names[phase2] = "0"  # the same name, numbered from 0
    assert groups.code("0", "default_pg", 2) == code
    unseen.seen[code] += 4  # phase 2: four seen
    phase2.issued = 4 + 4  # and four all_reduce_coalesced out of sight
    assert unseen.read() == 2 + 4
    with caplog.at_level(logging.WARNING, logger="commtop.monitor"):
        say_missed(0, unseen, groups.table, gloo_only=True)
    assert "6 collectives torch issued" in caplog.text and f"(6 on {code}:default_pg)" in caplog.text


def test_no_read_counts_before_the_baseline(fake_c10d) -> None:
    """A monitor's idle flush thread may read between the hooks going in and their baseline: what
    the group issued before would read as missed, and a group's count only grows (seen on a loaded
    run of the suite: 23 where 1 was missed)."""
    gloo = FakeGroup(ProcessGroupGloo(), issued=22)  # issued before the hooks went in
    fake_c10d._world.pg_names[gloo] = "g"
    groups = GroupTable()
    groups.code("g", "", 2)
    unseen = Unseen(groups)
    unseen.baselined = False  # as Monitor starts it
    assert unseen.read() == 0 and unseen.missed == {}
    unseen.baseline()
    gloo.issued += 1  # one out of sight
    assert unseen.read() == 1


def test_a_warning_of_ddps_constructor_names_the_jobs_line_not_commtops_wrapper(mon) -> None:
    import inspect
    import warnings

    from workers.capture import fallback

    fallback.patch_ddp()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = inspect.currentframe().f_lineno + 1  # type: ignore[union-attr]
        torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4), broadcast_buffers=True)
    said = [w for w in caught if "broadcast_buffers" in str(w.message)]
    assert said, "torch no longer warns of broadcast_buffers: pick another of its constructor's warnings"
    assert [(w.filename, w.lineno) for w in said] == [(__file__, line)]
