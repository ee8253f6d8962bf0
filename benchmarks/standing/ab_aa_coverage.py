"""A/A coverage of `commtop ab`: how often the 95 % interval of identical arms contains 1.

Target: an A/A experiment's interval contains 1 in at least 18 of 20 runs. A CI test cannot
assert that: with a true 95 % interval, 18 or more of 20 happens only ~92 % of the time, so such
a test fails by design now and then. This benchmark runs the 20 real experiments (2 gloo ranks
on the CPU, the same loop as tests/test_ab_gloo.py) and prints what it saw.

    python benchmarks/standing/ab_aa_coverage.py [--runs 20] [--duration 14] [--tiny]

Reference: what an exact 95 % interval would give for the same number of runs (binomial:
the expected count, and how likely the target is met); a count does not scale with the
machine's speed, so the reference is computed, not timed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

from _common import ROOT, Report, add_common_args, finish  # benchmarks/standing/ is sys.path[0]

#: Runs whose interval must contain 1, of 20; and the interval's nominal coverage.
TARGET = (18, 20)
NOMINAL = 0.95
LOOP = ["--collective", "all_reduce", "--shape", "256x256", "--collectives-per-step", "4", "--backend", "gloo"]


def one_run(duration: float, seed: int) -> dict[str, object]:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", COMMTOP_RUNTIME_DIR=tempfile.mkdtemp(prefix="ct-aa-", dir="/tmp"))
    argv = [sys.executable, "-m", "tui.cli", "ab", "--a", "mode=none", "--b", "mode=none", "--duration", str(duration)]
    argv += ["--block", "0.4", "--seed", str(seed), "--json", "--nproc", "2", *LOOP]
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=duration + 120)
    if proc.returncode != 0:
        raise SystemExit(f"commtop ab exited {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}")
    doc = json.loads(proc.stdout[proc.stdout.index("{") :])
    return dict(doc["classes"]["all"]["p50"], pairs=doc["pairs"])


def at_least(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p)."""
    return sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k, n + 1))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(ap)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--duration", type=float, default=14.0, help="seconds per experiment")
    ns = ap.parse_args(argv)
    runs, duration = (2, 6.0) if ns.tiny else (ns.runs, ns.duration)
    t0 = time.monotonic()
    report = Report(f"A/A coverage of `commtop ab` (2 gloo ranks, all_reduce 256x256, {duration:g} s per run)")
    per_run = report.table(
        "one row per A/A experiment (mode=none vs mode=none)",
        ("run", "pairs", "B/A p50", "95 % lo", "95 % hi", "contains 1"),
    )
    estimates = []
    covered = 0
    for i in range(runs):
        r = one_run(duration, seed=1000 + i)
        ok = not r["detectable"]
        covered += ok
        est, lo, hi = (float(r[k]) for k in ("estimate", "lo", "hi"))
        estimates.append(est)
        per_run.add(i, int(r["pairs"]), est, lo, hi, ok)
    need = math.ceil(TARGET[0] / TARGET[1] * runs)
    result = report.table(
        "result; reference: an exact 95 % interval over the same number of runs",
        (
            "runs",
            "interval contains 1",
            "target",
            "met",
            "reference: expected",
            "reference: P(target met)",
            "B/A p50 median",
            "runs with B/A < 1",
        ),
    )
    result.add(
        runs,
        covered,
        f">= {need} of {runs}",
        covered >= need,
        NOMINAL * runs,
        at_least(need, runs, NOMINAL),
        statistics.median(estimates),
        sum(e < 1 for e in estimates),
    )
    report.notes.append(f"seeds {1000}-{1000 + runs - 1}, blocks of 0.4 s; {time.monotonic() - t0:.0f} s in all")
    finish(report, ns)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
