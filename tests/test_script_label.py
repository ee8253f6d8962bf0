"""What a user's run is named after (its log, its recording, its run folder): the script, or a
module's last part, as the command line says it."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tui.run.job_plan import _command, script_argv, script_label, script_plan
from workers.wire.config import ConfigError


@pytest.mark.parametrize(
    ("script", "label"),
    [
        (["python", "train.py", "--lr", "0.1"], "train"),
        (["python", "-u", "examples/train_ddp.py"], "train_ddp"),
        (["python", "-m", "pkg.train", "--steps", "7"], "train"),
        (["python3", "-m", "trainer"], "trainer"),
        (["python", "-X", "dev", "-W", "error", "-O", "train.py"], "train"),
        (["torchrun", "--nproc-per-node", "2", "x.py"], "x"),
        (["torchrun", "--nproc-per-node", "2", "-m", "pkg.x"], "x"),
        (["torchrun", "--nproc-per-node", "2", "-m", "workers.capture.bootstrap", "t.py"], "t"),
    ],
)
def test_a_run_is_named_after_its_script_or_module(script: list[str], label: str) -> None:
    assert script_label(script, _command(script)) == label


@pytest.mark.parametrize(
    "script",
    [
        ["python", "train.py", "--lr", "0.1"],
        ["python", "-m", "pkg.train"],
        ["torchrun", "--nproc-per-node", "2", "-m", "workers.capture.bootstrap", "x.py"],
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", "-m", "workers", "x.py"],
    ],
)
def test_a_command_runs_under_exactly_one_torchrun(script: list[str]) -> None:
    """A torchrun inside a torchrun starts nproc x nproc ranks: `commtop ab -- python x.py` once
    ran every rank of the job twice (its plan held the command already put under torchrun)."""
    argv = script_argv(script, 2)
    launchers = [a for a in argv if a == "torch.distributed.run" or os.path.basename(a) == "torchrun"]
    assert len(launchers) == 1 and argv.count("workers.capture.bootstrap") <= 1


def test_ab_runs_the_users_command_as_commtop_run_does(tmp_path: Path) -> None:
    from tui.run.ab import script_job

    script = tmp_path / "train.py"
    script.write_text("")
    command = ["python", str(script), "--steps", "5"]
    plan = script_job(command, 2)
    assert plan.label == "ab" and plan.nproc == 2
    assert plan.argv(None, None) == script_plan(command, 2).argv(None, None)  # type: ignore[arg-type]
    assert plan.argv(None, None).count("torch.distributed.run") == 1  # type: ignore[arg-type]


def test_python_dash_c_is_refused_in_one_line() -> None:
    with pytest.raises(ConfigError, match="python -c runs no script"):
        _command(["python", "-c", "print(1)"])


def test_a_package_run_as_python_m_pkg_is_named_after_the_package_not_main_py() -> None:
    from workers.monitor.rank_info import script_name

    assert script_name("/home/u/proj/pkg/__main__.py") == "pkg"
    assert script_name("/home/u/proj/pkg/train.py") == "train.py"
    assert script_name("train.py") == "train.py" and script_name("") == "python"
