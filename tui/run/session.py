"""One run as this process sees it: a session.

A :class:`LiveSession` is the receiving side of a live run: the run's sockets, the model they
fill, the control server, the recorder, the run's lock and, for a run this process starts, its
torchrun job. Its constructors say which run: :meth:`LiveSession.for_job` (a job this process
starts: the synthetic loop or a user's script, see tui.run.job_plan), :meth:`LiveSession.watch`
(a new run that ranks started by hand connect to, a TCP listener, or a re-attach to a run's
connection file) and :meth:`LiveSession.open` (the collector of a given connection).
A :class:`ReplaySession` plays a recording into the same model: no sockets, no job.

`commtop run`, `watch`, `replay` and `ab` each build one and close it at the end; the TUI
(tui.view.build.build_app) and the headless summary read the same parts.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tui.ingest.interfaces import Sink, Source
from tui.model.run_model import RunModel, Snapshot
from tui.recordings.recorder import Recorder
from tui.recordings.replay import ReplaySource
from tui.run.control_server import ControlServer
from tui.run.job_output import JobLine
from tui.run.job_plan import JobPlan
from tui.run.launcher import STOP_GRACE_S, JobProcess
from tui.run.log_store import JobLogPaths
from tui.run.torchrun_line import is_torchrun
from workers.wire import connection as connections

if TYPE_CHECKING:
    from tui.run.headless_out import HeadlessTerminal


class SessionError(RuntimeError):
    """The session could not start (address in use, run already watched, ...)."""


@dataclass
class LiveSession:
    """Everything on the receiving side of one live run: sockets, model, control, recorder."""

    connection: connections.Connection
    source: Source
    model: RunModel
    controller: ControlServer
    recorder: Recorder
    lock_fd: int = -1
    #: remove the run's folder when closed (a run this process created; not a re-attached one)
    owns_run: bool = False
    #: torchrun's command line, for a session that starts its job (:meth:`for_job`)
    job_argv: list[str] = field(default_factory=list)
    #: the job once started (:meth:`start_job`)
    job: JobProcess | None = None
    #: where the job's output is kept (tui.run.log_store), for a session that starts its job
    job_logs: JobLogPaths | None = None
    #: the ranks the job starts (the headless progress line counts them)
    expected_ranks: int = 0
    #: the job is commtop's own loop (its ranks' stdout is a machine-readable summary, not passed through)
    runs_loop: bool = False
    #: the job's exit code is its failing rank's (a script commtop started torchrun for)
    script_codes: bool = False
    #: the job's exit code if it failed; said after the cleanup, so its error is the last thing printed
    failed_code: int | None = None
    #: headless: the job's lines and the progress line on this terminal (:meth:`supervised`)
    terminal: HeadlessTerminal | None = None
    #: how to reach this run (`commtop watch`): said on stderr, and shown in the TUI
    connect: tuple[str, ...] = ()
    #: the recording said as the run started (``--record``); others (``r``) are said at its end
    announced_recording: str = ""

    # ------------------------------------------------------------------ constructors

    @classmethod
    def open(
        cls, conn: connections.Connection, record: str | None, collective: str = "", *, owns_run: bool = True
    ) -> LiveSession:
        """The collector of ``conn`` (one per run): binds its sockets, its control server, and
        starts recording if ``record`` is not None ("" = the default path). ``owns_run``: the
        run's folder goes when the session closes."""
        from tui.ingest.feed import FeedError, FeedPublisher
        from tui.ingest.sources import LiveSource
        from tui.run.run_dirs import RunBusy, lock_run, prune_runs, remove_run

        try:
            lock_fd = lock_run(conn.run_dir)
        except RunBusy as exc:
            raise SessionError(f"run {conn.run_id} is already being watched ({exc})") from None
        prune_runs()  # folders of runs whose owner is gone (killed, crashed); this one is locked
        try:
            source = LiveSource(conn)
        except Exception as exc:
            os.close(lock_fd)
            raise SessionError(str(exc)) from None
        try:  # the run's records for `commtop ab --run` (a local subscriber); the run goes on without it
            source.attach_feed(FeedPublisher(conn))
        except FeedError as exc:
            print(f"commtop: {exc} (`commtop ab --run` cannot attach to this run)", file=sys.stderr)
        model = RunModel()
        try:
            controller = ControlServer(conn, in_force=model.in_force)
        except Exception as exc:
            _close_all([source.close])
            if owns_run:
                remove_run(conn)
            os.close(lock_fd)
            raise SessionError(str(exc)) from None
        recorder = Recorder(collective=collective or "run")
        controller.marks = recorder.write  # `commtop ab --run` leaves its marks in the recording
        session = cls(conn, source, model, controller, recorder, lock_fd=lock_fd, owns_run=owns_run)
        if record is not None:
            path = recorder.start(record or None)
            error = recorder.status().error
            if error:
                session.close()
                raise SessionError(error)
            print(f"commtop: recording to {path}", file=sys.stderr)
            session.announced_recording = path
        return session

    @classmethod
    def for_job(cls, plan: JobPlan, record: str | None, *, prometheus: str = "") -> LiveSession:
        """A new run for a job this process starts (:meth:`start_job`, or :meth:`supervised`)."""
        from tui.run import log_store

        conn = connections.create_run(label=plan.label, prometheus=prometheus)
        session = cls.open(conn, record, plan.label)  # the script's name before any rank says it
        recording = session.recorder.status()
        session.job_logs = log_store.for_run(conn.run_id, recording.path if recording.active else "")
        session.job_argv = plan.argv(conn, session.job_logs)
        session.expected_ranks = plan.nproc
        session.runs_loop = plan.loop is not None
        session.script_codes = plan.loop is None and not is_torchrun(list(plan.script))  # see JobProcess
        return session

    @classmethod
    def watch(
        cls, *, listen: str | None, connection_file: str | None, record: str | None, prometheus: str
    ) -> LiveSession:
        """`commtop watch`: a run for ranks started by hand (torchrun ... -m workers), on TCP
        when ``listen`` (multi-node), or the run of ``connection_file`` (re-attach)."""
        from tui.run.connect_help import connect_lines
        from workers.wire.config import ConfigError

        if connection_file and prometheus:
            raise ConfigError("--prometheus is set when a run is created; it cannot be added to an existing run")
        if listen:
            data, control, request = connections.tcp_endpoints(listen)
            host = connections.tcp_host(listen) or ""
            if host not in ("127.0.0.1", "localhost", "::1"):
                print(
                    f"commtop watch: warning: listening on {listen} is reachable from the network; every message is "
                    "signed with this run's key, so keep its connection file private",
                    file=sys.stderr,
                )
            conn = connections.create_run(
                data=data, control=control, request=request, label="watch", prometheus=prometheus
            )
        elif connection_file:
            conn = connections.load(connection_file)
        else:
            conn = connections.create_run(label="watch", prometheus=prometheus)
        try:
            session = cls.open(conn, record, owns_run=not connection_file)
        except SessionError:
            if not connection_file:  # a run that never listened must not become the "newest run"
                shutil.rmtree(conn.run_dir, ignore_errors=True)
            raise
        session.connect = tuple(connect_lines(conn, listen))
        return session

    # ------------------------------------------------------------------ the job

    def start_job(self, on_line: Callable[[JobLine], None] | None = None) -> JobProcess:
        """Start the job (the sockets are bound already); torchrun's word on ranks that died
        without saying so joins the source. ``on_line``: every line of the job as it is read."""
        from tui.run.launcher import JobExitSource

        if not self.job_argv:
            raise SessionError("this session has no job to start")
        try:
            job = JobProcess(
                self.job_argv, self.connection, logs=self.job_logs, on_line=on_line, script_codes=self.script_codes
            )
        except OSError as exc:  # the launcher itself cannot start (not found, not executable)
            raise SessionError(f"cannot start {self.job_argv[0]}: {exc.strerror or exc}") from None
        self.source = JobExitSource(self.source, job)  # a SIGKILLed rank's exit code
        self.job = job
        return job

    @contextlib.contextmanager
    def supervised(self, *, headless: bool = False) -> Iterator[JobProcess]:
        """Start the job, and stop the whole job and close this session however the block
        ends; then say where the job's log is and, if it failed, why (its error last). A closed
        terminal (tmux kill-session, a dropped SSH) stops the job first; so does a SIGTERM
        before the TUI or the headless loop takes it over. ``headless``: the job's lines go to
        this terminal as they come (tui.run.headless_out)."""
        from tui.run.hangup import ignore_hangup, on_hangup, on_terminate
        from tui.run.headless_out import HeadlessTerminal

        self.terminal = HeadlessTerminal(sys.stdout, sys.stderr, ranks_stdout=not self.runs_loop) if headless else None
        before = on_terminate()  # start-up: until the app or the headless loop handles SIGTERM
        try:
            job = self.start_job(on_line=self.terminal.line if self.terminal is not None else None)
        except BaseException:
            if self.job is not None:
                self.job.stop()
            self.close()
            before()
            raise
        restore = on_hangup(job.stop, self.close_on_hangup, last=self.remove_own_run)
        try:
            yield job
        finally:
            # The cleanup below is what a SIGTERM or a hang-up asks for: neither may cut it short
            # (SIGHUP ignored until restore() below puts back the handler from before).
            ignore_hangup()
            quiet = on_terminate(ignore=True)
            job.stop()
            if self.terminal is not None:
                self.terminal.close()
            self.close()
            with contextlib.suppress(OSError):  # a terminal gone away
                self._say_outcome()
            quiet()
            restore()
            before()

    def run_headless(self, job: JobProcess) -> int:
        """Collect until the job ends (or Ctrl-C), with a progress line on a terminal, then
        print the per-rank summary table."""
        from tui.run.headless import format_summary
        from tui.run.headless_out import Progress

        asked, forced = threading.Event(), threading.Event()
        by: list[int] = []

        def on_signal(signum: int, _frame: object) -> None:
            """The first Ctrl-C or SIGTERM stops the job while its last records still come in;
            a second one stops collecting at once."""
            if asked.is_set():
                forced.set()
                return
            by.append(signum)
            asked.set()
            job.terminate()

        previous = signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGTERM, on_signal)
        finished = job_finished(job)
        progress = Progress(self.model, self.expected_ranks)
        terminal = self.terminal
        asked_at: list[float] = []

        def until() -> bool:
            now = time.monotonic()
            if terminal is not None and terminal.progress_on and progress.due(now):
                terminal.progress(progress.text(now), job.writing_line())
            if asked.is_set():
                asked_at[:] = asked_at or [now]
                if now - asked_at[0] > STOP_GRACE_S:
                    return True
            return finished()

        try:
            snapshot = self.collect(forced, until=until)
        finally:
            signal.signal(signal.SIGINT, previous)
        interrupted = asked.is_set()
        code = job.stop() if interrupted else job.wait()
        if terminal is not None:
            terminal.close()
        print_out(format_summary(snapshot))
        if code != 0 and not interrupted:
            self.failed_code = code
        return 128 + by[0] if interrupted else code  # 130 after Ctrl-C, 143 after SIGTERM, as a shell says

    def stop_job_collecting(self, job: JobProcess) -> None:
        """After the TUI (``q``) with the job still running: SIGTERM it and keep collecting into
        the recording until it has ended (at most STOP_GRACE_S and the drain), so the records its
        ranks send as they stop are kept; :meth:`supervised` ends what is left."""
        if job.exit_code() is not None:
            return
        print("commtop: stopping the job (its ranks send their last records)...", file=sys.stderr, flush=True)
        job.terminate()
        finished, deadline = job_finished(job), time.monotonic() + STOP_GRACE_S
        self.collect(threading.Event(), until=lambda: finished() or time.monotonic() > deadline)

    def job_outcome(self) -> int:
        """After the TUI: the job's exit code (0 while it runs, or without a job); a failure is
        said when the session closes (:meth:`supervised`)."""
        code = self.job.exit_code() if self.job is not None else None
        if self.job is None or code in (None, 0):
            return 0
        self.failed_code = code
        return code

    def _keep_log(self) -> None:
        """Once the job's output was read to its end (the job stopped): its scratch files go;
        the log moves beside the recording if one was started during the run (``r``)."""
        from pathlib import Path

        logs, job = self.job_logs, self.job
        if logs is None or job is None or not job.output_done():
            return
        logs.remove_parts()
        from tui.run.log_store import logs_root

        # beside the first recording (one the run made from its start has it there already; later
        # ones of `r` leave it), else in the state folder until one was made
        first = next((path for path in self.recorder.saved if Path(path).exists()), "")
        if first and logs.log.parent == logs_root():
            self.job_logs = logs.moved_beside(first)
            job.logs = self.job_logs

    def _say_recordings(self) -> None:
        """The recordings made with ``r`` (the one of ``--record`` was said as it started)."""
        for path in self.recorder.saved:
            if path != self.announced_recording:
                print(f"commtop: recorded (r): {path}", file=sys.stderr)

    def _say_outcome(self) -> None:
        """Where the job's log is; if the job failed, why: the first failing rank's error last."""
        job = self.job
        if job is None:
            return
        if job.output.log_error:
            print(f"commtop: {job.output.log_error}", file=sys.stderr)
        if job.killed:
            print(
                f"commtop: {len(job.killed)} process(es) of the job still ran {STOP_GRACE_S:g} s after the "
                f"SIGTERM and were SIGKILLed ({', '.join(job.killed[:3])}{', ...' if len(job.killed) > 3 else ''})",
                file=sys.stderr,
            )
        restarts = job.output.restarts
        if restarts:
            times = "once" if restarts == 1 else f"{restarts} times"
            print(
                f"commtop: torchrun started the ranks again {times} (--max-restarts): the counts and "
                "the log hold every attempt",
                file=sys.stderr,
            )
        if self.failed_code is None:
            print(f"commtop: the job's output is in {job.log_path}", file=sys.stderr)
            return
        say_job_failed(job, self.failed_code)

    # ------------------------------------------------------------------ watch

    @contextlib.contextmanager
    def watching(self, *, headless: bool) -> Iterator[threading.Event]:
        """`commtop watch`: close on hang-up (and on SIGINT/SIGTERM when ``headless``: the
        event is set), say how to reach the run, close the session when the block ends."""
        from tui.run.hangup import on_hangup

        on_hangup(self.close_on_hangup, last=self.remove_own_run)
        stop = threading.Event()
        if headless:  # before the lines below: a SIGTERM right after them must end it cleanly
            signal.signal(signal.SIGINT, lambda *_: stop.set())
            signal.signal(signal.SIGTERM, lambda *_: stop.set())
        # Printed once listening, so a failed start says one line only; the TUI shows them too.
        for line in self.connect:
            print(f"commtop: {line}", file=sys.stderr)
        try:
            yield stop
        finally:
            self.close()

    def summarise(self, stop: threading.Event) -> int:
        """Collect until ``stop`` is set, then print the per-rank summary table."""
        from tui.run.headless import format_summary

        print_out(format_summary(self.collect(stop)))
        return 0

    # ------------------------------------------------------------------ ingest and close

    @property
    def sinks(self) -> list[Sink]:
        """Who gets every accepted message after the model: the control server, the recorder."""
        return [self.controller, self.recorder]

    def collect(
        self, stop: threading.Event, until: Callable[[], bool] = lambda: False, sinks: Iterable[Sink] = ()
    ) -> Snapshot:
        """Ingest on this thread (no TUI) into the model and the sinks (and ``sinks``) until
        ``stop`` is set or ``until()``; the final snapshot."""
        from tui.run.headless import run_headless

        return run_headless(self.source, self.model, stop, until=until, sinks=[*self.sinks, *sinks])

    def close_on_hangup(self) -> None:
        """What can be done safely from a signal handler on the main thread while the ingest
        thread may be inside a socket call: finish the recording, remove the run's folder."""
        try:
            self.recorder.close()
        finally:
            self.remove_own_run()

    def remove_own_run(self) -> None:
        """Remove the run's folder if this session made it (any thread; twice is harmless)."""
        if self.owns_run:
            from tui.run.run_dirs import remove_run

            remove_run(self.connection)

    def close(self) -> None:
        _close_all([self.recorder.stop, self.controller.close, self.source.close, self._keep_log, self._say_recordings])
        if self.owns_run:
            from tui.run.run_dirs import remove_run

            remove_run(self.connection)
            self.owns_run = False
        if self.lock_fd >= 0:
            os.close(self.lock_fd)
            self.lock_fd = -1


