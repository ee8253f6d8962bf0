"""Run folders (connection file, ipc sockets, job and sampler logs): who owns one, which are
live, and removing them when their run ends, so they do not pile up.

A run's owner is the collector that holds an exclusive ``flock`` on its ``collector.lock``
(the lock file also names its pid). The kernel drops the lock when that process ends however
it ends, so "owner gone" needs no pid guessing: a folder whose lock can be taken is dead.
A folder without a lock file (its collector never started) is dead once the process named in
its run id ("DATE-TIME-PID-LABEL") is gone. A folder younger than ``MIN_AGE_S`` is never pruned:
its creator may not have taken the lock yet.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

from workers.wire import connection as connections
from workers.wire import exporter_address

LOCK_NAME = "collector.lock"
MIN_AGE_S = 30.0


class RunBusy(RuntimeError):
    """The run already has a live collector."""


def lock_run(run_dir: Path) -> int:
    """Become the run's owner (one collector per run); returns the lock's fd, held until closed."""
    path = run_dir / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise RunBusy(f"pid {owner_pid(run_dir) or '?'}") from None
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())
    return fd


def owner_pid(run_dir: Path) -> int | None:
    """The pid the lock file names (the collector that took it last), if any."""
    try:
        text = (run_dir / LOCK_NAME).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def creator_pid(run_dir: Path) -> int | None:
    """The pid in the run id (``create_run`` puts its process's pid there)."""
    parts = run_dir.name.split("-")
    return int(parts[2]) if len(parts) > 2 and parts[2].isdigit() else None


def _pid_alive(pid: int | None) -> bool:
    if pid is None or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def has_live_collector(run_dir: Path) -> bool:
    """Whether a process holds the run's lock right now (its owner is alive), without taking it."""
    if not (run_dir / LOCK_NAME).exists():
        return False
    pid = owner_pid(run_dir)
    return _pid_alive(pid) and _lock_held(run_dir)


def _lock_held(run_dir: Path) -> bool:
    """Read /proc/locks for a FLOCK on the lock file's inode (taking the lock to test it would
    make a collector starting at that moment fail)."""
    try:
        inode = (run_dir / LOCK_NAME).stat().st_ino
        with open("/proc/locks") as fh:
            return any(line.split()[1] == "FLOCK" and line.split()[5].endswith(f":{inode}") for line in fh)
    except (OSError, IndexError):
        return _pid_alive(owner_pid(run_dir))  # no /proc/locks: trust the pid


def lingering_exporter(run_dir: Path) -> bool:
    """Whether a node's Prometheus exporter (``--prometheus``) still serves from this folder:
    it outlives the job by $COMMTOP_PROMETHEUS_LINGER_S for a last scrape, and removes its own
    URL file when it ends; the folder goes with the next prune after that."""
    for path in run_dir.glob(exporter_address.URL_FILE.format(host="*")):
        try:
            pid = json.loads(path.read_text()).get("pid")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(pid, int) and _pid_alive(pid):
            return True
    return False


def remove_run(conn: connections.Connection) -> None:
    """Remove a run's folder when its run ends (only a folder of this user's runtime root
    holding a connection file: never anything else; kept while an exporter lingers there)."""
    run_dir = conn.run_dir
    try:
        root = connections.runtime_root()
    except connections.ConnectionError_:
        return
    if run_dir.parent.resolve() != root.resolve() or not (run_dir / connections.FILE_NAME).is_file():
        return
    if not lingering_exporter(run_dir):
        shutil.rmtree(run_dir, ignore_errors=True)


@dataclass(frozen=True)
class Pruned:
    removed: list[str]
    kept_live: int
    sockets: list[str] = field(default_factory=list)  # dead exporters' tap sockets removed


def prune_runs(min_age_s: float = MIN_AGE_S) -> Pruned:
    """Remove this user's run folders whose owner process is gone; returns what was removed.

    A folder whose owner (the pid its lock names, or without a lock the pid in its run id) is
    dead goes at once, however young (a SIGKILLed `commtop run`, then `commtop ctl status`);
    one whose owner may still be taking the lock (no pid written yet, or a live pid) only once
    it is older than ``min_age_s``."""
    try:
        root = connections.runtime_root()
    except connections.ConnectionError_:
        return Pruned([], 0)
    removed: list[str] = []
    live = 0
    now = time.time()
    for run_dir in sorted(p for p in root.iterdir() if p.is_dir() and not p.is_symlink()):
        if not (run_dir / connections.FILE_NAME).exists():
            continue  # not a run folder: never ours to remove
        try:
            age = now - (run_dir / connections.FILE_NAME).stat().st_mtime
        except OSError:
            continue
        if lingering_exporter(run_dir):
            live += 1
            continue
        lock = run_dir / LOCK_NAME
        if lock.exists():
            if _remove_if_unlocked(run_dir, young=age < min_age_s):
                removed.append(run_dir.name)
            else:
                live += 1
        elif not _pid_alive(creator_pid(run_dir)):
            shutil.rmtree(run_dir, ignore_errors=True)
            removed.append(run_dir.name)
        else:
            live += 1
    return Pruned(removed, live, prune_tap_sockets(root, min_age_s))


def prune_tap_sockets(root: Path, min_age_s: float = MIN_AGE_S) -> list[str]:
    """Remove the node exporters' ipc socket files (``prom-*.sock``, beside the run folders)
    that nobody listens on any more: their exporter was killed before it could remove its own.
    A socket is dead when a connect to it is refused; files younger than ``min_age_s`` stay."""
    removed = []
    now = time.time()
    for path in sorted(root.glob(exporter_address.TAP_FILE.format(digest="*"))):
        try:
            if not path.is_socket() or now - path.lstat().st_mtime < min_age_s or _listening(path):
                continue
            path.unlink()
        except OSError:
            continue
        removed.append(path.name)
    return removed


def _listening(path: Path) -> bool:
    """Whether a process accepts connections on the unix socket ``path``."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(str(path))
        except (ConnectionRefusedError, FileNotFoundError):
            return False
        except OSError:  # no permission, a full backlog, ...: not ours to judge dead
            return True
    return True


def _remove_if_unlocked(run_dir: Path, *, young: bool) -> bool:
    """Take the run's lock and remove the folder, if no collector holds it and its owner is dead
    (or, ``young`` aside, has let it go); whether it was removed."""
    try:
        fd = os.open(run_dir / LOCK_NAME, os.O_RDWR)
    except OSError:
        return False
    try:
        owner = owner_pid(run_dir)
        if young and (owner is None or _pid_alive(owner)):
            return False  # its creator may be about to take the lock
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # a collector holds it
        shutil.rmtree(run_dir, ignore_errors=True)  # ours now: nobody can start collecting on it
        return True
    finally:
        os.close(fd)


def live_runs() -> list[Path]:
    """Connection files of runs with a live collector, newest first."""
    return [p for p in connections.list_runs() if has_live_collector(p.parent)]
