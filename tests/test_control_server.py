"""ControlServer and `commtop ctl` over real sockets, without workers.

What the workers would report is written straight into the server's Sink side
(``frozen_hello`` / ``header``); what the server publishes is read by rank 0's real
DesiredListener. The end-to-end tests with torchrun ranks are in test_control_e2e.py.
"""

from __future__ import annotations

import os
import threading
import time

import pytest
import zmq

from tui import cli
from tui.run import ctl
from tui.run.control_server import ControlServer
from tui.run.run_dirs import lock_run
from workers.rank.live_control import DesiredListener
from workers.wire import protocol
from workers.wire.settings import Settings


@pytest.fixture()
def server(conn):
    lock = lock_run(conn.run_dir)  # the run's collector holds its lock (what `ctl` looks for)
    srv = ControlServer(conn, publish_s=0.1)
    yield srv
    srv.close()
    os.close(lock)


def frozen_hello(
    rank: int, epoch: int, settings: Settings, rejected: dict[str, int] | None = None, config: dict | None = None
) -> protocol.Hello:
    return protocol.Hello(
        rank=rank,
        world_size=2,
        local_rank=rank,
        local_world_size=2,
        host="h",
        pid=1,
        backend="gloo/cpu",
        device="cpu",
        device_index=-1,
        gpu_uuid="",
        torch_version="x",
        nccl_version="",
        config=config or {},
        settings=settings.as_dict(),
        epoch=epoch,
        iteration=0,
        pinned_bytes=0,
        t_ns=0,
        started_ns=0,
        rejected=rejected or {},
    )


def header(rank: int, epoch: int, pending: int = -1, apply_at: int = -1) -> protocol.Batch:
    return protocol.Batch("coll", rank, 0, 0, {}, epoch_in_force=epoch, pending_epoch=pending, apply_at=apply_at)


def listen(conn, settle_s: float = 1.0) -> DesiredListener:
    listener = DesiredListener(conn.control, conn.key, conn.session, context=zmq.Context.instance())
    time.sleep(0.2)  # let the subscription reach the publisher
    return listener


