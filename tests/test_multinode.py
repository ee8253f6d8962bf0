"""Two torchrun "nodes" on this machine (``--nnodes 2``, c10d rendezvous on localhost), told
apart by COMMTOP_HOSTNAME, feeding one collector over TCP (``--listen`` / ``--connect``):
ranks carry their node's name, each node's sampler reports its own host, and the clock
offset between the two "hosts" (one machine, one clock) is estimated as ~0."""

from __future__ import annotations

import shutil
import signal
import time

import pytest
from synthetic_ranks import SMALL_JOB, child_env, open_tcp_collector, short_runtime_dir, start_job

from tui.ingest.loop import IngestLoop

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(150)]  # starts processes


def test_two_nodes_one_collector_ranks_and_telemetry_per_host(monkeypatch: pytest.MonkeyPatch) -> None:
    rt = short_runtime_dir()
    monkeypatch.setenv("COMMTOP_RUNTIME_DIR", rt)
    conn, collector, rdzv = open_tcp_collector()
    data = conn.data
    loop = IngestLoop(collector.source, collector.model, sinks=collector.sinks)
    loop.start()
    jobs = []
    try:
        for node, host in enumerate(("node-a", "node-b")):
            launch = f"--nnodes 2 --node-rank {node} --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:{rdzv} --rdzv-id mn"
            env = child_env(rt, COMMTOP_HOSTNAME=host)
            jobs.append(start_job(conn.path, env, *SMALL_JOB, "--connect", data, nproc=1, node=launch))
        deadline = time.monotonic() + 90
        snap = loop.snapshot()
        while time.monotonic() < deadline:
            snap = loop.snapshot()
            hosts = {h.host for h in snap.telemetry.hosts} if snap.telemetry is not None else set()
            if (
                len(snap.ranks) == 2
                and all(r.count > 500 for r in snap.ranks)
                and {"node-a", "node-b"} <= hosts
                and len(snap.clock_offsets_ms) == 2
            ):
                break
            time.sleep(0.2)
        by_host = {r.host: r.rank for r in snap.ranks}
        tel = {h.host: h for h in snap.telemetry.hosts}
        pids = {r.rank: r.pid for r in snap.ranks}
        print(
            f"\n[2 nodes] ranks by host {by_host}; counts {[r.count for r in snap.ranks]}; telemetry hosts "
            f"{sorted(tel)} with worker pids {[sorted(tel[h].procs) for h in sorted(tel)]}; clock offsets "
            f"{snap.clock_offsets_ms} (reference {snap.clock_ref})"
        )
        assert sorted(by_host) == ["node-a", "node-b"] and sorted(by_host.values()) == [0, 1]
        assert snap.world_size == 2
        # Each node's sampler reports its own host and sees its own worker.
        for host, rank in by_host.items():
            assert pids[rank] in tel[host].procs
            assert snap.telemetry.proc_status(host, pids[rank]) in ("running", "sleeping")
        # One machine, one clock: the estimate from collective end times is ~0.
        assert snap.clock_ref in by_host
        assert all(abs(v) < 5.0 for v in snap.clock_offsets_ms.values())
    finally:
        for job in jobs:
            job.signal(signal.SIGTERM)
        for job in jobs:
            try:
                job.wait(30)
            finally:
                job.kill_all()
        loop.stop()
        loop.join(2)
        collector.close()
        shutil.rmtree(rt, ignore_errors=True)
