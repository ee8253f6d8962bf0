"""workers.monitor in one process: real gloo (world size 1), real ZeroMQ, real store.

Every record the patched collectives produce must reach a real PULL socket with the right
op, size, step and iteration; the monitor must never raise into the job (no collector, a
garbage or unsafe connection file, an internal failure), and a knob flipped over the
signed control channel must apply at one step boundary.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import zmq

from tui.ingest.sources import LiveSource  # noqa: E402
from tui.run.job_plan import script_argv  # noqa: E402
from workers import monitor  # noqa: E402
from workers.monitor import patch as monitor_patch
from workers.monitor.records import OP_INDEX, OPS, MonitorBatcher  # noqa: E402
from workers.rank.publisher import NullPublisher  # noqa: E402
from workers.wire import connection as connections  # noqa: E402
from workers.wire import protocol
from workers.wire.busbw import bus_factors
from workers.wire.control import ctl_state_body  # noqa: E402
from workers.wire.settings import Settings  # noqa: E402

N = 256  # float32 elements per tensor


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module", autouse=True)
def world_of_one() -> Iterator[None]:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.fixture()
def run(monkeypatch: pytest.MonkeyPatch) -> Iterator[connections.Connection]:
    """A private runtime dir (short: ipc paths are limited) and one run in it."""
    root = tempfile.mkdtemp(prefix="cm-", dir="/tmp")
    monkeypatch.setenv("COMMTOP_RUNTIME_DIR", root)
    monkeypatch.delenv("COMMTOP_CONNECTION_FILE", raising=False)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    yield connections.create_run(label="t")
    monitor.stop()
    monitor.unpatch_distributed()
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture()
def source(run: connections.Connection) -> Iterator[LiveSource]:
    src = LiveSource(run)
    yield src
    src.close()


def drain(src: LiveSource, until_bye: bool = True, timeout_s: float = 5.0) -> list[Any]:
    """Every message until the rank's Bye (or the timeout)."""
    out: list[Any] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        out += src.poll(0.05)
        if until_bye and any(isinstance(m, protocol.Bye) for m in out):
            out += src.poll(0.1)
            break
    return out


def columns(messages: list[Any], kind: str) -> dict[str, np.ndarray]:
    batches = [m for m in messages if isinstance(m, protocol.Batch) and m.kind == kind and len(m)]
    if not batches:
        return {}
    return {k: np.concatenate([b.columns[k] for b in batches]) for k in batches[0].columns}


# --------------------------------------------------------------------------- records


def test_records_go_out_while_the_job_issues_no_more_collectives(run, source) -> None:
    """A job blocked in a collective no peer joins, evaluating or saving issues no more
    collectives: what it finished before goes out meanwhile (workers.monitor.flush_thread), not at
    its end (a hung gloo job showed 1 of its 4 all_reduces for as long as it hung)."""
    monitor.start(run.path, wait_s=2.0, sampler=False)
    monitor.patch_distributed()
    for _ in range(4):
        dist.all_reduce(torch.ones(4))
    messages = drain(source, until_bye=False, timeout_s=3.0)  # the job issues nothing meanwhile
    assert len(columns(messages, protocol.COLL).get("iteration", [])) == 4


def test_the_jobs_thread_never_encodes_or_sends_a_batch(run, source, monkeypatch) -> None:
    """Encoding and sending a batch (0.2-0.9 ms on the 2-core VM, cold after the job's idle gap)
    ran on the job's thread in its first collective after each batch interval: a job that
    computes between collectives paid it inside the call it timed, and commtop's duration left
    it out (a user's own timer read ~0.6 ms more). The job's threads only hand rows on."""
    from workers.rank.publisher import RecordPublisher

    senders: list[str] = []
    publish = RecordPublisher.publish

    def spy(self: RecordPublisher, *args: Any) -> bool:  # a spy in the test: who sends
        senders.append(threading.current_thread().name)
        return publish(self, *args)

    monkeypatch.setattr(RecordPublisher, "publish", spy)
    monitor.start(run.path, wait_s=2.0, sampler=False, batch_ms=20.0)
    monitor.patch_distributed()
    for _ in range(6):
        time.sleep(0.03)  # the job computes for longer than a batch interval
        dist.all_reduce(torch.ones(4))
    messages = drain(source, until_bye=False, timeout_s=1.5)
    assert len(columns(messages, protocol.COLL).get("iteration", [])) == 6  # all sent, none late
    assert senders and threading.main_thread().name not in senders
    # a job that never calls step(): its Hellos start anyway, from its collectives
    assert any(isinstance(m, protocol.Hello) for m in messages)


def test_a_blocking_collective_is_the_ranks_inside_until_it_returns(run) -> None:
    """The Hello says which blocking collective the job is inside (a hang names where each rank
    stopped); the first thread in holds it; an async call or a failed one leaves nothing behind."""
    mon = monitor.start(run.path, sampler=False, batch_ms=60_000.0)
    monitor.patch_distributed()
    all_reduce = monitor_patch._spec("all_reduce", monitor_patch._originals["all_reduce"])
    first = mon.coll_begin(all_reduce, (torch.ones(64),), {})
    op, group, nbytes, since = mon.status.inside
    assert (OPS[op], group, nbytes) == ("all_reduce", 0, 256) and abs(since - time.time_ns()) < 60e9
    second = mon.coll_begin(all_reduce, (torch.ones(8),), {})  # another thread's, meanwhile
    mon.coll_end(second, None)
    assert mon.status.inside[2] == 256  # still the first one's
    mon.coll_end(first, None)
    assert mon.status.inside == ()
    mon.coll_end(mon.coll_begin(all_reduce, (torch.ones(4),), {"async_op": True}), None)
    assert mon.status.inside == ()
    work = dist.all_reduce(torch.ones(4), async_op=True)  # an async gloo one: inside until its Work completes
    work.wait()
    deadline = time.monotonic() + 5.0
    while mon.status.inside and time.monotonic() < deadline:  # gloo's thread runs the done-callback
        time.sleep(0.01)
    assert mon.status.inside == ()
    mon.coll_failed(mon.coll_begin(all_reduce, (torch.ones(4),), {}))
    assert mon.status.inside == ()
    mon.close()


