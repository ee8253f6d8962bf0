"""Unmodified jobs under `commtop run --headless --record` (real torchrun, 2 gloo ranks, the real
collector and recorder): every collective each rank issued is in the recording once, with its
process group (named through the rank's Hello), op, dtype and size, and no rank lost any.

* tests/jobs/two_groups.py: two process groups, ten ops, three sizes, two dtypes; the expected
  counts come from the job's own logic;
* tests/jobs/pipeline_p2p.py: a pipeline's isend / irecv / batch_isend_irecv, one irecv waited
  only after a later all_reduce; every one in the recording as a send or recv, timed to the
  job's own wait();
* tests/jobs/functional_collectives.py: torch.distributed._functional_collectives (DTensor's
  path) and two DTensor redistributions, each timed to its first use (``wait_tensor``);
* tests/jobs/out_of_sight.py: DDP, ``all_reduce_coalesced``, a funcol backward: what torch
  issues underneath counts as lost, and recorded + lost = what torch.profiler saw;
* tests/jobs/threaded_collectives.py: a saver thread's collectives beside the training loop's;
* tests/jobs/spawned_ranks.py: ranks started by the script (``torch.multiprocessing.spawn``,
  ``multiprocessing.Process``), under ``--nproc 1``: the started processes are the ranks;
* examples/train_fsdp2.py: FSDP2 (``fully_shard``) on gloo; the expected counts come from
  torch.profiler in the same job (every c10d op the dispatcher ran, with its shapes),
  independently of commtop's wrappers.
"""

from __future__ import annotations

import collections
import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest

from tui import cli
from tui.recordings.codec import Tables
from tui.recordings.reader import open_recording
from workers.monitor.records import OPS
from workers.wire import protocol

pytestmark = pytest.mark.e2e  # starts processes

REPO = Path(__file__).resolve().parent.parent
Key = tuple[str, str, str, int]  # (group name, op, dtype, nbytes)


def run_recorded(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    launcher: tuple[str, ...] = ("python",),
    nproc: int = 2,
    exit_code: int = 0,
    printed: list[str] | None = None,
) -> Tables:
    """`commtop run --headless --nproc NPROC --record -- LAUNCHER ARGV`: the recording's tables
    (`commtop run` exits with ``exit_code``; what it printed, stdout then stderr, is added to
    ``printed``)."""
    root = tempfile.mkdtemp(prefix="cm-", dir="/tmp")
    rec_path = str(Path(root) / "job.commtop")
    monkeypatch.setenv("COMMTOP_RUNTIME_DIR", root)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.delenv("COMMTOP_CONNECTION_FILE", raising=False)
    try:
        code = cli.main(["run", "--headless", "--nproc", str(nproc), "--record", rec_path, "--", *launcher, *argv])
        out = capsys.readouterr()
        assert code == exit_code, out.err[-3000:] + out.out[-3000:]
        if printed is not None:
            printed += [out.out, out.err]
        with open_recording(rec_path) as rec:
            assert rec.complete, rec.summary()
            return rec.tables()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def last_hellos(tables: Tables) -> dict[int, protocol.Hello]:
    """Each rank's newest Hello (the one sent at its end carries its final counts)."""
    out: dict[int, protocol.Hello] = {}
    for _, h in tables.hellos:
        if h.backend != "unknown" and (h.rank not in out or h.t_ns >= out[h.rank].t_ns):
            out[h.rank] = h
    return out


def recorded(tables: Tables, rank: int, hello: protocol.Hello) -> collections.Counter[Key]:
    coll = tables.coll
    mine = coll["rank"] == rank
    # none lost, none twice: the rank's iterations are 0..n-1
    assert np.array_equal(np.sort(coll["iteration"][mine]), np.arange(mine.sum()))
    names = [g[0] for g in hello.groups]
    return collections.Counter(
        (names[g], OPS[o], protocol.DTYPES[d], n)
        for g, o, d, n in zip(
            coll["group"][mine].tolist(),
            coll["op"][mine].tolist(),
            coll["dtype"][mine].tolist(),
            coll["nbytes"][mine].tolist(),
            strict=True,
        )
    )


