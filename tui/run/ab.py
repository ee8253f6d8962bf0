"""`commtop ab`: is B slower than A, by how much, with a 95 % interval?

    commtop ab --a mode=none --b mode=overlap [--duration 30 | --until-ci 1] [--json]
    commtop ab --a mode=none --b mode=overlap -- python train.py
    commtop ab --run RUN --a mode=none --b mode=overlap   (a run already going: tui.run.ab_attach)

It starts its own run like ``commtop run --headless`` (the synthetic forum loop, or a user's
script after ``--``), alternates A and B in blocks (tui.experiment.ab_experiment), then prints the
table of tui.experiment.ab_stats and exits 0. With ``--record`` the A/B marks go into the
recording, and ``commtop report FILE`` prints the same verdict again.
"""

from __future__ import annotations

import argparse
import json
import math
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from workers.wire import connection as connections
from workers.wire.config import ConfigError, add_loop_arguments, config_from_args
from workers.wire.settings import Settings, SettingsError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="commtop ab", description="A/B experiment: alternate two settings in random AB/BA blocks"
    )
    parser.add_argument("--a", required=True, metavar="NAME=VALUE[,...]", help="settings of arm A, e.g. mode=none")
    parser.add_argument("--b", required=True, metavar="NAME=VALUE[,...]", help="settings of arm B, e.g. mode=overlap")
    parser.add_argument("--duration", type=float, default=30.0, metavar="SECONDS", help="run this long (default 30)")
    parser.add_argument(
        "--until-ci",
        default="",
        metavar="PCT",
        help="stop once the p50 ratio's 95 %% interval is within +/- PCT (e.g. 1%%), or at --duration",
    )
    parser.add_argument("--block", type=float, default=1.0, metavar="SECONDS", help="block length (default 1)")
    parser.add_argument("--seed", type=int, default=None, help="seed of the AB/BA order (default: random, printed)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--nproc", type=int, default=None, help="ranks (default: one per GPU, or 2 on CPU)")
    parser.add_argument("--record", nargs="?", const="", default=None, metavar="PATH", help="record to PATH")
    parser.add_argument(
        "--run",
        default=None,
        metavar="RUN",
        help="attach to a live run (a run id or prefix, a connection file, or 'newest'; see `commtop ctl status`) "
        "instead of starting one; its settings are restored at the end",
    )
    add_loop_arguments(parser)
    return parser


def _percent(text: str) -> float:
    if not text:
        return 0.0
    try:
        value = float(text.strip().rstrip("%"))
    except ValueError:
        raise ConfigError(f"--until-ci must be a percentage like 1% ; got {text!r}") from None
    if not 0 < value < 100:
        raise ConfigError(f"--until-ci must be in (0, 100) %; got {text!r}")
    return value


@dataclass(frozen=True)
class Launch:
    """What `commtop ab` borrows from the CLI to start a run like `commtop run --headless`
    (passed in by tui.cli, which sits above this module)."""

    open_collector: Callable[..., Any]
    collector_error: type[Exception]
    check_memory: Callable[..., None]
    script_argv: Callable[[list[str], int], list[str]]
    job_finished: Callable[[Any], Callable[[], bool]]
    cpu_ranks: int


