"""The statistics of an A/B experiment: per arm and overlap class, and the ratio B/A with a
95 % confidence interval from the blocks.

Plain numpy (no Textual, no torch), shared by `commtop ab` (live), `commtop report` (from the
A/B marks in a recording) and the TUI's verdict line, so all three say the same thing.

Method (also in the README):

* The experiment alternates settings A and B in blocks of whole steps; blocks come in pairs
  whose order (AB or BA) is drawn at random, so a slow drift (clocks, heat, a neighbour) hits
  both arms alike and cancels in each pair.
* Per block and class, the block's median and mean collective duration (all ranks pooled).
* Per pair, the log of B's statistic over A's. The estimate is the geometric mean of the
  pair ratios; the 95 % interval is a paired Student-t interval on the log ratios (n - 1
  degrees of freedom), mapped back with exp. Pairs are the independent units, so records
  within a block may be as correlated as they like.
* "no detectable difference" when the interval contains 1. With fewer than 2 complete pairs
  there is no interval.
* A class B has but A lacks (``during copies`` against ``mode=none``) is compared with all
  of A: "B's collectives during copies vs A's collectives".
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from workers.wire.overlap import CLASSES
from workers.wire.stats import percentiles

#: Kind of the mark messages an experiment leaves in a recording (start, each block, end).
AB_MARK = "ab"
#: Arm of the unscored block an experiment runs before its first pair (ignored by analyse and
#: by blocks_from_marks, so recordings with or without it read the same way).
WARMUP = "W"
ALL = "all"
#: Result rows: every collective, then each overlap class.
ROWS: tuple[str, ...] = (ALL, *CLASSES)
#: Two-sided 97.5 % quantiles of Student's t for 1..30 degrees of freedom.
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip
_Z975 = 1.959963984540054


def t975(df: int) -> float:
    """The 97.5 % quantile of Student's t (table to 30 df, Cornish-Fisher beyond: < 1e-4 off)."""
    if df < 1:
        return math.nan
    if df <= len(_T975):
        return _T975[df - 1]
    z, v = _Z975, float(df)
    return (
        z
        + (z**3 + z) / (4 * v)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * v**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * v**3)
    )


@dataclass(frozen=True)
class Block:
    """One block of the experiment: the settings epoch it ran as, its arm, its pair."""

    epoch: int
    arm: str  # "A" or "B"; WARMUP for the unscored block before the first pair (pair -1)
    pair: int


@dataclass(frozen=True)
class Ratio:
    """B/A with a 95 % interval; NaN where there are too few pairs."""

    estimate: float = math.nan
    lo: float = math.nan
    hi: float = math.nan
    pairs: int = 0

    @property
    def known(self) -> bool:
        return math.isfinite(self.lo) and math.isfinite(self.hi)

    @property
    def detectable(self) -> bool:
        """The interval excludes 1."""
        return self.known and not self.lo <= 1.0 <= self.hi

    @property
    def half_width_pct(self) -> float:
        return (self.hi - self.lo) / 2 * 100 if self.known else math.inf

    def words(self) -> str:
        """ "+1.6 % [+1.2, +2.0]" or "+0.1 % [-0.4, +0.6] no detectable difference"."""
        if not math.isfinite(self.estimate):
            return "n/a"
        text = f"{pct(self.estimate)} %"
        if not self.known:
            return text + " (too few blocks for an interval)"
        text += f" [{pct(self.lo)}, {pct(self.hi)}]"
        return text if self.detectable else text + " no detectable difference"


def pct(ratio: float) -> str:
    return f"{(ratio - 1) * 100:+.1f}"


@dataclass(frozen=True)
class ArmStats:
    """One arm (and class), all its blocks pooled."""

    n: int = 0
    p50_ms: float = math.nan
    p99_ms: float = math.nan
    mean_ms: float = math.nan
    overlapped: float = math.nan  # mean overlapped fraction (during copies)


@dataclass(frozen=True)
class ClassResult:
    name: str
    a: ArmStats
    b: ArmStats
    p50: Ratio
    mean: Ratio
    baseline: str  # the class of A that B is compared with


