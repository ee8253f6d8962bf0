"""An unmodified DDP script under `commtop run --headless --record` (real torchrun, 2 gloo ranks,
the real collector and recorder): every collective it issued is in the recording, once.

On gloo there is no Flight Recorder timing and no CUPTI, so this exercises the bootstrap's
fallback: torch.distributed wrappers, and DDP's C++ bucket all-reduce made visible through
the equivalent comm hook. The expected records come from the script's own logic.
"""

from __future__ import annotations

import collections
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest

from tui import cli
from tui.recordings.reader import open_recording
from workers.monitor.records import OPS

pytestmark = pytest.mark.e2e  # starts processes

EXAMPLE = str(Path(__file__).resolve().parent.parent / "examples" / "train_ddp_plain.py")
STEPS, LAYERS, HIDDEN = 6, 3, 256
#: One Linear layer's gradient bytes (weight + bias, fp32): DDP all-reduces each once per step.
LAYER_BYTES = (HIDDEN * HIDDEN + HIDDEN) * 4
PARAM_BYTES = LAYERS * LAYER_BYTES
LOSS_BYTES = 4  # the script's own dist.all_reduce of a scalar loss, once per step


def test_unmodified_ddp_script_gives_exactly_its_collectives(monkeypatch, capsys) -> None:
    root = tempfile.mkdtemp(prefix="cm-", dir="/tmp")
    rec_path = str(Path(root) / "plain.commtop")
    monkeypatch.setenv("COMMTOP_RUNTIME_DIR", root)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.delenv("COMMTOP_CONNECTION_FILE", raising=False)
    try:
        code = cli.main(
            ["run", "--headless", "--nproc", "2", "--record", rec_path, "--", "python", EXAMPLE]
            + ["--steps", str(STEPS), "--layers", str(LAYERS), "--hidden", str(HIDDEN)]
        )
        out = capsys.readouterr()
        assert code == 0, out.err[-3000:] + out.out[-3000:]
        assert "job train_ddp_plain.py" in out.out
        with open_recording(rec_path) as rec:
            tables = rec.tables()
            coll = tables.coll
            assert rec.complete, rec.summary()
        # gloo has no Flight Recorder timing: the fallback, named in every rank's Hello.
        assert {h.config.get("capture") for _, h in tables.hellos if h.backend != "unknown"} == {"python hooks"}
    finally:
        shutil.rmtree(root, ignore_errors=True)
    for rank in (0, 1):
        mine = coll["rank"] == rank
        ops = collections.Counter(OPS[o] for o in coll["op"][mine].tolist())
        assert set(ops) == {"all_reduce"}, ops
        nbytes, step = coll["nbytes"][mine], coll["step"][mine]
        # Async (bucket) all_reduces are recorded when they finish, so rows may come out of order.
        assert np.array_equal(np.sort(coll["iteration"][mine]), np.arange(mine.sum()))  # none lost, none twice
        loss = nbytes == LOSS_BYTES
        assert loss.sum() == STEPS
        # Steps come from the optimizer's step hook: step k runs from the k-th optimizer step to the
        # next, so it holds iteration k's gradient buckets and iteration k-1's loss all_reduce.
        assert sorted(step[loss].tolist()) == list(range(1, STEPS + 1))
        grads = ~loss
        per_step = collections.Counter()
        for s, b in zip(step[grads].tolist(), nbytes[grads].tolist(), strict=True):
            per_step[s] += b
        assert per_step == {s: PARAM_BYTES for s in range(STEPS)}  # every gradient, once per step
        # After DDP rebuilds its buckets (first step), one bucket per layer (bucket_cap_mb < a layer).
        later = grads & (step >= 1)
        assert set(nbytes[later].tolist()) == {LAYER_BYTES} and later.sum() == (STEPS - 1) * LAYERS
        assert np.all(coll["dur_us"][mine] > 0)
