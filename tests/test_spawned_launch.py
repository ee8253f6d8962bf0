"""What a launcher tells the processes it starts (workers.capture.spawned), without starting
any: which of torchrun's variables a child drops, and which processes may be ranks."""

from __future__ import annotations

import functools
import multiprocessing
import sys
from multiprocessing.process import BaseProcess

import pytest
import torch.multiprocessing  # noqa: F401 - loads torch.multiprocessing.spawn (the module)

from workers.capture import spawned


@pytest.fixture()
def launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    """torchrun's variables as a one-rank torchrun sets them, the capture's ring size."""
    for name, value in {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "8192")
    monkeypatch.setattr(
        spawned, "_torchrun_env", {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    )
    monkeypatch.setattr(spawned, "_capture_env", {"TORCH_FR_BUFFER_SIZE": "8192"})


def test_a_child_drops_torchruns_and_the_captures_variables_but_not_what_the_script_set(
    launcher: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MASTER_PORT", "12355")  # the script's own, before starting its ranks
    launch = spawned._launch(3, "spawn")
    assert set(launch.torchruns) == {"RANK", "WORLD_SIZE", "MASTER_ADDR", "TORCH_FR_BUFFER_SIZE"}
    assert launch.index == 3 and not launch.forked and launch.launchers == 1
    assert spawned._launch(0, "fork").forked


def test_several_torchrun_ranks_are_told_to_the_child(launcher: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(spawned._torchrun_env, "WORLD_SIZE", "2")
    assert spawned._launch(0, "spawn").launchers == 2


class _OwnRun(multiprocessing.Process):
    def run(self) -> None:
        """A rank's work, as a subclass writes it."""


def _work() -> None:
    """A target."""


def test_a_process_with_a_target_or_its_own_run_may_be_a_rank_and_mp_spawns_are_left_to_it() -> None:
    assert spawned._job_of(multiprocessing.Process(target=_work), BaseProcess) == "target"
    assert spawned._job_of(_OwnRun(), BaseProcess) == "run"
    assert spawned._job_of(multiprocessing.Process(), BaseProcess) == ""  # nothing to run
    assert (
        spawned._job_of(multiprocessing.Process(target=sys.modules["torch.multiprocessing.spawn"]._wrap), BaseProcess)
        == ""
    )  # mp.spawn's
    launch = spawned.Launch(0, False, (), 1)
    wrapped = multiprocessing.Process(target=functools.partial(spawned.process_main, _work, launch))
    assert spawned._job_of(wrapped, BaseProcess) == ""  # once
