"""What real runs do to a profiler, done to commtop: real torchrun gloo ranks, the real
collector (`commtop watch --headless`), real ZeroMQ, real signals.

Each test prints the numbers it measured (``pytest -s`` shows them; the reliability report
quotes them). Thresholds are generous on purpose: CI has 2 shared cores, so a scheduling
hiccup of tens of ms is noise; what the tests catch is a worker that *waits* for a dead or
frozen collector (a blocking send stalls for the whole outage: seconds).
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from synthetic_ranks import (
    SMALL_JOB,
    Proc,
    child_env,
    rss_bytes,
    short_runtime_dir,
    start_job,
    start_tui,
    start_watch,
    summary_table,
    wait_bound,
    worker_pids,
    worker_summaries,
)

from tui.recordings.reader import open_recording
from workers.wire.connection import create_run
from workers.wire.protocol import COLL, Batch, Bye, Hello

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]  # starts processes


@pytest.fixture
def run(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, dict[str, str], list[Proc]]]:
    """(connection file, child env, processes to clean up)."""
    rt = short_runtime_dir()
    monkeypatch.setenv("COMMTOP_RUNTIME_DIR", rt)
    conn = create_run(label="faults")
    procs: list[Proc] = []
    yield conn.path, child_env(rt), procs
    for proc in procs:
        proc.kill_all()
    shutil.rmtree(rt, ignore_errors=True)


def records(path: str) -> tuple[dict[int, list[tuple[int, np.ndarray, np.ndarray]]], list[Hello]]:
    """rank -> [(recv_ns, iteration, host_ns)] of every collective batch in a recording."""
    out: dict[int, list[tuple[int, np.ndarray, np.ndarray]]] = {}
    hellos: list[Hello] = []
    with open_recording(path) as rec:
        for recv_ns, m in rec.messages():
            if isinstance(m, Batch) and m.kind == COLL and len(m):
                out.setdefault(m.rank, []).append((recv_ns, m.columns["iteration"], m.columns["host_ns"]))
            elif isinstance(m, Hello):
                hellos.append(m)
    return out, hellos


def iteration_times_ms(batches: list[tuple[int, np.ndarray, np.ndarray]]) -> np.ndarray:
    """Time between consecutive iterations (both received) of one rank, in ms."""
    if not batches:
        return np.zeros(0)
    it = np.concatenate([b[1] for b in batches])
    t = np.concatenate([b[2] for b in batches])
    order = np.argsort(it)
    it, t = it[order], t[order]
    step = np.diff(it) == 1
    return np.diff(t)[step] / 1e6


def test_tui_sigkilled_and_restarted_five_times_never_stalls_the_workers(run, tmp_path: Path) -> None:
    """The first collector is headless (the baseline); the five restarts are the real Textual
    TUI on a pseudo-terminal, SIGKILLed each time; "shows data" = a rank row on its screen. The
    recordings are the measure: their chunks come every 0.9 s here, so a kill loses a short tail."""
    conn_path, env, procs = run
    env = {**env, "COMMTOP_RECORD_FLUSH_S": "0.9"}
    first = start_watch(conn_path, env, record=str(tmp_path / "c0.cmtrec"))
    procs.append(first)
    wait_bound(first, record=True)
    job = start_job(conn_path, {**env, "COMMTOP_HOSTNAME": "fh"}, *SMALL_JOB)  # rows read "fh:cpu"
    procs.append(job)
    # Baseline: wait until the first collector has data, then let it watch for 2 s.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not Path(tmp_path / "c0.cmtrec").stat().st_size > 4096:
        time.sleep(0.1)
    time.sleep(2.0)
    collectors: list[tuple[Any, str, int, int]] = [(first, str(tmp_path / "c0.cmtrec"), 0, 0)]
    current: Any = first
    outages_ms: list[float] = []
    shown_ms: list[float] = []
    up_ms: list[float] = []
    start_to_shown_ms: list[float] = []
    for k in range(1, 6):
        killed_ns = time.time_ns()
        current.signal(signal.SIGKILL)
        current.wait(5)
        time.sleep(0.4)  # a longer outage than the noise: a stalled worker could not hide in it
        path = str(tmp_path / f"c{k}.cmtrec")
        current = start_tui(conn_path, env, record=path)
        procs.append(current)
        bound = current.first_seen("recording to", 30)  # printed once its sockets are bound
        # Textual's first write (alternate screen): the app is up. Between the bind and this the TUI
        # imports and starts Textual, 0.2-0.6 s of CPU on a loaded 2-core machine that no worker can
        # shorten, so time-to-data is measured from here (from the bind it reached 961 ms of 1000).
        up = current.first_seen("\x1b[?1049h", 30)
        shown = current.first_seen("fh:cpu", 10)  # a rank row drawn on its screen
        collectors.append((current, path, bound, up))
        outages_ms.append((bound - killed_ns) / 1e6)
        up_ms.append((up - bound) / 1e6)
        shown_ms.append((shown - up) / 1e6)
        start_to_shown_ms.append((shown - current.started_ns) / 1e6)
        time.sleep(1.3)  # > one recorder flush (env: 0.9 s), so the kill below loses at most the tail
    job.signal(signal.SIGTERM)  # torchrun forwards it: every rank stops at a step boundary
    assert job.wait(30) in (0, 1, -15, 143), job.text()[-2000:]
    time.sleep(0.5)
    current.signal(signal.SIGKILL)
    current.wait(10)

    base, _ = records(collectors[0][1])
    before = np.concatenate([iteration_times_ms(base[r]) for r in base])
    during: list[np.ndarray] = []
    to_data_ms: list[float] = []
    start_to_data_ms: list[float] = []
    gap_ms_per_iter: list[float] = []
    windows = [records(path)[0] for _, path, _, _ in collectors]
    for k in range(1, 6):
        recs = windows[k]
        assert sorted(recs) == [0, 1], f"collector {k} got no data from some rank: {sorted(recs)}"
        first_recv = min(b[0][0] for b in recs.values())
        to_data_ms.append((first_recv - collectors[k][3]) / 1e6)
        start_to_data_ms.append((first_recv - collectors[k][0].started_ns) / 1e6)
        during += [iteration_times_ms(recs[r]) for r in recs]
        for r in (0, 1):  # the outage itself: iterations between the last record of k-1 and the first of k
            prev = windows[k - 1].get(r)
            if prev:
                i0, t0 = int(prev[-1][1][-1]), int(prev[-1][2][-1])
                i1, t1 = int(recs[r][0][1][0]), int(recs[r][0][2][0])
                gap_ms_per_iter.append((t1 - t0) / 1e6 / max(1, i1 - i0))
    during_all = np.concatenate(during)
    print(
        f"\n[kill x5] iteration time before: max {before.max():.1f} ms, mean {before.mean():.3f} ms "
        f"(n={len(before)}); during restarts: max {during_all.max():.1f} ms, mean {during_all.mean():.3f} ms "
        f"(n={len(during_all)}); across outages: mean {np.mean(gap_ms_per_iter):.3f} ms/iteration "
        f"(worst {max(gap_ms_per_iter):.3f}); app up after bind: "
        + ", ".join(f"{x:.0f}" for x in up_ms)
        + " ms; rank rows on the new TUI's screen after the app is up: "
        + ", ".join(f"{x:.0f}" for x in shown_ms)
        + " ms (from process start: "
        + ", ".join(f"{x:.0f}" for x in start_to_shown_ms)
        + " ms); first record after the app is up: "
        + ", ".join(f"{x:.0f}" for x in to_data_ms)
        + " ms (from process start: "
        + ", ".join(f"{x:.0f}" for x in start_to_data_ms)
        + " ms); outages (kill to new bind): "
        + ", ".join(f"{x:.0f}" for x in outages_ms)
        + " ms"
    )
    # Records flow soon after the app is up (the workers reconnect every 100 ms; ~100-300 ms when the
    # machine is idle). How soon also depends on how much CPU the new TUI gets: 1110 ms was seen at load
    # 4.5 on 2 cores against a 1000 ms bound (issue 16). The bound catches workers that stopped
    # reconnecting or back off for seconds, not a starved scheduler: 3 s for data, 5 s to paint it.
    # End-to-end latency is measured in benchmarks/standing/e2e_latency.py.
    assert max(to_data_ms) < 3000.0 and max(shown_ms) < 5000.0
    # No stall: a worker that waited for the dead collector would stop for a whole outage (>= 0.8 s
    # here), one iteration as long as the outage and a few iterations across it. The bounds leave
    # room for a loaded 2-core machine's scheduling (the baseline ran at another moment's load) and
    # still sit far below what a stall gives.
    assert during_all.max() < max(0.9 * min(outages_ms), before.max() + 150.0)
    assert max(gap_ms_per_iter) < 10 * before.mean() + 5.0
    summaries = worker_summaries(job)
    assert sorted(summaries) == [0, 1]
    assert all(s["dropped"] > 0 for s in summaries.values())  # records of the outages: dropped, not queued


def hello_rate(hellos: list[Hello], rank: int, lo_ns: int, hi_ns: int) -> float:
    """Iterations per second of ``rank`` between its first hello at or after ``lo_ns`` and its
    last hello at or before ``hi_ns`` (hellos carry the iteration count and when they were made)."""
    mine = sorted((h.t_ns, h.iteration) for h in hellos if h.rank == rank and lo_ns <= h.t_ns <= hi_ns)
    assert len(mine) >= 2, f"rank {rank}: fewer than 2 hellos in the window"
    (t0, i0), (t1, i1) = mine[0], mine[-1]
    return (i1 - i0) / ((t1 - t0) / 1e9)


def test_tui_frozen_for_10_s_workers_keep_speed_memory_bounded_drops_counted_once(run, tmp_path: Path) -> None:
    conn_path, env, procs = run
    rec = str(tmp_path / "frozen.cmtrec")
    watch = start_watch(conn_path, env, record=rec)
    procs.append(watch)
    wait_bound(watch, record=True)
    job = start_job(conn_path, env, *SMALL_JOB, "--copies", "0")  # only collective records: drops are exact
    procs.append(job)
    pids = worker_pids(job, 2)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and Path(rec).stat().st_size < 8192:
        time.sleep(0.1)
    time.sleep(2.0)
    rss_before = {r: rss_bytes(pid) for r, pid in pids.items()}
    collector_rss_before = rss_bytes(watch.pid)
    frozen_at = time.time_ns()
    watch.signal(signal.SIGSTOP)
    time.sleep(10.0)
    rss_frozen = {r: rss_bytes(pid) for r, pid in pids.items()}
    resumed_at = time.time_ns()
    watch.signal(signal.SIGCONT)
    time.sleep(3.0)
    collector_rss_after = rss_bytes(watch.pid)
    stop_at = time.time_ns()
    job.signal(signal.SIGTERM)
    job.wait(30)
    time.sleep(0.5)
    watch.signal(signal.SIGINT)
    assert watch.wait(10) == 0, watch.text()[-2000:]

    recs, hellos = records(rec)
    rate_before = [hello_rate(hellos, r, frozen_at - 3_000_000_000, frozen_at) for r in (0, 1)]
    rate_frozen = [hello_rate(hellos, r, frozen_at - 1_000_000_000, resumed_at + 1_000_000_000) for r in (0, 1)]
    rate_after = [hello_rate(hellos, r, resumed_at, stop_at) for r in (0, 1)]
    times = {r: iteration_times_ms(recs[r]) for r in recs}
    it_before = np.concatenate(
        [np.diff(np.concatenate([b[2] for b in recs[r] if b[2][-1] < frozen_at])) / 1e6 for r in recs]
    )
    in_freeze = []
    for r in recs:
        it = np.concatenate([b[1] for b in recs[r]])
        t = np.concatenate([b[2] for b in recs[r]])
        sel = (t >= frozen_at) & (t <= resumed_at)
        d = np.diff(t[sel]) / 1e6
        in_freeze.append(d[np.diff(it[sel]) == 1])
    it_frozen = np.concatenate(in_freeze)
    summary = summary_table(watch.text("out"))
    lost_line = next((ln for ln in watch.text("out").splitlines() if ln.startswith("batches lost")), "")
    workers = worker_summaries(job)
    growth = {r: (rss_frozen[r] - rss_before[r]) / 2**20 for r in pids}
    print(
        f"\n[frozen 10 s] iterations/s before {rate_before[0]:.0f}/{rate_before[1]:.0f}, across the freeze "
        f"{rate_frozen[0]:.0f}/{rate_frozen[1]:.0f}, after {rate_after[0]:.0f}/{rate_after[1]:.0f}; "
        f"max iteration time before {it_before.max():.1f} ms, during the freeze {it_frozen.max():.1f} ms "
        f"(n={len(it_frozen)} queued records), whole run {max(t.max() for t in times.values()):.1f} ms; "
        f"worker RSS {[round(rss_before[r] / 2**20, 1) for r in sorted(pids)]} -> "
        f"{[round(rss_frozen[r] / 2**20, 1) for r in sorted(pids)]} MiB; collector RSS "
        f"{collector_rss_before / 2**20:.1f} -> {collector_rss_after / 2**20:.1f} MiB; "
        f"worker dropped {[workers[r]['dropped'] for r in (0, 1)]}, collector "
        f"count/missing/drops {[(summary[r]['count'], summary[r]['missing'], summary[r]['drops']) for r in (0, 1)]}; "
        f"by sequence number: {lost_line!r}"
    )
    assert lost_line and int(lost_line.rsplit(" ", 1)[1]) > 0  # batches missing from the seq numbers
    # waiting on the frozen collector would take the whole 10 s; 3 s leaves room for a loaded machine
    assert len(it_frozen) > 100 and it_frozen.max() < 3000.0
    for r in (0, 1):
        # A worker that waited on the frozen collector would stall 10 s of this 12 s window (rate
        # <= 0.17x); 0.35x leaves room for the noise of a shared 2-core CI machine (0.52x seen).
        assert rate_frozen[r] > 0.35 * rate_before[r], "the workers slowed down while the collector was frozen"
        assert growth[r] < 32, f"rank {r} grew {growth[r]:.1f} MiB while the collector was frozen"
        w, s = workers[r], summary[r]
        assert w["dropped"] > 0, "10 s of records cannot all fit the bounded queues: some must be dropped"
        # Every record is either received or counted as dropped, exactly once.
        assert int(s["count"]) + int(s["missing"]) == w["iterations"]
        assert int(s["missing"]) == w["dropped"]
        assert int(s["drops"]) == w["dropped"]  # max(dropped, missing), never their sum
    assert (collector_rss_after - collector_rss_before) / 2**20 < 100


def test_worker_exits_within_2_s_with_no_tui_at_all_and_with_its_send_queue_full(run, tmp_path: Path) -> None:
    """LINGER 0 / bounded linger: neither an absent collector nor a full queue holds a worker."""
    conn_path, env, procs = run
    frozen_conn = create_run(label="full")  # a second run whose collector we freeze
    watch = start_watch(frozen_conn.path, env, record=str(tmp_path / "full.cmtrec"))
    procs.append(watch)
    wait_bound(watch, record=True)
    worker = [sys.executable, "-m", "workers", *SMALL_JOB, "--batch-ms", "5"]
    lonely = Proc([*worker, "--connection-file", conn_path], env)  # nobody ever binds its endpoints
    full = Proc([*worker, "--connection-file", frozen_conn.path], env)
    procs += [lonely, full]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and Path(tmp_path / "full.cmtrec").stat().st_size < 4096:
        time.sleep(0.1)
    watch.signal(signal.SIGSTOP)  # from here on its queue (and then the worker's) fills up
    time.sleep(3.0)
    exit_s = {}
    for name, proc in (("no collector", lonely), ("queue full", full)):
        t0 = time.monotonic()
        proc.signal(signal.SIGTERM)
        code = proc.proc.wait(10)
        exit_s[name] = time.monotonic() - t0
        proc.wait(5)
        assert code == 0, proc.text()[-2000:]
    watch.signal(signal.SIGCONT)
    lonely_sum = worker_summaries(lonely)[0]
    full_sum = worker_summaries(full)[0]
    print(
        f"\n[exit] SIGTERM to exit: no collector {exit_s['no collector']:.2f} s "
        f"({lonely_sum['iterations']} iterations, {lonely_sum['sent']} records sent); queue full "
        f"{exit_s['queue full']:.2f} s ({full_sum['iterations']} iterations, {full_sum['dropped']} records dropped)"
    )
    assert lonely_sum["iterations"] > 0 and lonely_sum["sent"] == 0
    assert full_sum["iterations"] > 0 and full_sum["dropped"] > 0  # the queue really was full
    # a worker that waited for its queue would run into its 5 s hard-exit grace; under load a clean
    # stop (finish the step, close the sockets, interpreter exit) takes up to a few seconds
    assert max(exit_s.values()) < 4.5


def test_rank_sigkilled_is_marked_with_its_exit_code_run_fails_and_the_recording_is_whole(run, tmp_path: Path) -> None:
    _conn_path, env, procs = run
    rec = str(tmp_path / "killed.cmtrec")
    job = Proc([sys.executable, "-m", "tui.cli", "run", "--headless", "--nproc", "2", *SMALL_JOB, "--record", rec], env)
    procs.append(job)
    pids = worker_pids(job, 2)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (not Path(rec).exists() or Path(rec).stat().st_size < 8192):
        time.sleep(0.1)
    time.sleep(1.0)
    killed_ns = time.time_ns()
    os.kill(pids[1], signal.SIGKILL)
    code = job.wait(60)
    ended_s = (time.time_ns() - killed_ns) / 1e9
    err = job.text("err")
    rows = summary_table(job.text("out"))

    byes = {}
    counts = {0: 0, 1: 0}
    last_it = {0: -1, 1: -1}
    with open_recording(rec) as recording:
        complete = recording.complete
        for recv_ns, m in recording.messages():
            if isinstance(m, Bye):
                byes[m.rank] = (recv_ns, m)
            elif isinstance(m, Batch) and m.kind == COLL:
                counts[m.rank] += len(m)
                last_it[m.rank] = max(last_it[m.rank], int(m.columns["iteration"].max()))
    marked_s = (byes[1][0] - killed_ns) / 1e9 if 1 in byes else float("inf")
    print(
        f"\n[rank killed] rank 1 SIGKILLed: marked '{byes[1][1].reason}' exit {byes[1][1].exit_code} after "
        f"{marked_s:.2f} s; rank 0 {rows[0]['state']} ({byes[0][1].reason[:60]}...); commtop run exit {code} after "
        f"{ended_s:.1f} s; history kept: counts {[rows[r]['count'] for r in (0, 1)]}, recording "
        f"{counts} records, last iterations {last_it}, complete={complete}"
    )
    assert code != 0
    # commtop's own lines (torchrun's "exitcode: -9" line passes through only when it names that
    # rank first: it may name rank 0's exit 1); the code -9 is the Bye's, asserted below
    assert "the job exited with code" in err and "rank 1 failed first: killed by SIGKILL" in err, err[-3000:]
    assert byes[1][1].exit_code == -9 and "SIGKILL" in byes[1][1].reason
    assert marked_s < 6.0  # torchrun polls every 0.2 s; the rest is a loaded machine's scheduling
    assert rows[1]["state"].startswith("killed by SIGKILL") and rows[0]["state"].startswith("exited")
    # The others' history is kept, and the recording holds everything the collector got.
    for r in (0, 1):
        assert int(rows[r]["count"]) == counts[r] > 100 and rows[r]["missing"] == "0"
        assert last_it[r] == counts[r] - 1  # every iteration from 0 to the last one
    assert complete


def test_rank_sigstopped_is_shown_stalled_by_the_sampler_not_lost(run) -> None:
    """The real app (Pilot) on a real job: rank 1 SIGSTOPped -> its row says "stopped" (the node
    sampler reads the process state), distinct from an exit; SIGCONT -> live again."""
    import asyncio

    from tui.run.session import LiveSession
    from tui.view.build import build_app
    from tui.view.widgets.rank_grid import RankGrid
    from workers.wire.connection import load

    conn_path, env, procs = run
    collector = LiveSession.open(load(conn_path), None)
    job = start_job(conn_path, env, *SMALL_JOB)
    procs.append(job)
    pids = worker_pids(job, 2)
    found: dict[str, float | str] = {}

    async def body() -> None:
        app = build_app(collector, title="faults")
        async with app.run_test(size=(160, 24)) as pilot:

            async def until(cond, timeout_s: float) -> float:  # noqa: ANN001
                t0 = time.monotonic()
                while not cond():
                    assert time.monotonic() - t0 < timeout_s, f"timed out: {app.snapshot}"
                    await pilot.pause(0.05)
                return time.monotonic() - t0

            def ranks() -> dict:  # noqa: ANN202
                snap = app.snapshot
                return {r.rank: r for r in snap.ranks} if snap is not None else {}

            def row(rank: int) -> str:
                grid = app.query_one(RankGrid)
                lines = grid.line_texts()
                return lines[rank * grid.row_h] if len(lines) > rank * grid.row_h else ""

            await until(
                lambda: len(ranks()) == 2 and all(r.state == "live" and r.count > 100 for r in ranks().values()), 60
            )
            await until(
                lambda: (
                    app.snapshot.telemetry is not None
                    and app.snapshot.telemetry.proc_status(ranks()[1].host, pids[1]) in ("running", "sleeping")
                ),
                10,
            )
            os.kill(pids[1], signal.SIGSTOP)
            try:
                found["stopped_after_s"] = await until(lambda: "stopped" in row(1) and "stalled" in row(0), 10)
                found["row1"] = row(1)
                found["row0"] = row(0)
                found["state1"] = ranks()[1].state
                found["state0"] = ranks()[0].state
                found["proc1"] = str(app.snapshot.telemetry.proc_status(ranks()[1].host, pids[1]))
            finally:
                os.kill(pids[1], signal.SIGCONT)
            count = ranks()[1].count
            found["resumed_after_s"] = await until(lambda: ranks()[1].state == "live" and ranks()[1].count > count, 10)

    try:
        asyncio.run(body())
    finally:
        job.signal(signal.SIGTERM)
        job.wait(30)
        collector.close()
    print(
        f"\n[rank stopped] rank 1 SIGSTOPped: row says stopped after {found['stopped_after_s']:.2f} s "
        f"(state {found['state1']}, sampler {found['proc1']}); rank 0 state {found['state0']}; live again "
        f"{found['resumed_after_s']:.2f} s after SIGCONT\n  {str(found['row1']).rstrip()}\n  {str(found['row0']).rstrip()}"
    )
    assert found["proc1"] == "stopped" and found["state1"] == "stale"
    # Its peer waits in the collective: heartbeat alive, loop blocked -> "stalled", not "live".
    assert found["state0"] == "stalled" and "stalled" in str(found["row0"])
    assert "exited" not in str(found["row1"]) and "gone" not in str(found["row1"])
    assert float(found["stopped_after_s"]) < 8.0  # stale after 2 s without a heartbeat, plus load
