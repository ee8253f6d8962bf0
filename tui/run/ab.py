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
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from tui.experiment.ab_experiment import ABExperiment, refused_arm
from tui.experiment.ab_stats import ABResult
from tui.model.run_model import Snapshot
from tui.run.ab_result import ABRun
from tui.run.job_plan import CPU_RANKS, JobPlan, check_memory, script_plan
from tui.run.launcher import JobProcess
from tui.run.session import LiveSession, SessionError, job_finished, say_job_failed
from workers.wire import connection as connections
from workers.wire.config import ConfigError, add_loop_arguments, config_from_args
from workers.wire.settings import SettingsError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`commtop ab`'s options, on its subparser (tui.cli)."""
    parser.description = "A/B experiment: alternate two settings in random AB/BA blocks"
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


def run(ns: argparse.Namespace) -> int:
    """`commtop ab ...` (``ns.script``: the command after ``--``, None without one)."""
    if ns.script is not None and not ns.script:
        print("commtop ab: error: nothing to run after `--`", file=sys.stderr)
        return 2
    try:
        return show(run_experiment(ns, ns.script or []), json_out=ns.json)
    except (ConfigError, ValueError, SettingsError, connections.ConnectionError_) as exc:
        print(f"commtop ab: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def show(done: ABRun, *, json_out: bool) -> int:
    """Print the result (a table, or JSON); the exit code: 0 when the experiment is done with
    at least two pairs, else 1, or the job's exit code (its last lines on stderr)."""
    experiment, result, code, job = done.experiment, done.result, done.code, done.job
    if experiment.refused:  # an arm the run cannot set: nothing ran
        print(f"commtop ab: error: {experiment.refused}", file=sys.stderr)
        return 2
    if json_out:
        from tui.experiment.ab_stats import as_json

        out = as_json(result) | {"seed": experiment.seed, "state": experiment.state, "note": experiment.note}
        print(json.dumps(_finite(out), indent=1))
    else:
        from tui.experiment.ab_stats import format_table
        from tui.experiment.verdict import pcie_peak

        peak = pcie_peak(done.snapshot.telemetry)
        print(format_table(result, peak.share(result.copy_gbps[1]) if peak is not None else ""))
        print(f"seed {experiment.seed} · {experiment.state}" + (f": {experiment.note}" if experiment.note else ""))
    if code and job is None:  # attached (--run): the settings could not be confirmed restored (said above)
        return code
    if code and job is not None:
        say_job_failed(job, code, prefix="commtop ab")
        return code
    return 0 if experiment.state == "done" and result.pairs >= 2 else 1


def _finite(value: object) -> object:
    """JSON without NaN: n/a numbers become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _refuse(a: Mapping[str, Any], b: Mapping[str, Any], check: Callable[[Mapping[str, Any]], str]) -> None:
    """Both arms checked before anything starts: the first one the run cannot set, in one line."""
    why = refused_arm(check, a, b)
    if why:
        raise ConfigError(why)


def run_experiment(ns: argparse.Namespace, script: list[str]) -> ABRun:
    """Start the job and its session, run the experiment, stop both (or, with ``--run``, run
    it on a run already going: tui.run.ab_attach)."""
    from tui.experiment.ab_experiment import parse_arm
    from tui.model.changeable import Changeable, job_refusal
    from tui.run.gpus import visible_gpus

    if ns.duration <= 0 or ns.block <= 0:
        raise ConfigError("--duration and --block must be positive")
    if ns.run is not None:
        from tui.run.ab_attach import attach_experiment

        return attach_experiment(ns, script, _percent(ns.until_ci))
    a, b = parse_arm(ns.a), parse_arm(ns.b)
    until = _percent(ns.until_ci)
    gpus = visible_gpus()
    if script:
        # a job's knobs are known once it runs (the experiment checks them before its first
        # block); the loop's own settings are never a job's: refuse them before any rank starts
        _refuse(a, b, job_refusal)
        plan = script_job(script, ns.nproc)
    else:
        cpu = gpus.count == 0 or ns.backend == "gloo"
        nproc = ns.nproc if ns.nproc is not None else (CPU_RANKS if cpu else gpus.count)
        if nproc < 1:
            raise ConfigError("--nproc must be at least 1")
        _refuse(a, b, Changeable.loop(nproc).check)  # the loop's settings are known: check before any rank starts
        config = config_from_args(ns, cpu=cpu)
        check_memory(config, nproc, cpu, gpus.memory_bytes)
        plan = JobPlan(nproc, label="ab", collective=config.collective, loop=config)
    try:
        session = LiveSession.for_job(plan, ns.record)
    except SessionError as exc:
        raise ConfigError(str(exc)) from None
    experiment = ABExperiment(
        session.controller,
        a,
        b,
        duration_s=ns.duration,
        until_ci_pct=until,
        block_s=ns.block,
        seed=ns.seed,
        mark=session.recorder.write,
    )
    job = session.start_job()
    stop = threading.Event()
    previous = signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        result, snapshot, code = _collect(session, job, experiment, stop)
    finally:
        signal.signal(signal.SIGINT, previous)
        job.stop()
        session.close()
    return ABRun(experiment, result, snapshot, code, job)


def script_job(script: list[str], nproc: int | None) -> JobPlan:
    """The user's command as `commtop run -- CMD` runs it (put under torchrun once, by the plan),
    in a run folder named "ab"."""
    return replace(script_plan(script, nproc), label="ab")


def _collect(
    session: LiveSession, job: JobProcess, experiment: ABExperiment, stop: threading.Event
) -> tuple[ABResult, Snapshot, int]:
    """Ingest (model, control server, recorder, experiment) until the experiment is over,
    the job ends, or Ctrl-C; then the result and the job's exit code (0 while it runs)."""
    finished = job_finished(job)
    snapshot = session.collect(stop, until=lambda: experiment.tick() or finished(), sinks=[experiment])
    ended = experiment.state not in ("done", "failed") and not stop.is_set() and finished()
    experiment.stop()
    if ended:
        experiment.note = job_ended_note(experiment)
    code = job.exit_code()
    return experiment.result(), snapshot, (code if code not in (None, 0) and experiment.state != "done" else 0)


def job_ended_note(experiment: ABExperiment) -> str:
    """The job ended before the experiment did: how far it got, and how to give it time."""
    progress = experiment.progress(background=False)
    if progress.blocks == 0:
        got = "before the experiment could start"
    elif progress.pairs == 0:
        got = f"before its first pair of blocks, {progress.elapsed_s:.0f} s into the experiment"
    else:
        got = f"after {progress.pairs} pair(s) of blocks, {progress.elapsed_s:.0f} s into the experiment"
    return (
        f"the job ended {got}: make it run longer than "
        f"--duration {experiment.duration_s:g} s (more steps or iterations; examples/train_ddp.py: --seconds 60) "
        "or give ab a shorter --duration"
    )
