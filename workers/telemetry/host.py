"""Host side of a node tick: CPU %, host RAM, and the state of this node's worker processes.

The sampler's parent is the local-rank-0 worker, whose parent is the torchrun agent; every
child of that agent is a worker of this node. Their status lets the TUI tell a rank that is
stalled (SIGSTOP -> ``stopped``) from one that is lost (``gone``/``zombie``).
"""

from __future__ import annotations

import os
import time

import psutil

from workers.wire.telemetry import ProcInfo

_STATUS = {
    psutil.STATUS_RUNNING: "running",
    psutil.STATUS_SLEEPING: "sleeping",
    psutil.STATUS_DISK_SLEEP: "sleeping",
    psutil.STATUS_IDLE: "sleeping",
    psutil.STATUS_WAKING: "running",
    psutil.STATUS_STOPPED: "stopped",
    psutil.STATUS_TRACING_STOP: "stopped",
    psutil.STATUS_ZOMBIE: "zombie",
    psutil.STATUS_DEAD: "gone",
}
GONE_KEEP_S = 30.0  # how long a vanished worker is still reported as "gone"
MAX_WATCHED = 256


class HostProbe:
    """Reads host load each tick; re-lists the worker processes at most once a second."""

    def __init__(self, parent_pid: int | None = None) -> None:
        self.parent_pid = os.getppid() if parent_pid is None else parent_pid
        self._procs: dict[int, psutil.Process] = {}
        self._gone: dict[int, float] = {}
        self._listed_at = 0.0
        psutil.cpu_percent(interval=None)  # primes the node counter: the first call returns 0.0
        self._refresh()

    def _agent(self) -> psutil.Process | None:
        try:
            parent = psutil.Process(self.parent_pid)
            agent = parent.parent()
        except psutil.Error:
            return None
        if agent is None or agent.pid <= 1:
            return None
        return agent

    def _refresh(self) -> None:
        self._listed_at = time.monotonic()
        agent = self._agent()
        try:
            if agent is not None:
                found = agent.children(recursive=False)
            else:
                found = [psutil.Process(self.parent_pid)]
        except psutil.Error:
            found = []
        for proc in found[:MAX_WATCHED]:
            if proc.pid not in self._procs and proc.pid != os.getpid():
                self._procs[proc.pid] = proc
                try:
                    proc.cpu_percent(interval=None)
                except psutil.Error:
                    pass

    def read(self) -> tuple[float, int, int, tuple[ProcInfo, ...]]:
        """(node cpu %, host memory used, total, per-worker info)."""
        if time.monotonic() - self._listed_at > 1.0:
            self._refresh()
        cpu = psutil.cpu_percent(interval=None)
        vm = psutil.virtual_memory()
        now = time.monotonic()
        out: list[ProcInfo] = []
        for pid, proc in list(self._procs.items()):
            try:
                with proc.oneshot():
                    status = _STATUS.get(proc.status(), "running")
                    pct = proc.cpu_percent(interval=None)
                    rss = proc.memory_info().rss
                out.append(ProcInfo(pid, status, pct, rss))
            except psutil.NoSuchProcess:
                del self._procs[pid]
                self._gone[pid] = now
            except psutil.Error:
                out.append(ProcInfo(pid, "running", float("nan"), 0))
        for pid, since in list(self._gone.items()):
            if now - since > GONE_KEEP_S:
                del self._gone[pid]
            else:
                out.append(ProcInfo(pid, "gone", 0.0, 0))
        return cpu, vm.total - vm.available, vm.total, tuple(out)
