"""An unmodified script stopped midway (Ctrl-C or SIGTERM to `commtop run --headless --record`,
real torchrun, 2 gloo ranks): the recording holds every collective each rank issued up to the
stop, its ranks end by SIGTERM and say so. Before, a stopped rank died with the records since
its last send (up to 63 collectives per rank, all of a slow job's) and ``missing 0``.

The job counts its own collectives into a file per rank: ``begun`` before each call, ``done``
after it returned. A stop can land between the two, so a rank's records lie in [done, begun].
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tui.recordings.reader import Recording, open_recording
from workers.wire.protocol import COLL, Batch, Bye, Hello

pytestmark = pytest.mark.e2e  # starts processes

JOB = """
import json, os, sys, time
from pathlib import Path
import torch, torch.distributed as dist
dist.init_process_group("gloo")
out = Path(sys.argv[1]) / f"rank{dist.get_rank()}.json"
counts = {"begun": 0, "done": 0}
def save():
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(counts))
    os.replace(tmp, out)
x = torch.ones(64)
slow = sys.argv[2] == "slow"
t0 = time.monotonic()
while time.monotonic() - t0 < 90:
    counts["begun"] += 1
    save()
    dist.all_reduce(x)
    counts["done"] += 1
    save()
    time.sleep(0.3 if slow else 0.005)
"""


def truth(folder: Path) -> dict[int, dict[str, int]]:
    out = {}
    for rank in (0, 1):
        try:
            out[rank] = json.loads((folder / f"rank{rank}.json").read_text())
        except (OSError, ValueError):
            out[rank] = {"begun": 0, "done": 0}
    return out


def what_each_rank_said(rec: Recording) -> dict[int, str]:
    """Per rank, for a failure's message: the collective batches recorded (and their seq
    numbers' range), its last Hello's batches sent and records dropped, its Bye: says whether a
    record missing from the recording was never sent, dropped by the rank, or lost on the way."""
    said: dict[int, dict[str, object]] = collections.defaultdict(dict)
    for _t, msg in rec.messages():
        if isinstance(msg, Batch) and msg.kind == COLL:
            seqs = said[msg.rank].setdefault("coll seq", [])
            assert isinstance(seqs, list)
            seqs.append(msg.seq)
        elif isinstance(msg, Hello):
            said[msg.rank]["hello"] = f"seq_coll {msg.seq_coll} iteration {msg.iteration} dropped {msg.dropped}"
        elif isinstance(msg, Bye):
            said[msg.rank]["bye"] = f"{msg.exit_code} {msg.reason}"
    out = {}
    for rank, d in said.items():
        seqs = d.pop("coll seq", [])
        assert isinstance(seqs, list)
        out[rank] = f"{len(seqs)} batches (seq {min(seqs, default=-1)}..{max(seqs, default=-1)}), {d}"
    if rec.problems:
        out[-1] = "; ".join(rec.problems)
    return out


@pytest.mark.parametrize(("how", "sig", "least"), [("fast", signal.SIGINT, 60), ("slow", signal.SIGTERM, 4)])
def test_a_stopped_run_keeps_every_collective_its_ranks_issued(how: str, sig: int, least: int) -> None:
    root = Path(tempfile.mkdtemp(prefix="cs-", dir="/tmp"))
    script, rec_path = root / "job.py", root / "stopped.commtop"
    script.write_text(JOB)
    env = dict(os.environ, COMMTOP_RUNTIME_DIR=str(root), CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    env.pop("COMMTOP_CONNECTION_FILE", None)
    cmd = [sys.executable, "-m", "tui.cli", "run", "--headless", "--nproc", "2", "--record", str(rec_path)]
    run = subprocess.Popen(
        [*cmd, "--", "python", str(script), str(root), how],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while min(t["done"] for t in truth(root).values()) < least and time.monotonic() < deadline:
            assert run.poll() is None, run.communicate()[0][-3000:]
            time.sleep(0.1)
        run.send_signal(sig)  # commtop only: it stops the job
        out, _ = run.communicate(timeout=90)
        issued = truth(root)
        assert run.returncode == 128 + sig, out[-3000:]  # 130 after Ctrl-C, 143 after SIGTERM
        with open_recording(rec_path) as rec:
            ranks = rec.tables().coll["rank"].tolist()
            account = what_each_rank_said(rec)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.communicate()
        shutil.rmtree(root, ignore_errors=True)
    recorded = collections.Counter(ranks)
    for rank, counts in issued.items():
        assert counts["done"] >= least, issued
        assert counts["done"] <= recorded[rank] <= counts["begun"], (rank, recorded, issued, account, out[-1500:])
    rows = [line.split() for line in out.splitlines() if line.startswith(("0 ", "1 "))]
    assert len(rows) == 2 and all(" ".join(r[-3:]) == "killed by SIGTERM" for r in rows), out[-3000:]
