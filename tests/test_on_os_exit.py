"""workers.capture.on_os_exit in a process of its own: ``os._exit(code)`` in the process that
installed it runs the flush once with the code, then exits with that code; a forked child's
``os._exit`` (a multiprocessing helper) runs nothing; the original stays reachable for an exit
that must not wait (the heartbeat's dead-man exit)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

PROGRAM = textwrap.dedent(
    """
    import os, sys
    from workers.capture import on_os_exit

    out = sys.argv[1]

    def flush(code):
        with open(out, "a") as f:
            f.write(f"{os.getpid()} flushed {code}\\n")

    on_os_exit.install(flush)
    assert os._exit.__commtop_original__ is not os._exit
    pid = os.fork()
    if pid == 0:
        os._exit(7)  # a forked helper: nothing flushed
    _, status = os.waitpid(pid, 0)
    with open(out, "a") as f:
        f.write(f"child {os.waitstatus_to_exitcode(status)}\\n")
    os._exit(5)
    """
)


@pytest.mark.e2e  # starts a process
def test_os_exit_flushes_once_in_the_installing_process_only(tmp_path: Path) -> None:
    out = tmp_path / "log"
    proc = subprocess.run(
        [sys.executable, "-c", PROGRAM, str(out)], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    lines = out.read_text().splitlines()
    assert lines[0] == "child 7"
    assert len(lines) == 2 and lines[1].endswith(" flushed 5")
    assert proc.returncode == 5, proc.stderr
