"""Does every process `commtop run` starts end when commtop ends, however it ends?

    python benchmarks/standing/orphans.py [--trials 20] [--parallel 4] [--ways sighup,sigkill,pty,torchrun]

Each trial starts the real `commtop run` (the Textual TUI on a pseudo-terminal, torchrun, 2 gloo
ranks of a tiny workload, the node sampler), waits until the ranks run (plus a random delay; every
4th trial ends commtop during start-up instead), ends it one way and then looks for survivors:
every process whose environment carries the trial's marker, wherever it was reparented to.

Ways: ``sighup`` (what tmux kill-session and a dropped SSH send), ``sigkill`` (commtop SIGKILLed),
``pty`` (the terminal's master side closed, nothing else), ``torchrun`` (the torchrun agent
SIGKILLed: its ranks and the sampler must go, commtop stays and is then quit with SIGTERM),
``both`` (commtop SIGKILLed, then its torchrun at once: the ranks are orphaned with stderr on
the pipe of a dead reader; this once left both ranks and the sampler running).
After ``sighup`` and ``pty`` the run's folder must be gone too.

Target: no process survives, whatever the way. Same-run reference: commtop's own quit
(``sigterm``, what ``q`` does), run first; each way's time until the last process was gone
is also given as a ratio to it. Prints per way: trials, trials with survivors, the time until
the last process was gone (p50/max). Exit 1 if any process survived. tests/test_orphans.py runs
a few trials of each way in CI.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from _common import Report, add_common_args, finish  # benchmarks/standing/ is sys.path[0]

REPO = Path(__file__).resolve().parents[2]
MARKER = "COMMTOP_ORPHAN_TRIAL"
WAYS = ("sighup", "sigkill", "pty", "torchrun", "both")
#: commtop's own quit (SIGTERM quits as ``q`` does): the same-run reference.
REFERENCE = "sigterm"
#: A tiny job: 2 gloo ranks, 64x64, few copies (cheap on a loaded 2-core CI machine).
JOB = ["--nproc", "2", "--shape", "64x64", "--copies", "1", "--collectives-per-step", "8", "--warmup", "1"]


def marked_pids(marker: str) -> dict[int, str]:
    """pid -> command line of every live process whose environment holds ``MARKER=marker``."""
    needle = f"{MARKER}={marker}".encode()
    found: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                if needle not in fh.read().split(b"\0"):
                    continue
            with open(f"/proc/{entry}/stat", "rb") as fh:
                if fh.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                    continue  # a zombie has ended; its parent has not reaped it yet
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                found[int(entry)] = fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
    return found


def _is_sampler(cmd: str) -> bool:
    return "workers.telemetry" in cmd


def _is_torchrun(cmd: str) -> bool:
    return "torch.distributed.run" in cmd


@dataclass
class Trial:
    way: str
    survivors: list[str]
    gone_s: float  # from the end of commtop (or torchrun) until the last marked process was gone
    phase: str  # "running" or "start-up"
    note: str = ""


def run_trial(way: str, index: int, grace_s: float = 30.0, runtime_dir: str | None = None) -> Trial:
    """One commtop run, ended one way; returns what survived ``grace_s`` later."""
    import fcntl
    import pty
    import struct
    import termios

    marker = uuid.uuid4().hex
    rt = runtime_dir or tempfile.mkdtemp(prefix="co-", dir="/tmp")
    env = dict(os.environ)
    env.pop("COMMTOP_CONNECTION_FILE", None)
    env.update(
        {
            MARKER: marker,
            "COMMTOP_RUNTIME_DIR": rt,
            "XDG_STATE_HOME": os.path.join(rt, "state"),  # job logs go with the trial, not into your home
            "OMP_NUM_THREADS": "1",
            "CUDA_VISIBLE_DEVICES": "",
            "TERM": "xterm-256color",
            "PYTHONPATH": os.pathsep.join(x for x in (str(REPO), env.get("PYTHONPATH", "")) if x),
        }
    )
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 120, 0, 0))

    def controlling_tty() -> None:  # like a terminal emulator: the pty becomes commtop's terminal
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    proc = subprocess.Popen(
        [sys.executable, "-m", "tui.cli", "run", *JOB],
        env=env,
        cwd=REPO,
        stdin=slave,
        stdout=slave,
        stderr=slave,
        preexec_fn=controlling_tty,
    )
    os.close(slave)
    import threading

    def drain() -> None:  # a terminal reads what is drawn (else commtop blocks writing)
        while True:
            try:
                if not os.read(master, 65536):
                    break
            except OSError:
                break

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    rng = random.Random(index)
    phase = "start-up" if index % 4 == 3 else "running"
    deadline = time.monotonic() + 120
    try:
        if phase == "running":  # the sampler exists once rank 0 is past init_process_group
            while not any(_is_sampler(c) for c in marked_pids(marker).values()):
                if time.monotonic() > deadline or proc.poll() is not None:
                    return Trial(way, [], 0.0, phase, f"never started (exit {proc.poll()})")
                time.sleep(0.1)
            time.sleep(rng.uniform(0.0, 1.5))
        else:  # somewhere in start-up: torchrun or the ranks still importing torch
            while not any(_is_torchrun(c) for c in marked_pids(marker).values()):
                if time.monotonic() > deadline or proc.poll() is not None:
                    return Trial(way, [], 0.0, phase, f"never started (exit {proc.poll()})")
                time.sleep(0.05)
            time.sleep(rng.uniform(0.0, 2.0))
        ended = time.monotonic()
        if way == "sighup":  # tmux kill-session: SIGHUP to the pane's process group, then the pty goes
            os.killpg(proc.pid, signal.SIGHUP)
            time.sleep(0.05)
            os.close(master)
            master = -1
        elif way == "sigkill":
            proc.kill()
        elif way == REFERENCE:
            proc.terminate()
        elif way == "pty":  # the terminal window closed: the kernel hangs up the session
            os.close(master)
            master = -1
        elif way in ("torchrun", "both"):
            if way == "both":  # commtop and then its torchrun SIGKILLed: the ranks' stderr pipe has no reader
                proc.kill()
            agents = [pid for pid, c in marked_pids(marker).items() if _is_torchrun(c)]
            for pid in agents:
                os.kill(pid, signal.SIGKILL)
        else:
            raise ValueError(way)
        while True:
            alive = {pid: c for pid, c in marked_pids(marker).items() if pid != proc.pid}
            if not alive or time.monotonic() - ended > grace_s:
                break
            time.sleep(0.1)
        gone_s = time.monotonic() - ended
        survivors = [f"{pid} {c[:100]}" for pid, c in alive.items()]
        if way == "torchrun" and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                survivors.append(f"{proc.pid} commtop itself ignored SIGTERM")
        note = ""
        if way in ("sighup", "pty", REFERENCE):  # a handled end: the run's folder goes with it
            proc.wait(20)
            left = [p.name for p in Path(rt).iterdir() if (p / "connection.json").exists()]
            note = f"run folder left behind: {left}" if left else ""
        return Trial(way, survivors, gone_s, phase, note)
    finally:
        for pid in list(marked_pids(marker)):  # leave nothing behind, whatever the verdict
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        if master >= 0:
            os.close(master)
        if runtime_dir is None:
            shutil.rmtree(rt, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(parser)
    parser.add_argument("--trials", type=int, default=0, help="trials per way (default 20; tiny 1)")
    parser.add_argument("--parallel", type=int, default=4, help="trials of one way at a time (default 4)")
    parser.add_argument("--ways", default=",".join(WAYS))
    parser.add_argument("--grace", type=float, default=30.0, help="seconds a process may take to end (default 30)")
    args = parser.parse_args(argv)
    trials_per_way = args.trials or (1 if args.tiny else 20)
    report = Report(f"orphans: `commtop run` ended {trials_per_way} times per way (TUI on a pty, 2 gloo ranks)")
    table = report.table(
        "per way; reference: commtop's own quit (SIGTERM) in the same run",
        (
            "way",
            "trials",
            "with survivors",
            "run folder left",
            "all gone p50 s",
            "all gone max s",
            "p50 / reference",
            "target",
            "met",
        ),
    )
    failed = 0
    ref_p50 = float("nan")
    for way in [REFERENCE, *(w for w in args.ways.split(",") if w != REFERENCE)]:
        with ThreadPoolExecutor(args.parallel) as pool:
            trials = list(pool.map(lambda i, w=way: run_trial(w, i, args.grace), range(trials_per_way)))
        survived = [t for t in trials if t.survivors]
        left = [t for t in trials if t.note.startswith("run folder")]
        bad = [t for t in trials if t.survivors or t.note.startswith("run folder")]
        gone = sorted(t.gone_s for t in trials if not t.note.startswith("never"))
        p50 = gone[len(gone) // 2] if gone else float("nan")
        if way == REFERENCE:
            ref_p50 = p50
        name = f"{way} (reference)" if way == REFERENCE else way
        table.add(
            name,
            len(trials),
            len(survived),
            len(left),
            p50,
            max(gone, default=float("nan")),
            p50 / ref_p50,
            "0 survivors, 0 folders",
            not bad,
        )
        for t in bad:
            report.notes.append(f"{way} ({t.phase}): survivors {t.survivors} {t.note}")
        report.notes += [f"{way}: {t.note}" for t in trials if t.note and t not in bad]
        failed += len(bad)
    report.notes.append(
        f"load average at the end {os.getloadavg()[0]:.1f}; every 4th trial ends commtop during start-up"
    )
    finish(report, args)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
