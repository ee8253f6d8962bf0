"""Real runs with `--prometheus 127.0.0.1:0`: real gloo ranks under torchrun, the real node
sampler serving HTTP, scraped with urllib and parsed with prometheus_client.parser.

The exporter keeps serving for $COMMTOP_PROMETHEUS_LINGER_S after its ranks exit, so the last
scrape reads a finished run's final counts, which are compared with the run's recording (and
with the collector's counts for two "nodes")."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families
from synthetic_ranks import REPO, SMALL_JOB, child_env, open_tcp_collector, short_runtime_dir, start_job
from test_prometheus_metrics import dashboard_queries

from tui.ingest.loop import IngestLoop
from tui.recordings.reader import open_recording

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]  # starts processes
ITERS = 1500
LINGER = {"COMMTOP_PROMETHEUS_LINGER_S": "60"}


def endpoint_files(runtime: str) -> dict[str, dict]:
    """host -> {"url", "host", "pid"}: what each node's sampler wrote beside the connection file."""
    out = {}
    for path in Path(runtime).glob("*/prometheus-*.json"):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        out[data["host"]] = data
    return out


def scrape(url: str) -> dict[str, list]:
    with urllib.request.urlopen(url, timeout=10) as reply:
        text = reply.read().decode()
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def per_rank(fams: dict[str, list], family: str, sample: str) -> dict[int, float]:
    out: dict[int, float] = {}
    for s in fams.get(family, []):
        if s.name == sample:
            out[int(s.labels["rank"])] = out.get(int(s.labels["rank"]), 0.0) + s.value
    return out


