"""Start torchrun as a child process group and stop every process of it, always.

`commtop run` owns the workers: quitting the TUI (or Ctrl-C in headless mode) stops the
whole group; a SIGKILLed `commtop` takes torchrun with it (PR_SET_PDEATHSIG), and torchrun
stops its workers; the ranks and their sampler end with their own parent too
(`workers.wire.lifeline`, asked for through the environment). torchrun and the ranks write
into files, never into a pipe: a pipe whose reader (this process) died turns every later
write of torchrun or a rank into an error at the worst moment (while shutting down). Each
rank writes its own files (torchrun's ``--log-dir``, ``--redirects 3``); tui.run.job_output
follows them, writes the job's log (tui.run.log_store says where it is kept) and keeps the
last lines of every rank; tui.run.job_failure says which rank failed first, and why.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tui.ingest.interfaces import ResetModel, Source
from tui.run.job_failure import Failure, RankExit, ended_text, first_failure
from tui.run.job_output import JobLine, JobOutput
from tui.run.log_store import JobLogPaths
from workers.wire.connection import CONNECTION_FILE_ENV, Connection
from workers.wire.lifeline import env_for_child
from workers.wire.protocol import Bye, Hello, Message

PR_SET_PDEATHSIG = 1
STOP_GRACE_S = 5.0


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


def torchrun_prefix(nproc: int, logs: JobLogPaths | None = None) -> list[str]:
    """torchrun (as `python -m torch.distributed.run`, so no PATH lookup) on this node, polling
    its workers every 0.2 s (a dead rank is reported that soon); with ``logs``, every rank
    writes its stdout and stderr into its own files there (tui.run.job_output reads them).
    The program follows."""
    files = ["--log-dir", str(logs.ranks_dir), "--redirects", "3"] if logs is not None else []
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "--monitor-interval=0.2",
        *files,
    ]


def torchrun_argv(
    nproc: int, worker_args: list[str], connection: Connection, logs: JobLogPaths | None = None
) -> list[str]:
    """torchrun running commtop's workers on this node."""
    return [*torchrun_prefix(nproc, logs), "-m", "workers", "--connection-file", connection.path, *worker_args]


