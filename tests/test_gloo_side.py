"""A GPU job's gloo side groups under the Flight Recorder capture (workers.capture.gloo_side), on the CPU.

In one process on real gloo (world size 1), real ZeroMQ: the wrappers go in when the job makes
its first gloo group; in their gloo-only mode a collective on a group that is not gloo's (named
so by a fake: these machines have no NCCL) is left to the Flight Recorder, and the hooks' records
and the Flight Recorder's take their iterations from one numbering, so no iteration comes twice
and none is missing.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from tui.ingest.sources import LiveSource
from workers import monitor
from workers.capture import gloo_side
from workers.monitor.unseen import Unseen
from workers.wire import connection as connections
from workers.wire import protocol


@pytest.fixture(scope="module", autouse=True)
def world_of_one() -> Iterator[None]:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.fixture()
def source(conn: connections.Connection) -> Iterator[LiveSource]:
    src = LiveSource(conn)  # before the monitor: it sends only once a peer is there
    yield src
    src.close()


@pytest.fixture()
def mon(conn: connections.Connection, source: LiveSource, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    m = monitor.start(conn.path, wait_s=2.0, sampler=False)
    yield m
    monitor.stop()
    monitor.unpatch_distributed()


def coll_columns(source: LiveSource, timeout_s: float = 5.0) -> dict[str, np.ndarray]:
    out: list[Any] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not any(isinstance(m, protocol.Bye) for m in out):
        out += source.poll(0.05)
    batches = [m for m in out if isinstance(m, protocol.Batch) and m.kind == protocol.COLL and len(m)]
    return {k: np.concatenate([b.columns[k] for b in batches]) for k in batches[0].columns}


def test_the_wrappers_go_in_when_the_job_makes_its_first_gloo_group(monkeypatch) -> None:
    monkeypatch.setattr(c10d, "_new_group_with_tag", c10d._new_group_with_tag)  # put back after
    calls: list[int] = []
    monkeypatch.setattr(gloo_side, "only_gloo", lambda pg: False)  # as if the default group were NCCL's
    gloo_side.install(lambda: calls.append(1))
    assert calls == []
    monkeypatch.setattr(gloo_side, "only_gloo", lambda pg: True)
    dist.new_group([0], backend="gloo")
    dist.new_group([0], backend="gloo")
    assert calls == [1]  # once
    gloo_side.install(lambda: calls.append(2))  # a gloo group exists now: at once
    assert calls == [1, 2]


def test_gloo_only_hooks_leave_other_groups_alone_and_share_the_numbering(mon, source, monkeypatch) -> None:
    nccl_like = dist.new_group([0], backend="gloo")  # named NCCL's by the fake below
    real_is_gloo = Unseen.is_gloo
    monkeypatch.setattr(Unseen, "is_gloo", lambda self, code, g: g is not nccl_like and real_is_gloo(self, code, g))
    mon.time_gloo_groups()
    assert mon.timers.gloo_only and monitor.patch.patched()
    t = torch.ones(16)
    dist.all_reduce(t)  # 0
    dist.all_reduce(t, group=nccl_like)  # the Flight Recorder's: no record, no iteration
    dist.all_reduce(t)  # 1
    assert mon.take_iterations(5) == 2  # the capture thread's records: 2..6
    dist.all_reduce(t)  # 7
    with pytest.raises((RuntimeError, ValueError)):
        dist.broadcast(t, src=7)  # refused: takes 8, gives it back
    assert mon.take_iterations(2) == 8
    dist.all_reduce(t)  # 10
    spec = monitor.patch._spec("all_reduce", monitor.patch._originals["all_reduce"])
    token = mon.coll_begin(spec, (t,), {})  # 11: a call begun; the capture thread takes 12..14 before it fails
    assert mon.take_iterations(3) == 12
    mon.coll_failed(token)
    dist.all_reduce(t)  # 11, the spare
    dist.all_reduce(t)  # 15
    monitor.stop()
    coll = coll_columns(source)
    assert sorted(coll["iteration"].tolist()) == [0, 1, 7, 10, 11, 15]
    assert set(coll["group"].tolist()) == {protocol.WORLD_GROUP}