@dataclass(frozen=True)
class ABResult:
    """Everything `commtop ab` prints, `report` reproduces and the TUI's verdict line shows."""

    a: str  # "mode=none"
    b: str  # "mode=overlap"
    pairs: int
    blocks: int
    rows: dict[str, ClassResult] = field(default_factory=dict)
    copy_gbps: tuple[float, float] = (math.nan, math.nan)  # per arm
    link_gbps: tuple[float, float] = (math.nan, math.nan)  # per arm: PCIe/NVLink tx, from telemetry
    #: per arm: HBM bandwidth utilisation % (GPM DRAM_BW_UTIL, mean per GPU); NaN without GPM
    hbm_util_pct: tuple[float, float] = (math.nan, math.nan)
    seconds: float = 0.0
    method: str = "paired t on log(B/A) of block medians and means, 95 %"

    @property
    def overall(self) -> ClassResult:
        return self.rows[ALL]

    def verdict(self, peak: str = "") -> str:
        """One line: "mode=overlap vs mode=none: p50 +1.6 % [+1.2, +2.0] · during copies +1.9 % · ..."."""
        parts = [f"{self.b} vs {self.a}: p50 {self.overall.p50.words()}"]
        for name, short in ((CLASSES[1], "during copies"), (CLASSES[2], "after")):
            row = self.rows.get(name)
            if row is not None and row.b.n:
                parts.append(f"{short} {pct(row.p50.estimate)} %")
        gbps = self.copy_gbps[1]
        if math.isfinite(gbps):
            parts.append(f"copies {gbps:.1f} GB/s" + (f" = {peak}" if peak else ""))
        parts.append(f"{self.pairs} pairs")
        return " · ".join(parts)


