"""What `commtop run -- CMD` can run as a rank, decided before anything starts: a Python file,
a module, or a console script found on PATH (a pip-installed ``my-trainer``, a Python file);
refused in one line: another launcher (``accelerate launch``, ``deepspeed``, ``mpirun``: each
rank would start a launcher of its own; before, "cannot run 'accelerate': no such file"), a
shell script or a program (before, python ran a ``#!/bin/bash`` file and failed inside the job)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from tui.run.job_plan import runnable_script, script_argv, script_plan
from workers.wire.config import ConfigError


@pytest.mark.parametrize(
    ("command", "named"),
    [
        (["accelerate", "launch", "--num_processes", "2", "train.py"], "accelerate launch"),
        (["/opt/venv/bin/accelerate", "launch", "train.py"], "accelerate launch"),
        (["python", "-m", "accelerate.commands.launch", "train.py"], "accelerate launch"),
        (["accelerate-launch", "--multi_gpu", "--num_processes", "2", "train.py"], "accelerate launch"),
        (["python", "-m", "accelerate.commands.accelerate_cli", "launch", "train.py"], "accelerate launch"),
        (["ds", "--num_gpus", "8", "train.py"], "deepspeed"),
        (["deepspeed", "--num_gpus", "8", "train.py", "--deepspeed", "ds.json"], "deepspeed"),
        (["mpirun", "-np", "2", "python", "train.py"], "mpirun"),
        (["srun", "python", "train.py"], "srun"),
    ],
)
def test_a_launcher_that_starts_ranks_itself_is_refused_saying_what_to_run(command: list[str], named: str) -> None:
    with pytest.raises(ConfigError) as err:
        script_plan(command, 2)
    line = str(err.value)
    assert "\n" not in line and line.startswith(f"{named} starts the ranks itself")
    assert "commtop run --nproc N -- python train.py ARGS" in line


def test_a_launchers_subcommand_that_starts_no_ranks_is_not_called_a_launcher() -> None:
    """`accelerate env` starts nothing: it is not refused as `accelerate launch` is (here, with
    no accelerate installed, it is refused as a command that is not there)."""
    with pytest.raises(ConfigError) as err:
        script_plan(["accelerate", "env"], 2)
    assert "starts the ranks itself" not in str(err.value)


def test_a_shell_script_or_a_program_is_refused_naming_what_it_is(tmp_path: Path) -> None:
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/bash\ntorchrun train.py\n")
    with pytest.raises(ConfigError, match=r"a #!/bin/bash script, not a Python script"):
        script_plan([str(script)], 2)
    program = shutil.which("ls")
    assert program is not None
    for command in (["ls", "-l"], [program]):
        with pytest.raises(ConfigError, match="a program, not a Python script"):
            script_plan(command, 2)
    if shutil.which("env"):  # `-- env FOO=1 python ...`: where the variables go instead
        with pytest.raises(ConfigError, match=r"set variables before commtop: `FOO=1 commtop run -- python \.\.\.`"):
            script_plan(["env", "FOO=1", "python", "train.py"], 2)


def test_a_python_file_runs_with_or_without_its_suffix_or_shebang(tmp_path: Path) -> None:
    for name, text in (("train.py", ""), ("train", "#!/usr/bin/env python3\n"), ("t", "import torch\n")):
        path = tmp_path / name
        path.write_text(text)
        assert runnable_script([str(path), "--lr", "1"]) == [str(path), "--lr", "1"]


def test_a_console_script_on_path_runs_as_its_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``commtop run -- my-trainer 7``: the file pip installed runs under the capture, named
    after itself; a missing command still says so."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    trainer = bin_dir / "my-trainer"
    trainer.write_text(f"#!{sys.executable}\nimport sys\nsys.exit(0)\n")
    trainer.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.chdir(tmp_path)
    plan = script_plan(["my-trainer", "7"], 2)
    assert plan.label == "my-trainer" and plan.script == (str(trainer), "7")
    argv = script_argv(list(plan.script), 2)
    assert argv[-2:] == [str(trainer), "7"] and "workers.capture.bootstrap" in argv
    assert script_plan(["python", "-u", "my-trainer"], 2).script == ("python", "-u", str(trainer))
    with pytest.raises(ConfigError, match="cannot run 'no-such-trainer': no such file"):
        script_plan(["no-such-trainer"], 2)


def test_a_torchrun_lines_script_is_not_looked_up_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """torchrun runs its script by path: a name only on PATH would fail there, so it is refused here."""
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    (tmp_path / "my-trainer").write_text("#!/usr/bin/env python3\n")
    monkeypatch.chdir("/")
    with pytest.raises(ConfigError, match="no such file"):
        script_plan(["torchrun", "--nproc-per-node", "2", "my-trainer"], None)


def test_pythons_joined_module_spelling_and_its_own_flags_are_told_apart() -> None:
    from tui.run.torchrun_line import split_python

    assert split_python(["python", "-mpkg.train", "--out", "x"]) == ([], ["-m", "pkg.train", "--out", "x"])
    assert split_python(["python3", "-O", "-W", "error::UserWarning", "-Xdev", "-u", "t.py", "-O"]) == (
        ["-O", "-W", "error::UserWarning", "-Xdev", "-u"],
        ["t.py", "-O"],
    )
    with pytest.raises(ConfigError, match="python -c runs no script"):
        split_python(["python", "-cprint(1)"])


@pytest.mark.e2e
def test_the_ranks_run_with_pythons_own_flags_as_the_command_gave_them(tmp_path: Path, monkeypatch) -> None:
    """``commtop run -- python -O -X dev -W error::UserWarning train.py``: each rank's python has
    them (they were dropped: asserts ran under -O, warnings did not raise under -W error)."""
    import json
    import tempfile

    from tui import cli

    script = tmp_path / "flags.py"
    out = tmp_path / "flags.json"
    script.write_text(
        "import json, sys\n"
        f"json.dump([sys.flags.optimize, sys.flags.dev_mode, sys.warnoptions, sys.argv[1:]], open({str(out)!r}, 'w'))\n"
    )
    root = tempfile.mkdtemp(prefix="cm-", dir="/tmp")
    monkeypatch.setenv("COMMTOP_RUNTIME_DIR", root)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.delenv("COMMTOP_CONNECTION_FILE", raising=False)
    try:
        argv = ["python", "-O", "-X", "dev", "-W", "error::UserWarning", str(script), "-O", "x"]
        code = cli.main(["run", "--headless", "--nproc", "1", "--", *argv])
    finally:
        shutil.rmtree(root, ignore_errors=True)
    assert code == 0
    assert json.loads(out.read_text()) == [
        1,
        True,
        ["default", "error::UserWarning"],
        ["-O", "x"],
    ]  # as python gives them


def test_a_job_with_a_module_named_like_commtops_rank_package_is_refused_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job's own ``workers.py`` (or ``workers/`` package) beside its script or in the current
    folder: every rank failed on "'workers' is not a package", or the script imported
    commtop's; now one line says why before anything starts."""
    job = tmp_path / "job"
    job.mkdir()
    (job / "train.py").write_text("import workers\n")
    (job / "workers.py").write_text("def make_loader(): ...\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(
        ConfigError, match=r"the script's folder holds a Python module named 'workers' \(.*workers.py\)"
    ):
        script_plan(["python", str(job / "train.py")], 2)
    monkeypatch.chdir(job)
    with pytest.raises(ConfigError, match="the current folder holds a Python module named 'workers'"):
        script_plan(["python", "-m", "train"], 2)
    (job / "workers.py").unlink()
    (job / "workers").mkdir()
    (job / "workers" / "loader.py").write_text("")  # a namespace package of the job's
    with pytest.raises(ConfigError, match="named 'workers'"):
        script_plan(["torchrun", "--nproc-per-node", "2", "train.py"], None)
    (job / "workers" / "loader.py").unlink()  # a folder of data with that name: no module
    assert script_plan(["python", "train.py"], 2).script == ("python", "train.py")


def test_a_python_of_another_environment_is_said_to_be_replaced_by_commtops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tui.run.job_plan import interpreter_note

    other = tmp_path / "env" / "bin"
    other.mkdir(parents=True)
    (other / "python3").write_text("#!/bin/sh\n")
    (other / "python3").chmod(0o755)
    monkeypatch.setenv("PATH", f"{other}:/usr/bin:/bin")
    note = interpreter_note(["python3", "train.py"])
    assert note.startswith(f"the ranks run commtop's python ({sys.executable}), not {other / 'python3'}")
    assert interpreter_note([sys.executable, "train.py"]) == ""
    assert interpreter_note(["torchrun", "train.py"]) == ""