class JobProcess:
    """A running torchrun job: its output (followed, kept in its log), exit code and a reliable stop().

    ``logs``: where its output goes (tui.run.log_store.for_run); by default a scratch folder in
    the run's folder, removed with it (tests and benchmarks). ``on_line``: every line of the
    job as it is read (the headless terminal), on the output's thread."""

    def __init__(
        self,
        argv: list[str],
        connection: Connection,
        env: dict[str, str] | None = None,
        tail_lines: int = 200,
        *,
        logs: JobLogPaths | None = None,
        on_line: Callable[[JobLine], None] | None = None,
        script_codes: bool = False,
    ) -> None:
        self.argv = argv
        run_dir = Path(connection.run_dir)
        self.logs = logs or JobLogPaths(run_dir / "job.log", run_dir / "job")
        self.logs.create()
        #: rank -> (time in ns, reason) of a Bye that said the rank failed (tui.run.job_failure orders by it)
        self._failing_byes: dict[int, tuple[int, str]] = {}
        self._lock = threading.Lock()
        # The ranks (and their sampler) end with their torchrun agent: PR_SET_PDEATHSIG, armed
        # by each rank at start. Only asked from the main thread, whose end is the process's.
        child_env = env_for_child(dict(os.environ if env is None else env), direct=False)
        child_env[CONNECTION_FILE_ENV] = connection.path
        child_env.setdefault("PYTHONUNBUFFERED", "1")
        with open(self.logs.torchrun_stdout, "ab") as out, open(self.logs.torchrun_stderr, "ab") as err:
            main_thread = threading.current_thread() is threading.main_thread()
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                env=child_env,
                start_new_session=True,
                preexec_fn=_die_with(os.getpid()) if main_thread else None,
            )
        self.started = time.monotonic()
        #: Processes of the job still running when :meth:`stop`'s grace ended, SIGKILLed by it
        #: (their command lines): the end says so (a rank that catches SIGTERM and carries on).
        self.killed: list[str] = []
        #: The exit code is the failing script's, as ``python train.py`` gives it (``commtop run --
        #: python ...``: commtop chose torchrun, whose own code is 1 for any rank's failure); a
        #: user's own torchrun line keeps torchrun's.
        self.script_codes = script_codes
        self._script_code: int | None = None
        self.output = JobOutput(self.logs, lambda: self.proc.poll() is not None, on_line=on_line, tail_lines=tail_lines)
        self.output.start()

    @property
    def log_path(self) -> str:
        """The job's log (every rank's lines with their prefix, and torchrun's)."""
        return str(self.logs.log)

    @property
    def worker_exits(self) -> dict[int, int]:
        """pid -> exit code of workers torchrun saw end with an error (a SIGKILLed rank cannot
        say Bye itself)."""
        return self.output.pid_exits()

    def rank_exits(self) -> dict[int, RankExit]:
        return self.output.exits()

    def note_bye(self, bye: Bye) -> None:
        """A rank said Bye (its own, not torchrun's word): one with an error orders the failures."""
        if bye.exit_code != 0:
            with self._lock:
                self._failing_byes.setdefault(bye.rank, (bye.t_ns, bye.reason))

    def failure(self) -> Failure:
        """Why the job failed (or is failing), from what was read so far."""
        with self._lock:
            byes = dict(self._failing_byes)
        return self.output.failure(self.exit_code() or 0, byes)

    # ProcessWatch (tui.ingest.interfaces): what the app's status line reads
    def lines(self) -> list[str]:
        return self.output.lines()

    def writing_line(self) -> str:
        """The line the lowest rank still writes (a progress bar's latest state), as shown, or ""."""
        writing = self.output.writing()
        if not writing:
            return ""
        rank = min(writing)
        return f"[rank{rank}]: {writing[rank][-1].strip()}"

    def error_lines(self, limit: int = 14) -> list[str]:
        """The lines that explain a failure, the first failing rank's own error last."""
        return [ln.strip() for ln in self.failure().lines][-limit:]

    def log_sections(self, lines_per_rank: int) -> list[tuple[str, bool, list[str]]]:
        """The log pane: (title, is an error, lines): the first failing rank's error first, then
        the last lines of every rank, then torchrun's."""
        failure = self.failure()
        sections: list[tuple[str, bool, list[str]]] = []
        if failure.first is not None:
            error = [ln.strip() for ln in failure.lines if ln.startswith(f"  [rank{failure.first}]")]
            what = self.output.rank_error(failure.first) or failure.ended.get(failure.first, "").split(" (")[0]
            sections.append((f"rank {failure.first} failed first: {what}", True, error))
        ended, writing = self.output.rank_lines(), self.output.writing()
        for rank in sorted(set(ended) | set(writing)):
            lines = ended.get(rank, []) + writing.get(rank, [])  # a progress bar's latest state last
            state = failure.ended.get(rank, "")
            sections.append((f"rank {rank}" + (f" · {state}" if state else ""), False, lines[-lines_per_rank:]))
        torchrun = self.output.torchrun_lines()
        if torchrun:
            sections.append(("torchrun", False, torchrun[-lines_per_rank:]))
        return sections

    def exit_code(self) -> int | None:
        code = self.proc.poll()
        return None if code is None else self._as_script_code(code)

    def _as_script_code(self, code: int) -> int:
        """torchrun's ``code``, or for a script (``script_codes``) that failed, its first failing
        rank's exit code (128 + N for a signal N, as a shell says) once torchrun's summary was
        read; torchrun's own until then, or where no rank failed."""
        if code == 0 or not self.script_codes:
            return code
        if self._script_code is not None:
            return self._script_code
        if not self.output.done:
            return code
        exits = self.output.exits()
        with self._lock:
            byes = dict(self._failing_byes)
        first = first_failure(exits, self.output.outputs(), byes)
        rank_code = exits[first].code if first is not None and first in exits else 0
        self._script_code = rank_code if rank_code > 0 else 128 - rank_code if rank_code < 0 else code
        return self._script_code

    def output_done(self) -> bool:
        """Whether the job's output was read to its end (torchrun's failure summary comes last)."""
        return self.output.done

    def wait(self, timeout: float | None = None) -> int:
        code = self.proc.wait(timeout)
        self.output.join(timeout=2)
        return self._as_script_code(code)

    def terminate(self) -> None:
        """SIGTERM the whole group and return at once: its ranks send their last records and end
        (workers.capture.on_sigterm) while the caller still collects; :meth:`stop` ends what is left."""
        if self.proc.poll() is None:
            self._signal_group(signal.SIGTERM)

    def stop(self, grace_s: float = STOP_GRACE_S) -> int:
        """SIGTERM the whole group, then SIGKILL what is left after ``grace_s``: the group, and
        every process torchrun had started when the stop began. torch starts each rank in a
        session of its own, out of the group's reach: a job whose ranks catch SIGTERM and carry
        on (some frameworks' handlers only note it) ran on, orphaned, after commtop exited."""
        import psutil

        started = self._descendants()
        deadline = time.monotonic() + grace_s
        if self.proc.poll() is None:
            self._signal_group(signal.SIGTERM)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                pass
        # Workers may outlive torchrun by a moment; the group is ours, so clean it fully.
        self._signal_group(signal.SIGKILL)
        # the ranks get the rest of the grace (torchrun may go first): their last records and Bye
        _, left = psutil.wait_procs(started, timeout=max(0.0, deadline - time.monotonic()))
        for process in left:
            try:
                what = " ".join(process.cmdline()[-2:])
                process.kill()  # psutil: not a later process that took the pid
                self.killed.append(what)
            except psutil.Error:  # gone meanwhile, or not ours
                pass
        code = self.proc.wait()
        self.output.join(timeout=2)
        return code

    def _descendants(self) -> list[Any]:
        """torchrun's processes (ranks and what they started) now, as psutil Processes."""
        import psutil

        try:
            return list(psutil.Process(self.proc.pid).children(recursive=True))
        except psutil.Error:
            return []

    def _signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