def paired_ratio(a: np.ndarray, b: np.ndarray) -> Ratio:
    """Geometric mean of b/a over pairs with a paired t interval on the logs."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    ok = np.isfinite(a) & np.isfinite(b) & (a > 0) & (b > 0)
    logs = np.log(b[ok] / a[ok])
    n = len(logs)
    if n == 0:
        return Ratio()
    mean = float(logs.mean())
    if n < 2:
        return Ratio(math.exp(mean), pairs=n)
    half = t975(n - 1) * float(logs.std(ddof=1)) / math.sqrt(n)
    return Ratio(math.exp(mean), math.exp(mean - half), math.exp(mean + half), n)


def _arm(values_us: np.ndarray, frac: np.ndarray | None = None) -> ArmStats:
    if len(values_us) == 0:
        return ArmStats()
    d = values_us.astype(np.float64)
    p50, p99 = percentiles(d, (50, 99))
    return ArmStats(
        n=len(d),
        p50_ms=float(p50) / 1e3,
        p99_ms=float(p99) / 1e3,
        mean_ms=float(d.mean()) / 1e3,
        overlapped=float(frac.mean()) if frac is not None and len(frac) else math.nan,
    )


def analyse(
    blocks: Sequence[Block],
    coll: Mapping[str, np.ndarray],
    copy: Mapping[str, np.ndarray] | None = None,
    *,
    a: str = "A",
    b: str = "B",
    link_gbps: tuple[float, float] = (math.nan, math.nan),
    hbm_util_pct: tuple[float, float] = (math.nan, math.nan),
    seconds: float = 0.0,
) -> ABResult:
    """The experiment's result from its blocks and records.

    ``coll`` holds ``epoch``, ``dur_us``, ``cls`` (overlap class) and optionally ``frac``;
    ``copy`` holds ``epoch``, ``nbytes``, ``dur_us``. Records of epochs that are no block
    (warm-up, the time between experiments) are ignored.
    """
    blocks = [blk for blk in blocks if blk.arm in ("A", "B")]  # not the warm-up block
    arm_of = {blk.epoch: blk for blk in blocks}
    epochs = np.fromiter(sorted(arm_of), dtype=np.int64, count=len(arm_of))
    rec_epoch = np.asarray(coll["epoch"], dtype=np.int64)
    pos = np.minimum(np.searchsorted(epochs, rec_epoch), max(len(epochs) - 1, 0))
    in_block = (epochs[pos] == rec_epoch) if len(epochs) else np.zeros(len(rec_epoch), dtype=bool)
    dur = np.asarray(coll["dur_us"])[in_block]
    cls = np.asarray(coll["cls"])[in_block]
    frac = np.asarray(coll["frac"])[in_block] if "frac" in coll else None
    bidx = pos[in_block]  # index into epochs
    block_arm = np.array([arm_of[int(e)].arm == "B" for e in epochs], dtype=bool)
    block_pair = np.array([arm_of[int(e)].pair for e in epochs], dtype=np.int64)
    pairs = sorted({p for p in block_pair.tolist() if (block_pair == p).sum() == 2})
    is_b = block_arm[bidx] if len(bidx) else np.zeros(0, dtype=bool)

    # Per block and class: median and mean (NaN where empty). Sorting once keeps it linear.
    n_blocks = len(epochs)
    keys = bidx * (len(CLASSES) + 1) + cls.astype(np.int64) + 1
    order = np.argsort(keys, kind="stable")
    sorted_keys, sorted_dur = keys[order], dur[order].astype(np.float64)
    stats_med = np.full((n_blocks, len(CLASSES) + 1), np.nan)
    stats_mean = np.full((n_blocks, len(CLASSES) + 1), np.nan)
    uniq, first = np.unique(sorted_keys, return_index=True)
    bounds = np.append(first, len(sorted_keys))
    for k, lo, hi in zip(uniq.tolist(), bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
        blk, c = divmod(k, len(CLASSES) + 1)
        part = sorted_dur[lo:hi]
        stats_med[blk, c] = float(np.median(part))
        stats_mean[blk, c] = float(part.mean())
    # column 0 = all classes of the block
    b_sorted = bidx[np.argsort(bidx, kind="stable")]
    d_by_block = dur[np.argsort(bidx, kind="stable")].astype(np.float64)
    ub, fb = np.unique(b_sorted, return_index=True)
    bb = np.append(fb, len(b_sorted))
    for blk, lo, hi in zip(ub.tolist(), bb[:-1].tolist(), bb[1:].tolist(), strict=True):
        stats_med[blk, 0] = float(np.median(d_by_block[lo:hi]))
        stats_mean[blk, 0] = float(d_by_block[lo:hi].mean())

    a_of_pair = {int(block_pair[i]): i for i in range(n_blocks) if not block_arm[i]}
    b_of_pair = {int(block_pair[i]): i for i in range(n_blocks) if block_arm[i]}
    ia = np.array([a_of_pair[p] for p in pairs], dtype=np.intp)
    ib = np.array([b_of_pair[p] for p in pairs], dtype=np.intp)

    rows: dict[str, ClassResult] = {}
    for col, name in enumerate(ROWS):
        sel_b = is_b if col == 0 else is_b & (cls == col - 1)
        a_has = col == 0 or bool((~is_b & (cls == col - 1)).any())
        sel_a = ~is_b if col == 0 or not a_has else ~is_b & (cls == col - 1)
        base_col = col if a_has else 0
        rows[name] = ClassResult(
            name=name,
            a=_arm(dur[sel_a], frac[sel_a] if frac is not None else None),
            b=_arm(dur[sel_b], frac[sel_b] if frac is not None else None),
            p50=paired_ratio(stats_med[ia, base_col], stats_med[ib, col]) if len(pairs) else Ratio(),
            mean=paired_ratio(stats_mean[ia, base_col], stats_mean[ib, col]) if len(pairs) else Ratio(),
            baseline=name if a_has else ALL,
        )
    copy_gbps = (math.nan, math.nan)
    if copy is not None and len(copy.get("epoch", ())):
        ce = np.asarray(copy["epoch"], dtype=np.int64)
        cpos = np.minimum(np.searchsorted(epochs, ce), max(len(epochs) - 1, 0))
        inb = (epochs[cpos] == ce) if len(epochs) else np.zeros(len(ce), dtype=bool)
        cb = block_arm[cpos[inb]] if len(epochs) else np.zeros(0, dtype=bool)
        nb = np.asarray(copy["nbytes"], dtype=np.float64)[inb]
        du = np.asarray(copy["dur_us"], dtype=np.float64)[inb]
        vals = []
        for arm in (False, True):
            t = du[cb == arm].sum()
            vals.append(float(nb[cb == arm].sum() / t / 1e3) if t > 0 else math.nan)
        copy_gbps = (vals[0], vals[1])
    return ABResult(
        a=a,
        b=b,
        pairs=len(pairs),
        blocks=n_blocks,
        rows=rows,
        copy_gbps=copy_gbps,
        link_gbps=link_gbps,
        hbm_util_pct=hbm_util_pct,
        seconds=seconds,
    )


# --------------------------------------------------------------------------- output


def _f(x: float, fmt: str = "{:.4f}") -> str:
    return "-" if not math.isfinite(x) else fmt.format(x)


def format_table(result: ABResult, peak: str = "") -> str:
    """The table `commtop ab` prints (and `commtop report` reproduces from a recording)."""
    head = f"A/B: A = {result.a}, B = {result.b} · {result.pairs} pairs of blocks (AB/BA in random order)" + (
        f" · {result.seconds:.0f} s" if result.seconds else ""
    )
    cols = ("class", "arm", "n", "p50 ms", "p99 ms", "mean ms", "overlapped", "B/A p50 [95 % CI]", "B/A mean [95 % CI]")
    rows: list[tuple[str, ...]] = []
    for name in ROWS:
        r = result.rows.get(name)
        if r is None or (r.a.n == 0 and r.b.n == 0):
            continue
        for arm, st in (("A", r.a), ("B", r.b)):
            rows.append(
                (
                    name if arm == "A" else "",
                    arm + (" (all)" if arm == "A" and r.baseline != name else ""),
                    str(st.n),
                    _f(st.p50_ms),
                    _f(st.p99_ms),
                    _f(st.mean_ms),
                    _f(st.overlapped * 100, "{:.0f} %"),
                    r.p50.words() if arm == "B" else "",
                    r.mean.words() if arm == "B" else "",
                )
            )
    widths = [max(len(c), *(len(row[i]) for row in rows)) if rows else len(c) for i, c in enumerate(cols)]

    def fmt(row: Sequence[str]) -> str:
        return "  ".join(
            v.ljust(w) if i in (0, 1, 7, 8) else v.rjust(w) for i, (v, w) in enumerate(zip(row, widths, strict=True))
        ).rstrip()

    lines = [head, fmt(cols), "  ".join("-" * w for w in widths), *(fmt(r) for r in rows)]
    ga, gb = result.copy_gbps
    la, lb = result.link_gbps
    lines.append(f"copy GB/s: A {_f(ga, '{:.1f}')}, B {_f(gb, '{:.1f}')}" + (f" ({peak})" if peak else ""))
    if math.isfinite(la) or math.isfinite(lb):
        lines.append(f"link tx GB/s (NVML): A {_f(la, '{:.1f}')}, B {_f(lb, '{:.1f}')}")
    ha, hb = result.hbm_util_pct
    if math.isfinite(ha) or math.isfinite(hb):
        lines.append(
            f"HBM bandwidth used (GPM DRAM_BW_UTIL): A {_f(ha, '{:.1f} %')}, B {_f(hb, '{:.1f} %')}" + busier(ha, hb)
        )
    lines.append(f"method: {result.method}; verdict: {result.verdict(peak)}")
    return "\n".join(lines)


def busier(a: float, b: float) -> str:
    """ " · busier in B (+18.3 points)", so the table says which arm used the resource more."""
    if not (math.isfinite(a) and math.isfinite(b)):
        return ""
    if abs(b - a) < 1.0:
        return " · about the same"
    return f" · busier in {'B' if b > a else 'A'} ({b - a:+.1f} points)"


def as_json(result: ABResult) -> dict[str, object]:
    def arm(s: ArmStats) -> dict[str, object]:
        return {"n": s.n, "p50_ms": s.p50_ms, "p99_ms": s.p99_ms, "mean_ms": s.mean_ms, "overlapped": s.overlapped}

    def ratio(r: Ratio) -> dict[str, object]:
        return {"estimate": r.estimate, "lo": r.lo, "hi": r.hi, "pairs": r.pairs, "detectable": r.detectable}

    return {
        "a": result.a,
        "b": result.b,
        "pairs": result.pairs,
        "blocks": result.blocks,
        "seconds": result.seconds,
        "method": result.method,
        "copy_gbps": list(result.copy_gbps),
        "link_gbps": list(result.link_gbps),
        "hbm_util_pct": list(result.hbm_util_pct),
        "verdict": result.verdict(),
        "classes": {
            name: {"a": arm(r.a), "b": arm(r.b), "baseline": r.baseline, "p50": ratio(r.p50), "mean": ratio(r.mean)}
            for name, r in result.rows.items()
        },
    }


def blocks_from_marks(messages: Sequence[tuple[int, Any]]) -> list[tuple[dict[str, Any], list[Block]]]:
    """The experiments recorded as marks: (start mark, its blocks), in recording order. The
    start mark gains ``seconds``: from it to the experiment's last mark (its end, when recorded)."""
    out: list[tuple[dict[str, Any], list[Block]]] = []
    by_id: dict[str, int] = {}
    for _, msg in messages:
        if not isinstance(msg, dict) or msg.get("k") != AB_MARK:
            continue
        exp = str(msg.get("id", ""))
        event = msg.get("event")
        if exp in by_id:
            start = out[by_id[exp]][0]
            t0, t1 = start.get("t_ns"), msg.get("t_ns")
            if isinstance(t0, int) and isinstance(t1, int) and t1 > t0:
                start["seconds"] = (t1 - t0) / 1e9
        if event == "start":
            by_id[exp] = len(out)
            out.append((dict(msg), []))
        elif event == "block" and exp in by_id:
            try:
                block = Block(int(msg["epoch"]), str(msg["arm"]), int(msg["pair"]))
            except (KeyError, TypeError, ValueError):
                continue
            if block.arm in ("A", "B"):
                out[by_id[exp]][1].append(block)
    return out
