"""The `commtop` command: run, watch, replay, report, ctl.

This module only parses arguments and wires parts together; each part lives in its own
module. It must never import torch (the workers run in torchrun's processes).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tui.run.connect_help import connect_lines
from workers.wire import connection as connections

if TYPE_CHECKING:  # the parts are imported when used, so `commtop -h` stays fast
    from tui.model.interfaces import Sink, Source
    from tui.model.run_model import RunModel
    from tui.recordings.recorder import Recorder
    from tui.run.control_server import ControlServer
from workers.wire.config import ConfigError, LoopConfig, add_loop_arguments, config_from_args

CPU_RANKS = 2
ABOUT = "commtop: live profiler for GPU communication (NCCL collectives vs. offload copies)"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # ctl and report own their whole command line.
    if argv and argv[0] == "ctl":
        from tui.run import ctl

        return ctl.main(argv[1:])
    if argv and argv[0] == "ab":
        from tui.run import ab

        return ab.main(argv[1:], ab_launch())
    if argv and argv[0] == "report":
        from tui.report import command as report

        return report.main(argv[1:])
    script: list[str] = []
    if argv and argv[0] == "run" and "--" in argv:  # `commtop run [options] -- python train.py ...`
        cut = argv.index("--")
        argv, script = argv[:cut], argv[cut + 1 :]
        if not script:
            print(
                "commtop run: error: nothing to run after `--` (e.g. commtop run -- python train.py)", file=sys.stderr
            )
            return 2
    parser = build_parser()
    ns = parser.parse_args(argv)
    ns.script = script
    if ns.command is None:
        parser.print_help()
        return 2
    try:
        return int(ns.func(ns))
    except (ConfigError, connections.ConnectionError_, CollectorError) as exc:
        print(f"commtop {ns.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


RUN_USAGE = "commtop run [options]\n       commtop run [--nproc N] [--headless] [--record [PATH]] -- CMD [ARGS ...]"
RUN_EPILOG = """the second form runs your own script (instrumented with workers.monitor) under torchrun:
  commtop run -- python examples/train_ddp.py
  commtop run --nproc 4 --headless -- python -m mypkg.train --lr 3e-4
