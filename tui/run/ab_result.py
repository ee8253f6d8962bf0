"""What one `commtop ab` experiment leaves: the same for an experiment on a run of its own
(tui.run.ab) and on a run already going (tui.run.ab_attach), which both print it."""

from __future__ import annotations

from dataclasses import dataclass

from tui.experiment.ab_experiment import ABExperiment
from tui.experiment.ab_stats import ABResult
from tui.model.run_model import Snapshot
from tui.run.launcher import JobProcess


@dataclass
class ABRun:
    """An experiment that ran, its result, the run's final snapshot and the exit code (the job's,
    or 1 when an attached run's settings could not be confirmed restored)."""

    experiment: ABExperiment
    result: ABResult
    snapshot: Snapshot
    code: int
    #: the job `commtop ab` started; None when it attached to a run (--run)
    job: JobProcess | None