def expected(prefix: str, rank: int, group: str | None = None) -> collections.Counter[Key]:
    rows = json.loads(Path(f"{prefix}.rank{rank}.json").read_text())
    if group is not None:  # counts without a group: all on the world group
        rows = [[group, *r] for r in rows]
    return collections.Counter({(g, op, dt, nb): n for g, op, dt, nb, n in rows})


@pytest.mark.parametrize(
    "launcher", [("python",), ("torchrun", "--standalone", "--nproc-per-node", "2")], ids=["python", "torchrun"]
)
def test_a_job_with_two_groups_is_recorded_per_group_op_dtype_and_size(monkeypatch, capsys, launcher) -> None:
    """As `-- python two_groups.py`, and as the user's own torchrun line (its options kept, the
    capture put in front of the script)."""
    counts = tempfile.mkdtemp(prefix="cm-counts-", dir="/tmp")
    prefix = f"{counts}/two_groups"
    try:
        job = [str(REPO / "tests" / "jobs" / "two_groups.py"), "--counts", prefix]
        tables = run_recorded(monkeypatch, capsys, job, launcher)
        hellos = last_hellos(tables)
        assert sorted(hellos) == [0, 1]
        for rank, hello in hellos.items():
            want = expected(prefix, rank)
            got = recorded(tables, rank, hello)
            assert got == want
            by_stream = collections.Counter({(g, op, nb): n for (g, op, _dt, nb), n in got.items()})
            assert len({k[0] for k in want}) == 2 and len({k[1] for k in want}) >= 4 and len({k[3] for k in want}) >= 3
            assert sum(by_stream.values()) == sum(want.values())
            assert hello.groups[0][1:] == ("default_pg", 2) and hello.groups[1][1:] == ("pair", 2)
            assert hello.lost == 0 and hello.dropped == 0
    finally:
        shutil.rmtree(counts, ignore_errors=True)


def test_fsdp2_on_two_gloo_ranks_shows_every_all_gather_and_reduce_scatter(monkeypatch, capsys) -> None:
    counts = tempfile.mkdtemp(prefix="cm-counts-", dir="/tmp")
    prefix = f"{counts}/fsdp2"
    try:
        tables = run_recorded(
            monkeypatch, capsys, [str(REPO / "examples" / "train_fsdp2.py"), "--steps", "3", "--count", prefix]
        )
        hellos = last_hellos(tables)
        assert sorted(hellos) == [0, 1]
        for rank, hello in hellos.items():
            world = hello.groups[0][0]
            want = expected(prefix, rank, group=world)  # torch.profiler's count, in the same job
            assert recorded(tables, rank, hello) == want
            ops = {op: n for (_g, op, _dt, _nb), n in want.items()}
            assert ops["all_gather"] == 3 * 4 * 2 and ops["reduce_scatter"] == 3 * 4  # 4 layers, 3 steps
            assert hello.lost == 0
    finally:
        shutil.rmtree(counts, ignore_errors=True)


def test_a_device_mesh_job_is_captured(monkeypatch, capsys) -> None:
    """``init_device_mesh`` makes the default group through torch's own binding of
    init_process_group, with no backend named: the capture still starts, and the Hello names
    the backend torch's device map holds (gloo), not "undefined"."""
    counts = tempfile.mkdtemp(prefix="cm-counts-", dir="/tmp")
    prefix = f"{counts}/mesh"
    try:
        tables = run_recorded(
            monkeypatch, capsys, [str(REPO / "tests" / "jobs" / "device_mesh.py"), "--counts", prefix]
        )
        hellos = last_hellos(tables)
        assert sorted(hellos) == [0, 1]
        for rank, hello in hellos.items():
            assert recorded(tables, rank, hello) == expected(prefix, rank)
            assert hello.backend == "gloo/cpu" and hello.lost == 0
    finally:
        shutil.rmtree(counts, ignore_errors=True)


def ends_in_issue_order(tables: Tables, rank: int) -> tuple[list[str], np.ndarray]:
    """A rank's ops in issue (iteration) order and the end of each, ns."""
    coll = tables.coll
    mine = coll["rank"] == rank
    order = np.argsort(coll["iteration"][mine])
    start = coll["start_ns"][mine][order]
    end = start + (coll["dur_us"][mine][order] * 1e3).astype(np.int64)
    return [OPS[o] for o in coll["op"][mine][order].tolist()], end