def heard(listener: DesiredListener, within_s: float = 2.0) -> tuple[int, Settings] | None:
    """What the listener holds after ``within_s`` (sooner once it heard something)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline and listener.desired is None:
        listener.poll(0.05)
    return listener.desired


def test_publishes_nothing_until_the_workers_report_then_adopts_the_state_in_force(conn, server):
    listener = listen(conn)
    try:
        assert heard(listener, 0.6) is None
        assert server.request({"mode": "none"}).startswith("the workers have not reported")
        assert "waiting for the workers" in server.view().note
        server.write(header(0, 3))  # a header alone names no settings: still nothing
        assert heard(listener, 0.4) is None
        in_force = Settings(mode="sync", copies=2)
        server.write(frozen_hello(0, 3, in_force))
        assert heard(listener) == (3, in_force)
        assert server.view().requested == in_force == server.in_force().settings
        assert server.in_force().epoch == 3
    finally:
        listener.close()


def test_request_validates_and_bumps_the_epoch(conn, server):
    server.write(frozen_hello(0, 0, Settings()))
    assert server.request({"copies": 17}).startswith("copies must be an integer in 0..16")
    assert server.request({"speed": 1}).startswith("unknown setting 'speed'")
    assert server.desired == (0, Settings())
    assert server.request({"mode": "sync-barrier", "pinned": False}) == ""
    assert server.desired == (1, Settings(mode="sync-barrier", pinned=False))
    listener = listen(conn)
    try:
        assert heard(listener) == (1, Settings(mode="sync-barrier", pinned=False))
    finally:
        listener.close()
    # the workers switching: "switching at iteration N", then in force
    server.write(header(0, 0, 1, 640))
    now = server.in_force()
    assert (now.epoch, now.pending_epoch, now.apply_at) == (0, 1, 640)
    server.write(header(0, 0, 1, 1280))  # re-issued after a late rank
    assert "re-issued" in server.view().note and "1280" in server.view().note
    server.write(header(0, 1))
    now = server.in_force()
    assert (now.epoch, now.pending_epoch) == (1, -1)
    assert now.settings is not None and now.settings.mode == "sync-barrier"


def test_holds_while_workers_switch_to_an_epoch_it_does_not_know(conn, server):
    """A restarted collector must not push an older state over a change still in flight."""
    server.write(frozen_hello(0, 4, Settings()))
    server.write(header(0, 4, 5, 900))
    assert server.request({"copies": 1}).startswith("the workers are still switching")
    listener = listen(conn)
    try:
        assert heard(listener, 0.5) is None
        server.write(frozen_hello(0, 5, Settings(mode="none")))
        server.write(header(0, 5))
        assert heard(listener) == (5, Settings(mode="none"))
    finally:
        listener.close()


def fake_workers_follow(server: ControlServer, stop: threading.Event) -> None:
    """Acts as the workers: whatever is desired is in force 0.2 s later (headers + Hello)."""
    done = 0
    while not stop.is_set():
        desired = server.desired
        if desired is not None and desired[0] > done:
            epoch, settings = desired
            done = epoch
            server.write(header(0, epoch - 1, epoch, 100 * epoch))
            time.sleep(0.2)
            server.write(header(0, epoch))
            server.write(frozen_hello(0, epoch, settings))
        time.sleep(0.05)


def test_ctl_set_mode_and_status(conn, server, capsys):
    server.write(frozen_hello(0, 0, Settings()))
    stop = threading.Event()
    follower = threading.Thread(target=fake_workers_follow, args=(server, stop), daemon=True)
    follower.start()
    try:
        assert cli.main(["ctl", "mode", "sync"]) == 0  # newest run of this user
        assert "mode=sync: in force from iteration 100 (epoch 1)" in capsys.readouterr().out
        assert cli.main(["ctl", "--run", conn.run_id, "set", "copies=3", "pinned=false", "copy_scale=0.5"]) == 0
        assert server.desired == (2, Settings(mode="sync", copies=3, pinned=False, copy_scale=0.5))
        capsys.readouterr()
        assert cli.main(["ctl", "--run", conn.path, "status"]) == 0
        out = capsys.readouterr().out
        assert "in force  (epoch 2): mode=sync copies=3 copy_scale=0.5 pinned=false direction=d2h" in out
        assert "requested (epoch 2): same" in out
    finally:
        stop.set()
        follower.join()


def test_ctl_out_of_range_is_a_clear_error_exit_2_and_changes_nothing(conn, server, capsys):
    server.write(frozen_hello(0, 0, Settings()))
    for argv in (["set", "copies=99"], ["mode", "fast"], ["set", "copy_scale=3"], ["set", "colour=red"]):
        assert cli.main(["ctl", *argv]) == 2, argv
        *note, err = capsys.readouterr().err.splitlines()  # checked locally, or: which run it asked, then why
        assert note in ([], [f"commtop ctl: run {conn.run_id} (collector pid {os.getpid()})"]), note
        assert err.startswith("commtop ctl: error: ") and "nothing changed" in err, err
    # the collector refuses it too (a ctl that skipped its own check)
    with ctl.CtlClient(conn) as client:
        reply = client.call("set", changes={"copies": 99}, expect=1)
    assert reply["ok"] is False and "copies must be an integer in 0..16" in reply["error"]
    assert server.desired == (0, Settings())


def test_ctl_without_a_collector_says_so(conn, capsys):
    assert cli.main(["ctl", "--timeout", "0.3", "status"]) == 2  # the only run has no collector: not a candidate
    assert "no running commtop run of yours" in capsys.readouterr().err
    assert (
        cli.main(["ctl", "--timeout", "0.3", "--run", conn.run_id, "status"]) == 1
    )  # named: it is asked, and says nothing
    assert "no reply from the collector" in capsys.readouterr().err
    assert cli.main(["ctl", "--run", "no-such-run", "status"]) == 2


def raw_request(conn, frames: list[bytes], timeout_s: float = 0.3) -> list[bytes] | None:
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(conn.request)
    try:
        sock.send_multipart(frames)
        if sock.poll(int(timeout_s * 1000)):
            return sock.recv_multipart()
        return None
    finally:
        sock.close(0)


def set_body(conn, expect: int, changes: dict, session: str | None = None) -> dict:
    return {
        "v": protocol.SCHEMA_VERSION,
        "k": protocol.CTL_REQ,
        "s": session or conn.session,
        "op": "set",
        "expect": expect,
        "changes": changes,
        "nonce": "n",
    }


def test_rogue_requests_never_change_the_mode_and_are_counted_by_reason(conn, server):
    server.write(frozen_hello(0, 0, Settings()))
    valid = protocol.seal(conn.key, set_body(conn, 1, {"mode": "sync"}))
    assert raw_request(conn, valid) is not None  # a legitimate change: epoch 1
    assert server.desired == (1, Settings(mode="sync"))
    unsigned = [b"", protocol.seal(conn.key, set_body(conn, 2, {"mode": "none"}))[1]]
    wrong_key = protocol.seal(bytes(32), set_body(conn, 2, {"mode": "none"}))
    flipped = protocol.seal(conn.key, set_body(conn, 2, {"mode": "none"}))
    flipped[1] = flipped[1].replace(b"none", b"nonf")
    foreign = protocol.seal(conn.key, set_body(conn, 2, {"mode": "none"}, session="other"))
    for frames in (unsigned, wrong_key, flipped, foreign):
        assert raw_request(conn, frames) is None  # no answer to an unauthenticated peer
    reply = raw_request(conn, valid)  # replay of the old valid request: stale epoch
    assert reply is not None
    body = protocol.open_frames(conn.key, reply, conn.session)
    assert body["ok"] is False and body["error"].startswith("stale request")
    assert server.desired == (1, Settings(mode="sync"))
    assert server.rejected_by_reason() == {"signature": 3, "session": 1, "replay": 1}
    assert server.view().rejected == 5


def test_a_restarted_server_learns_the_mode_in_force_without_resetting_it(conn):
    first = ControlServer(conn, publish_s=0.1)
    first.write(frozen_hello(0, 0, Settings()))
    assert first.request({"mode": "none", "copies": 7}) == ""
    first.close()
    second = ControlServer(conn, publish_s=0.1)
    listener = listen(conn)
    try:
        assert heard(listener, 0.5) is None  # nothing published before the workers speak
        second.write(header(1, 1))
        second.write(frozen_hello(1, 1, Settings(mode="none", copies=7), rejected={"signature": 2}))
        assert heard(listener) == (1, Settings(mode="none", copies=7))
        in_force, requested = second.in_force().settings, second.view().requested
        assert in_force is not None and in_force.mode == "none" and requested is not None and requested.copies == 7
        with ctl.CtlClient(conn) as client:
            assert client.status()["worker_rejected"] == 2
    finally:
        listener.close()
        second.close()


def test_a_second_server_on_a_live_run_is_refused(conn, server):
    from tui.run.control_server import ControlServerError

    with pytest.raises(ControlServerError, match="address already in use"):
        ControlServer(conn)


def test_knobs_of_a_monitored_job_are_validated_with_the_choices_it_declared(conn, server, capsys):
    knobs = {"offload": ["none", "overlap", "sync"]}
    in_force = Settings(mode="overlap", copies=0, knobs={"offload": "overlap"})
    server.write(frozen_hello(0, 0, in_force, config={"source": "monitor", "knobs": knobs}))
    assert cli.main(["ctl", "--no-wait", "set", "knob.offload=sync"]) == 0, capsys.readouterr().err
    assert server.desired == (1, Settings(mode="overlap", copies=0, knobs={"offload": "sync"}))
    assert cli.main(["ctl", "--no-wait", "set", "offload=none"]) == 0, capsys.readouterr().err
    assert server.desired[1].knobs == {"offload": "none"}
    capsys.readouterr()
    assert cli.main(["ctl", "--no-wait", "set", "offload=fast"]) == 2
    assert "offload=fast: choices none, overlap, sync; nothing changed" in capsys.readouterr().err
    assert (
        server.request({"knob.colour": "red"})
        == "this job has no knob 'colour' (its knobs: offload (none/overlap/sync))"
    )
    assert server.desired == (2, Settings(mode="overlap", copies=0, knobs={"offload": "none"}))


def test_a_change_that_changes_nothing_starts_no_epoch(conn, server):
    server.write(frozen_hello(0, 4, Settings(pinned=False)))
    assert server.request({"pinned": False}) == ""  # accepted: it is already so
    assert server.desired == (4, Settings(pinned=False))  # no epoch 5, nothing for the workers to do
    assert server.request({"pinned": True}) == "" and server.desired == (5, Settings(pinned=True))


def test_ctl_json_prints_the_status_without_the_envelope(conn, server, capsys):
    import json

    server.write(frozen_hello(0, 0, Settings()))
    assert cli.main(["ctl", "--run", conn.run_id, "--json", "status"]) == 0
    reply = json.loads(capsys.readouterr().out)
    assert reply["epoch_in_force"] == 0 and reply["in_force"]["mode"] == Settings().mode
    assert not {"nonce", "s", "v", "k"} & set(reply) and conn.session not in json.dumps(reply)


def test_status_counts_ranks_that_ended_apart_and_drops_an_endpoint_its_sampler_closed(conn, server, capsys):
    from workers.wire.telemetry import Caps, caps_body

    for rank in (0, 1):
        server.write(frozen_hello(rank, 0, Settings()))

    def caps(url: str) -> dict:
        return caps_body(conn.session, Caps("h", 1, 0, 0.5, "", "", (), prometheus=url))

    server.write(caps("http://127.0.0.1:9400/metrics"))
    assert cli.main(["ctl", "--run", conn.run_id, "status"]) == 0
    out = capsys.readouterr().out
    assert f"run {conn.run_id}: 2 rank(s) reporting\n" in out and "prometheus h: http://127.0.0.1:9400/metrics" in out
    server.write(protocol.Bye(rank=1, exit_code=0, reason="", t_ns=0))
    assert cli.main(["ctl", "--run", conn.run_id, "status"]) == 0
    assert f"run {conn.run_id}: 1 rank(s) reporting, 1 exited\n" in capsys.readouterr().out
    server.write(frozen_hello(1, 0, Settings()))  # torchrun started it again
    server.write(protocol.Bye(rank=0, exit_code=0, reason="", t_ns=0))
    server.write(caps(""))  # the sampler's last word: its exporter closed
    assert cli.main(["ctl", "--run", conn.run_id, "status"]) == 0
    out = capsys.readouterr().out
    assert f"run {conn.run_id}: 1 rank(s) reporting, 1 exited\n" in out and "prometheus" not in out
