"""The `commtop` command: run, watch, replay, report, ctl, ab.

This module only parses arguments (one argparse subparser per subcommand) and calls the
run's session (tui.run.session) or the subcommand's module; `report`, `ctl` and `ab` add their
own options when they are used. It must never import torch (the workers run in torchrun's
processes).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from workers.wire import connection as connections
from workers.wire.config import ConfigError, add_loop_arguments

if TYPE_CHECKING:  # the parts are imported when used, so `commtop -h` stays fast
    from tui.view.build import Session

ABOUT = "commtop: live profiler for GPU communication (NCCL collectives vs. offload copies)"


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    ns, extras = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    if ns.command is None:
        if extras:
            parser.error(f"unrecognized arguments: {' '.join(extras)}")
        parser.print_help()
        return 2
    if extras:  # said by the subcommand: `commtop run: error: ...`, as its own bad values are
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        sub.choices[ns.command].error(f"unrecognized arguments: {' '.join(extras)}")
    return int(ns.func(ns))


RUN_USAGE = "commtop run [options]\n       commtop run [--nproc N] [--headless] [--record [PATH]] -- CMD [ARGS ...]"
RUN_EPILOG = """the second form runs your own script under torchrun, unmodified: every collective and copy
is read through workers.capture.bootstrap (add workers.monitor for named steps and live knobs):
  commtop run -- python examples/train_ddp_plain.py
  commtop run --nproc 4 --headless -- python -m mypkg.train --lr 3e-4
  commtop run -- torchrun --standalone --nproc-per-node 8 train.py   (your torchrun line, as it is)