def test_a_pipelines_isend_irecv_and_batch_isend_irecv_are_each_recorded(monkeypatch, capsys, tmp_path) -> None:
    """gloo finishes a non-blocking send or recv only in the job's own wait(): each still comes
    once, as a send or recv with its size, and the one waited late lasts past the all_reduce
    issued before its wait."""
    steps, prefix = 4, str(tmp_path / "p2p")
    job = [str(REPO / "tests" / "jobs" / "pipeline_p2p.py"), "--steps", str(steps), "--counts", prefix]
    tables = run_recorded(monkeypatch, capsys, job)
    hellos = last_hellos(tables)
    assert sorted(hellos) == [0, 1]
    # per step: isend, irecv, irecv (waited late), all_reduce, isend, 2 x (isend, irecv), isend,
    # irecv (any source), all_reduce
    per_step = ["send", "recv", "recv", "all_reduce", "send", "send", "recv", "send", "recv", "send", "recv"]
    per_step.append("all_reduce")
    for rank, hello in hellos.items():
        want = expected(prefix, rank)
        assert recorded(tables, rank, hello) == want
        ops = collections.Counter({op: 0 for op in ("send", "recv")})
        for (_g, op, _dt, _nb), n in want.items():
            ops[op] += n
        assert ops["send"] == ops["recv"] == 5 * steps
        assert hello.lost == 0 and hello.dropped == 0
        ops_in_order, end = ends_in_issue_order(tables, rank)
        assert ops_in_order == per_step * steps
        for s in range(steps):  # the late irecv (third) ends at its wait, after the all_reduce (fourth)
            assert end[s * 12 + 2] >= end[s * 12 + 3]


def test_functional_collectives_and_dtensor_redistributions_are_each_recorded(monkeypatch, capsys, tmp_path) -> None:
    """DTensor and tensor parallelism issue functional collectives, which no torch.distributed
    function sees: each is recorded once, and one used only after a later blocking all_reduce
    ends at that use (its wait), after the blocking one."""
    steps, prefix = 3, str(tmp_path / "funcol")
    job = [str(REPO / "tests" / "jobs" / "functional_collectives.py"), "--steps", str(steps), "--counts", prefix]
    tables = run_recorded(monkeypatch, capsys, job)
    hellos = last_hellos(tables)
    assert sorted(hellos) == [0, 1]
    per_step = ["all_reduce", "all_reduce", "all_gather", "all_gather", "reduce_scatter", "all_to_all"]
    per_step += ["broadcast", "all_gather", "all_reduce"]
    for rank, hello in hellos.items():
        assert recorded(tables, rank, hello) == expected(prefix, rank)
        assert hello.lost == 0 and hello.dropped == 0
        ops_in_order, end = ends_in_issue_order(tables, rank)
        assert ops_in_order == per_step * steps
        for s in range(steps):  # the funcol all_reduce (first) waits after the blocking one (second)
            assert end[s * 9] >= end[s * 9 + 1]


def test_what_torch_issues_out_of_the_hooks_sight_is_counted_as_lost(monkeypatch, capsys, tmp_path) -> None:
    """DDP's set-up from C++, ``all_reduce_coalesced`` and a functional collective's backward
    pass no Python wrapper: each rank's recorded collectives and its Hello's ``lost`` add up to
    what torch.profiler saw the job issue, on both groups; what gloo issues several ops for
    (a list reduce_scatter, monitored_barrier) counts once, as the profiler counts it."""
    steps, prefix = 3, str(tmp_path / "oos")
    job = [str(REPO / "tests" / "jobs" / "out_of_sight.py"), "--steps", str(steps), "--counts", prefix]
    tables = run_recorded(monkeypatch, capsys, job)
    hellos = last_hellos(tables)
    assert sorted(hellos) == [0, 1]
    for rank, hello in hellos.items():
        want = json.loads(Path(f"{prefix}.rank{rank}.json").read_text())
        got = recorded(tables, rank, hello)
        ops = collections.Counter({op: 0 for op in ("all_reduce", "reduce_scatter", "barrier")})
        for (_g, op, _dt, _nb), n in got.items():
            ops[op] += n
        assert ops == {"all_reduce": 3 * steps, "reduce_scatter": steps, "barrier": steps}  # 2 DDP buckets, funcol
        assert sum(got.values()) + hello.lost == want["issued"]
        assert hello.lost > want["out_of_sight_per_step"] * steps  # and DDP's set-up
        assert hello.dropped == 0