@dataclass
class ReplaySession:
    """A recording played back (`commtop replay`): the same model and app as a live run;
    no connection, no control, no recorder, no job."""

    source: ReplaySource
    model: RunModel = field(default_factory=RunModel)

    @classmethod
    def open(cls, path: str, speed: float) -> ReplaySession:
        """Raises OSError, or ValueError (one line) if the file is not a recording."""
        from tui.recordings.replay import open_replay

        return cls(open_replay(path, speed=speed))

    @property
    def warning(self) -> str:
        """One line on a damaged or incomplete recording ("" when it is clean)."""
        return self.source.warning

    @property
    def sinks(self) -> list[Sink]:
        return []

    @property
    def controller(self) -> None:
        return None

    @property
    def recorder(self) -> None:
        return None

    @property
    def job(self) -> None:
        return None

    def close(self) -> None:
        _close_all([self.source.close])


def print_out(text: str) -> None:
    """``text`` on stdout; where its reader left (``| head``) the rest is dropped, not a
    BrokenPipeError traceback and exit code 1 (nor one at the interpreter's last flush)."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def job_finished(job: JobProcess) -> Callable[[], bool]:
    """Whether to stop ingesting: the job ended half a second ago and its output is read to the
    end (torchrun's last lines say which rank died of what), or three seconds ago at most."""
    ended_at: list[float] = []

    def finished() -> bool:
        if job.exit_code() is None:
            return False
        if not ended_at:
            ended_at.append(time.monotonic())
        waited = time.monotonic() - ended_at[0]
        # drain what is still in flight, and read torchrun's last lines (which rank died of what)
        # from job.log to its end
        return waited > 0.5 and (job.output_done() or waited > 3.0)

    return finished


def say_job_failed(job: JobProcess, code: int, prefix: str = "commtop") -> None:
    """The job's exit code, where its log is, and why it failed, on stderr: one line per rank
    that ended, then the first failing rank's own error (tui.run.job_failure) last."""
    sys.stdout.flush()
    print(f"{prefix}: the job exited with code {code}; its output is in {job.log_path}", file=sys.stderr)
    for line in job.failure().lines:
        print(line if line.startswith(" ") else f"{prefix}: {line}", file=sys.stderr)


def _close_all(closers: Iterable[Callable[[], None]]) -> None:
    """Call each; one that fails is said in one line and the others still run."""
    for close in closers:
        try:
            close()
        except Exception as exc:  # closing must go on for the other parts
            print(f"commtop: while closing {close.__qualname__.split('.')[0]}: {exc}", file=sys.stderr)
