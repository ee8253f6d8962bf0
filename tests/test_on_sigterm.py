"""workers.capture.on_sigterm in a real child process: on SIGTERM the flush runs, then the
process ends by SIGTERM (what its parent and torchrun see is unchanged); a script that chose its
own SIGTERM handling keeps it."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e  # starts processes

CHILD = """
import signal, sys, threading, time
from pathlib import Path
from workers.capture import on_sigterm
out = Path(sys.argv[1])
if sys.argv[2] == "own":
    signal.signal(signal.SIGTERM, lambda *_: (out.write_text("own handler"), sys.exit(7)))
held = threading.Event()
def hold():
    held.set()
    return held
installed = on_sigterm.install(lambda: out.write_text("flushed"), hold if sys.argv[2] == "hold" else None)
print("installed" if installed else "not installed", flush=True)
while True:
    time.sleep(0.01)
"""


def run_child(tmp_path: Path, variant: str) -> tuple[int, str, str]:
    out = tmp_path / f"{variant}.txt"
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(out), variant], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    said = child.stdout.readline().strip()
    time.sleep(0.1)
    child.send_signal(signal.SIGTERM)
    code = child.wait(timeout=30)
    return code, said, out.read_text() if out.exists() else ""


@pytest.mark.parametrize("variant", ["plain", "hold"])
def test_sigterm_flushes_then_ends_the_process_by_sigterm(tmp_path: Path, variant: str) -> None:
    code, said, written = run_child(tmp_path, variant)
    assert said == "installed"
    assert written == "flushed"
    assert code == -signal.SIGTERM  # killed by SIGTERM, as without the handler


def test_a_script_with_its_own_sigterm_handler_keeps_it(tmp_path: Path) -> None:
    code, said, written = run_child(tmp_path, "own")
    assert said == "not installed"
    assert written == "own handler" and code == 7