def main(argv: list[str], launch: Launch) -> int:
    script: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, script = argv[:cut], argv[cut + 1 :]
        if not script:
            print("commtop ab: error: nothing to run after `--`", file=sys.stderr)
            return 2
    ns = build_parser().parse_args(argv)
    try:
        return run(ns, script, launch)
    except (ConfigError, ValueError, SettingsError, connections.ConnectionError_) as exc:
        print(f"commtop ab: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


@dataclass
class ABRun:
    """An experiment that ran, its result, the run's final snapshot and the job's exit code."""

    experiment: Any
    result: Any
    snapshot: Any
    code: int
    job: Any


def run(ns: argparse.Namespace, script: list[str], launch: Launch) -> int:
    done = run_experiment(ns, script, launch)
    experiment, result, code, job = done.experiment, done.result, done.code, done.job
    if ns.json:
        from tui.experiment.ab_stats import as_json

        out = as_json(result) | {"seed": experiment.seed, "state": experiment.state, "note": experiment.note}
        print(json.dumps(_finite(out), indent=1))
    else:
        from tui.experiment.ab_stats import format_table
        from tui.experiment.verdict import pcie_peak

        peak = pcie_peak(getattr(done.snapshot, "telemetry", None))
        print(format_table(result, peak.share(result.copy_gbps[1]) if peak is not None else ""))
        print(f"seed {experiment.seed} · {experiment.state}" + (f": {experiment.note}" if experiment.note else ""))
    if code and job is None:  # attached (--run): the settings could not be confirmed restored (said above)
        return code
    if code:
        print(f"commtop ab: the job exited with code {code}; its last lines:", file=sys.stderr)
        for line in job.error_lines():
            print(f"  {line}", file=sys.stderr)
        return code
    return 0 if experiment.state == "done" and result.pairs >= 2 else 1


def _finite(value: Any) -> Any:
    """JSON without NaN: n/a numbers become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def run_experiment(ns: argparse.Namespace, script: list[str], launch: Launch) -> ABRun:
    """Start the job and its collector, run the experiment, stop both."""
    from tui.experiment.ab_experiment import ABExperiment, parse_arm
    from tui.run.gpus import visible_gpus
    from tui.run.launcher import JobExitSource, JobProcess, torchrun_argv

    if ns.duration <= 0 or ns.block <= 0:
        raise ConfigError("--duration and --block must be positive")
    if ns.run is not None:
        from tui.run.ab_attach import attach_experiment

        return attach_experiment(ns, script, _percent(ns.until_ci))  # type: ignore[no-any-return]
    a, b = parse_arm(ns.a), parse_arm(ns.b)
    if not script:  # the synthetic loop's settings are known here: refuse a bad value before any rank starts
        for arm in (a, b):
            Settings().updated(arm)
    until = _percent(ns.until_ci)
    gpus = visible_gpus()
    if script:
        nproc = ns.nproc if ns.nproc is not None else (gpus.count or launch.cpu_ranks)
        argv = launch.script_argv(script, nproc)
        conn = connections.create_run(label="ab")
        collective = "monitor"
    else:
        cpu = gpus.count == 0 or ns.backend == "gloo"
        nproc = ns.nproc if ns.nproc is not None else (launch.cpu_ranks if cpu else gpus.count)
        if nproc < 1:
            raise ConfigError("--nproc must be at least 1")
        config = config_from_args(ns, cpu=cpu)
        launch.check_memory(config, nproc, cpu, gpus.memory_bytes)
        conn = connections.create_run(label="ab")
        argv = torchrun_argv(nproc, config.to_argv(), conn)
        collective = config.collective
    try:
        collector = launch.open_collector(conn, ns.record, collective)
    except launch.collector_error as exc:
        raise ConfigError(str(exc)) from None
    recorder = collector.recorder
    experiment = ABExperiment(
        collector.controller,
        a,
        b,
        duration_s=ns.duration,
        until_ci_pct=until,
        block_s=ns.block,
        seed=ns.seed,
        mark=recorder.write if recorder is not None else None,
    )
    job = JobProcess(argv, conn)
    collector.source = JobExitSource(collector.source, job)
    stop = threading.Event()
    previous = signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        result, snapshot, code = _collect(collector, job, experiment, stop, launch.job_finished(job))
    finally:
        signal.signal(signal.SIGINT, previous)
        job.stop()
        collector.close()
    return ABRun(experiment, result, snapshot, code, job)


def _collect(
    collector: Any, job: Any, experiment: Any, stop: threading.Event, finished: Callable[[], bool]
) -> tuple[Any, Any, int]:
    """Ingest (model, control server, recorder, experiment) until the experiment is over,
    the job ends, or Ctrl-C; then the result and the job's exit code (0 while it runs)."""
    from tui.run.headless import run_headless

    sinks = [*collector.sinks, experiment]
    snapshot = run_headless(
        collector.source, collector.model, stop, until=lambda: experiment.tick() or finished(), sinks=sinks
    )
    experiment.stop()
    code = job.exit_code()
    return experiment.result(), snapshot, (code if code not in (None, 0) and experiment.state != "done" else 0)
