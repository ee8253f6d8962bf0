"""Start torchrun as a child process group and stop every process of it, always.

`commtop run` owns the workers: quitting the TUI (or Ctrl-C in headless mode) stops the
whole group; a SIGKILLed `commtop` takes torchrun with it (PR_SET_PDEATHSIG), and torchrun
stops its workers; the ranks and their sampler end with their own parent too
(`workers.wire.lifeline`, asked for through the environment). torchrun writes into the run's
job.log, never into a pipe: a pipe whose reader (this process) died turns every later write
of torchrun or a rank into an error at the worst moment (while shutting down). The last lines
the job printed are read back from that file (bounded) for the status line.
"""

from __future__ import annotations

import collections
import ctypes
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from tui.ingest.interfaces import ResetModel, Source
from workers.wire.connection import CONNECTION_FILE_ENV, Connection
from workers.wire.lifeline import env_for_child
from workers.wire.protocol import Bye, Hello, Message

#: torchrun's agent, the moment it sees a worker die: "failed (exitcode: -9) local_rank: 1 (pid: 123)".
#: It names only the *first* failure of that poll (ties on a whole-second timestamp go to the lowest
#: local rank), so a peer that died of the SIGKILLed rank's broken collective can be named instead.
_FAILED = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: \d+ \(pid: (\d+)\)")
#: torchrun's ChildFailedError summary at exit lists every failed worker: "  exitcode  : -9 (pid: 123)".
_FAILURE_ROW = re.compile(r"^\s*exitcode\s*: (-?\d+) \(pid: (\d+)\)")

PR_SET_PDEATHSIG = 1
STOP_GRACE_S = 5.0
#: How often the job's log is read for new lines (the status line's latency).
OUTPUT_POLL_S = 0.05


def _die_with(parent_pid: int) -> Callable[[], None]:
    """Between fork and exec: SIGTERM when the forking thread (the main thread) ends, and no
    start at all if the parent already died before that was armed."""

    def arm() -> None:
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        except (OSError, AttributeError):
            pass
        if os.getppid() != parent_pid:
            os._exit(1)

    return arm


def torchrun_prefix(nproc: int) -> list[str]:
    """torchrun (as `python -m torch.distributed.run`, so no PATH lookup) on this node, polling
    its workers every 0.2 s (a dead rank is reported that soon); the program follows."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "--monitor-interval=0.2",
    ]


def torchrun_argv(nproc: int, worker_args: list[str], connection: Connection) -> list[str]:
    """torchrun running commtop's workers on this node."""
    return [*torchrun_prefix(nproc), "-m", "workers", "--connection-file", connection.path, *worker_args]


