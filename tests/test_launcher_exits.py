"""A rank SIGKILLed under torchrun is marked with its exit code, whichever rank torchrun names.

torchrun's agent logs one "failed (exitcode: N) local_rank: R (pid: P)" line per poll: the
first failure, ties on its whole-second timestamp going to the lowest local rank. When the
SIGKILLed rank's peer dies of the broken collective before that poll, the line names the
peer (exit 1), and only the ChildFailedError summary at exit names the SIGKILLed rank. The
text below is torchrun 2.13's real output for exactly that case (pids renumbered).
"""

from __future__ import annotations

import sys
import tempfile
from typing import Any

import pytest
from frozen_run import frozen_hello

from tui.run.launcher import JobExitSource, JobProcess
from workers.wire import connection as connections
from workers.wire.protocol import Bye

pytestmark = pytest.mark.e2e  # starts processes

TORCHRUN_OUTPUT = """\
E1202 11:25:36.521000 29167 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 1) local_rank: 0 (pid: 1000) of binary: /work/venv/bin/python
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
workers FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-12-02_11:25:36
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 1001)  (SIGKILL)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 1001
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-02_11:25:36
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 1000)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""


class FakeSource:
    """Both ranks' Hellos (pids 1000, 1001), then rank 0's own Bye; rank 1 was SIGKILLed."""

    rejected: dict[str, int] = {}

    def __init__(self) -> None:
        self.script: list[list[Any]] = [
            [frozen_hello(0), frozen_hello(1), Bye(0, 1, "RuntimeError: gloo connection closed by peer", 0)]
        ]

    def poll(self, timeout_s: float) -> list[Any]:
        return self.script.pop(0) if self.script else []

    def close(self) -> None:
        pass


def test_a_sigkilled_rank_named_only_in_torchruns_summary_gets_its_bye(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(connections.RUNTIME_DIR_ENV, str(tmp_path / "rt"))
    conn = connections.create_run(label="exits")
    job = JobProcess([sys.executable, "-c", f"print({TORCHRUN_OUTPUT!r}, end='')"], conn)
    assert job.wait(30) == 0
    source = JobExitSource(FakeSource(), job)
    got = [m for _ in range(3) for m in source.poll(0.0) if isinstance(m, Bye)]
    # rank 0's own Bye, then rank 1's from torchrun, then torchrun's last word once its output is read
    assert [(b.rank, b.exit_code) for b in got] == [(0, 1), (1, -9), (1, -9)]
    assert got[1].reason == "killed by SIGKILL (reported by torchrun)"
    # torchrun's summary names rank 0 as the root cause; rank 0's own error says its peer died
    assert got[2].reason == "killed by SIGKILL (failed first)"
    assert job.failure().lines[-1] == "rank 1 failed first: killed by SIGKILL"


RESTARTED_OUTPUT = """\
W1207 08:49:10.074000 20120 torch/distributed/elastic/multiprocessing/api.py:1028] Sending process 1000 closing signal SIGTERM
E1207 08:49:10.293000 20120 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 1) local_rank: 1 (pid: 1001) of binary: /work/venv/bin/python3
"""


class RestartedSource:
    """`torchrun --max-restarts 1`: the first attempt's rank 1 fails (exit 1) and torchrun stops
    rank 0; both run again in new processes (pids 1002, 1003) and finish."""

    rejected: dict[str, int] = {}

    def __init__(self) -> None:
        first = [frozen_hello(0), frozen_hello(1), Bye(1, 1, "SystemExit: rank 1 fails", 1), Bye(0, -15, "stopped", 2)]
        again = [
            frozen_hello(0, pid=1002),
            frozen_hello(1, pid=1003),
            Bye(0, 0, "finished", 3),
            Bye(1, 0, "finished", 4),
        ]
        self.script: list[list[Any]] = [first + again]  # all before torchrun's end is read

    def poll(self, timeout_s: float) -> list[Any]:
        return self.script.pop(0) if self.script else []

    def close(self) -> None:
        pass


def test_torchruns_word_on_an_earlier_attempts_process_is_not_the_ranks_end(monkeypatch: pytest.MonkeyPatch) -> None:
    """The job ran again after its first attempt failed and then finished: each rank's last
    Bye is the second attempt's own, not torchrun's word on the first attempt's processes."""
    monkeypatch.setenv(connections.RUNTIME_DIR_ENV, tempfile.mkdtemp(prefix="cm-", dir="/tmp"))  # short: ipc paths
    conn = connections.create_run(label="restarted")
    job = JobProcess([sys.executable, "-c", f"print({RESTARTED_OUTPUT!r}, end='')"], conn)
    assert job.wait(30) == 0
    source = JobExitSource(RestartedSource(), job)
    got = [m for _ in range(4) for m in source.poll(0.0) if isinstance(m, Bye)]
    assert [(b.rank, b.exit_code) for b in got] == [(1, 1), (0, -15), (0, 0), (1, 0)]