def test_every_patched_collective_and_copy_reaches_the_collector(run, source) -> None:
    mon = monitor.start(run.path, wait_s=2.0, sampler=False)
    assert "all_gather_into_tensor" in monitor.patch_distributed()
    t = torch.ones(N)
    big = torch.ones(N)
    out = torch.empty(N)
    expected: list[tuple[str, int, int]] = []  # (op, nbytes, step)
    for step in range(4):
        with mon.step(100 + step):
            dist.all_reduce(t)
            dist.all_gather_into_tensor(out, t)
            dist.reduce_scatter_tensor(out, big)
            dist.all_reduce(t, async_op=True).wait()
            dist.reduce_scatter_tensor(out, big, async_op=True).wait()  # a gloo Work without a future
            dist.all_gather([out], t, async_op=True).wait()
            dist.barrier()
            with mon.copy("offload", nbytes=t.nbytes):
                big.copy_(t)
        nb = 4 * N
        expected += [
            ("all_reduce", nb, 100 + step),
            ("all_gather", nb, 100 + step),
            ("reduce_scatter", nb, 100 + step),
            ("all_reduce", nb, 100 + step),
            ("reduce_scatter", nb, 100 + step),
            ("all_gather", nb, 100 + step),
            ("barrier", 0, 100 + step),
        ]
    monitor.stop()  # flushes, says Bye
    messages = drain(source)
    coll = columns(messages, protocol.COLL)
    order = np.argsort(coll["iteration"])
    assert coll["iteration"][order].tolist() == list(range(len(expected)))
    assert [OPS[o] for o in coll["op"][order]] == [e[0] for e in expected]
    assert coll["nbytes"][order].tolist() == [e[1] for e in expected]
    assert coll["step"][order].tolist() == [e[2] for e in expected]
    assert (coll["dur_us"] > 0).all() and (coll["start_ns"] >= coll["host_ns"] - 1_000_000).all()
    assert (coll["busbw"] == 0).all()  # one rank moves nothing over a bus
    copies = columns(messages, protocol.COPY)
    assert copies["step"].tolist() == [100, 101, 102, 103]
    assert copies["nbytes"].tolist() == [4 * N] * 4 and (copies["gbps"] > 0).all()
    hello = [m for m in messages if isinstance(m, protocol.Hello)][-1]
    assert hello.config["source"] == "monitor" and hello.config["op_names"] == list(OPS)
    assert hello.backend == "gloo/cpu" and hello.iteration == len(expected)
    bye = [m for m in messages if isinstance(m, protocol.Bye)]
    assert [(b.exit_code, b.reason) for b in bye] == [(0, "finished")]
    assert not source.rejected


def test_records_carry_their_group_and_dtype_and_hellos_name_the_groups(run, source) -> None:
    mon = monitor.start(run.path, wait_s=2.0, sampler=False)
    monitor.patch_distributed()
    second = dist.new_group([0])
    third = dist.new_group([0], group_desc="tp")
    calls = [  # (tensor, group argument, expected code, expected dtype)
        (torch.ones(N), None, 0, "float32"),
        (torch.ones(N, dtype=torch.bfloat16), second, 1, "bfloat16"),
        (torch.ones(N, dtype=torch.int64), third, 2, "int64"),
        (torch.ones(N, dtype=torch.bfloat16), dist.group.WORLD, 0, "bfloat16"),  # the world, named: code 0
        (torch.ones(N), second, 1, "float32"),
    ]
    with mon.step(0):
        for t, group, _, _ in calls:
            dist.all_reduce(t, group=group)
        dist.barrier(group=third)
    monitor.stop()
    messages = drain(source)
    coll = columns(messages, protocol.COLL)
    order = np.argsort(coll["iteration"])
    assert coll["group"][order].tolist() == [c[2] for c in calls] + [2]
    assert [protocol.DTYPES[d] for d in coll["dtype"][order]] == [c[3] for c in calls] + ["?"]  # a barrier has none
    hello = max((m for m in messages if isinstance(m, protocol.Hello)), key=lambda h: h.t_ns)  # two sockets
    name = dist.distributed_c10d._get_process_group_name
    assert hello.groups == (
        (name(dist.group.WORLD), "default_pg", 1),
        (name(second), "undefined", 1),
        (name(third), "tp", 1),
    )
    assert hello.lost == 0


def test_unpatched_and_stopped_monitor_record_nothing(run, source) -> None:
    monitor.patch_distributed()
    monitor.unpatch_distributed()
    assert not hasattr(dist.all_reduce, "__commtop_original__")
    mon = monitor.start(run.path, wait_s=2.0, sampler=False)
    t = torch.ones(N)
    with mon.step(0):
        dist.all_reduce(t)
    monitor.stop()
    assert not columns(drain(source), protocol.COLL)


