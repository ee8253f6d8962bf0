"""workers.capture.on_sigterm in a real child process: on SIGTERM the flush runs, then the
process ends by SIGTERM (what its parent and torchrun see is unchanged); the job's own code stops
where the signal found it; a script that chose its own SIGTERM handling keeps it."""

from __future__ import annotations

import contextlib
import os
import runpy
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from workers.capture import on_sigterm

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


#: A job whose work is not hooked (as under the Flight Recorder capture): it counts its iterations
#: into a file; the flush notes the count it sees, then takes a while, as a last read does.
COUNTING_CHILD = """
import os, sys, time
from pathlib import Path
from workers.capture import on_sigterm
count, out = Path(sys.argv[1]), Path(sys.argv[2])
def flush():
    out.write_text(count.read_text())
    time.sleep(0.5)
on_sigterm.install(flush)
print("installed", flush=True)
tmp, n = count.with_suffix(".tmp"), 0
while True:
    n += 1
    tmp.write_text(str(n))
    os.replace(tmp, count)
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


@pytest.mark.e2e  # starts processes
@pytest.mark.parametrize("variant", ["plain", "hold"])
def test_sigterm_flushes_then_ends_the_process_by_sigterm(tmp_path: Path, variant: str) -> None:
    code, said, written = run_child(tmp_path, variant)
    assert said == "installed"
    assert written == "flushed"
    assert code == -signal.SIGTERM  # killed by SIGTERM, as without the handler


@pytest.mark.e2e
def test_the_jobs_own_code_stops_where_sigterm_found_it(tmp_path: Path) -> None:
    """Nothing the job does comes after the flush's count (before, the job ran on through the
    flush: on an H100, 150-300 collectives a stop that no read saw)."""
    count, out = tmp_path / "count.txt", tmp_path / "flushed.txt"
    child = subprocess.Popen(
        [sys.executable, "-c", COUNTING_CHILD, str(count), str(out)], stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None and child.stdout.readline().strip() == "installed"
    time.sleep(0.2)
    child.send_signal(signal.SIGTERM)
    assert child.wait(timeout=30) == -signal.SIGTERM
    assert int(out.read_text()) > 0
    assert count.read_text() == out.read_text()


#: A job whose main thread is stuck in a C call when SIGTERM comes (system() waits for its child
#: through EINTR, as a device sync waits for a collective a stopped peer never issued).
STUCK_CHILD = """
import ctypes, sys
from pathlib import Path
from workers.capture import on_sigterm
out = Path(sys.argv[1])
on_sigterm.install(lambda: out.write_text("flushed"))
print("installed", flush=True)
ctypes.CDLL(None).system(b"sleep 60")
"""

#: A job that forks a worker (as a DataLoader does) and stops it with SIGTERM: the worker ends by
#: SIGTERM's default, the rank carries on and flushes nothing.
FORKING_CHILD = """
import os, signal, sys, time
from pathlib import Path
from workers.capture import on_sigterm
out = Path(sys.argv[1])
on_sigterm.install(lambda: out.write_text("flushed"))
pid = os.fork()
if pid == 0:
    time.sleep(60)
    os._exit(0)
time.sleep(0.2)
os.kill(pid, signal.SIGTERM)
_, status = os.waitpid(pid, 0)
time.sleep(1.5)
print("rank alive; worker", "killed by SIGTERM" if os.WTERMSIG(status) == signal.SIGTERM else status, flush=True)
"""


#: The same, with the worker's SIGTERM landing between its fork and commtop's fork hook (a Pool's
#: terminate of a worker it has just forked): a hook registered first sends it there.
FORK_WINDOW_CHILD = FORKING_CHILD.replace(
    "on_sigterm.install(",
    "os.register_at_fork(after_in_child=lambda: os.kill(os.getpid(), signal.SIGTERM))\non_sigterm.install(",
).replace("time.sleep(60)", "time.sleep(5)")


@pytest.mark.e2e
def test_a_main_thread_stuck_in_a_c_call_still_flushes_and_ends(tmp_path: Path) -> None:
    """Python runs handlers only between bytecodes; the wake-up watcher begins the stop."""
    out = tmp_path / "flushed.txt"
    child = subprocess.Popen(
        [sys.executable, "-c", STUCK_CHILD, str(out)], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "installed"
        time.sleep(0.3)
        t0 = time.monotonic()
        child.send_signal(signal.SIGTERM)
        assert child.wait(timeout=40) == -signal.SIGTERM
        assert time.monotonic() - t0 < 30  # not when the C call returns (60 s)
        assert out.read_text() == "flushed"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)  # the sleep system() started


@pytest.mark.e2e
def test_a_forked_worker_stopped_by_sigterm_does_not_stop_the_rank(tmp_path: Path) -> None:
    out = tmp_path / "flushed.txt"
    done = subprocess.run([sys.executable, "-c", FORKING_CHILD, str(out)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "rank alive; worker killed by SIGTERM"
    assert not out.exists()


@pytest.mark.e2e
def test_a_worker_stopped_before_its_fork_hook_ran_does_not_stop_the_rank(tmp_path: Path) -> None:
    """Its SIGTERM waits (blocked from the fork) until the hook has let go of the rank's wake-up
    pipe, then ends it. Before: the worker's wake-up byte went down the rank's pipe and the rank's
    watcher ended the rank (a job with fork Pools under commtop: ~1 run in 2 killed by SIGTERM)."""
    out = tmp_path / "flushed.txt"
    done = subprocess.run(
        [sys.executable, "-c", FORK_WINDOW_CHILD, str(out)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "rank alive; worker killed by SIGTERM"
    assert not out.exists()


def test_commtop_code_on_the_stack_is_not_parked() -> None:
    """A handler that lands in commtop's code (a hook, the monitor) must not park there: that code
    may hold a lock the flush needs. The job's code, started by runpy, is parked."""
    here = sys._getframe()
    assert not on_sigterm.in_commtop(here)
    assert on_sigterm._quietly(lambda: on_sigterm.in_commtop(sys._getframe())) is True


def test_a_script_run_by_runpy_from_commtop_is_the_jobs_code(tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text(
        "import sys\nfrom workers.capture import on_sigterm\nfound = on_sigterm.in_commtop(sys._getframe())\n"
    )
    ran = on_sigterm._quietly(lambda: runpy.run_path(str(script)))
    assert ran["found"] is False


@pytest.mark.e2e
def test_a_script_with_its_own_sigterm_handler_keeps_it(tmp_path: Path) -> None:
    code, said, written = run_child(tmp_path, "own")
    assert said == "not installed"
    assert written == "own handler" and code == 7
