"""Connection files are private (0600 in a 0700 directory) and the key never shows in ps."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from workers.wire import connection as c


@pytest.fixture(autouse=True)
def fresh_runtime_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A runtime folder that does not exist yet: commtop must make it private."""
    root = tmp_path / "rt"
    monkeypatch.setenv(c.RUNTIME_DIR_ENV, str(root))
    monkeypatch.delenv(c.CONNECTION_FILE_ENV, raising=False)
    return root


def test_modes_are_private(fresh_runtime_dir: Path) -> None:
    conn = c.create_run()
    assert stat.S_IMODE(fresh_runtime_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE(conn.run_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE(Path(conn.path).stat().st_mode) == 0o600
    assert conn.data.startswith("ipc://") and str(conn.run_dir) in conn.data
    assert c.load(conn.path) == conn
    assert c.newest_run() == conn
    assert len(conn.key) == 32


def test_world_readable_or_missing_files_are_refused(tmp_path: Path) -> None:
    conn = c.create_run()
    os.chmod(conn.path, 0o644)
    with pytest.raises(c.ConnectionError_, match="0600"):
        c.load(conn.path)
    with pytest.raises(c.ConnectionError_, match="cannot read"):
        c.load(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    os.chmod(bad, 0o600)
    with pytest.raises(c.ConnectionError_, match="not a commtop connection file"):
        c.load(bad)


def test_no_run_gives_a_clear_error() -> None:
    with pytest.raises(c.ConnectionError_, match="commtop run"):
        c.newest_run()


def test_tcp_endpoints_and_connect_override() -> None:
    data, control, request = c.tcp_endpoints("tcp://0.0.0.0:5555")
    assert (control, request) == ("tcp://0.0.0.0:5556", "tcp://0.0.0.0:5557")
    conn = c.create_run(data=data, control=control, request=request)
    moved = conn.for_connect("tcp://head:5555")
    assert (moved.data, moved.control, moved.request) == ("tcp://head:5555", "tcp://head:5556", "tcp://head:5557")
    with pytest.raises(c.ConnectionError_):
        c.tcp_endpoints("tcp://host")


@pytest.mark.e2e
def test_key_is_not_on_the_command_line_of_a_run(fresh_runtime_dir: Path) -> None:
    """`commtop run` hands workers the file path, never the key: check real `ps` output."""
    from tui.run.launcher import torchrun_argv

    conn = c.create_run()
    argv = torchrun_argv(2, ["--iters", "1"], conn)
    assert conn.key_hex not in " ".join(argv)
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)", *argv])
    try:
        ps = subprocess.run(["ps", "-ww", "-eo", "args"], capture_output=True, text=True, check=True).stdout
        assert conn.path in ps
        assert conn.key_hex not in ps
    finally:
        proc.kill()
        proc.wait()


def test_too_long_ipc_paths_get_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(c.RUNTIME_DIR_ENV, str(tmp_path / ("x" * 90)))
    with pytest.raises(c.ConnectionError_, match=c.RUNTIME_DIR_ENV):
        c.create_run()