@pytest.mark.parametrize(
    "start",
    [
        ["--start", "mp.spawn"],
        ["--start", "spawn"],
        ["--start", "fork", "--launcher-is-rank0"],
        ["--start", "spawn", "--subclass"],
    ],
    ids=["mp.spawn", "Process-spawn", "Process-fork-launcher-is-rank0", "Process-subclass-spawn"],
)
def test_ranks_a_script_starts_itself_are_the_runs_ranks(monkeypatch, capsys, tmp_path, start) -> None:
    """The PyTorch tutorials' shapes (``mp.spawn``, or ``multiprocessing.Process`` with env://
    and MASTER_ADDR/PORT set in the child, or a Process subclass's own ``run``; 3 ranks) under ``commtop run --nproc 1``: every
    collective of each rank is recorded with its group; the torchrun process that started them
    is no rank of its own (no Hello), unless it joins the job's group itself (then it is rank 0).
    Under plain ``torchrun --nproc-per-node 1`` the Process shapes wait for ever in
    init_process_group (torchrun's agent store); the script binds its functions by name."""
    prefix = str(tmp_path / "spawned")
    job = [str(REPO / "tests" / "jobs" / "spawned_ranks.py"), "--ranks", "3", "--steps", "4", "--counts", prefix]
    tables = run_recorded(monkeypatch, capsys, [*job, *start], nproc=1)
    hellos = last_hellos(tables)
    assert sorted(hellos) == [0, 1, 2]
    assert len({h.pid for _, h in tables.hellos}) == 3  # three spawned processes, nobody else
    for rank, hello in hellos.items():
        assert hello.world_size == 3 and hello.backend == "gloo/cpu"
        assert recorded(tables, rank, hello) == expected(prefix, rank)
        assert hello.lost == 0 and hello.dropped == 0


def test_a_ranks_own_multiprocessing_helpers_are_no_ranks(monkeypatch, capsys, tmp_path) -> None:
    """Ranks that use a fork pool and a spawn Process before their group exists (and a pool
    after): each rank's collectives are recorded once, its Hellos are its own (no helper speaks
    for it, none is a rank), and it ends as it did."""
    prefix = str(tmp_path / "helpers")
    tables = run_recorded(monkeypatch, capsys, [str(REPO / "tests" / "jobs" / "pool_helpers.py"), "--counts", prefix])
    hellos = last_hellos(tables)
    assert sorted(hellos) == [0, 1]
    assert len({h.pid for _, h in tables.hellos}) == 2
    for rank, hello in hellos.items():
        assert recorded(tables, rank, hello) == expected(prefix, rank)
        assert hello.lost == 0 and hello.dropped == 0
    assert sorted((b.rank, b.exit_code) for _, b in tables.byes) == [(0, 0), (1, 0)]


def test_collectives_from_two_threads_are_each_recorded(monkeypatch, capsys, tmp_path) -> None:
    """The training loop on the main thread and a saver thread on a group of its own (an
    asynchronous checkpoint's shape) issue collectives at the same time: each rank's recording
    holds every one of both threads, with its group, and no rank lost any. (Before, a thread
    inside a collective hid the other's: about half of them were counted lost.)"""
    prefix = str(tmp_path / "threads")
    job = [str(REPO / "tests" / "jobs" / "threaded_collectives.py"), "--steps", "100", "--counts", prefix]
    printed: list[str] = []
    tables = run_recorded(monkeypatch, capsys, job, printed=printed)
    hellos = last_hellos(tables)
    assert sorted(hellos) == [0, 1]
    orders = []
    for rank, hello in hellos.items():
        want = expected(prefix, rank)
        assert {g for g, *_ in want} == {"0", "1"} and sum(n for (g, *_), n in want.items() if g == "1") >= 3
        assert recorded(tables, rank, hello) == want
        assert hello.lost == 0 and hello.dropped == 0
        mine = tables.coll["rank"] == rank
        groups = tables.coll["group"][mine][np.argsort(tables.coll["iteration"][mine])]
        orders.append([hello.groups[g][0] for g in groups.tolist()])
    # The two threads' collectives interleave as the threads ran on each rank: where the ranks'
    # orders differ (the job decides, not commtop), no skew compares their k-th collectives.
    differ = orders[0] != orders[1]
    assert ("they issue their collectives in different orders" in printed[0]) == differ, (differ, printed[0][-2000:])


