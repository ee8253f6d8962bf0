"""The bootstrap runs a script as python would, and the capture thread's reading of the Flight
Recorder: every record once, nothing left behind at the end."""

from __future__ import annotations

import copy
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from workers.capture.bootstrap import split_target
from workers.capture.cuda_capture import CaptureThread
from workers.capture.flight_recorder import op_name
from workers.capture.fr_source import FlightRecorderSource, InProcessDump
from workers.capture.rows import StepTimeline
from workers.monitor.records import OPS
from workers.rank.groups import GroupTable

ROOT = Path(__file__).resolve().parent.parent
FR_DUMP = ROOT / "tests" / "fixtures" / "h200" / "fr_dump_h200_torch2.11_nccl2.28.9.pkl"


def run_bootstrap(script: Path, **env_set: str) -> subprocess.CompletedProcess[str]:
    """``python -m workers.capture.bootstrap SCRIPT`` with no collector (the monitor says it is off)."""
    env = {k: v for k, v in os.environ.items() if k != "COMMTOP_CONNECTION_FILE"}
    env.update(PYTHONPATH=str(ROOT), **env_set)
    return subprocess.run(
        [sys.executable, "-m", "workers.capture.bootstrap", str(script)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


@pytest.mark.e2e
def test_the_script_keeps_its_argv_main_exit_code_and_signal_handlers(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            """
            import signal, sys
            print("argv", sys.argv)
            print("name", __name__, sys.modules["__main__"].__file__ == __file__)
            print("path0", sys.path[0])
            print("sigterm default", signal.getsignal(signal.SIGTERM) is signal.SIG_DFL)
            sys.exit(3)
            """
        )
    )
    env = {k: v for k, v in os.environ.items() if k != "COMMTOP_CONNECTION_FILE"}
    env["PYTHONPATH"] = str(ROOT)
    p = subprocess.run(
        [sys.executable, "-m", "workers.capture.bootstrap", str(script), "--lr", "1"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        cwd=tmp_path,
    )
    assert p.returncode == 3, p.stderr
    assert f"argv ['{script}', '--lr', '1']" in p.stdout
    assert "name __main__ True" in p.stdout
    assert f"path0 {tmp_path}" in p.stdout
    assert "sigterm default True" in p.stdout
    assert "commtop monitor: off" in p.stderr  # no collector: said once, the script still ran


@pytest.mark.e2e
def test_a_script_named_by_a_relative_path_gets_an_absolute_file_as_under_python(tmp_path: Path) -> None:
    """Python (3.9+) makes the main script's ``__file__`` absolute and leaves ``sys.argv[0]`` as
    typed; a script that changes directory and then opens a file beside itself depends on it."""
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "train.py").write_text(
        "import os, sys\nos.chdir('/')\nprint('file', __file__)\nprint('argv0', sys.argv[0])\n"
        "print('beside', open(os.path.join(os.path.dirname(__file__), 'train.py')).read(9))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "COMMTOP_CONNECTION_FILE"}
    env["PYTHONPATH"] = str(ROOT)
    for argv in ([sys.executable], [sys.executable, "-m", "workers.capture.bootstrap"]):
        p = subprocess.run([*argv, "jobs/train.py"], capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path)
        assert p.returncode == 0, p.stderr
        assert p.stdout.splitlines() == [
            f"file {tmp_path / 'jobs' / 'train.py'}",
            "argv0 jobs/train.py",
            "beside import os",
        ]


@pytest.mark.e2e
def test_commtops_warnings_keep_their_own_line_whatever_the_job_does_with_logging(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        "import io, logging, sys\n"
        "logging.basicConfig(level=logging.ERROR, format='JOB %(levelname)s %(message)s')\n"
        "logging.getLogger('commtop.monitor').warning('commtop monitor: rank 0: first')\n"
        "logging.getLogger('commtop.monitor').info('commtop monitor: not shown')\n"
        "logging.getLogger('job').error('its own')\n"
        "sys.stderr = io.StringIO()  # a job that takes stderr over: commtop writes to its stream\n"
        "logging.getLogger('commtop.capture').warning('commtop capture: second')\n"
        "sys.__stderr__.write('taken ' + repr(sys.stderr.getvalue()) + '\\n')\n"
    )
    p = run_bootstrap(script)
    assert p.returncode == 0, p.stderr
    lines = [line for line in p.stderr.splitlines() if "monitor: off" not in line]
    assert lines == ["commtop monitor: rank 0: first", "JOB ERROR its own", "taken 'commtop capture: second\\n'"]


@pytest.mark.e2e
def test_a_missing_script_is_one_clear_line(tmp_path: Path) -> None:
    p = subprocess.run(
        [sys.executable, "-m", "workers.capture.bootstrap", str(tmp_path / "nope.py")],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=60,
    )
    assert p.returncode == 1 and p.stderr.strip().splitlines() == [
        f"commtop: cannot run {str(tmp_path / 'nope.py')!r}: no such file"
    ]


def test_split_target() -> None:
    assert split_target(["train.py", "-x"]) == ("path", "train.py", ["train.py", "-x"])
    assert split_target(["-m", "pkg.train", "-x"]) == ("module", "pkg.train", ["pkg.train", "-x"])


class FakeMonitor:
    """Stands in for workers.monitor.monitor.Monitor: what CaptureThread reads and calls."""

    def __init__(self) -> None:
        self._epoch = 0
        self._mode = 0
        self.status = SimpleNamespace(iteration=0, untimed=0, lost=0, groups=(), gpu_inside=())
        self.groups = GroupTable(self.status)
        self.groups.world(("0", "default_pg", 1))
        self.coll: list[tuple[Any, ...]] = []

    def add_records(self, coll: list[tuple[Any, ...]], copies: list[tuple[Any, ...]]) -> None:
        self.coll.extend(coll)

    def add_coll_array(self, records: Any) -> None:
        self.coll.extend(records.tolist())

    def capture_lost(self, n: int) -> None:
        self.status.lost = n

    def take_iterations(self, n: int) -> int:
        first, self.taken = getattr(self, "taken", 0), getattr(self, "taken", 0) + n
        return first


def test_capture_thread_reads_each_collective_once_and_waits_at_stop_for_unretired_ones() -> None:
    real = pickle.loads(FR_DUMP.read_bytes())  # a real H200 dump; the dump function is a fake
    early = copy.deepcopy(real)
    for e in early["entries"][12:]:
        e["retired"] = False  # finished, not yet retired by torch's watchdog: no duration yet
        e.pop("duration_ms")
    dumps = [early, early, real]

    def fake_dump(**_kw: Any) -> bytes:
        return pickle.dumps(dumps.pop(0) if len(dumps) > 1 else dumps[0])

    issued = {"0": 16, "1": 1}

    def fake_status() -> dict:  # torch's status dump (JSON: counts as strings)
        return {"pg_status": {g: {"last_enqueued_collective": str(n)} for g, n in issued.items()}}

    mon = FakeMonitor()
    thread = CaptureThread(mon, StepTimeline(), FlightRecorderSource(InProcessDump(fake_dump), fake_status, 2000), None)
    thread.drain(force_fr=True)
    assert len(mon.coll) == 12 and thread.fr is not None and thread.fr.cursor.pending == 5
    op, code, _nbytes, since = mon.status.gpu_inside  # the oldest still running: the Hello's inside
    stuck = early["entries"][12]
    assert (OPS[op], code, since) == (op_name(stuck["profiling_name"]), 0, stuck["time_created_ns"])
    issued["1"] = 3  # two more on group "1" that no read will see
    thread.stop(settle_s=5.0)  # the final read waits until the watchdog has retired them
    assert [row[0] for row in mon.coll] == list(range(17))  # iteration: each collective once
    assert thread.fr.cursor.pending == 0 and thread.fr.cursor.untimed == 0
    assert mon.status.iteration == 17 and mon.status.lost == 2  # the last Hello says so
    assert mon.status.gpu_inside == ()
    assert [row[5] for row in mon.coll].count(1) == 1 and mon.groups.table[1] == ("1", "undefined", 1)


def test_a_capture_for_groups_made_again_goes_on_from_the_counts_of_the_one_before() -> None:
    """After ``destroy_process_group()`` and a new world, a new capture starts: what the one
    before lost and left untimed stays in the Hello's counts."""
    real = pickle.loads(FR_DUMP.read_bytes())
    issued = {"0": 16 + 4, "1": 1}  # four more than the ring holds on group "0": never read

    def fake_status() -> dict:
        return {"pg_status": {g: {"last_enqueued_collective": str(n)} for g, n in issued.items()}}

    mon = FakeMonitor()
    fr = FlightRecorderSource(InProcessDump(lambda **_kw: pickle.dumps(real)), fake_status, 2000)
    thread = CaptureThread(mon, StepTimeline(), fr, None, before=(3, 2))
    thread.stop(settle_s=0.0)
    assert fr.lost == 4 and mon.status.lost == 3 + 4 and mon.status.untimed == 2 + fr.cursor.untimed


def test_cupti_is_left_to_a_profiler_that_holds_it(monkeypatch) -> None:
    import torch

    from workers.capture.bootstrap import cupti_holder

    monkeypatch.delenv("CUDA_INJECTION64_PATH", raising=False)
    monkeypatch.delenv("NSYS_PROFILING_SESSION_ID", raising=False)
    assert cupti_holder() == ""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        assert cupti_holder() == "torch.profiler"
    monkeypatch.setenv("CUDA_INJECTION64_PATH", "/opt/nsight/libToolsInjection64.so")
    assert cupti_holder() == "Nsight"


class _RecordingMonitor:
    """What the step hooks call on the monitor, recorded (a named fake: the hooks' order is the point)."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.status = SimpleNamespace(steps=-1)  # what its Hellos say of the steps taken

    def step(self, n: int) -> Any:
        self.calls.append(f"step {n}")
        return SimpleNamespace(__enter__=lambda: None, __exit__=lambda *a: self.calls.append("exit"))

    def hold_if_stopping(self) -> None:
        self.calls.append("hold point")


def test_the_step_hooks_end_at_a_hold_point() -> None:
    """A stop holds a Flight Recorder job's thread at its next step hook, after the hook's own work
    (no collective hook comes under that capture)."""
    from workers.capture.bootstrap import Capture

    cap = Capture()
    mon = cap.mon = _RecordingMonitor()
    cap._mon_step = mon.step
    cap.block = SimpleNamespace(__exit__=lambda *a: mon.calls.append("exit"))
    cap._on_optimizer_step(None, (), {})
    assert mon.calls[-2:] == ["step 1", "hold point"]
    cap._user_step(7)
    assert mon.calls[-2:] == ["step 7", "hold point"]


def test_an_optimizer_stepping_another_counts_one_step() -> None:
    """ZeroRedundancyOptimizer (or any wrapper optimizer) steps its own inner optimizer: the
    global post-step hook fires for both, and each training step counted twice (a 10-step ZeRO
    job showed 21 steps at twice its rate). Only the outermost counts; a step that raised does
    not leave later ones uncounted."""
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook

    from workers.capture.bootstrap import Capture

    class Wrapping(torch.optim.Optimizer):
        """Test double: an optimizer that steps an inner one, as ZeroRedundancyOptimizer does."""

        def __init__(self, params: Any) -> None:
            params = list(params)
            super().__init__(params, {})
            self.inner = torch.optim.SGD(params, lr=0.1)
            self.fail = False

        def step(self, closure: Any = None) -> None:  # type: ignore[override]
            self.inner.step()
            if self.fail:
                raise RuntimeError("a step that raised")

    cap = Capture()
    mon = cap.mon = _RecordingMonitor()
    cap._mon_step = mon.step
    cap.block = SimpleNamespace(__exit__=lambda *a: None)
    weight = torch.nn.Parameter(torch.ones(2))
    weight.grad = torch.ones(2)
    outer = Wrapping([weight])
    handle = register_optimizer_step_post_hook(cap._on_optimizer_step)
    try:
        outer.step()
        outer.inner.step()  # stepped on its own: a step too
        outer.fail = True
        with pytest.raises(RuntimeError):
            outer.step()  # its inner step ran inside it, then it raised: no step
        outer.fail = False
        outer.step()
    finally:
        handle.remove()
    assert [c for c in mon.calls if c.startswith("step")] == ["step 1", "step 2", "step 3"]
    assert mon.status.steps == 3  # what its Hellos say: the report counts the job's steps by it


@pytest.mark.parametrize(
    ("init_method", "kept"),
    [
        ("tcp://127.0.0.1:29631", False),
        ("tcp://localhost:29500", True),
        ("env://", True),
        (None, True),
        ("tcp://h:x", True),
    ],
)
def test_a_tcp_rendezvous_of_its_own_is_served_by_rank_0_as_run_by_hand(monkeypatch, init_method, kept) -> None:
    """``init_process_group(init_method="tcp://127.0.0.1:29631", rank=..., world_size=...)`` under
    torchrun: with torchrun's agent-store flag every rank is a client of 29631 and none serves it
    (a hang of the timeout, as under plain torchrun). At another port than torchrun's store the
    flag goes, and rank 0 serves it as the script run by hand does."""
    from workers.capture.bootstrap import Capture

    monkeypatch.setenv("MASTER_PORT", "29500")
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    Capture._own_tcp_store(init_method)
    assert ("TORCHELASTIC_USE_AGENT_STORE" in os.environ) == kept


@pytest.mark.e2e
def test_lines_printed_at_once_by_two_threads_come_out_whole_under_pythonunbuffered(tmp_path: Path) -> None:
    """`commtop run` starts the job unbuffered (its lines show live); unbuffered, print writes the
    text and the newline apart, and two writers (mp.spawn's ranks, threads) interleaved them."""
    script = tmp_path / "two_writers.py"
    script.write_text(
        "import threading\n"
        "def say(ch):\n"
        "    for _ in range(3000):\n"
        "        print(ch * 40)\n"
        "ts = [threading.Thread(target=say, args=(c,)) for c in 'AB']\n"
        "[t.start() for t in ts]; [t.join() for t in ts]\n"
    )
    p = run_bootstrap(script, PYTHONUNBUFFERED="1")
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert len(lines) == 6000 and set(lines) == {"A" * 40, "B" * 40}
