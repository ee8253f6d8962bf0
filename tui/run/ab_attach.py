"""`commtop ab --run RUN`: an A/B experiment on a run that is already going (`commtop run`,
`commtop watch`), from another shell.

The run's collector keeps its job, its TUI and its recording. This process

* switches the blocks through the run's control channel (signed ``set`` requests with
  ``new_epoch``, as `commtop ctl` sends them), so the workers switch at the same iteration
  exactly as for the TUI's A/B key, and every block is one settings epoch;
* reads the run's records from the collector's data feed (tui.ingest.feed), keeping those of
  its blocks' epochs;
* sends its A/B marks to the collector, which writes them into the run's recording if it
  records (`commtop report` on it then reproduces the verdict);
* restores the settings that were in force before it, also on Ctrl-C or failure, and says
  whether the restore is in force.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from tui.experiment.ab_experiment import ABExperiment, refused_arm
from tui.ingest.interfaces import ControlView
from tui.model.changeable import Changeable
from tui.model.in_force import reported_settings
from tui.run.ab_result import ABRun
from tui.run.ctl import BUILTIN, CtlClient, CtlError, resolve_run
from workers.wire.config import ConfigError
from workers.wire.settings import Settings

#: Seconds to wait for the restored settings to be in force on the workers.
RESTORE_WAIT_S = 20.0
#: How often the run's collector is checked to be alive.
ALIVE_CHECK_S = 1.0


class RemoteController:
    """What tui.experiment.ab_experiment.ABExperiment needs from a controller (``view``,
    ``request(changes, new_epoch=...)``, ``desired``), over a run's request channel."""

    def __init__(self, client: CtlClient) -> None:
        self.client = client
        self.desired: tuple[int, dict[str, Any]] | None = None
        self.lost_marks = 0
        self.marks_recorded = False

    def view(self) -> ControlView:
        try:
            status = self.client.status()
        except CtlError as exc:
            return ControlView(requested=None, note=str(exc))
        return ControlView(
            requested=reported_settings(status.get("requested")),
            note=str(status.get("note") or ""),
            can_change=Changeable.from_wire(status.get("can_change")),
        )

    def request(self, changes: dict[str, Any], *, new_epoch: bool = False) -> str:
        try:
            reply = self.client.set(dict(changes), new_epoch=new_epoch)
        except CtlError as exc:
            return str(exc)
        self.desired = (int(reply["epoch"]), dict(reply.get("requested") or {}))
        return ""

    def mark(self, body: dict[str, Any]) -> None:
        """An A/B mark into the run's recording (lost marks are counted, never fatal)."""
        try:
            reply = self.client.call("mark", mark=body)
        except CtlError:
            self.lost_marks += 1
            return
        if not reply.get("ok"):
            self.lost_marks += 1
        self.marks_recorded = bool(reply.get("recorded"))


def check_arguments(ns: argparse.Namespace, script: list[str]) -> None:
    if script:
        raise ConfigError("--run attaches to a job that is already running: nothing may follow `--`")
    if ns.record is not None:
        raise ConfigError(
            "--record with --run: the run's own collector records (commtop run --record, or key r); "
            "the A/B marks go into its recording"
        )
    if ns.nproc is not None:
        raise ConfigError("--nproc with --run: the run already has its ranks")


def attach_experiment(ns: argparse.Namespace, script: list[str], until_ci_pct: float) -> ABRun:
    """Run the experiment on the live run ``ns.run``."""
    from tui.experiment.ab_experiment import parse_arm
    from tui.ingest.feed import FeedError, FeedSource
    from tui.model.run_model import RunModel
    from tui.run.headless import run_headless
    from tui.run.run_dirs import has_live_collector

    check_arguments(ns, script)
    a, b = parse_arm(ns.a), parse_arm(ns.b)
    for arm in (a, b):  # a bad value of a known setting fails before anything is sent (knobs: the collector)
        Settings().updated({k: v for k, v in arm.items() if k in BUILTIN})
    try:
        conn = resolve_run(None if ns.run in ("", "newest") else ns.run)
    except CtlError as exc:
        raise ConfigError(str(exc)) from None
    client = CtlClient(conn)
    try:
        try:
            check_arms(Changeable.from_wire(client.status().get("can_change")), a, b)
            source = FeedSource(conn)
        except (CtlError, FeedError) as exc:
            raise ConfigError(str(exc)) from None
        controller = RemoteController(client)
        experiment = ABExperiment(
            controller,
            a,
            b,
            duration_s=ns.duration,
            until_ci_pct=until_ci_pct,
            block_s=ns.block,
            seed=ns.seed,
            mark=controller.mark,
        )
        print(f"commtop ab: attached to run {conn.run_id}", file=sys.stderr)
        stop = threading.Event()
        previous = signal.signal(signal.SIGINT, lambda *_: stop.set())
        gone = _collector_gone(lambda: has_live_collector(conn.run_dir))
        try:
            snapshot = run_headless(
                source, RunModel(), stop, until=lambda: experiment.tick() or gone(), sinks=[experiment]
            )
        finally:
            signal.signal(signal.SIGINT, previous)
            source.close()
        if gone():
            experiment.note = experiment.note or "the run's collector ended"
        experiment.stop()  # restores the settings if it has not yet (Ctrl-C, the run ended)
        code = _report_restore(client, controller, experiment)
        if controller.lost_marks:
            print(f"commtop ab: {controller.lost_marks} A/B mark(s) did not reach the run's recording", file=sys.stderr)
        result = experiment.result()
    finally:
        client.close()
    return ABRun(experiment, result, snapshot, code, None)


def check_arms(can: Changeable, a: dict[str, str], b: dict[str, str]) -> None:
    """Both arms against what the run can change, before a block starts (ConfigError: one line).
    A run that has not said yet (no Hello, knobs not declared) is checked by the experiment."""
    why = refused_arm(can.check, a, b) if can.known else ""
    if why:
        raise ConfigError(why)


def _collector_gone(alive: Callable[[], bool]) -> Callable[[], bool]:
    """A check of the run's collector, at most every ALIVE_CHECK_S (it reads /proc/locks)."""
    state = {"at": 0.0, "gone": False}

    def gone() -> bool:
        now = time.monotonic()
        if not state["gone"] and now - float(state["at"]) >= ALIVE_CHECK_S:
            state["at"] = now
            state["gone"] = not alive()
        return bool(state["gone"])

    return gone


def _report_restore(client: CtlClient, controller: RemoteController, experiment: ABExperiment) -> int:
    """Wait until the settings from before the experiment are in force again; 0 if they are."""
    restore = dict(experiment.restore)
    if not restore:
        return 0
    shown = " ".join(f"{k}={v}" for k, v in restore.items())
    desired = controller.desired
    try:
        if experiment.restore_error != "":
            raise CtlError(experiment.restore_error or "it was never sent", 1)
        if desired is None:
            raise CtlError("no change was accepted", 1)
        client.wait_in_force(desired[0], RESTORE_WAIT_S)
    except CtlError as exc:
        print(f"commtop ab: could not confirm the restore of {shown}: {exc}", file=sys.stderr)
        return 1
    print(f"commtop ab: settings restored: {shown}", file=sys.stderr)
    return 0
