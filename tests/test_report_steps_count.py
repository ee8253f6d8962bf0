"""`commtop report` counts a job's steps as its optimizer took them: collectives after the last
optimizer step (an eval, a final barrier) are not one more step (a job of 5 steps read 6), and a job
that never steps an optimizer took none (it read 1)."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest

from tui import cli

pytestmark = pytest.mark.e2e  # starts processes

JOB = Path(__file__).parent / "jobs" / "eval_after_last_step.py"


@pytest.mark.parametrize(
    ("steps", "after"),
    [(5, []), (5, ["no-eval"]), (0, [])],
    ids=["eval after the last step", "none after it", "no optimizer step at all"],
)
def test_the_steps_are_the_optimizers_not_one_more_for_an_eval_after_the_last(
    monkeypatch, capsys, steps, after
) -> None:
    root = tempfile.mkdtemp(prefix="cm-", dir="/tmp")
    monkeypatch.setenv("COMMTOP_RUNTIME_DIR", root)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.delenv("COMMTOP_CONNECTION_FILE", raising=False)
    rec = str(Path(root) / "job.commtop")
    try:
        assert (
            cli.main(
                ["run", "--headless", "--nproc", "2", "--record", rec, "--", "python", str(JOB), str(steps), *after]
            )
            == 0
        )
        capsys.readouterr()
        assert cli.main(["report", rec, "--format", "json"]) == 0
        doc = json.loads(capsys.readouterr().out)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    per_rank = {s["rank"]: s["steps"] for s in doc["steps"]}
    assert per_rank == {0: steps, 1: steps, None: 2 * steps}  # a job that never steps took 0, not 1
    evals = 0 if after else 2
    assert sum(r["count"] for r in doc["rows"] if r["rank"] is None) == 2 * (steps * 2 + evals)  # every collective kept
