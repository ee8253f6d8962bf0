"""`r` during a `commtop run --record A`: A stops, then a new recording B starts. A keeps the job's
log beside it (the log was moved to B's name, leaving A without one), B goes where A is (it went
to ./recordings/, inside the user's repo), and the end of the run names B (only A was said)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tui.ingest.interfaces import ResetModel
from tui.run.job_plan import script_plan
from tui.run.session import LiveSession

pytestmark = pytest.mark.e2e  # starts processes

JOB = Path(__file__).parent / "jobs" / "eval_after_last_step.py"


def test_a_second_recording_goes_beside_the_first_which_keeps_the_log(
    runtime_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.chdir(tmp_path)
    first = tmp_path / "mine" / "a.commtop"
    first.parent.mkdir()
    session = LiveSession.for_job(script_plan(["python", str(JOB), "3"], 2), str(first))
    with session.supervised() as job:
        deadline = time.monotonic() + 120
        while job.exit_code() is None and time.monotonic() < deadline:
            for message in session.source.poll(0.05):  # the ingest thread's part in the app
                if not isinstance(message, ResetModel):
                    session.recorder.write(message)
        session.recorder.stop()  # r
        second = session.recorder.start()  # r again
        while not job.output_done() and time.monotonic() < deadline:
            time.sleep(0.05)
    err = capsys.readouterr().err
    assert Path(second).parent == first.parent  # beside the first, not ./recordings/
    assert not (tmp_path / "recordings").exists()
    assert (first.parent / "a.log").exists() and "[rank0]" in (first.parent / "a.log").read_text()
    assert f"recorded (r): {second}" in err
