"""`commtop ctl` against a real ControlServer (real sockets, no workers: their Hellos are
written into the server's Sink side): a run refuses what it has no knob for, at once, in one
line, and starts no epoch. The same with real gloo ranks: test_ctl_gloo.py."""

from __future__ import annotations

import os
import time

import pytest
from test_control_server import frozen_hello, heard, listen

from tui import cli
from tui.run.control_server import ControlServer
from tui.run.run_dirs import lock_run
from workers.wire import connection as connections
from workers.wire.settings import Settings

PLAIN = {"source": "monitor", "collective": "monitor: train_ddp_plain.py", "knobs": {}, "mode_knob": ""}
DDP = {
    "source": "monitor",
    "collective": "monitor: train_ddp.py",
    "knobs": {"offload": ["none", "overlap", "sync"]},
    "mode_knob": "offload",
}


@pytest.fixture()
def conn(tmp_path, monkeypatch):
    monkeypatch.setenv(connections.RUNTIME_DIR_ENV, str(tmp_path / "rt"))
    monkeypatch.delenv(connections.CONNECTION_FILE_ENV, raising=False)
    return connections.create_run(label="test")


@pytest.fixture()
def server(conn):
    lock = lock_run(conn.run_dir)
    srv = ControlServer(conn, publish_s=0.1)
    yield srv
    srv.close()
    os.close(lock)


def error_line(capsys: pytest.CaptureFixture[str]) -> str:
    """The one error line `ctl` printed (after the line naming the run it asked)."""
    lines = [ln for ln in capsys.readouterr().err.splitlines() if not ln.startswith("commtop ctl: run ")]
    assert len(lines) == 1, lines
    return lines[0]


def test_a_job_without_knobs_refuses_mode_and_set_and_starts_no_epoch(conn, server, capsys):
    server.write(frozen_hello(0, 0, Settings(mode="none", copies=0), config=PLAIN))
    for argv in (["mode", "sync"], ["set", "copies=3"], ["set", "knob.offload=sync"]):
        assert cli.main(["ctl", *argv]) == 2, argv
        line = error_line(capsys)
        assert line.startswith("commtop ctl: error: train_ddp_plain.py has no live knobs"), line
        assert line.endswith("nothing changed"), line
    assert server.desired == (0, Settings(mode="none", copies=0))  # no epoch started


def test_an_unknown_value_of_a_knob_is_refused_naming_its_choices(conn, server, capsys):
    server.write(frozen_hello(0, 0, Settings(mode="overlap", copies=0, knobs={"offload": "overlap"}), config=DDP))
    assert cli.main(["ctl", "set", "knob.offload=off"]) == 2
    assert error_line(capsys) == "commtop ctl: error: knob.offload=off: choices none, overlap, sync; nothing changed"
    assert cli.main(["ctl", "set", "copies=3"]) == 2
    line = error_line(capsys)
    assert "train_ddp.py has no knob for copies (its knobs: offload (none/overlap/sync))" in line
    assert server.desired is not None and server.desired[0] == 0


def test_delay_rank_beyond_the_world_is_refused(conn, server, capsys):
    server.write(frozen_hello(0, 0, Settings()))  # a 2-rank run of commtop's loop
    assert cli.main(["ctl", "--no-wait", "set", "delay_ms=110", "delay_rank=3"]) == 2
    line = error_line(capsys)
    assert "delay_rank=3: this run has 2 ranks (0..1, or -1 for every rank)" in line
    assert server.desired == (0, Settings())
    assert cli.main(["ctl", "--no-wait", "set", "delay_ms=110", "delay_rank=1"]) == 0
    assert server.desired == (1, Settings(delay_ms=110.0, delay_rank=1))


def test_live_control_off_is_said_at_once(conn, server, capsys):
    server.write(frozen_hello(0, 0, Settings(), config={"collective": "all_gather", "live_control": False}))
    started = time.monotonic()
    assert cli.main(["ctl", "mode", "sync"]) == 2
    assert time.monotonic() - started < 3.0  # not 20 s of "workers busy?"
    assert "live control is off in this run (COMMTOP_LIVE_CONTROL=0" in error_line(capsys)
    assert cli.main(["ctl", "status"]) == 0
    assert "can change: nothing (live control is off)" in capsys.readouterr().out


def test_status_shows_the_delay_in_force_and_what_the_run_can_change(conn, server, capsys):
    server.write(frozen_hello(0, 2, Settings(mode="sync", delay_ms=110.0, delay_rank=1)))
    assert cli.main(["ctl", "status"]) == 0
    out = capsys.readouterr().out
    assert "in force  (epoch 2): mode=sync copies=5 copy_scale=1.0 pinned=true direction=d2h delay_ms=110.0 " in out
    assert "delay_rank=1 delay_on=host" in out
    assert "can change: settings mode, copies, copy_scale, pinned, direction, delay_ms, delay_rank, delay_on" in out


def test_at_epoch_0_requested_is_what_the_job_reports_in_force(conn, server, capsys):
    """A job's Hellos start before it declares its knobs (the capture bootstrap starts them at
    init_process_group): what is requested at epoch 0 follows what it reports, and nothing is
    published for epoch 0 (rank 0 would count the knobs it now has as a conflict)."""
    listener = listen(conn)
    try:
        server.write(frozen_hello(0, 0, Settings(mode="none", copies=0), config=PLAIN | {"knobs_final": False}))
        in_force = Settings(mode="overlap", copies=0, knobs={"offload": "overlap"})
        server.write(frozen_hello(0, 0, in_force, config=DDP))
        assert server.view().requested == in_force
        assert cli.main(["ctl", "status"]) == 0
        out = capsys.readouterr().out
        assert "in force  (epoch 0): mode=overlap knob.offload=overlap" in out
        assert "requested (epoch 0): same" in out and "mode=none" not in out
        assert heard(listener, 0.6) is None
    finally:
        listener.close()


def test_ctl_help_names_every_setting(capsys):
    with pytest.raises(SystemExit):
        cli.main(["ctl", "-h"])
    out = capsys.readouterr().out
    for name in ("delay_ms", "delay_rank", "delay_on", "knob."):
        assert name in out, name