recordings go to recordings/<date>-<time>-<host>-<collective>.commtop unless --record names a PATH"""
RECORD_HELP = "record to PATH (default: recordings/<date>-<time>-<host>-<collective>.commtop)"


def build_parser() -> argparse.ArgumentParser:
    from tui.args import DefaultsFormatter, OneLineParser, version

    parser = OneLineParser(prog="commtop", description=ABOUT)
    parser.add_argument("--version", action="version", version=f"commtop {version()}")
    sub = parser.add_subparsers(dest="command", metavar="{run,watch,replay,report,ctl,ab}")

    run = sub.add_parser(
        "run",
        help="start torchrun workers on this node (or your script: run -- CMD) and watch them live",
        usage=RUN_USAGE,
        epilog=RUN_EPILOG,
        formatter_class=DefaultsFormatter,
    )
    run.add_argument("--nproc", type=int, default=None, help="ranks (default: one per visible GPU, or 2 on CPU)")
    run.add_argument("--headless", action="store_true", help="no TUI: run, then print the per-rank summary")
    run.add_argument("--record", nargs="?", const="", default=None, metavar="PATH", help=RECORD_HELP)
    _add_prometheus_argument(run)
    add_loop_arguments(run)
    run.set_defaults(func=cmd_run)

    watch = sub.add_parser(
        "watch",
        help="TUI only, for workers started by hand (torchrun ... -m workers)",
        formatter_class=DefaultsFormatter,
    )
    watch.add_argument(
        "--listen",
        default=None,
        metavar="tcp://ADDR:PORT",
        help="listen on TCP for multi-node runs (uses PORT, PORT+1, PORT+2)",
    )
    watch.add_argument("--connection-file", default=None, help="re-attach to this run (default: a new run)")
    watch.add_argument("--record", nargs="?", const="", default=None, metavar="PATH", help=RECORD_HELP)
    watch.add_argument("--headless", action="store_true", help="collect without a TUI until Ctrl-C")
    _add_prometheus_argument(watch)
    watch.set_defaults(func=cmd_watch)

    replay = sub.add_parser(
        "replay",
        help="replay a recording in the TUI (commtop replay FILE [--speed X])",
        formatter_class=DefaultsFormatter,
        epilog="keys: space pause, + / - speed, left / right seek 5 s, n / p next / previous settings change",
    )
    replay.add_argument("file", metavar="FILE", help="a .commtop recording (commtop run --record, or r in the TUI)")
    replay.add_argument("--speed", type=float, default=1.0, help="playback speed, e.g. 4 for four times as fast")
    replay.set_defaults(func=cmd_replay)

    sub.add_parser(
        "report", help="per-mode tables, CSV, Perfetto traces and plots from a recording (commtop report -h)"
    )
    sub.add_parser(
        "ctl", help="change a running job's settings: commtop ctl status | mode MODE | set NAME=VALUE ... (ctl -h)"
    )
    sub.add_parser("ab", help="A/B experiment with a 95 %% confidence interval (commtop ab -h)")
    return parser


def _add_prometheus_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--prometheus",
        metavar="[HOST:]PORT",
        default="",
        help="every node's sampler serves its ranks' metrics there (127.0.0.1 unless HOST; 0 = any free port); "
        "the URLs are in the run directory and `commtop ctl status`",
    )


def prometheus_setting(text: str) -> str:
    """Checked ``--prometheus`` (one-line error), with one line of warning when it binds wider."""
    from workers.wire import exporter_address

    if not text:
        return ""
    try:
        host, _ = exporter_address.parse(text)
    except exporter_address.AddressError as exc:
        raise ConfigError(str(exc)) from None
    if exporter_address.is_wide(host):
        print(f"commtop: {exporter_address.warning(text)}", file=sys.stderr)
    return text


# --------------------------------------------------------------------------- collector


class CollectorError(RuntimeError):
    """The collector could not start (address in use, run already watched, ...)."""


@dataclass
class Collector:
    """Everything on the receiving side of one run: sockets, model, control, recorder."""

    connection: connections.Connection
    source: Source
    model: RunModel
    controller: ControlServer | None = None
    recorder: Recorder | None = None
    lock_fd: int = -1
    #: remove the run's folder when closed (a run this process created; not a re-attached one)
    owns_run: bool = False

    @property
    def sinks(self) -> list[Sink]:
        """Who gets every accepted message after the model: the control server, the recorder."""
        return [part for part in (self.controller, self.recorder) if part is not None]

    def close_on_hangup(self) -> None:
        """What can be done safely from a signal handler on the main thread while the ingest
        thread may be inside a socket call: finish the recording, remove the run's folder."""
        if self.recorder is not None:
            self.recorder.close()
        if self.owns_run and self.connection is not None:
            from tui.run.run_dirs import remove_run

            remove_run(self.connection)

    def close(self) -> None:
        closers = [
            self.recorder.stop if self.recorder is not None else None,
            self.controller.close if self.controller is not None else None,
            self.source.close,
        ]
        for close in closers:
            if close is None:
                continue
            try:
                close()
            except Exception as exc:  # closing must go on for the other parts
                print(f"commtop: while closing {close.__qualname__.split('.')[0]}: {exc}", file=sys.stderr)
        if self.owns_run and self.connection is not None:
            from tui.run.run_dirs import remove_run

            remove_run(self.connection)
            self.owns_run = False
        if self.lock_fd >= 0:
            os.close(self.lock_fd)
            self.lock_fd = -1


