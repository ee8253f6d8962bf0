"""Where an A/A bias of `commtop ab` could come from: block position, not arm.

Runs N real A/A experiments (2 gloo ranks on the CPU, the loop of tests/test_ab_gloo.py) in this
process and looks at each block's median collective duration by its position: the first block
of the experiment (right after the switch from the run's starting settings), the first vs the
second block of each pair, and the last block. If arm B looked faster in A/A (RESULTS.md:
15 of 20 estimates below 1), a position effect and an uneven share of AB-first pairs would
show here; the estimate without pair 0 says how much the first block weighs.

    python benchmarks/probes/ab_aa_position.py [--runs 6] [--duration 14]
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import shutil
import statistics
import tempfile

import numpy as np

LOOP = ["--collective", "all_reduce", "--shape", "256x256", "--collectives-per-step", "4", "--backend", "gloo"]


def one(duration: float, seed: int) -> dict[str, float]:
    from tui import cli
    from tui.experiment.ab_stats import analyse
    from tui.run import ab

    ns = cli.build_parser().parse_args(
        ["ab", "--a", "mode=none", "--b", "mode=none", "--duration", str(duration), "--block", "0.4", "--seed", str(seed),
         "--nproc", "2", *LOOP]
    )  # fmt: skip
    done = ab.run_experiment(ns, [])
    coll, copy = done.experiment.columns()
    blocks = done.experiment.blocks
    med = {}
    for blk in blocks:
        sel = coll["epoch"] == blk.epoch
        if sel.any():
            med[blk.epoch] = float(np.median(coll["dur_us"][sel]))
    seen = [b for b in blocks if b.epoch in med]
    pairs: dict[int, list] = {}
    for b in seen:
        pairs.setdefault(b.pair, []).append(b)
    full = {p: bs for p, bs in pairs.items() if len(bs) == 2}
    second_vs_first = [math.log(med[bs[1].epoch] / med[bs[0].epoch]) for bs in full.values()]
    overall = statistics.median(med.values())
    res = done.result.overall.p50.estimate
    later = [b for b in blocks if b.pair != 0]
    without0 = analyse(later, coll, copy).overall.p50.estimate
    first_pair = full.get(0, [])
    return {
        "estimate": res,
        "without_pair0": without0,
        "first_block_vs_median": math.log(med[seen[0].epoch] / overall),
        "last_block_vs_median": math.log(med[seen[-1].epoch] / overall),
        "second_vs_first_in_pair": statistics.mean(second_vs_first),
        "pair0": "".join(b.arm for b in first_pair),
        "pairs": len(full),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=6)
    ap.add_argument("--duration", type=float, default=14.0)
    ap.add_argument("--seed0", type=int, default=1000)
    ns = ap.parse_args()
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    root = tempfile.mkdtemp(prefix="ct-pos-", dir="/tmp")
    os.environ["COMMTOP_RUNTIME_DIR"] = root
    print(f"A/A block positions · {platform.node()} · {os.cpu_count()} cores")
    print("run  pair0  pairs  B/A p50  without pair 0  first block  last block  2nd vs 1st in pair (log)")
    rows = []
    try:
        for i in range(ns.runs):
            r = one(ns.duration, ns.seed0 + i)
            rows.append(r)
            print(
                f"{i:>3}  {r['pair0']:>5}  {r['pairs']:>5}  {r['estimate']:.4f}  {r['without_pair0']:>14.4f}  "
                f"{r['first_block_vs_median']:+11.3f}  {r['last_block_vs_median']:+10.3f}  {r['second_vs_first_in_pair']:+.4f}",
                flush=True,
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    for key in ("first_block_vs_median", "last_block_vs_median", "second_vs_first_in_pair"):
        print(f"mean {key}: {statistics.mean(r[key] for r in rows):+.4f} (log ratio)")
    print(
        f"B/A < 1: {sum(r['estimate'] < 1 for r in rows)} of {len(rows)}; without pair 0: "
        f"{sum(r['without_pair0'] < 1 for r in rows)} of {len(rows)}"
    )


if __name__ == "__main__":
    main()