@pytest.mark.parametrize("code", [0, 3])
def test_ranks_that_end_with_os_exit_send_every_collective_and_say_bye(monkeypatch, capsys, tmp_path, code) -> None:
    """``os._exit`` skips atexit: the ranks' last batches were never sent (17 of 37 recorded,
    ``missing 0``) and no Bye came (the summary said "live"). Now every collective is recorded
    and each rank's one Bye carries the job's exit code (or SIGTERM's, for a rank torchrun
    stopped first); a forked helper's own os._exit says nothing."""
    prefix = str(tmp_path / "os_exit")
    job = [str(REPO / "tests" / "jobs" / "ends_by_os_exit.py"), "--code", str(code), "--counts", prefix]
    tables = run_recorded(monkeypatch, capsys, job, exit_code=code)  # the script's, as python gives it
    hellos = last_hellos(tables)
    assert sorted(hellos) == [0, 1]
    for rank, hello in hellos.items():
        assert recorded(tables, rank, hello) == expected(prefix, rank)
        assert hello.lost == 0
    byes = sorted((b.rank, b.exit_code) for _, b in tables.byes)
    assert [r for r, _ in byes] == [0, 1]  # one Bye each, also where torchrun's SIGTERM met an os._exit
    if code:  # the first rank out fails the job: torchrun stops the other, which may not have reached os._exit yet
        assert {c for _, c in byes} <= {code, -15} and code in {c for _, c in byes}
    else:
        assert byes == [(0, 0), (1, 0)]


@pytest.mark.parametrize("wait", [False, True], ids=["blocking", "async-wait"])
def test_a_hang_says_which_rank_is_inside_a_collective_and_sends_what_each_finished(
    monkeypatch, capsys, tmp_path, wait
) -> None:
    """Rank 1 skips an all_reduce and sleeps 4 s; rank 0 waits inside it. Meanwhile rank 0's
    Hellos say it is inside that all_reduce (the TUI's "stalled inside all_reduce ..."), rank 1's
    say nothing, and both ranks' 4 finished all_reduces are sent before the end (they waited for
    a next collective that never came: 1 of 4 showed). The failed fifth counts as lost. The same
    where rank 0 waits on an async all_reduce's Work (DDP's and FSDP's way)."""
    prefix = str(tmp_path / "hang")
    job = [str(REPO / "tests" / "jobs" / "peer_leaves_a_collective.py"), "--seconds", "4", "--counts", prefix]
    tables = run_recorded(monkeypatch, capsys, job + (["--wait"] if wait else []))
    hellos = last_hellos(tables)
    for rank, hello in hellos.items():
        assert recorded(tables, rank, hello) == expected(prefix, rank)
    assert (hellos[0].lost, hellos[1].lost) == (1, 0)
    coll = tables.coll
    mine = {r: coll["rank"] == r for r in (0, 1)}
    done = {r: (coll["host_ns"][mine[r]] + coll["dur_us"][mine[r]] * 1e3).max() for r in (0, 1)}  # 4th's end
    inside = {h.rank: h for _, h in tables.hellos if h.inside and h.t_ns > done[h.rank] + 0.1e9}
    assert sorted(inside) == [0], inside  # after their 4th, only rank 0 was inside a collective
    op, group, nbytes, since = inside[0].inside
    assert (OPS[op], group, nbytes) == ("all_reduce", 0, 256) and inside[0].t_ns - since > 0.5e9
    byes = {b.rank: b.t_ns for _, b in tables.byes}  # every finished record was received long before the rank's end
    assert all(coll["recv_ns"][coll["rank"] == r].max() < byes[r] - 2e9 for r in (0, 1)), byes


