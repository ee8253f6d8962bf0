"""commtop stopped while its job's ranks catch SIGTERM and carry on: every process of the job
ends anyway, a grace period after the SIGTERM (as torchrun's own stop does). torch starts each
rank in a session of its own, so the SIGKILL of torchrun's process group missed them: they ran
on, orphaned, after commtop had exited 143."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks" / "standing"))
from orphans import MARKER, marked_pids  # noqa: E402

pytestmark = pytest.mark.e2e  # starts processes

REPO = Path(__file__).resolve().parent.parent
JOB = Path(__file__).parent / "jobs" / "ignores_sigterm.py"


@pytest.mark.timeout(180)
def test_ranks_that_catch_sigterm_end_when_commtop_is_stopped() -> None:
    marker = uuid.uuid4().hex
    rt = tempfile.mkdtemp(prefix="cs-", dir="/tmp")
    env = {k: v for k, v in os.environ.items() if k != "COMMTOP_CONNECTION_FILE"}
    env |= {MARKER: marker, "COMMTOP_RUNTIME_DIR": rt, "XDG_STATE_HOME": os.path.join(rt, "state")}
    env |= {"OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tui.cli", "run", "--headless", "--", "python", str(JOB)],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if "running" in line:
                break
        else:
            pytest.fail(f"the job never ran (exit {proc.wait()})")
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=90)
        assert proc.returncode == 128 + signal.SIGTERM
        deadline = time.monotonic() + 10  # what was SIGKILLed leaves /proc at once; a moment for the kernel
        while marked_pids(marker) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert marked_pids(marker) == {}, rest[-2000:]
        assert "of the job still ran 5 s after the SIGTERM and were SIGKILLed" in rest  # said, not silent
    finally:
        for pid in marked_pids(marker):
            os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