def stop_exporters(runtime: str, pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    shutil.rmtree(runtime, ignore_errors=True)


def test_two_scrapes_of_a_real_run_match_its_recording(tmp_path: Path) -> None:
    runtime = short_runtime_dir()
    env = child_env(runtime, **LINGER)
    record = tmp_path / "run.commtop"
    argv = [sys.executable, "-m", "tui.cli", "run", "--headless", "--nproc", "2", "--prometheus", "127.0.0.1:0"]
    argv += ["--record", str(record), "--iters", str(ITERS), *SMALL_JOB]
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pids: list[int] = []
    try:
        deadline = time.monotonic() + 90
        first: dict[str, list] = {}
        while time.monotonic() < deadline:  # a loaded machine may finish the run first: the endpoint lingers
            if proc.poll() not in (None, 0):
                break  # failed: its stderr is asserted below
            found = endpoint_files(runtime)
            if found:
                (info,) = found.values()
                pids = [info["pid"]]
                first = scrape(info["url"])
                if sum(
                    per_rank(
                        first, "commtop_collective_duration_seconds", "commtop_collective_duration_seconds_count"
                    ).values()
                ):
                    break
            time.sleep(0.05)
        out, err = proc.communicate(timeout=150)
        assert proc.returncode == 0, err[-2000:]
        assert first, f"no endpoint found while the run ran; stderr: {err[-1000:]}"
        (info,) = endpoint_files(runtime).values()  # still served: the exporter lingers
        assert info["url"].startswith("http://127.0.0.1:")
        second = scrape(info["url"])

        count = "commtop_collective_duration_seconds_count"
        c1 = per_rank(first, "commtop_collective_duration_seconds", count)
        c2 = per_rank(second, "commtop_collective_duration_seconds", count)
        tables = open_recording(record).tables()
        recorded = {r: int((tables.coll["rank"] == r).sum()) for r in (0, 1)}
        copies = {r: int((tables.copy["rank"] == r).sum()) for r in (0, 1)}
        print(f"\n[prometheus] first scrape {c1}, second {c2}, recording {recorded} collectives, {copies} copies")
        # every rank sent exactly ITERS collectives; the endpoint counted each once, as did the recording
        assert recorded == {0: ITERS, 1: ITERS}
        assert c2 == {0: ITERS, 1: ITERS}
        assert all(c2[r] - c1.get(r, 0) == recorded[r] - c1.get(r, 0) >= 0 for r in (0, 1))
        assert sum(c1.values()) > 0
        nbytes = int(tables.coll["nbytes"][0])
        assert per_rank(second, "commtop_collective_bytes", "commtop_collective_bytes_total") == {
            r: float(ITERS * nbytes) for r in (0, 1)
        }
        got_copies = per_rank(second, "commtop_copy_duration_seconds", "commtop_copy_duration_seconds_count")
        assert got_copies == {r: float(copies[r]) for r in (0, 1)}
        copy_bytes = per_rank(second, "commtop_copy_bytes", "commtop_copy_bytes_total")
        assert copy_bytes == {r: float(tables.copy["nbytes"][tables.copy["rank"] == r].sum()) for r in (0, 1)}
        # the histogram's sum is the recorded durations' sum
        dur_sum = per_rank(second, "commtop_collective_duration_seconds", "commtop_collective_duration_seconds_sum")
        for r in (0, 1):
            want = float(tables.coll["dur_us"][tables.coll["rank"] == r].astype(np.float64).sum()) * 1e-6
            assert dur_sum[r] == pytest.approx(want, rel=1e-6)
        assert per_rank(second, "commtop_rank_lost_batches", "commtop_rank_lost_batches_total") == {0: 0.0, 1: 0.0}
        modes = {s.labels["mode"] for s in second["commtop_collective_duration_seconds"]}
        assert modes == {"overlap"}
        # every metric the Grafana dashboard queries is served by this real endpoint (GPU families
        # are declared without samples on a machine without NVML)
        families = set(second)
        suffixes = ("_bucket", "_sum", "_count", "_total")
        missing = {
            q
            for q in dashboard_queries()
            if q not in families and not any(q.endswith(x) and q[: -len(x)] in families for x in suffixes)
        }
        assert not missing, sorted(missing)
        assert "process_cpu_seconds" in families  # the exporter's own CPU, for the benchmark's claim
    finally:
        if proc.poll() is None:
            proc.kill()
        stop_exporters(runtime, pids)


def test_two_nodes_expose_two_endpoints_whose_sums_are_the_whole_run(monkeypatch: pytest.MonkeyPatch) -> None:
    rt = short_runtime_dir()
    monkeypatch.setenv("COMMTOP_RUNTIME_DIR", rt)
    conn, collector, rdzv = open_tcp_collector()
    data = conn.data
    loop = IngestLoop(collector.source, collector.model, sinks=collector.sinks)
    loop.start()
    jobs, pids = [], []
    try:
        for node, host in enumerate(("node-a", "node-b")):
            launch = f"--nnodes 2 --node-rank {node} --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:{rdzv} --rdzv-id pm"
            env = child_env(rt, COMMTOP_HOSTNAME=host, **LINGER)
            args = (*SMALL_JOB, "--iters", str(ITERS), "--connect", data, "--prometheus", "127.0.0.1:0")
            jobs.append(start_job(conn.path, env, *args, nproc=1, node=launch))
        for job in jobs:
            assert job.wait(150) == 0
        found = endpoint_files(rt)
        assert sorted(found) == ["node-a", "node-b"]
        pids = [info["pid"] for info in found.values()]
        assert len({info["url"] for info in found.values()}) == 2
        time.sleep(0.5)  # the collector drains its queue
        snap = loop.snapshot()
        whole = {r.rank: r.count for r in snap.ranks}
        count = "commtop_collective_duration_seconds_count"
        by_node = {
            host: per_rank(scrape(info["url"]), "commtop_collective_duration_seconds", count)
            for host, info in found.items()
        }
        print(f"\n[prometheus 2 nodes] per endpoint {by_node}; collector {whole}")
        assert all(len(counts) == 1 for counts in by_node.values())  # each node serves its own rank only
        summed: dict[int, float] = {}
        for counts in by_node.values():
            for rank, n in counts.items():
                summed[rank] = summed.get(rank, 0.0) + n
        assert summed == {0: ITERS, 1: ITERS} == {r: float(n) for r, n in whole.items()}
    finally:
        for job in jobs:
            job.kill_all()
        loop.stop()
        loop.join(2)
        collector.close()
        stop_exporters(rt, pids)


def test_a_monitored_training_job_exports_through_commtop_run(tmp_path: Path) -> None:
    """`commtop run --prometheus 127.0.0.1:0 -- python examples/train_ddp.py`: the user monitor's
    ranks tap their batches too; per step the example issues 3 collectives (as test_example_train_ddp)."""
    steps = 30
    runtime = short_runtime_dir()
    env = child_env(runtime, **LINGER)
    argv = [sys.executable, "-m", "tui.cli", "run", "--headless", "--nproc", "2", "--prometheus", "127.0.0.1:0"]
    argv += ["--", "python", str(REPO / "examples" / "train_ddp.py"), "--steps", str(steps)]
    pids: list[int] = []
    try:
        proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
        assert proc.returncode == 0, proc.stderr[-2000:]
        found = endpoint_files(runtime)
        assert len(found) == 1, f"no endpoint file; stderr: {proc.stderr[-1000:]}"
        (info,) = found.values()
        pids = [info["pid"]]
        fams = scrape(info["url"])
        count = "commtop_collective_duration_seconds_count"
        assert per_rank(fams, "commtop_collective_duration_seconds", count) == {0: 3.0 * steps, 1: 3.0 * steps}
        ops = {s.labels["op"] for s in fams["commtop_collective_duration_seconds"]}
        assert ops == {"all_reduce", "all_gather"}
        copies = per_rank(fams, "commtop_copy_duration_seconds", "commtop_copy_duration_seconds_count")
        assert copies == {0: float(steps), 1: float(steps)}  # one offload copy per step
    finally:
        stop_exporters(runtime, pids)


def test_a_hang_grows_the_waiting_ranks_inside_gauge_while_it_lasts(tmp_path: Path) -> None:
    """`commtop run --prometheus` of a job whose rank 1 skips an all_reduce and sleeps 6 s: while it
    hangs, a scrape shows rank 0 inside a collective for seconds (its Hellos reach the node's
    exporter) and rank 1 in none; after the job, both 0."""
    runtime = short_runtime_dir()
    env = child_env(runtime, **LINGER)
    job = [str(REPO / "tests" / "jobs" / "peer_leaves_a_collective.py"), "--seconds", "6"]
    argv = [sys.executable, "-m", "tui.cli", "run", "--headless", "--nproc", "2", "--prometheus", "127.0.0.1:0"]
    pids: list[int] = []
    proc = subprocess.Popen([*argv, "--", "python", *job], cwd=REPO, env=env, stdout=subprocess.PIPE, text=True)
    try:
        seen: dict[int, float] = {}
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline and seen.get(0, 0.0) < 1.5:
            found = endpoint_files(runtime)
            if found:
                (info,) = found.values()
                pids = [info["pid"]]
                name = "commtop_rank_inside_collective_seconds"
                with contextlib.suppress(OSError):
                    seen = per_rank(scrape(info["url"]), name, name)
            time.sleep(0.3)
        assert seen.get(0, 0.0) >= 1.5 and seen.get(1) == 0.0, seen
        proc.wait(timeout=120)
        assert proc.returncode == 0
        name = "commtop_rank_inside_collective_seconds"
        assert per_rank(scrape(info["url"]), name, name) == {0: 0.0, 1: 0.0}
    finally:
        if proc.poll() is None:
            proc.kill()
        stop_exporters(runtime, pids)