def test_sends_and_receives_that_never_end_count_as_lost(monkeypatch, capsys, tmp_path) -> None:
    """After the 4 all_reduces rank 0 isends to rank 1 and never waits on it, then waits on an
    irecv that fails when rank 1 leaves. Neither has a record (gloo ends them at the job's own
    wait): each counts as lost, with a line each at the rank's end. Before, neither counted (the
    hooks saw both, torch's number agreed, and no later record made a gap): 4 + 0 of 6."""
    prefix = str(tmp_path / "p2p")
    job = [str(REPO / "tests" / "jobs" / "peer_leaves_a_collective.py"), "--seconds", "2", "--counts", prefix, "--p2p"]
    printed: list[str] = []
    tables = run_recorded(monkeypatch, capsys, job, printed=printed)
    hellos = last_hellos(tables)
    for rank, hello in hellos.items():
        assert recorded(tables, rank, hello) == expected(prefix, rank)
    assert (hellos[0].lost, hellos[1].lost) == (2, 0)
    out = "\n".join(printed)
    assert "rank 0: 1 collective ended by the job's own wait()" in out, out[-3000:]
    assert "rank 0: 1 collective failed inside torch once issued" in out, out[-3000:]


def test_a_failed_wait_the_job_survives_counts_once(monkeypatch, capsys, tmp_path) -> None:
    """Rank 0's irecv times out in its wait() mid-run, the job goes on: the irecv has no record
    and counts as missing once, as the gap the later records leave (it also counted as lost at
    once: 6 + 2 of the 7 rank 0 issued)."""
    prefix = str(tmp_path / "caught")
    job = [str(REPO / "tests" / "jobs" / "caught_recv_timeout.py"), "--counts", prefix]
    tables = run_recorded(monkeypatch, capsys, job)
    hellos = last_hellos(tables)
    coll = tables.coll
    for rank, hello in hellos.items():
        iterations = np.sort(coll["iteration"][coll["rank"] == rank])
        gaps = int(iterations[-1]) + 1 - len(iterations)
        issued = json.loads(Path(f"{prefix}.rank{rank}.json").read_text())["issued"]
        assert (len(iterations), gaps + hello.lost) == (issued - (rank == 0), int(rank == 0)), (rank, iterations, hello)


@pytest.mark.parametrize(("by", "code", "reason"), [("sys.exit", 3, "sys.exit(3)"), ("message", 1, "SystemExit: rank")])
def test_ranks_that_end_with_sys_exit_say_their_exit_code(monkeypatch, capsys, tmp_path, by, code, reason) -> None:
    """``sys.exit(3)`` (or a message: status 1) never reaches sys.excepthook: each rank's own Bye
    said "finished", exit code 0, and only torchrun's word at the end corrected the first one.
    Now the ranks' own Byes say the script's status and why."""
    job = [str(REPO / "tests" / "jobs" / "ends_by_os_exit.py"), "--by", by, "--code", str(code)]
    tables = run_recorded(monkeypatch, capsys, job, exit_code=code)  # the script's, as python gives it
    own = [b for _, b in tables.byes if not b.reason.endswith("(reported by torchrun)")]
    assert own and all((b.exit_code, b.reason.startswith(reason)) in ((code, True), (-15, False)) for b in own), own
    assert any(b.exit_code == code for b in own)


@pytest.mark.parametrize("start", ["mp.spawn", "spawn"], ids=["mp.spawn", "Process-spawn"])
def test_a_script_that_spawns_its_ranks_under_several_torchrun_ranks_is_refused_in_one_line(
    monkeypatch, capsys, tmp_path, start
) -> None:
    """Two torchrun ranks would each start the job's ranks (they collide on one store): each
    stops before spawning (``mp.spawn``) or each child as it makes its group (``Process``: it may
    be a helper until then), saying how to run it; no rank of the job runs."""
    root = tempfile.mkdtemp(prefix="cm-", dir="/tmp")
    monkeypatch.setenv("COMMTOP_RUNTIME_DIR", root)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.delenv("COMMTOP_CONNECTION_FILE", raising=False)
    job = [str(REPO / "tests" / "jobs" / "spawned_ranks.py"), "--counts", str(tmp_path / "never"), "--start", start]
    try:
        code = cli.main(["run", "--headless", "--nproc", "2", "--", "python", *job])
    finally:
        shutil.rmtree(root, ignore_errors=True)
    out = capsys.readouterr()
    assert code == 2 if start == "mp.spawn" else code != 0  # mp.spawn's refusal's own code (torchrun's is 1)
    said = [line for line in (out.out + out.err).splitlines() if "starts its own ranks" in line]
    assert said and all("`commtop run --nproc 1 -- ...`" in line for line in said), out.out[-2000:]
    assert not list(tmp_path.glob("never.rank*.json"))  # no rank of the job ran