def test_a_forked_child_forgets_the_monitor_it_inherited_without_a_word(run, source) -> None:
    """workers.capture.spawned in a forked child: the parent's monitor is dropped, never closed
    (closing it would send the parent's Bye through the parent's sockets); the child's own
    start() makes a new one. (Here in one process: what the child does to its copy.)"""
    mon = monitor.start(run.path, wait_s=2.0, sampler=False)
    monitor.patch_distributed()
    from workers.monitor import api

    api.forget_inherited()
    assert monitor.active() is None and monitor_patch._target is None
    assert not mon._closed  # nothing said for the parent
    assert not any(isinstance(m, protocol.Bye) for m in drain(source, timeout_s=0.5))
    fresh = monitor.start(run.path, sampler=False)
    assert fresh is not mon and monitor.active() is fresh
    fresh.close()
    mon.close()


def test_bus_factors_follow_nccl_tests_per_row() -> None:
    op = np.array([OP_INDEX["all_reduce"], OP_INDEX["all_gather"], OP_INDEX["broadcast"], OP_INDEX["barrier"]])
    ranks = np.array([8, 8, 4, 8])
    assert bus_factors(op, ranks).tolist() == [1.75, 0.875, 1.0, 0.0]
    batcher = MonitorBatcher(NullPublisher(), lambda: (0, -1, -1), batch_ms=50)
    cols = batcher.coll_columns([(0, 1, 0, 0, OP_INDEX["all_reduce"], 0, 1, 1000, 8, 5, 6, 1.0)])
    assert set(cols) == set(protocol.COLL_COLUMNS)
    assert cols["algbw"].tolist() == [1.0] and cols["busbw"].tolist() == [1.75]


# --------------------------------------------------------------------------- never raises


def test_no_collector_never_slows_or_raises(run) -> None:
    """The run's file names an endpoint nobody listens on: sends drop, the loop goes on."""
    mon = monitor.start(run.path, sampler=False)
    monitor.patch_distributed()
    mon.knob("offload", ["none", "overlap"])
    t = torch.ones(N)
    started = time.perf_counter()
    for step in range(300):
        with mon.step(step):
            dist.all_reduce(t)
            with mon.copy("offload", nbytes=t.nbytes):
                pass
    assert time.perf_counter() - started < 10
    assert mon.on and mon.setting("offload") == "none"
    mon.harvest()
    mon.batcher.flush()
    assert mon.publisher.dropped > 0 and mon.publisher.sent == 0


@pytest.mark.parametrize(
    "content,mode,loads",
    [
        (b"\x00\xffnot json at all", 0o600, False),
        (b'{"run_id": 1, "session": [], "key_hex": "zz", "data": 5}', 0o600, False),
        (
            b'{"run_id": "r", "session": "s", "key_hex": "00", "data": "tcp://[::1", "control": "x", '
            b'"request": "y", "host": "h", "created_ns": 0}',
            0o600,
            True,  # loads; its endpoints are nonsense: sends drop, live knobs stay off
        ),
        (b"{}", 0o644, False),  # not private: refused
    ],
)
def test_garbage_connection_file_logs_once_and_leaves_the_job_alone(run, content, mode, loads, caplog, tmp_path):
    path = tmp_path / "connection.json"
    path.write_bytes(content)
    os.chmod(path, mode)
    with caplog.at_level(logging.WARNING, logger="commtop.monitor"):
        mon = monitor.start(str(path), sampler=False)
        monitor.patch_distributed()
        value = mon.knob("offload", ["none", "overlap"], default="overlap")
        t = torch.ones(N)
        for step in range(5):
            with mon.step(step):
                dist.all_reduce(t)
                with mon.copy("offload"):
                    pass
        monitor.stop()
    assert value == "overlap" and mon.setting("offload") == "overlap"
    assert t.tolist() == [1.0] * N
    assert mon.on is loads
    warnings = [r for r in caplog.records if r.name == "commtop.monitor"]
    assert len(warnings) == 1 and "off" in warnings[0].getMessage()


def test_an_internal_failure_is_logged_once_and_disables_timing(run, source, caplog) -> None:
    mon = monitor.start(run.path, wait_s=2.0, sampler=False)
    monitor.patch_distributed()

    class FakeBrokenRows(list):
        def append(self, row: Any) -> None:
            raise MemoryError("frozen failure for the test")

    mon.batcher.coll_rows = FakeBrokenRows()
    t = torch.ones(N)
    with caplog.at_level(logging.WARNING, logger="commtop.monitor"):
        for step in range(20):
            with mon.step(step):
                dist.all_reduce(t)
    assert t.tolist() == [1.0] * N  # every all_reduce ran (world of one: sum = itself)
    assert not mon.on and "MemoryError" in mon.failure
    assert len([r for r in caplog.records if "disabled" in r.getMessage()]) == 1


def test_bad_knob_declarations_warn_once_and_return_the_default(run, caplog) -> None:
    mon = monitor.start(run.path, sampler=False)
    with caplog.at_level(logging.WARNING, logger="commtop.monitor"):
        assert mon.knob("x", []) is None
        assert mon.knob("y", ["a", "a"], default="a") == "a"
        assert mon.knob("z", ["a", "b"], default="c") == "c"
    assert mon.knobs == {}
    assert len(caplog.records) == 1
    assert mon.knob("offload", ["none", "overlap", "sync"]) == "none"
    assert mon.mode_knob == "offload"


