"""A real torch Flight Recorder ring (gloo's, on the CPU) read through torch's worker server on
the fill level of torch's status dump, as the capture reads NCCL's (tests/jobs/fr_ring_gloo.py):
a reader that keeps up loses nothing, one that stops loses exactly what the ring overwrote, and
what was issued after the last read is counted from torch's own count; every collective is read
or counted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from workers.capture.fr_child import ChildDecoder

pytestmark = pytest.mark.e2e  # starts processes

REPO = Path(__file__).resolve().parent.parent
RING = 64


@pytest.mark.parametrize("decoder", ["rank", "child", "child-killed"])
def test_a_real_ring_read_through_the_worker_server_loses_only_what_it_overwrote(decoder: str) -> None:
    """Decoded in the rank, in the decoder child, or in a child killed halfway (the rank goes on
    from the child's cursor): the same counts."""
    with tempfile.TemporaryDirectory(prefix="cm-fr-", dir="/tmp") as folder:
        env = dict(os.environ, TORCH_FR_BUFFER_SIZE=str(RING), CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
        proc = subprocess.run(
            [sys.executable, str(REPO / "tests" / "jobs" / "fr_ring_gloo.py"), folder, decoder],
            env=env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=240,
        )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("fr_ring_gloo: "))
    r = json.loads(line.split(": ", 1)[1])
    local = "torch's worker server (off the GIL)"
    assert r["ring"] == RING and r["how_after"] == (ChildDecoder.how if decoder == "child" else local)
    assert r["how"] == (local if decoder == "rank" else ChildDecoder.how)
    keep_up = r["keep_up"]
    assert keep_up["overwritten"] == 0 and keep_up["reads"] >= 500 // RING  # read by fill level, before a wrap
    # nobody read for 200 collectives: all but the newest 64 of what was not yet accounted are gone
    assert r["blind"]["overwritten"] == 500 + 200 - RING - keep_up["accounted"] > 0
    assert r["unread"] == 7  # issued after the last read: torch's pg_status says so
    assert r["untimed"] + r["overwritten"] + r["unread"] == r["issued"] == r["lost"]  # gloo's entries carry no time
    assert len(r["warnings"]) == 1 and "TORCH_FR_BUFFER_SIZE=" in r["warnings"][0]