class JobProcess:
    """A running torchrun job: its output tail, exit code and a reliable stop()."""

    def __init__(
        self, argv: list[str], connection: Connection, env: dict[str, str] | None = None, tail_lines: int = 200
    ) -> None:
        self.argv = argv
        self._tail: collections.deque[str] = collections.deque(maxlen=tail_lines)
        #: pid -> exit code of workers torchrun saw die (a SIGKILLed rank cannot say Bye itself).
        self.worker_exits: dict[int, int] = {}
        self._lock = threading.Lock()
        # The ranks (and their sampler) end with their torchrun agent: PR_SET_PDEATHSIG, armed
        # by each rank at start. Only asked from the main thread, whose end is the process's.
        child_env = env_for_child(dict(os.environ if env is None else env), direct=False)
        child_env[CONNECTION_FILE_ENV] = connection.path
        child_env.setdefault("PYTHONUNBUFFERED", "1")
        log_path = Path(connection.run_dir) / "job.log"
        self.log_path = str(log_path)
        with open(log_path, "ab") as log:
            start = log.tell()
            main_thread = threading.current_thread() is threading.main_thread()
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=child_env,
                start_new_session=True,
                preexec_fn=_die_with(os.getpid()) if main_thread else None,
            )
        self.started = time.monotonic()
        self._pump_thread = threading.Thread(target=self._pump, args=(start,), name="job-output", daemon=True)
        self._pump_thread.start()

    def _pump(self, start: int) -> None:
        """Follow job.log from ``start`` until torchrun has exited and the file is read to its end."""
        with open(self.log_path, "rb") as log:
            log.seek(start)
            partial = b""
            while True:
                exited = self.proc.poll() is not None  # before reading: what it wrote is in the file
                chunk = log.read(65536)
                if chunk:
                    *lines, partial = (partial + chunk).split(b"\n")
                    for raw in lines:
                        self._take(raw)
                    continue
                if exited:
                    if partial:
                        self._take(partial)
                    return
                time.sleep(OUTPUT_POLL_S)

    def _take(self, raw: bytes) -> None:
        line = raw.decode(errors="replace").rstrip()
        if line:
            failed = _FAILED.search(line) or _FAILURE_ROW.match(line)
            with self._lock:
                self._tail.append(line)
                if failed:
                    self.worker_exits[int(failed.group(2))] = int(failed.group(1))

    # ProcessWatch (tui.ingest.interfaces): what the app's status line reads
    def lines(self) -> list[str]:
        with self._lock:
            return list(self._tail)

    def error_lines(self, limit: int = 12) -> list[str]:
        """The lines that explain a failure: tracebacks and torchrun's failure summary."""
        lines = self.lines()
        keep = [
            ln
            for ln in lines
            if "Error" in ln
            or "error" in ln
            or "Traceback" in ln
            or "exitcode" in ln
            or ln.startswith(("  File", "[rank"))
        ]
        return (keep or lines)[-limit:]

    def exit_code(self) -> int | None:
        return self.proc.poll()

    def output_done(self) -> bool:
        """Whether the job's output was read to its end (torchrun's failure summary comes last)."""
        return not self._pump_thread.is_alive()

    def wait(self, timeout: float | None = None) -> int:
        code = self.proc.wait(timeout)
        self._pump_thread.join(timeout=2)
        return code

    def stop(self, grace_s: float = STOP_GRACE_S) -> int:
        """SIGTERM the whole group, then SIGKILL what is left after ``grace_s``."""
        if self.proc.poll() is None:
            self._signal_group(signal.SIGTERM)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                pass
        # Workers may outlive torchrun by a moment; the group is ours, so clean it fully.
        self._signal_group(signal.SIGKILL)
        code = self.proc.wait()
        self._pump_thread.join(timeout=2)
        return code

    def _signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


class JobExitSource:
    """The live source, plus a Bye for each rank that torchrun saw die without saying Bye
    itself (SIGKILL, OOM killer, segfault): only the launcher knows such a rank's exit code."""

    def __init__(self, source: Source, job: JobProcess) -> None:
        self.source = source
        self.job = job
        self._rank_of_pid: dict[int, int] = {}
        self._said_bye: set[int] = set()
        self._reported: set[int] = set()

    @property
    def rejected(self) -> Counter[str]:
        return self.source.rejected

    def poll(self, timeout_s: float) -> list[Message | ResetModel]:
        out = self.source.poll(timeout_s)
        for m in out:
            if isinstance(m, Hello):
                self._rank_of_pid[m.pid] = m.rank
            elif isinstance(m, Bye):
                self._said_bye.add(m.rank)
        with self.job._lock:
            exits = list(self.job.worker_exits.items())
        for pid, code in exits:
            rank = self._rank_of_pid.get(pid)
            if pid in self._reported or rank is None or rank in self._said_bye:
                continue
            self._reported.add(pid)
            why = f"killed by {signal.Signals(-code).name}" if code < 0 and -code in signal.valid_signals() else ""
            out.append(Bye(rank, code, f"{why or f'exit code {code}'} (reported by torchrun)", time.time_ns()))
        return out

    def close(self) -> None:
        self.source.close()