# --------------------------------------------------------------------------- knobs


def test_a_knob_flipped_over_the_control_channel_applies_at_a_step_boundary(run, source) -> None:
    ctx = zmq.Context.instance()
    pub = ctx.socket(zmq.PUB)  # what the collector's ControlServer binds (signed CTL_STATE)
    pub.bind(run.control)
    try:
        mon = monitor.start(run.path, wait_s=2.0, sampler=False)
        monitor.patch_distributed()
        mon.knob("offload", ["none", "overlap", "sync"])
        mon.knob("dtype", ["bf16", "fp32"])
        t = torch.ones(N)
        seen: list[tuple[str, str]] = []
        wanted = Settings(mode="none", copies=0, knobs={"offload": "sync", "dtype": "fp32"})
        forged = Settings(mode="none", copies=0, knobs={"offload": "overlap", "dtype": "bf16"})
        next_send = 0.0
        deadline = time.monotonic() + 20
        step = 0
        while time.monotonic() < deadline and (not seen or seen[-1][0] == "none" or len(seen) < 5):
            with mon.step(step):
                dist.all_reduce(t)
                seen.append((mon.setting("offload"), mon.setting("dtype")))
            if time.monotonic() >= next_send:
                pub.send_multipart(protocol.seal(run.key, ctl_state_body(run.session, 1, wanted)))
                pub.send_multipart(protocol.seal(b"x" * 32, ctl_state_body(run.session, 2, forged)))
                next_send = time.monotonic() + 0.1
            time.sleep(0.002)
            step += 1
        switch = next(i for i, s in enumerate(seen) if s != ("none", "bf16"))
        assert set(seen[:switch]) == {("none", "bf16")} and set(seen[switch:]) == {("sync", "fp32")}
        monitor.stop()
        coll = columns(drain(source), protocol.COLL)
        order = np.argsort(coll["iteration"])
        epochs, modes, steps = coll["epoch"][order], coll["mode"][order], coll["step"][order]
        assert steps.tolist() == list(range(len(seen)))
        assert epochs.tolist() == [0] * switch + [1] * (len(seen) - switch)
        assert [protocol.MODES[m] for m in modes] == [s[0] for s in seen]  # the offload knob colours records
    finally:
        pub.close(0)


# --------------------------------------------------------------------------- commtop run --


def test_run_script_argv_puts_the_script_under_torchrun() -> None:
    head = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "--monitor-interval=0.2"]
    head += ["-m", "--", "workers.capture.bootstrap"]  # the script runs unmodified under the capture bootstrap
    assert script_argv(["python", "-u", "train.py", "--lr", "1"], 2)[1:] == [*head, "train.py", "--lr", "1"]
    assert script_argv(["python3", "-m", "pkg.train"], 2)[1:] == [*head, "-m", "pkg.train"]
    assert script_argv(["train.py"], 2)[1:] == [*head, "train.py"]
    # a user's own torchrun line keeps its options; the script goes under the bootstrap all the same
    assert script_argv(["torchrun", "--nproc-per-node", "8", "t.py"], 8)[1:] == [
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "8",
        "--monitor-interval=0.2",
        "-m",
        "--",
        "workers.capture.bootstrap",
        "t.py",
    ]
    with pytest.raises(Exception, match="nothing to run"):
        script_argv(["python"], 2)


