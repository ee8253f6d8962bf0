"""A user's own torchrun line under `commtop run -- torchrun ...`: its options kept, the capture
bootstrap put in front of the script, one torchrun, and a one-line error for what cannot be
watched (an option torchrun's parser does not know, --no-python, nothing to run)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tui.run.job_plan import script_argv, script_plan
from tui.run.log_store import JobLogPaths
from tui.run.torchrun_line import is_torchrun, parse
from workers.wire.config import ConfigError

BOOT = ["-m", "--", "workers.capture.bootstrap"]  # `--`: the script's options are never torchrun's


@pytest.mark.parametrize(
    ("command", "options", "target", "nproc"),
    [
        (["torchrun", "--nproc-per-node", "8", "train.py", "--lr", "0.1"], ["--nproc-per-node", "8"], ["train.py", "--lr", "0.1"], 8),
        (["torchrun", "--standalone", "--nproc_per_node=4", "-m", "pkg.train", "-x"], ["--standalone", "--nproc_per_node=4"], ["-m", "pkg.train", "-x"], 4),
        (["/venv/bin/torchrun", "--nnodes=1", "--nproc-per=2", "t.py"], ["--nnodes=1", "--nproc-per=2"], ["t.py"], 2),
        (["python", "-u", "-m", "torch.distributed.run", "--rdzv-endpoint", "h:1", "--run-path", "t.py"], ["--rdzv-endpoint", "h:1"], ["t.py"], None),
        (["torchrun", "--nproc-per-node", "gpu", "t.py", "--nproc-per-node", "3"], ["--nproc-per-node", "gpu"], ["t.py", "--nproc-per-node", "3"], None),
    ],
)  # fmt: skip
def test_a_torchrun_line_splits_into_its_options_and_its_script(
    command: list[str], options: list[str], target: list[str], nproc: int | None
) -> None:
    assert is_torchrun(command)
    line = parse(command)
    assert (list(line.options), list(line.target), line.nproc) == (options, target, nproc)


@pytest.mark.parametrize(
    ("command", "why"),
    [
        (["torchrun", "--bogus", "t.py"], "unknown torchrun option '--bogus'"),
        (["torchrun", "--n", "2", "t.py"], "unknown torchrun option '--n'"),  # a prefix of several options
        (["torchrun", "--no-python", "./a.out"], "not Python"),
        (["torchrun", "--nproc-per-node", "2"], "nothing to run"),
        (["torchrun", "--master-port"], "needs a value"),
        (["torchrun", "--standalone=1", "t.py"], "takes no value"),
    ],
)
def test_a_torchrun_line_commtop_cannot_watch_is_one_line(command: list[str], why: str) -> None:
    with pytest.raises(ConfigError, match=why) as err:
        parse(command)
    assert "\n" not in str(err.value)


def test_the_bootstrap_runs_the_script_under_the_users_own_torchrun(tmp_path: Path) -> None:
    logs = JobLogPaths(tmp_path / "job.log", tmp_path / "job")
    argv = script_argv(["torchrun", "--standalone", "--nproc-per-node", "2", "t.py", "--lr", "1"], 2, logs)
    assert argv[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert argv[-6:] == [*BOOT, "t.py", "--lr", "1"]
    assert argv.count("torch.distributed.run") == 1 and "--log-dir" in argv and "--monitor-interval=0.2" in argv
    # the user's own output options are theirs: commtop adds none of its own
    own = script_argv(["torchrun", "--nproc-per-node=2", "--tee", "3", "-m", "pkg.t"], 2, logs)
    assert "--log-dir" not in own and own[-5:] == [*BOOT, "-m", "pkg.t"]
    # torchrun's default is one rank; commtop's --nproc, when given, is added to the line
    assert "--nproc-per-node=3" in script_argv(["torchrun", "t.py"], 3, logs)


def test_the_plan_takes_its_ranks_from_the_line_and_checks_its_script(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("")
    plan = script_plan(["torchrun", "--nproc-per-node", "3", str(script)], None)
    assert plan.nproc == 3 and plan.label == "train"
    assert script_plan(["torchrun", str(script)], None).nproc == 1  # torchrun's default
    assert script_plan(["torchrun", str(script)], 4).nproc == 4
    with pytest.raises(ConfigError, match="disagree"):
        script_plan(["torchrun", "--nproc-per-node", "3", str(script)], 2)
    with pytest.raises(ConfigError, match="no such file"):
        script_plan(["torchrun", "--nproc-per-node", "3", str(tmp_path / "missing.py")], None)


@pytest.mark.e2e  # tries to start a process
def test_a_launcher_that_cannot_start_is_one_line_and_leaves_no_run(runtime_dir: Path) -> None:
    from tui.run.job_plan import JobPlan
    from tui.run.session import LiveSession, SessionError

    session = LiveSession.for_job(JobPlan(2, label="t", collective="monitor", script=("python", "t.py")), None)
    session.job_argv = [str(runtime_dir / "no-such-launcher"), "t.py"]
    with pytest.raises(SessionError, match=r"cannot start .*no-such-launcher: No such file"), session.supervised():
        pass
    assert not any(runtime_dir.glob("*/connection.json"))  # the run's folder went with the session


@pytest.mark.parametrize(
    "command",
    [
        ["python", "t.py", "--start", "fork", "--log", "x", "--max", "3", "-m", "y"],
        ["torchrun", "--nproc-per-node", "2", "t.py", "--start", "fork", "--node", "1"],
    ],
)
def test_the_scripts_options_reach_the_script_even_where_torchrun_has_a_longer_one(command: list[str]) -> None:
    """torchrun's own parser, on the line commtop runs: ``--start`` is a prefix of torchrun's
    ``--start-method`` (plain torchrun refuses it as ambiguous before the script runs); ``-m`` is
    torchrun's too. After the bootstrap, everything is the script's."""
    from torch.distributed.run import get_args_parser

    argv = script_argv(command, 2)
    args = get_args_parser().parse_args(argv[3:])  # after `python -m torch.distributed.run`
    assert args.module and args.training_script == "workers.capture.bootstrap"
    assert args.training_script_args == command[command.index("t.py") :]


@pytest.mark.parametrize("use_env", [False, True], ids=["local-rank-arg", "use-env"])
def test_a_torch_distributed_launch_line_gives_the_script_its_local_rank_as_launch_does(use_env: bool) -> None:
    """``python -m torch.distributed.launch`` (deprecated, in older repos) passes
    ``--local-rank=N`` to the script unless ``--use-env``; scripts read it (``set_device``).
    commtop keeps launch as the launcher, and the bootstrap hands the argument on right after
    the script, where launch puts it without commtop. (Before: torchrun ran it: -1 in every rank.)"""
    from torch.distributed.launch import parse_args
    from torch.distributed.run import config_from_args

    from workers.capture.bootstrap import split_target

    command = ["python", "-m", "torch.distributed.launch", *(["--use-env"] if use_env else []), "--nproc_per_node", "2"]
    command += ["t.py", "--lr", "1"]
    line = parse(command)
    assert line.launcher == "torch.distributed.launch" and line.target == ("t.py", "--lr", "1")
    argv = script_argv(command, 2)
    assert argv[1:3] == ["-m", "torch.distributed.launch"]
    args = parse_args(argv[3:])
    _config, _cmd, cmd_args = config_from_args(args)
    after = cmd_args[cmd_args.index("workers.capture.bootstrap") + 1 :]
    local_rank = [] if use_env else [a for a in after if a.startswith("--local-rank=")]
    assert len(local_rank) == (0 if use_env else 1)
    assert split_target(after) == ("path", "t.py", ["t.py", *local_rank, "--lr", "1"])


def test_use_env_on_a_torchrun_line_is_refused_in_one_line() -> None:
    with pytest.raises(ConfigError, match="--use-env is torch.distributed.launch's option, not torchrun's"):
        parse(["torchrun", "--use-env", "--nproc-per-node", "2", "t.py"])
    assert parse(["torchrun", "--nproc-per-node", "2", "t.py"]).launcher == "torch.distributed.run"