def open_collector(
    conn: connections.Connection, record: str | None, collective: str = "", *, owns_run: bool = True
) -> Collector:
    """The collector of ``conn`` (one per run); ``owns_run``: its folder goes when it closes."""
    from tui.model.run_model import RunModel
    from tui.model.sources import LiveSource
    from tui.run.run_dirs import RunBusy, lock_run, prune_runs

    try:
        lock_fd = lock_run(conn.run_dir)
    except RunBusy as exc:
        raise CollectorError(f"run {conn.run_id} is already being watched ({exc})") from None
    prune_runs()  # folders of runs whose owner is gone (killed, crashed); this one is locked
    try:
        source = LiveSource(conn)
    except Exception as exc:
        os.close(lock_fd)
        raise CollectorError(str(exc)) from None
    from tui.model.feed import FeedError, FeedPublisher

    try:  # the run's records for `commtop ab --run` (a local subscriber); the run goes on without it
        source.attach_feed(FeedPublisher(conn))
    except FeedError as exc:
        print(f"commtop: {exc} (`commtop ab --run` cannot attach to this run)", file=sys.stderr)
    collector = Collector(connection=conn, source=source, model=RunModel(), lock_fd=lock_fd, owns_run=owns_run)
    from tui.run.control_server import ControlServer

    try:
        collector.controller = ControlServer(conn, in_force=collector.model.in_force)
    except Exception as exc:
        collector.close()
        raise CollectorError(str(exc)) from None
    collector.recorder = make_recorder(collective)
    if collector.controller is not None:  # `commtop ab --run` leaves its marks in the recording
        collector.controller.marks = collector.recorder.write
    if record is not None:
        path = collector.recorder.start(record or None)
        error = collector.recorder.status().error
        if error:
            collector.close()
            raise CollectorError(error)
        print(f"commtop: recording to {path}", file=sys.stderr)
    return collector


def ab_launch() -> Any:
    """What `commtop ab` (tui.run.ab, a layer below) needs to start a run like `run --headless`."""
    from tui.run.ab import Launch

    return Launch(open_collector, CollectorError, check_memory, script_argv, _job_finished, CPU_RANKS)


def make_recorder(collective: str) -> Any:
    from tui.recordings.recorder import Recorder

    return Recorder(collective=collective or "run")


# --------------------------------------------------------------------------- run


def cmd_run(ns: argparse.Namespace) -> int:
    if getattr(ns, "script", None):
        return cmd_run_script(ns)
    from tui.run.gpus import visible_gpus
    from tui.run.launcher import torchrun_argv

    prometheus = prometheus_setting(ns.prometheus)  # a bad address fails before anything is said
    gpus = visible_gpus()
    cpu = gpus.count == 0 or ns.backend == "gloo"
    if ns.backend == "nccl" and gpus.count == 0:
        raise ConfigError(f"--backend nccl needs a GPU: {gpus.reason}")
    nproc = ns.nproc if ns.nproc is not None else (CPU_RANKS if cpu else gpus.count)
    if nproc < 1:
        raise ConfigError("--nproc must be at least 1")
    if not cpu and nproc > gpus.count:
        raise ConfigError(f"--nproc {nproc} but only {gpus.count} GPU(s) are visible")
    config = config_from_args(ns, cpu=cpu)
    check_memory(config, nproc, cpu, gpus.memory_bytes)
    if cpu:
        why = gpus.reason if gpus.count == 0 else "--backend gloo"
        print(f"commtop: no GPU ({why}): running {nproc} gloo ranks on the CPU (backend gloo/cpu)", file=sys.stderr)
    conn = connections.create_run(label=config.collective, prometheus=prometheus)
    collector = open_collector(conn, ns.record, config.collective)
    title = f"commtop run · {nproc} ranks · {'gloo/cpu' if cpu else 'nccl'}"
    return supervise(collector, torchrun_argv(nproc, config.to_argv(), conn), nproc, ns.headless, title)


