"""Every benchmark runs at its tiny size and reports a table of measured numbers.

Smoke only: the targets are for the benchmarks' normal sizes (benchmarks/RESULTS.md), never
asserted here. Each benchmark runs as a subprocess, exactly as a person runs it, and appends
its report to a temporary results file (--results).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e  # starts processes

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = (
    "overhead",
    "ingest_rate",
    "render_scale",
    "e2e_latency",
    "recordings",
    "cuda_timer_costs",
    "overlap_ingest",
    "prometheus_export",
    "monitor_hook_cost",
    "fr_decode_cost",
)
ROW_WITH_NUMBER = re.compile(r"^\|[^\n]*\d[^\n]*\|$", re.M)


@pytest.mark.parametrize("name", BENCHMARKS)
def test_tiny_run_reports_a_table_of_numbers(name: str, tmp_path: Path) -> None:
    results = tmp_path / "RESULTS.md"
    with tempfile.TemporaryDirectory(prefix="cb", dir="/tmp") as runtime:  # ipc paths must stay short
        env = dict(os.environ, COMMTOP_RUNTIME_DIR=runtime, PYTHONPATH=str(ROOT))
        proc = subprocess.run(
            [sys.executable, str(ROOT / "benchmarks" / "standing" / f"{name}.py"), "--tiny", "--results", str(results)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = results.read_text()
    assert text.strip() in proc.stdout  # printed and appended alike
    assert "- machine: `" in text and "- versions: python " in text and "- date: " in text
    tables = [block for block in text.split("**")[1:] if "| --- |" in block]
    assert tables, text
    for block in tables:
        rows = [ln for ln in block.splitlines() if ln.startswith("|") and "---" not in ln][1:]
        assert rows and all(ROW_WITH_NUMBER.match(r) for r in rows), block
