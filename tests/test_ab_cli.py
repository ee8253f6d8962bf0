"""`commtop ab` refuses bad arguments in one line, before any rank starts."""

from __future__ import annotations

import pytest

from tui import cli


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--a", "mode=bogus", "--b", "mode=none"], "mode must be one of none, overlap, sync, sync-barrier"),
        (["--a", "mode=none", "--b", "knob.offload=on"], "arm B (knob.offload=on): knob.offload: commtop's own loop"),
        (["--a", "mode=none", "--b", "delay_ms=20,delay_rank=5", "--nproc", "2"], "delay_rank=5: this run has 2 ranks"),
        (["--a", "mode=none", "--b", "copies=3", "--", "python", "x.py"], "a job has no knob for copies"),
        (["--a", "mode=none", "--b", "copies"], "expected name=value"),
        (["--a", "mode=none", "--b", "delay_ms=-3"], "delay_ms must be a number in 0..10000"),
        (["--a", "mode=none", "--b", "mode=sync", "--until-ci", "lots"], "--until-ci must be a percentage"),
        (["--a", "mode=none", "--b", "mode=sync", "--duration", "0"], "--duration and --block must be positive"),
    ],
)
def test_bad_arguments_are_one_line_errors(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["ab", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("commtop ab: error: ") and message in err and err.count("\n") == 1


def test_nothing_after_the_separator(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["ab", "--a", "mode=none", "--b", "mode=sync", "--"]) == 2
    assert "nothing to run after `--`" in capsys.readouterr().err


def test_a_missing_arm_is_one_line_not_the_usage(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["ab", "--a", "mode=none"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1, err
    assert err.startswith("commtop ab: error: the following arguments are required: --b"), err