def supervise(collector: Collector, argv: list[str], nproc: int, headless: bool, title: str) -> int:
    """Start the job (the collector's sockets are already bound), show it headless or in the
    TUI, and stop the whole job and the collector however that ends."""
    from tui.run.hangup import on_hangup
    from tui.run.launcher import JobExitSource, JobProcess

    job = JobProcess(argv, collector.connection)
    collector.source = JobExitSource(collector.source, job)  # a SIGKILLed rank's exit code
    # A closed terminal (tmux kill-session, a dropped SSH): stop the job before anything else.
    restore = on_hangup(job.stop, lambda: collector.close_on_hangup())
    try:
        if headless:
            return run_headless(collector, job, nproc)
        return run_tui(collector, job=job, title=title)
    finally:
        restore()
        job.stop()
        collector.close()


def cmd_run_script(ns: argparse.Namespace) -> int:
    """`commtop run [--nproc N] [--headless] [--record] -- python train.py ...`: the user's own
    script (instrumented with ``workers.monitor``) under torchrun, its connection set up
    through $COMMTOP_CONNECTION_FILE."""
    from tui.run.gpus import visible_gpus

    gpus = visible_gpus()
    nproc = ns.nproc if ns.nproc is not None else (gpus.count or CPU_RANKS)
    if nproc < 1:
        raise ConfigError("--nproc must be at least 1")
    argv = script_argv(ns.script, nproc)
    conn = connections.create_run(
        label=next((Path(a).stem for a in ns.script if a.endswith(".py")), "script"),
        prometheus=prometheus_setting(ns.prometheus),
    )
    collector = open_collector(conn, ns.record, "monitor")
    return supervise(collector, argv, nproc, ns.headless, f"commtop run · {' '.join(ns.script)[:60]}")


def script_argv(script: list[str], nproc: int) -> list[str]:
    """torchrun on this node for ``python x.py ARGS``, ``python -m mod ARGS`` or ``x.py ARGS``;
    a command that is already ``torchrun ...`` runs as given."""
    if os.path.basename(script[0]) == "torchrun":
        return script
    rest = list(script)
    if os.path.basename(rest[0]).startswith("python"):
        rest = rest[1:]
        while rest and rest[0].startswith("-") and rest[0] != "-m":  # python's own flags (-u, -O)
            rest = rest[1:]
    if not rest or (rest[0] == "-m" and len(rest) < 2):
        raise ConfigError(f"nothing to run in {' '.join(script)!r}; expected e.g. `-- python train.py`")
    from tui.run.launcher import torchrun_prefix

    # The bootstrap captures collectives and copies of the unmodified script, then runs it as __main__.
    return [*torchrun_prefix(nproc), "-m", "workers.capture.bootstrap", *rest]


def check_memory(config: LoopConfig, nproc: int, cpu: bool, gpu_memory: tuple[int, ...]) -> None:
    """Refuse sizes that cannot fit before any rank starts (a clear error, not an OOM later)."""
    import psutil

    available = psutil.virtual_memory().available
    host_need = nproc * config.peak_host_bytes() + (nproc * config.peak_device_bytes(nproc) if cpu else 0)
    if host_need > 0.8 * available:
        raise ConfigError(
            f"{config.collective} of {'x'.join(map(str, config.shape))} {config.dtype} on {nproc} "
            f"ranks needs ~{host_need / 2**30:.1f} GiB of host memory; {available / 2**30:.1f} GiB "
            "is available (use a smaller --shape)"
        )
    if not cpu and gpu_memory:
        need = config.peak_device_bytes(nproc)
        if need > 0.9 * min(gpu_memory):
            raise ConfigError(
                f"needs ~{need / 2**30:.1f} GiB per GPU; the smallest has "
                f"{min(gpu_memory) / 2**30:.1f} GiB (use a smaller --shape)"
            )