--headless prints the job's output as it comes, each line with its [rankN]: prefix; the job's
log is kept beside the recording, or under $XDG_STATE_HOME/commtop/logs (the path is said at exit)
recordings go to recordings/<date>-<time>-<host>-<collective>.commtop unless --record names a PATH"""
RECORD_HELP = "record to PATH (default: recordings/<date>-<time>-<host>-<collective>.commtop)"


def build_parser() -> argparse.ArgumentParser:
    from tui.args import CommandParser, DefaultsFormatter, OneLineParser, version

    parser = OneLineParser(prog="commtop", description=ABOUT)
    parser.add_argument("--version", action="version", version=f"commtop {version()}")
    sub = parser.add_subparsers(dest="command", metavar="{run,watch,replay,report,ctl,ab}", parser_class=CommandParser)

    run = sub.add_parser(
        "run",
        help="start torchrun workers on this node (or your script: run -- CMD) and watch them live",
        usage=RUN_USAGE,
        epilog=RUN_EPILOG,
        formatter_class=DefaultsFormatter,
        script=True,
    )
    run.add_argument("--nproc", type=int, default=None, help="ranks (default: one per visible GPU, or 2 on CPU)")
    run.add_argument(
        "--headless", action="store_true", help="no TUI: the job's output as it comes, then the per-rank summary"
    )
    run.add_argument("--record", nargs="?", const="", default=None, metavar="PATH", help=RECORD_HELP)
    _add_prometheus_argument(run)
    add_loop_arguments(run)
    run.set_defaults(func=_one_line_errors(cmd_run))

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
    watch.set_defaults(func=_one_line_errors(cmd_watch))

    replay = sub.add_parser(
        "replay",
        help="replay a recording in the TUI (commtop replay FILE [--speed X])",
        formatter_class=DefaultsFormatter,
        epilog="keys: space pause, + / - speed, left / right seek 5 s, n / p next / previous settings change",
    )
    replay.add_argument("file", metavar="FILE", help="a .commtop recording (commtop run --record, or r in the TUI)")
    replay.add_argument("--speed", type=float, default=1.0, help="playback speed, e.g. 4 for four times as fast")
    replay.set_defaults(func=_one_line_errors(cmd_replay))

    sub.add_parser(
        "report",
        help="per-mode tables, CSV, Perfetto traces and plots from a recording (commtop report -h)",
        arguments=_report_arguments,
    )
    sub.add_parser(
        "ctl",
        help="change a running job's settings: commtop ctl status | mode MODE | set NAME=VALUE ... (ctl -h)",
        arguments=_ctl_arguments,
    )
    sub.add_parser(
        "ab",
        help="A/B experiment with a 95 %% confidence interval (commtop ab -h)",
        arguments=_ab_arguments,
        script=True,
    )
    return parser


def _report_arguments(parser: argparse.ArgumentParser) -> None:
    from tui.report import command as report

    report.add_arguments(parser)
    parser.set_defaults(func=report.run)


def _ctl_arguments(parser: argparse.ArgumentParser) -> None:
    from tui.run import ctl

    ctl.add_arguments(parser)
    parser.set_defaults(func=ctl.run)


def _ab_arguments(parser: argparse.ArgumentParser) -> None:
    from tui.run import ab

    ab.add_arguments(parser)
    parser.set_defaults(func=ab.run)


def _add_prometheus_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--prometheus",
        metavar="[HOST:]PORT",
        default="",
        help="every node's sampler serves its ranks' metrics there (127.0.0.1 unless HOST; 0 = any free port); "
        "the URLs are in the run directory and `commtop ctl status`",
    )


def prometheus_setting(text: str, *, here: bool = False) -> str:
    """Checked ``--prometheus`` (one-line error), with one line of warning when it binds wider.
    ``here``: the job runs on this machine (``commtop run``), so a port already in use fails now,
    in one line (the node sampler that serves it could only say so in its own log)."""
    from workers.wire import exporter_address

    if not text:
        return ""
    try:
        host, port = exporter_address.parse(text)
    except exporter_address.AddressError as exc:
        raise ConfigError(str(exc)) from None
    if here and port:
        _port_free(host, port, text)
    if exporter_address.is_wide(host):
        print(f"commtop: {exporter_address.warning(text)}", file=sys.stderr)
    return text


def _port_free(host: str, port: int, text: str) -> None:
    import errno
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the exporter binds
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise ConfigError(
                    f"--prometheus {text}: port {port} is already in use on {host} (another exporter?); "
                    "choose another, or 0 for any free port"
                ) from None


def _one_line_errors(command: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """run, watch and replay: a bad setting, connection or address is one line with the
    subcommand's prefix and exit code 2; Ctrl-C is 130."""

    def guarded(ns: argparse.Namespace) -> int:
        from tui.run.session import SessionError

        try:
            return command(ns)
        except (ConfigError, connections.ConnectionError_, SessionError) as exc:
            print(f"commtop {ns.command}: error: {exc}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            return 130

    return guarded


# --------------------------------------------------------------------------- commands


def cmd_run(ns: argparse.Namespace) -> int:
    """`commtop run [options]` (the synthetic loop) or `commtop run [options] -- CMD ...`."""
    from tui.run.job_plan import interpreter_note, loop_plan, script_plan
    from tui.run.session import LiveSession

    if ns.script is not None:
        if not ns.script:
            print(
                "commtop run: error: nothing to run after `--` (e.g. commtop run -- python train.py)", file=sys.stderr
            )
            return 2
        plan = script_plan(ns.script, ns.nproc)
        prometheus = prometheus_setting(ns.prometheus, here=True)
        if note := interpreter_note(ns.script):
            print(f"commtop: {note}", file=sys.stderr)
    else:
        prometheus = prometheus_setting(ns.prometheus, here=True)  # a bad address fails before anything is said
        plan = loop_plan(ns)
    session = LiveSession.for_job(plan, ns.record, prometheus=prometheus)
    with session.supervised(headless=ns.headless) as job:
        if ns.headless:
            return session.run_headless(job)
        stopped_by = show(session, title=plan.title)
        outcome = session.job_outcome()  # before the stop: a job stopped by q did not fail
        session.stop_job_collecting(job)
        return 128 + stopped_by if stopped_by else outcome  # 130 after ctrl+c, 143 after SIGTERM


def cmd_watch(ns: argparse.Namespace) -> int:
    """`commtop watch`: a run whose ranks are started by hand, or a re-attach to one."""
    from tui.run.session import LiveSession

    session = LiveSession.watch(
        listen=ns.listen,
        connection_file=ns.connection_file,
        record=ns.record,
        prometheus=prometheus_setting(ns.prometheus),
    )
    with session.watching(headless=ns.headless) as stop:
        if ns.headless:
            return session.summarise(stop)
        show(session, title=f"commtop watch · {session.connection.run_id}", connect=session.connect)
        return 0  # ctrl+c and SIGTERM are how a collector ends: as --headless, 0


def cmd_replay(ns: argparse.Namespace) -> int:
    """`commtop replay FILE`: a recording in the TUI."""
    from pathlib import Path

    from tui.run.session import ReplaySession

    try:
        session = ReplaySession.open(ns.file, speed=ns.speed)
    except (OSError, ValueError) as exc:
        print(f"commtop replay: error: {exc}", file=sys.stderr)
        return 1
    if session.warning:
        print(f"commtop replay: warning: {session.warning}", file=sys.stderr)
    try:
        show(session, title=f"commtop replay · {Path(ns.file).name}", hint=session.warning)
        return 0
    finally:
        session.close()


def show(session: Session, *, title: str, hint: str = "", connect: Sequence[str] = ()) -> int:
    """The TUI on ``session`` until the user quits; the signal that ended it (0: q)."""
    from tui.view.build import build_app

    app = build_app(session, title=title, hint=hint, connect=connect, tune_gc=True)
    app.run()
    return app.stopped_by


if __name__ == "__main__":
    raise SystemExit(main())