class JobExitSource:
    """The live source, plus torchrun's word on how each rank ended: a Bye for a rank that died
    without saying so (SIGKILL, OOM killer, segfault), and, once the job ended, a last Bye for
    each rank that a signal ended (``killed by SIGTERM (stopped by torchrun after rank 1
    failed)``), whatever the rank said before: only the launcher knows a process's end."""

    def __init__(self, source: Source, job: JobProcess) -> None:
        self.source = source
        self.job = job
        self._rank_of_pid: dict[int, int] = {}
        #: rank -> the pid of its newest Hello: torchrun's --max-restarts starts a rank again in
        #: a new process, and what torchrun says of the old one is not how the rank ended.
        self._pid_of_rank: dict[int, int] = {}
        self._said_bye: dict[int, Bye] = {}
        self._reported: set[int] = set()
        self._final = False

    @property
    def rejected(self) -> Counter[str]:
        return self.source.rejected

    def poll(self, timeout_s: float) -> list[Message | ResetModel]:
        out = self.source.poll(timeout_s)
        for m in out:
            if isinstance(m, Hello):
                self._rank_of_pid[m.pid] = m.rank
                if self._pid_of_rank.setdefault(m.rank, m.pid) != m.pid:  # the rank runs again
                    self._pid_of_rank[m.rank] = m.pid
                    self._said_bye.pop(m.rank, None)
            elif isinstance(m, Bye):
                self._said_bye[m.rank] = m
                self.job.note_bye(m)
        for pid, code in self.job.worker_exits.items():
            rank = self._rank_of_pid.get(pid)
            if pid in self._reported or rank is None or rank in self._said_bye or self._pid_of_rank[rank] != pid:
                continue
            self._reported.add(pid)
            out.append(Bye(rank, code, f"{ended_text(code)} (reported by torchrun)", time.time_ns()))
        if not self._final and self.job.exit_code() is not None and self.job.output_done():
            self._final = True
            out += self._last_word()
        return out

    def _last_word(self) -> list[Message | ResetModel]:
        """How each rank ended, once torchrun's summary is read: a signal, or an exit code that
        differs from what the rank itself said."""
        failure = self.job.failure()
        byes: list[Message | ResetModel] = []
        for rank, e in sorted(self.job.rank_exits().items()):
            rank = self._rank_of_pid.get(e.pid, rank)
            if self._pid_of_rank.get(rank, e.pid) != e.pid:
                continue  # an earlier attempt's process: the rank ran again since (--max-restarts)
            own = self._said_bye.get(rank)
            if own is not None and own.exit_code == e.code and e.code >= 0:
                continue  # the rank's own words (its exception) say more
            why = failure.ended.get(rank) or ended_text(e.code)
            byes.append(Bye(rank, e.code, f"{why} (reported by torchrun)" if e.code >= 0 else why, time.time_ns()))
        return byes

    def close(self) -> None:
        self.source.close()