def test_run_with_nothing_after_the_dashes_is_one_line_and_exit_2(capsys) -> None:
    from tui.cli import main

    assert main(["run", "--headless", "--"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nothing to run after `--`" in err


def test_the_tuis_mode_key_through_the_real_control_server_moves_the_mode_knob(run, source) -> None:
    """ControlServer only knows built-in settings today; its mode change must reach the
    job's mode knob (the first knob whose choices are offload modes)."""
    from tui.run.control_server import ControlServer

    server = ControlServer(run, publish_s=0.1)
    try:
        mon = monitor.start(run.path, wait_s=2.0, sampler=False)
        monitor.patch_distributed()
        mon.knob("offload", ["none", "overlap", "sync"], default="overlap")
        t = torch.ones(N)
        seen: list[str] = []
        requested = ""
        deadline = time.monotonic() + 20
        step = 0
        while time.monotonic() < deadline and (not seen or seen[-1] != "sync" or seen.count("sync") < 3):
            with mon.step(step):
                dist.all_reduce(t)
                seen.append(mon.setting("offload"))
            for message in source.poll(0.0):
                server.write(message)
            if not requested and server.desired is not None:  # the collector heard the job's settings
                requested = server.request({"mode": "sync"}) or "accepted"
            time.sleep(0.003)
            step += 1
        assert requested == "accepted"
        first = seen.index("sync")
        assert set(seen[:first]) == {"overlap"} and set(seen[first:]) == {"sync"}
        until = time.monotonic() + 5  # the next Hello (1 s) tells the collector what is in force
        while time.monotonic() < until and getattr(server.in_force().settings, "knobs", None) != {"offload": "sync"}:
            with mon.step(step):  # the job goes on (batch headers say which epoch is in force)
                dist.all_reduce(t)
            step += 1
            for message in source.poll(0.01):
                server.write(message)
        now = server.in_force()
        assert now.settings is not None and now.settings.knobs == {"offload": "sync"} and now.settings.mode == "sync"
        assert now.epoch == 1
    finally:
        server.close()


def test_ctl_sets_a_knob_by_name_through_the_real_control_server(run, source) -> None:
    """The collector learns the job's knobs from its Hello and validates changes against them."""
    from tui.run.control_server import ControlServer

    server = ControlServer(run, publish_s=0.1)
    try:
        mon = monitor.start(run.path, wait_s=2.0, sampler=False)
        monitor.patch_distributed()
        mon.knob("offload", ["none", "overlap", "sync"])
        mon.knob("prefetch", ["off", "on"])
        t = torch.ones(N)
        seen: list[tuple[str, str]] = []
        answers: list[str] = []
        deadline = time.monotonic() + 20
        step = 0
        while time.monotonic() < deadline and (not seen or seen[-1][1] != "on" or len(answers) < 3):
            with mon.step(step):
                dist.all_reduce(t)
                seen.append((mon.setting("offload"), mon.setting("prefetch")))
            for message in source.poll(0.0):
                server.write(message)
            if not answers and server.desired is not None:
                answers.append(server.request({"prefetch": "sideways"}))  # not a declared choice
                answers.append(server.request({"knob.nope": "on"}))  # not a declared knob
                answers.append(server.request({"knob.prefetch": "on"}))
            time.sleep(0.003)
            step += 1
        assert "sideways" in answers[0] and "nope" in answers[1] and answers[2] == ""
        first = seen.index(("none", "on"))
        assert set(seen[:first]) == {("none", "off")} and set(seen[first:]) == {("none", "on")}
    finally:
        server.close()


def test_a_job_without_steps_still_sends_records_and_hellos(run, source) -> None:
    monitor.start(run.path, wait_s=2.0, sampler=False)
    monitor.patch_distributed()
    t = torch.ones(N)
    for _ in range(100):
        dist.all_reduce(t)
    time.sleep(1.3)  # the heartbeat's first Hello (its socket may still be connecting) and the next
    stopped_ns = time.time_ns()
    monitor.stop()
    messages = drain(source)
    coll = columns(messages, protocol.COLL)
    assert sorted(coll["iteration"].tolist()) == list(range(100)) and set(coll["step"].tolist()) == {-1}
    assert [m for m in messages if isinstance(m, protocol.Hello) and m.t_ns < stopped_ns]  # from the heartbeat


def test_a_slow_job_without_steps_sends_each_record_within_a_batch_interval(run, source) -> None:
    """A few collectives a second and no optimizer steps: the records reach the collector
    while the job runs (they waited for 64 collectives before), not only at its exit."""
    monitor.start(run.path, wait_s=2.0, sampler=False, batch_ms=50.0)
    monitor.patch_distributed()
    t = torch.ones(N)
    seen: list[Any] = []
    for _ in range(5):
        dist.all_reduce(t)
        time.sleep(0.08)
    dist.all_reduce(t)  # past the batch interval: the harvest that sends the five before it
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline and len(columns(seen, protocol.COLL).get("iteration", ())) < 5:
        seen += source.poll(0.05)
    assert len(columns(seen, protocol.COLL)["iteration"]) >= 5  # while the job still runs
    monitor.stop()


def test_a_refused_call_is_no_record_and_leaves_no_gap(run, source) -> None:
    """torch refuses a call before issuing it (a root outside the group, a dtype gloo lacks, a
    list for a tensor): the job sees torch's error, commtop counts nothing, and the next
    collective takes the iteration, so nothing is shown as missing."""
    monitor.start(run.path, wait_s=2.0, sampler=False)
    monitor.patch_distributed()
    t = torch.ones(N)
    dist.all_reduce(t)
    for bad in (
        lambda: dist.broadcast(t, src=7),
        lambda: dist.all_reduce(torch.ones(4, dtype=torch.uint16)),
        lambda: dist.all_reduce([t]),  # no tensor: the hooks cannot describe it (they turned the monitor off)
    ):
        with pytest.raises((RuntimeError, ValueError, TypeError)):
            bad()
    dist.all_reduce(t)
    monitor.stop()
    coll = columns(drain(source), protocol.COLL)
    assert coll["iteration"].tolist() == [0, 1]
    assert coll["op"].tolist() == [protocol.OP_NAMES.index("all_reduce")] * 2


def test_a_refused_call_on_one_thread_leaves_no_gap_while_another_thread_issues(run, source) -> None:
    """Two of the job's threads interleave (a saver thread beside the loop): the loop's call
    begins, the saver's begins and ends, then torch refuses the loop's: its iteration is taken
    by the next call, so every record is there once and nothing is shown as missing."""
    mon = monitor.start(run.path, wait_s=2.0, sampler=False)
    monitor.patch_distributed()
    spec = monitor_patch._spec("all_reduce", monitor_patch._originals["all_reduce"])
    t = torch.ones(N)
    refused = mon.coll_begin(spec, (t,), {})
    saver = threading.Thread(target=lambda: mon.coll_end(mon.coll_begin(spec, (t,), {}), None))
    saver.start()
    saver.join()
    mon.coll_failed(refused)
    for _ in range(2):
        mon.coll_end(mon.coll_begin(spec, (t,), {}), None)
    assert mon.timers.iteration == 3
    monitor.stop()
    coll = columns(drain(source), protocol.COLL)
    assert sorted(coll["iteration"].tolist()) == [0, 1, 2]


def test_a_group_this_rank_is_not_in_is_no_record(run, source) -> None:
    """torch returns at once for a group the rank is not in (GroupMember.NON_GROUP_MEMBER)
    and issues nothing: commtop must not count it as a collective of a group of its own."""
    mon = monitor.start(run.path, wait_s=2.0, sampler=False)
    monitor.patch_distributed()
    t = torch.ones(N)
    not_mine = dist.GroupMember.NON_GROUP_MEMBER  # what new_group gives a rank outside it
    for _ in range(3):
        assert dist.all_reduce(t, group=not_mine) is None
    dist.all_reduce(t)
    assert mon.timers.iteration == 1
    monitor.stop()
    coll = columns(drain(source), protocol.COLL)
    assert coll["iteration"].tolist() == [0]


def test_monitored_barrier_is_timed_as_a_barrier(run, source) -> None:
    monitor.start(run.path, wait_s=2.0, sampler=False)
    assert "monitored_barrier" in monitor.patch_distributed()
    for _ in range(3):
        dist.monitored_barrier()
    monitor.stop()
    coll = columns(drain(source), protocol.COLL)
    assert coll["op"].tolist() == [protocol.OP_NAMES.index("barrier")] * 3


# --------------------------------------------------------------------------- CUDA branch, without a GPU


class FakeCudaTensor:
    """What the hooks read of a CUDA tensor (CI has no GPU; the H200 run covers the real one)."""

    is_cuda = True
    nbytes = 4096
    dtype = torch.float16


class FakeCudaTimer:
    """Records which stream each begin/end ran on, like CudaTimer records events there."""

    def __init__(self, torch_: Any) -> None:
        self.torch = torch_
        self.calls: list[tuple[str, str, Any]] = []
        self.untimed = 0
        self.count = 0

    def begin(self, meta: Any) -> int:
        self.calls.append(("begin", self.torch.current, meta))
        return len(self.calls)

    def end(self, slot: int) -> None:
        self.calls.append(("end", self.torch.current, slot))

    def harvest(self, out: list) -> None:
        pass


class FakeCudaTimers:
    """What the hooks use of workers.monitor.timers.CudaTimers: a ring per thread (the calling
    thread's given one, ``coll``), ``limit`` rings at most."""

    def __init__(self, torch_: Any, coll: FakeCudaTimer, copy: FakeCudaTimer, limit: int = 8) -> None:
        self.torch, self.copy, self.stream, self.limit = torch_, copy, "private", limit
        self.rings = {threading.get_ident(): coll}

    def coll_ring(self) -> FakeCudaTimer | None:
        me = threading.get_ident()
        if me not in self.rings and len(self.rings) < self.limit:
            self.rings[me] = FakeCudaTimer(self.torch)
        return self.rings.get(me)

    def coll_rings(self) -> list[FakeCudaTimer]:
        return list(self.rings.values())


class FakeTorchCuda:
    """torch.cuda.stream(s) as a context that sets the current stream name."""

    def __init__(self) -> None:
        self.current = "issuing"
        self.cuda = self

    def stream(self, name: str) -> Any:
        fake = self

        class Ctx:
            def __enter__(self) -> None:
                self.prev, fake.current = fake.current, name

            def __exit__(self, *exc: object) -> None:
                fake.current = self.prev

        return Ctx()


class FakeFuture:
    def __init__(self, torch_: FakeTorchCuda, done: bool) -> None:
        self.torch, self._done, self.waited_on = torch_, done, ""

    def done(self) -> bool:
        return self._done

    def wait(self) -> None:
        self.waited_on = self.torch.current


class FakeWork:
    def __init__(self, future: FakeFuture | None) -> None:
        self.future = future

    def get_future(self) -> FakeFuture:
        if self.future is None:
            raise RuntimeError("Work::getFuture not implemented.")
        return self.future


def test_cuda_branch_ends_async_collectives_on_the_private_stream_and_never_waits(run) -> None:
    # a batch interval longer than the test: no harvest by time reaches the fake CUDA timers on a loaded machine
    mon = monitor.start(run.path, sampler=False, batch_ms=60_000.0)
    monitor.patch_distributed()
    fake_torch = FakeTorchCuda()
    timer = FakeCudaTimer(fake_torch)
    mon.timers.cuda = FakeCudaTimers(fake_torch, timer, FakeCudaTimer(fake_torch))
    spec = monitor_patch._spec("all_reduce", monitor_patch._originals["all_reduce"])
    t = FakeCudaTensor()

    mon.coll_end(mon.coll_begin(spec, (t,), {}), None)  # blocking: both ends on the issuing stream
    done = FakeFuture(fake_torch, done=True)
    mon.coll_end(mon.coll_begin(spec, (t,), {"async_op": True}), FakeWork(done))
    mon.coll_end(mon.coll_begin(spec, (t,), {"async_op": True}), FakeWork(FakeFuture(fake_torch, done=False)))
    mon.coll_end(mon.coll_begin(spec, (t, None, None, True), {}), FakeWork(None))

    assert [(c[0], c[1]) for c in timer.calls] == [
        ("begin", "issuing"),
        ("end", "issuing"),
        ("begin", "issuing"),
        ("end", "private"),  # after the private stream waited on the Work's future
        ("begin", "issuing"),
        ("begin", "issuing"),
    ]
    assert done.waited_on == "private" and timer.untimed == 2 and mon.on
    metas = [c[2] for c in timer.calls if c[0] == "begin"]
    assert [m[0] for m in metas] == [0, 1, 2, 3] and {m[4:9] for m in metas} == {
        (OP_INDEX["all_reduce"], 0, protocol.DTYPE_INDEX["float16"], 4096, 1)
    }


def test_gpu_collectives_of_another_thread_go_into_that_threads_ring(run) -> None:
    """A ring's begin/end pairs must not interleave (its slots) and complete in one stream's
    order: a thread that issues GPU collectives (DDP's comm hook on autograd's device thread, a
    saver beside the loop) gets a ring of its own; past the rings there are, a collective takes
    no slot and no iteration, and the Hello's ``lost`` counts it."""
    mon = monitor.start(run.path, sampler=False, batch_ms=60_000.0)
    monitor.patch_distributed()
    fake_torch = FakeTorchCuda()
    main_ring = FakeCudaTimer(fake_torch)
    mon.timers.cuda = cuda = FakeCudaTimers(fake_torch, main_ring, FakeCudaTimer(fake_torch), limit=2)
    spec = monitor_patch._spec("all_reduce", monitor_patch._originals["all_reduce"])
    main_token = mon.coll_begin(spec, (FakeCudaTensor(),), {})  # the main thread is inside one ...
    inside, release = threading.Event(), threading.Event()

    def saver() -> None:
        token = mon.coll_begin(spec, (FakeCudaTensor(),), {})
        inside.set()
        assert release.wait(10)
        mon.coll_end(token, None)

    other = threading.Thread(target=saver)
    other.start()
    assert inside.wait(10)  # ... while another thread begins its own
    third: list[Any] = []
    extra = threading.Thread(target=lambda: third.append(mon.coll_begin(spec, (FakeCudaTensor(),), {})))
    extra.start()
    extra.join()
    release.set()
    other.join()
    mon.coll_end(main_token, None)
    saver_ring = next(r for r in cuda.rings.values() if r is not main_ring)
    assert [c[0] for c in main_ring.calls] == ["begin", "end"] and [c[0] for c in saver_ring.calls] == ["begin", "end"]
    assert {main_ring.calls[0][2][0], saver_ring.calls[0][2][0]} == {0, 1}  # one numbering
    assert third == [None] and mon.timers.iteration == 2  # the third thread: no ring left
    assert mon.status.lost == 1 and mon.on


def test_a_gpu_collective_issued_during_cuda_graph_capture_is_counted_not_timed(run, caplog) -> None:
    """While a CUDA graph is captured no event may be recorded on the stream (on the H100 the
    event record failed the capture: "CUDA error: invalid argument", and the monitor switched
    itself off; under the Flight Recorder capture it was not counted at all): such a collective
    takes no slot and no iteration, counts as lost, and the end says that the graph's replays
    run it unseen. Capture over, timing goes on."""
    mon = monitor.start(run.path, sampler=False, batch_ms=60_000.0)
    monitor.patch_distributed()
    fake_torch = FakeTorchCuda()
    ring = FakeCudaTimer(fake_torch)
    mon.timers.cuda = FakeCudaTimers(fake_torch, ring, FakeCudaTimer(fake_torch))
    spec = monitor_patch._spec("all_reduce", monitor_patch._originals["all_reduce"])
    mon.timers.graph_counter = None  # no graph counter (tests/test_graph_counter.py): the hooks' count
    mon.timers.capturing = lambda: True
    assert mon.coll_begin(spec, (FakeCudaTensor(),), {}) is None
    mon.timers.capturing = lambda: False
    mon.coll_end(mon.coll_begin(spec, (FakeCudaTensor(),), {}), None)
    assert [c[0] for c in ring.calls] == ["begin", "end"] and ring.calls[0][2][0] == 0  # iteration 0
    assert mon.status.lost == 1 and mon.on
    # under the Flight Recorder capture the hooks leave NCCL's collectives to it, but torch keeps
    # no entry of a captured one: the hooks count it
    mon.timers.gloo_only, mon.timers.capturing = True, lambda: True
    assert mon.coll_begin(spec, (FakeCudaTensor(),), {}) is None and mon.status.lost == 2
    with caplog.at_level(logging.WARNING):
        mon.close()
    assert "2 collectives were issued while a CUDA graph was captured" in caplog.text


def test_a_gpu_send_on_an_nccl_group_stays_out_of_the_count_nccl_compares(run) -> None:
    """NCCL numbers its sends and receives apart from its collectives (workers.monitor.unseen):
    a hook that counted a CUDA tensor's send on an NCCL group would hide a missed collective."""
    mon = monitor.start(run.path, sampler=False, batch_ms=60_000.0)
    monitor.patch_distributed()
    fake_torch = FakeTorchCuda()
    ring = FakeCudaTimer(fake_torch)
    mon.timers.cuda = FakeCudaTimers(fake_torch, ring, FakeCudaTimer(fake_torch))
    mon.timers.capturing = lambda: False
    code, _size = mon.groups.of_pg(None)
    unseen = mon.timers.unseen
    unseen._code_kinds[code] = ("nccl",)  # as if the default group were NCCL's (no GPU here)
    send = monitor_patch._spec("send", monitor_patch._originals["send"])
    all_reduce = monitor_patch._spec("all_reduce", monitor_patch._originals["all_reduce"])
    mon.coll_end(mon.coll_begin(send, (FakeCudaTensor(), 0), {}), None)
    assert unseen.seen[code] == 0 and "send" not in unseen.issued
    mon.coll_end(mon.coll_begin(all_reduce, (FakeCudaTensor(),), {}), None)
    assert unseen.seen[code] == 1
    unseen._code_kinds[code] = ("gloo",)  # gloo numbers its sends with the rest
    mon.coll_end(mon.coll_begin(send, (FakeCudaTensor(), 0), {}), None)
    assert unseen.seen[code] == 2
    mon.close()


def test_collectives_in_cuda_graphs_count_in_the_ranks_lost(run, caplog) -> None:
    """The monitor counts what the job's CUDA graphs run at their replays (workers.monitor.graphs,
    on torch.cuda.CUDAGraph): the Hello's ``lost``, and one line at the end."""
    from workers.monitor import graphs

    mon = monitor.start(run.path, sampler=False, batch_ms=60_000.0)
    counter = mon.timers.graph_counter
    assert counter is not None and getattr(torch.cuda.CUDAGraph.replay, "__wrapped__", None) is not None
    numbers = [0]
    counter.sequences = lambda: {"0": numbers[0]}
    graph = object()
    counter.begin(graph)
    numbers[0] += 2  # two collectives issued into the graph
    counter.end(graph)
    assert mon.status.lost == 0  # a capture runs nothing
    counter.replay(graph)
    counter.replay(graph)
    assert mon.status.lost == 4
    with caplog.at_level(logging.WARNING):
        mon.close()
    assert "4 collectives run by the replays of 1 CUDA graph(s) (2 captured in them" in caplog.text
    graphs.uninstall()


def test_functional_collectives_are_timed_to_their_first_use(run, source) -> None:
    """A functional collective (DTensor's path) is recorded with its op, bytes and group (here
    given as a DeviceMesh-free ProcessGroup and as a list of ranks); unpatching restores them."""
    import torch.distributed._functional_collectives as funcol

    original = funcol.all_reduce
    monitor.start(run.path, wait_s=2.0, sampler=False)
    assert {"funcol.all_reduce", "funcol.all_gather_single"} <= set(monitor.patch_distributed())
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (1,))
    t = torch.ones(N)
    a = funcol.all_reduce(t, "sum", dist.group.WORLD)
    g = funcol.all_gather_single(t, 0, [0])
    assert float((a + 0).sum()) == N and g.shape == (N,)
    float(g.sum())
    for _ in range(2):  # a 1-D mesh: resolved once, then from the cache
        float(funcol.broadcast(t, 0, mesh).sum())
    assert monitor_patch._mesh_groups.get(mesh) is not None
    monitor.stop()
    coll = columns(drain(source), protocol.COLL)
    assert coll["op"].tolist() == [OP_INDEX[op] for op in ("all_reduce", "all_gather", "broadcast", "broadcast")]
    assert coll["nbytes"].tolist() == [N * 4] * 4 and coll["iteration"].tolist() == [0, 1, 2, 3]
    assert len(set(coll["group"].tolist())) == 1  # the world group, however it was named
    monitor.unpatch_distributed()
    assert funcol.all_reduce is original


def test_isend_and_irecv_of_cuda_tensors_are_left_to_the_flight_recorder(run) -> None:
    """NCCL's non-blocking point-to-point is not timed by the Python hooks (coalesced in
    batch_isend_irecv, its Works are not the ones waited on): no token, no iteration taken,
    so no gap; a CPU tensor's is timed to the job's wait (tests/test_wait_hook.py)."""
    mon = monitor.start(run.path, sampler=False, batch_ms=60_000.0)
    assert {"ProcessGroup.send", "ProcessGroup.recv"} <= set(monitor.patch_distributed())
    for name in ("send", "recv"):
        spec = monitor_patch.method_spec(name)
        assert mon.coll_begin(spec, (dist.group.WORLD, [FakeCudaTensor()], 0, 0), {}) is None
    assert mon.timers.iteration == 0 and mon.on


def test_gpu_records_still_in_flight_at_close_are_counted_lost_not_dropped(run) -> None:
    """A rank stopped while a kernel holds its last collectives (H100: 148 never sent, ``lost 0``):
    what never finished is counted in the last Hello."""
    mon = monitor.start(run.path, sampler=False, batch_ms=60_000.0)
    fake_torch = FakeTorchCuda()
    coll, copy = FakeCudaTimer(fake_torch), FakeCudaTimer(fake_torch)
    coll.untimed, coll.count, copy.untimed, copy.count = 2, 5, 1, 3  # harvest never finishes them
    mon.timers.cuda = FakeCudaTimers(fake_torch, coll, copy)
    mon.capture_lost(4)  # the Flight Recorder's, beside them (CUDA-event copies): added, not replaced
    mon.close()
    assert mon.status.lost == 4 + 2 + 5
    assert mon.status.untimed == 2 + 5 + 1 + 3


def test_a_stopping_rank_holds_the_jobs_thread_at_a_step_hook(run) -> None:
    """Under the Flight Recorder capture no collective hook comes: the capture's step hooks are
    where a stop holds the job's thread (when SIGTERM could not park it inside commtop's code)."""
    mon = monitor.start(run.path, sampler=False)
    mon.hold_if_stopping()  # not stopping: returns at once
    held = mon.hold_for_exit(-15, "stopped by SIGTERM")
    assert not held.is_set()
    threading.Thread(target=mon.hold_if_stopping, daemon=True).start()  # parks there for good
    assert held.wait(10)
    mon._holding = False  # (the process would end here; let the fixture close this monitor)
