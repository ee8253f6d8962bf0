"""examples/train_ddp.py end to end: `commtop run --headless -- python examples/train_ddp.py`
(real torchrun, 2 gloo ranks, the real collector: LiveSource + RunModel + headless summary)."""

from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path

import pytest

from tui import cli  # noqa: E402

pytestmark = pytest.mark.e2e  # starts processes

EXAMPLE = str(Path(__file__).resolve().parent.parent / "examples" / "train_ddp.py")
STEPS = 30
#: Per step the example issues DDP's bucket all_reduce, an all_gather and a loss all_reduce.
COLLECTIVES_PER_STEP = 3
#: DDP's own set-up from C++, out of the Python hooks' sight and so counted as missing
#: (workers.monitor.unseen; torch 2.13 on gloo: the constructor's all_gather and two broadcasts,
#: the first bucket rebuild's two broadcasts).
DDP_SET_UP = 5


def test_the_example_streams_its_collectives_and_copies_to_commtop_run(monkeypatch, capsys) -> None:
    root = tempfile.mkdtemp(prefix="cm-", dir="/tmp")
    monkeypatch.setenv("COMMTOP_RUNTIME_DIR", root)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.delenv("COMMTOP_CONNECTION_FILE", raising=False)
    try:
        code = cli.main(["run", "--headless", "--nproc", "2", "--", "python", EXAMPLE, "--steps", str(STEPS)])
    finally:
        shutil.rmtree(root, ignore_errors=True)
    out = capsys.readouterr()
    assert code == 0, out.err[-3000:]
    assert "backend gloo/cpu · world size 2 · job train_ddp.py" in out.out
    rows = [line.split() for line in out.out.splitlines() if re.match(r"^[01]\s+\S+:cpu\s", line)]
    assert [r[0] for r in rows] == ["0", "1"], out.out
    for r in rows:
        rank, _where, mode, count, missing = r[:5]
        assert mode == "overlap"  # the example's offload knob colours its records
        assert int(count) == STEPS * COLLECTIVES_PER_STEP and int(missing) == DDP_SET_UP
        copy_gbps = r[9]
        assert float(copy_gbps) > 0  # one offload copy per step arrived
        assert r[-2:] == ["exited", "(0)"]
