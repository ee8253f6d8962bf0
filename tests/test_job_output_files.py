"""The job's output as JobOutput reads it from torchrun's per-rank files, without a process:
files written here as a rank would, read one pass at a time."""

from __future__ import annotations

from pathlib import Path

from tui.run.job_output import JobOutput
from tui.run.log_store import JobLogPaths


def _rank_file(paths: JobLogPaths, rank: int, stream: str, attempt: int = 0) -> Path:
    path = paths.ranks_dir / "run_0" / f"attempt_{attempt}" / str(rank) / f"{stream}.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()
    return path


def _append(path: Path, data: bytes) -> None:
    with open(path, "ab") as fh:
        fh.write(data)


def _paths(tmp_path: Path) -> JobLogPaths:
    paths = JobLogPaths(tmp_path / "job.log", tmp_path / "parts")
    paths.create()
    return paths


def test_a_progress_bar_still_being_drawn_shows_its_latest_state_until_its_line_ends(tmp_path: Path) -> None:
    """tqdm redraws its bar with \\r and ends the line only when the bar is done: the rank's
    line being written is shown at its latest state (a character half written left out), and
    is an ended line (in the log) once its newline comes."""
    paths = _paths(tmp_path)
    err = _rank_file(paths, 1, "stderr")
    out = JobOutput(paths, lambda: False)
    _append(err, "\r 10%|█".encode())
    out._read_all()  # noqa: SLF001 - one pass of the reader thread, here
    assert out.writing() == {1: [" 10%|█"]}
    _append(err, "\r 20%|██".encode() + "\r 30%|██".encode() + "█".encode()[:2])
    out._read_all()  # noqa: SLF001
    assert out.writing() == {1: [" 30%|██"]} and out.rank_lines() == {}
    _append(err, "█".encode()[2:] + b"\n")
    out._read_all()  # noqa: SLF001
    assert out.writing() == {} and out.rank_lines() == {1: [" 30%|███"]}


def test_a_ranks_stdout_is_read_before_its_stderr_in_one_pass(tmp_path: Path) -> None:
    """A rank that prints its last step and then dies: within one read its printed lines come
    before its traceback (the files keep no times; stderr first put the error before them)."""
    paths = _paths(tmp_path)
    err, std = _rank_file(paths, 0, "stderr"), _rank_file(paths, 0, "stdout")
    _append(std, b"step 9\n")
    _append(err, b"Traceback (most recent call last):\nValueError: boom\n")
    out = JobOutput(paths, lambda: False)
    out._read_all()  # noqa: SLF001
    assert out.lines() == [
        "[rank0]: step 9",
        "[rank0]: Traceback (most recent call last):",
        "[rank0]: ValueError: boom",
    ]


def test_a_new_runs_log_replaces_the_one_at_the_same_path(tmp_path: Path) -> None:
    """`--record x.commtop` twice: the recording is replaced, and so is its log (it was
    appended to: two runs' lines in one log beside one run's recording)."""
    paths = _paths(tmp_path)
    paths.log.write_text("[rank0]: from the run before\n")
    _append(_rank_file(paths, 0, "stdout"), b"this run\n")
    out = JobOutput(paths, lambda: True)
    out.start()
    out.join(10)
    assert out.done and paths.log.read_text() == "[rank0]: this run\n"


def test_a_restarted_ranks_error_is_its_last_attempts(tmp_path: Path) -> None:
    """torchrun --max-restarts writes each attempt into attempt_N: the error that explains a
    failure is the last attempt's (the first attempt's traceback was taken), and the restarts
    are counted."""
    paths = _paths(tmp_path)
    _append(_rank_file(paths, 1, "stderr"), b"Traceback (most recent call last):\nValueError: attempt 0\n")
    out = JobOutput(paths, lambda: False)
    out._read_all()  # noqa: SLF001
    assert out.restarts == 0 and out.rank_error(1) == "ValueError: attempt 0"
    _append(_rank_file(paths, 1, "stderr", attempt=1), b"Traceback (most recent call last):\nKeyError: 'attempt 1'\n")
    out._read_all(everything=True)  # noqa: SLF001
    assert out.restarts == 1 and out.rank_error(1) == "KeyError: 'attempt 1'"
    assert out.rank_lines()[1][-1] == "KeyError: 'attempt 1'" and len(out.rank_lines()[1]) == 4  # both kept to read