def run_headless(collector: Collector, job: Any, nproc: int) -> int:
    """Collect until the job ends (or Ctrl-C), then print the per-rank summary table."""
    from tui.run.headless import format_summary
    from tui.run.headless import run_headless as collect

    stop = threading.Event()
    previous = signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        snapshot = collect(collector.source, collector.model, stop, until=_job_finished(job), sinks=collector.sinks)
    finally:
        signal.signal(signal.SIGINT, previous)
    interrupted = stop.is_set()
    code = job.stop() if interrupted else job.wait()
    print(format_summary(snapshot))
    if code != 0 and not interrupted:
        print(f"commtop: the job exited with code {code}; its last lines:", file=sys.stderr)
        for line in job.error_lines():
            print(f"  {line}", file=sys.stderr)
    return 130 if interrupted else code


def _job_finished(job: Any) -> Callable[[], bool]:
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


def run_tui(
    collector: Collector, *, job: Any = None, title: str = "commtop", hint: str = "", connect: Sequence[str] = ()
) -> int:
    from tui.view.app import build_app

    app = build_app(collector=collector, job=job, title=title, hint=hint, connect=connect, tune_gc=True)
    app.run()
    if job is not None and job.exit_code() not in (None, 0):
        print(f"commtop: the job exited with code {job.exit_code()}; its last lines:", file=sys.stderr)
        for line in job.error_lines():
            print(f"  {line}", file=sys.stderr)
        return int(job.exit_code())
    return 0


# --------------------------------------------------------------------------- watch


def cmd_watch(ns: argparse.Namespace) -> int:
    prometheus = prometheus_setting(ns.prometheus)
    if ns.connection_file and prometheus:
        raise ConfigError("--prometheus is set when a run is created; it cannot be added to an existing run")
    if ns.listen:
        data, control, request = connections.tcp_endpoints(ns.listen)
        host = connections.tcp_host(ns.listen) or ""
        if host not in ("127.0.0.1", "localhost", "::1"):
            print(
                f"commtop watch: warning: listening on {ns.listen} is reachable from the network; every message is "
                "signed with this run's key, so keep its connection file private",
                file=sys.stderr,
            )
        conn = connections.create_run(data=data, control=control, request=request, label="watch", prometheus=prometheus)
    elif ns.connection_file:
        conn = connections.load(ns.connection_file)
    else:
        conn = connections.create_run(label="watch", prometheus=prometheus)
    try:
        collector = open_collector(conn, ns.record, owns_run=not ns.connection_file)
    except CollectorError:
        if not ns.connection_file:  # a run that never listened must not become the "newest run"
            shutil.rmtree(conn.run_dir, ignore_errors=True)
        raise
    from tui.run.hangup import on_hangup

    on_hangup(lambda: collector.close_on_hangup())
    stop = threading.Event()
    if ns.headless:  # before the lines below: a SIGTERM right after them must end it cleanly
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
    # Printed once listening, so a failed start says one line only; the TUI shows them too.
    connect = connect_lines(conn, ns.listen)
    for line in connect:
        print(f"commtop: {line}", file=sys.stderr)
    try:
        if ns.headless:
            from tui.run.headless import format_summary
            from tui.run.headless import run_headless as collect

            print(
                format_summary(
                    collect(collector.source, collector.model, stop, until=lambda: False, sinks=collector.sinks)
                )
            )
            return 0
        return run_tui(collector, title=f"commtop watch · {conn.run_id}", connect=connect)
    finally:
        collector.close()


# --------------------------------------------------------------------------- replay


def cmd_replay(ns: argparse.Namespace) -> int:
    from tui.model.run_model import RunModel
    from tui.recordings.replay import open_replay

    try:
        source = open_replay(ns.file, speed=ns.speed)
    except (OSError, ValueError) as exc:
        print(f"commtop replay: error: {exc}", file=sys.stderr)
        return 1
    warning = getattr(source, "warning", "")
    if warning:
        print(f"commtop replay: warning: {warning}", file=sys.stderr)
    collector = Collector(connection=None, source=source, model=RunModel())  # type: ignore[arg-type]
    try:
        return run_tui(collector, title=f"commtop replay · {Path(ns.file).name}", hint=warning)
    finally:
        collector.close()


if __name__ == "__main__":
    raise SystemExit(main())
