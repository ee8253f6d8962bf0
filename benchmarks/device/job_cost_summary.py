"""Sum up benchmarks/device/h200_job_cost.sh's runs: the step-time ratio of each alternating pair
(under commtop / bare, the job's own clock), their mean with a 95 % Student-t interval per
condition, and per commtop run what it recorded, lost and the job issued.

    python3 benchmarks/device/job_cost_summary.py WORKDIR [--json OUT.json]

WORKDIR holds ``job_{cond}_{arm}_{pair}.json`` (ddp_offload.py --result) and
``rec_{cond}_{pair}.commtop`` (commtop run --record) for arm in bare/commtop, and
``job_rate*_commtop_1.json`` + ``rec_rate*_1.commtop`` for the high-rate runs. A missing or broken
file is said in one line and left out; nothing here stops on one.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

#: Two-sided 95 % Student-t quantiles by degrees of freedom.
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}
T95.update({11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 20: 2.086, 25: 2.060, 30: 2.042})


def t95(df: int) -> float:
    if df in T95:
        return T95[df]
    return next((T95[k] for k in sorted(T95) if k >= df), 1.96)


def mean_ci(values: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95 % t interval (NaN with fewer than 2 values)."""
    n = len(values)
    if n == 0:
        return math.nan, math.nan
    m = sum(values) / n
    if n < 2:
        return m, math.nan
    sd = math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1))
    return m, t95(n - 1) * sd / math.sqrt(n)


def load(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else None
    except (OSError, ValueError) as exc:
        print(f"  (no result {path.name}: {exc})")
        return None


def recording_counts(path: Path) -> dict[str, Any]:
    """Records, lost (each rank's last Hello), dropped and the ranks' groups of a recording."""
    from tui.recordings.reader import RecordingError, open_recording

    try:
        with open_recording(path) as rec:
            tables = rec.tables(coll_columns=["iteration"])
    except (RecordingError, OSError) as exc:
        return {"error": str(exc)[:200]}
    ranks = tables.coll["rank"].tolist() if "rank" in tables.coll else []
    last: dict[int, Any] = {}
    for _, h in tables.hellos:
        if h.backend != "unknown" and (h.rank not in last or h.t_ns >= last[h.rank].t_ns):
            last[h.rank] = h
    return {
        "recorded": len(ranks),
        "lost": sum(h.lost for h in last.values()),
        "dropped": sum(h.dropped for h in last.values()),
        "untimed": sum(h.untimed for h in last.values()),
        "capture": sorted({str(h.config.get("capture", "")) for h in last.values()}),
        "groups": {r: [list(g) for g in h.groups] for r, h in last.items()},
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workdir")
    ap.add_argument("--json", default="")
    ns = ap.parse_args()
    work = Path(ns.workdir)
    out: dict[str, Any] = {"conditions": {}}
    pairs: dict[str, set[int]] = {}
    for path in work.glob("job_*_*_*.json"):
        m = re.fullmatch(r"job_(\w+?)_(bare|commtop)_(\d+)\.json", path.name)
        if m and not m.group(1).startswith("rate"):
            pairs.setdefault(m.group(1), set()).add(int(m.group(3)))
    for cond in sorted(pairs):
        print(f"== {cond}: step time under commtop / bare (ddp_offload.py's own clock, mean of the timed steps)")
        ratios: list[float] = []
        p50s: list[float] = []
        rows = []
        for i in sorted(pairs[cond]):
            bare = load(work / f"job_{cond}_bare_{i}.json")
            ct = load(work / f"job_{cond}_commtop_{i}.json")
            counts = recording_counts(work / f"rec_{cond}_{i}.commtop")
            if bare is None or ct is None:
                print(f"  pair {i}: incomplete, left out")
                continue
            r = ct["step_ms_mean"] / bare["step_ms_mean"]
            r50 = ct["step_ms_p50"] / bare["step_ms_p50"]
            ratios.append(r)
            p50s.append(r50)
            issued = int(ct.get("issued_total", 0))
            extra = counts.get("recorded", 0) + counts.get("lost", 0) - issued
            print(
                f"  pair {i}: bare {bare['step_ms_mean']:.4f} ms, commtop {ct['step_ms_mean']:.4f} ms: "
                f"ratio {r:.4f} (p50 {r50:.4f}); recorded {counts.get('recorded', '?')} lost {counts.get('lost', '?')} "
                f"dropped {counts.get('dropped', '?')} issued {issued} (recorded + lost - issued = {extra:+d}: the job "
                f"counts neither DDP's set-up collectives nor its first step's own bucketing) {counts.get('error', '')}"
            )
            rows.append({"pair": i, "bare": bare, "commtop": ct, "ratio": r, "ratio_p50": r50, "counts": counts})
        m, h = mean_ci(ratios)
        m50, h50 = mean_ci(p50s)
        print(f"  {cond}: mean ratio {m:.4f} ± {h:.4f} (95 % t, n={len(ratios)}); p50 ratio {m50:.4f} ± {h50:.4f}")
        out["conditions"][cond] = {"pairs": rows, "mean_ratio": m, "ci95": h, "mean_p50_ratio": m50, "ci95_p50": h50}
    for path in sorted(work.glob("job_rate*_commtop_1.json")):
        name = path.name.split("_")[1]
        rate = load(path)
        if rate is None:
            continue
        counts = recording_counts(work / f"rec_{name}_1.commtop")
        issued = int(rate.get("issued_total", 0))
        ok = counts.get("recorded", -1) + counts.get("lost", 0) == issued
        print(
            f"== {name}: {rate.get('rate_per_s')} collectives/s for {rate.get('elapsed_s')} s: recorded "
            f"{counts.get('recorded', '?')} + lost {counts.get('lost', '?')} {'=' if ok else '!='} issued {issued}; "
            f"dropped {counts.get('dropped', '?')} {counts.get('error', '')}"
        )
        out[name] = {"job": rate, "counts": counts, "recorded_plus_lost_equals_issued": ok}
    if ns.json:
        Path(ns.json).write_text(json.dumps(out, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
