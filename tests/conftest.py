"""What every test gets: the ``e2e`` rule and the fixtures several test files share.

``e2e`` marks a test that starts processes (torchrun ranks, the TUI on a pty, a subprocess CLI)
or drives the whole stack for seconds of wall-clock time (512 ranks into the app, a replay
watched as it plays). The fast loop leaves them out: ``pytest -m "not e2e"``. A test that starts
a process without the mark fails here, at the call, so the fast loop stays free of processes
without anyone keeping a list.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from frozen_run import fake_connection
from recording_synth import synth_run, write_recording
from synthetic_ranks import child_env

from workers.wire import connection as connections

_running: list[pytest.Item | None] = [None]  # the test whose setup, call or teardown runs now


class ProcessInFastTest(RuntimeError):
    """A test without the e2e mark started a process."""


def _refuse(what: str) -> None:
    item = _running[0]
    if item is not None and item.get_closest_marker("e2e") is None:
        raise ProcessInFastTest(f"{item.nodeid} starts a process ({what}): mark it @pytest.mark.e2e")


_popen_init = subprocess.Popen.__init__
_fork, _forkpty, _posix_spawn = os.fork, os.forkpty, os.posix_spawn


def _popen(self: subprocess.Popen[Any], *args: Any, **kwargs: Any) -> None:
    _refuse(f"subprocess {str(args[0] if args else kwargs.get('args'))[:80]}")
    _popen_init(self, *args, **kwargs)


def _guarded(name: str, call: Any) -> Any:
    def guarded(*args: Any, **kwargs: Any) -> Any:
        _refuse(f"os.{name}")
        return call(*args, **kwargs)

    return guarded


subprocess.Popen.__init__ = _popen  # type: ignore[method-assign]
os.fork = _guarded("fork", _fork)
os.forkpty = _guarded("forkpty", _forkpty)
os.posix_spawn = _guarded("posix_spawn", _posix_spawn)


def pytest_sessionstart(session: pytest.Session) -> None:
    """matplotlib (`commtop report --plot`) lists the system's fonts with ``fc-list`` the first
    time it runs on a machine: done here, before any test, so that a fresh machine's first plot
    test does not count it as its own process (it passed only where an e2e plot ran first)."""
    try:
        import matplotlib.font_manager  # noqa: F401 - builds its font cache once per machine
    except ImportError:  # the plot extra is not installed: its tests say so
        pass


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    _running[0] = item
    try:
        yield
    finally:
        _running[0] = None


@pytest.fixture(autouse=True)
def _private_state_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """`commtop run` keeps job logs under $XDG_STATE_HOME: a test's go to a temporary folder (and
    so do those of the commands it starts), never into the tester's home."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("state")))


@pytest.fixture
def runtime_dir(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private runtime folder for run folders, short (ipc:// paths must stay under 107
    characters), set as $COMMTOP_RUNTIME_DIR, with no connection file inherited; removed after."""
    root = tempfile.mkdtemp(prefix="ct-", dir="/tmp")
    monkeypatch.setenv(connections.RUNTIME_DIR_ENV, root)
    monkeypatch.delenv(connections.CONNECTION_FILE_ENV, raising=False)
    yield Path(root)
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def rt(runtime_dir: Path) -> tuple[Path, dict[str, str]]:
    """The runtime folder and the environment for the commands a test starts there."""
    return runtime_dir, child_env(str(runtime_dir))


@pytest.fixture
def conn(runtime_dir: Path) -> connections.Connection:
    """A fresh run's connection (its folder, endpoints and key) in the private runtime folder."""
    return connections.create_run(label="test")


@pytest.fixture(scope="session")
def recording(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Any]]:
    """A synthetic 2-rank recording of 6 s (settings epochs change at 2 s and 4 s), in chunks of
    0.5 s, and the messages written into it."""
    items = list(synth_run(duration_s=6.0, world=2, seed=4))
    path = tmp_path_factory.mktemp("recording") / "run.commtop"
    write_recording(path, items, chunk_s=0.5)
    return path, items


@pytest.fixture
def connection() -> Iterator[connections.Connection]:
    """A fake run's connection (tests/frozen_run.py) in a private folder: data socket only."""
    folder = Path(tempfile.mkdtemp(prefix="ct-app-", dir="/tmp"))
    yield fake_connection(folder)
    shutil.rmtree(folder, ignore_errors=True)
