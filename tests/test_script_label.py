"""What a user's run is named after (its log, its recording, its run folder): the script, or a
module's last part, as the command line says it."""

from __future__ import annotations

import pytest

from tui.run.job_plan import _command, script_label


@pytest.mark.parametrize(
    ("script", "label"),
    [
        (["python", "train.py", "--lr", "0.1"], "train"),
        (["python", "-u", "examples/train_ddp.py"], "train_ddp"),
        (["python", "-m", "pkg.train", "--steps", "7"], "train"),
        (["python3", "-m", "trainer"], "trainer"),
        (["torchrun", "--nproc-per-node", "2", "x.py"], "x"),
        (["torchrun", "--nproc-per-node", "2", "-m", "pkg.x"], "script"),
    ],
)
def test_a_run_is_named_after_its_script_or_module(script: list[str], label: str) -> None:
    assert script_label(script, _command(script)) == label
