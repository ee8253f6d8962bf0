"""A job's uncaught traceback as the script alone prints it: commtop's bootstrap, runpy and the
hooks' wrapper frames left out, everything else (the script's frames, torch's, the error) kept."""

from __future__ import annotations

import functools
import subprocess
import sys
import textwrap
from pathlib import Path
from types import TracebackType
from typing import Any

import pytest

from workers.capture.own_frames import without_own_frames

REPO = Path(__file__).resolve().parent.parent


def _names(tb: TracebackType | None) -> list[str]:
    out = []
    while tb is not None:
        out.append(tb.tb_frame.f_code.co_name)
        tb = tb.tb_next
    return out


def _defined(name: str, filename: str) -> Any:
    """``name(f)`` that calls ``f``, compiled as if it came from ``filename``."""
    ns: dict[str, Any] = {}
    exec(compile(f"def {name}(f):\n    return f()\n", filename, "exec"), ns)  # noqa: S102 - test code
    return ns[name]


def _traceback_through(start: Any, wrap: Any) -> TracebackType:
    def boom() -> None:
        raise ValueError("the job's own error")

    def job() -> None:
        wrap(boom)

    run_code = _defined("_run_code", "<frozen runpy>")
    with pytest.raises((ValueError, RuntimeError)) as caught:
        start(functools.partial(run_code, functools.partial(start, job)))  # partial: no frame of its own
    tb = caught.value.__traceback__
    assert tb is not None and tb.tb_next is not None
    return tb.tb_next  # from the first start frame, as the interpreter's top hands it over


def test_the_start_and_the_wrappers_frames_are_left_out() -> None:
    start, wrap = _defined("start", "STARTUP"), _defined("wrap", "WRAPPER")
    tb = _traceback_through(start, wrap)
    assert _names(tb) == ["start", "_run_code", "start", "job", "wrap", "boom"]
    kept = without_own_frames(tb, startup={"STARTUP"}, wrappers={"WRAPPER"})
    assert _names(kept) == ["job", "boom"]


def test_the_last_frame_is_kept_even_where_it_is_a_wrappers() -> None:
    """An error raised in commtop's own code (a bug) still shows where."""
    start = _defined("start", "STARTUP")

    def raising(_f: Any) -> None:
        raise RuntimeError("inside the wrapper")

    tb = _traceback_through(start, raising)
    assert _names(without_own_frames(tb, startup={"STARTUP"}, wrappers={__file__})) == ["raising"]


@pytest.mark.e2e  # starts processes
def test_a_script_run_by_the_bootstrap_prints_its_traceback_as_alone(tmp_path: Path) -> None:
    """`python -m workers.capture.bootstrap script.py` (what torchrun runs for `commtop run`),
    with nothing to watch: the traceback starts at the script's own frame, as `python script.py`
    prints it; the exit code is Python's (1)."""
    script = tmp_path / "fails.py"
    script.write_text(
        textwrap.dedent(
            """
            def step():
                raise ValueError("boom in step")

            step()
            """
        )
    )
    env = {"PATH": "/usr/bin:/bin", "COMMTOP_CAPTURE": "off", "PYTHONPATH": str(REPO)}
    run = subprocess.run(
        [sys.executable, "-m", "workers.capture.bootstrap", str(script)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    alone = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert run.returncode == alone.returncode == 1
    lines = [ln for ln in run.stderr.splitlines() if not ln.startswith("commtop")]
    assert lines == alone.stderr.splitlines(), run.stderr
