"""Who holds the others up, and how far apart the hosts' clocks are: statistics of the aligned
history and of the ranks' rings (plain numpy).

All ranks leave a collective together, so the rank that *arrived* last waited least: the
shortest latency of an iteration names its straggler, and the spread of its latencies is the
skew. End times coincide across the ranks of a collective, so they also tell the clock offsets
between hosts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import numpy as np

from tui.model.rank_state import RankState
from tui.model.snapshot import History, SkewEvent
from tui.model.streams import UNNAMED
from workers.wire.protocol import Hello
from workers.wire.stats import median
from workers.wire.straggler import STRAGGLER_ITERS, clearly_last

#: Iterations left out of the straggler headline when the run does not say its step length.
SETTLE_ITERS = 32
#: Newest complete iterations searched for the worst skew at every snapshot (the worst one
#: of the run is kept; a snapshot comes every ~70 ms, so every iteration is searched many times).
SKEW_ITERS = 512
#: Recent iterations (per host pair) used to estimate clock offsets between hosts.
CLOCK_ITERS = 256


def straggler_shares(history: History, complete: np.ndarray | None = None) -> np.ndarray | None:
    """Per rank, the share of recent complete iterations in which it arrived last.

    All ranks leave a collective together, so the rank that *arrived* last waited least:
    it has the shortest duration for that iteration.
    """
    ms = history.ms
    if ms.shape[0] < 2 or ms.shape[1] == 0:
        return None
    if complete is None:
        complete = ~np.isnan(ms).any(axis=0)
    cols = np.flatnonzero(complete)[-STRAGGLER_ITERS:]
    if len(cols) == 0:
        return None
    sub = _columns(ms, cols)
    # argmin down the columns, as np.argmin(sub, axis=0) (the first row on a tie; no NaN in
    # complete columns) in a third of its time at 512 ranks: numpy's argmin walks axis 0 slowly
    last_in = (sub == sub.min(axis=0)).argmax(axis=0)
    return np.bincount(last_in, minlength=ms.shape[0]) / len(cols)


def _columns(ms: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """``ms[:, cols]``: a view where ``cols`` are consecutive (the usual case: the complete
    iterations are all but the newest few), else a copy. At 512 ranks x 512 iterations the
    copy was most of the skew's time (0.76 of 0.87 ms a snapshot on the VM)."""
    if len(cols) and int(cols[-1]) - int(cols[0]) == len(cols) - 1:
        return ms[:, int(cols[0]) : int(cols[-1]) + 1]
    return ms[:, cols]


def worst_skews(
    history: History, order: list[int], settle: int = 0, complete: np.ndarray | None = None, since_ns: int = 0
) -> tuple[SkewEvent | None, SkewEvent | None]:
    """(The complete iteration of the history window whose ranks arrived furthest apart, and the
    same among those that started at or after ``since_ns``), iterations before ``settle`` left
    out (the first step still carries the ranks' start-up). One pass over the newest SKEW_ITERS
    complete iterations: a snapshot wants both, and the spread per iteration is most of the
    cost (0.26 ms each at 8 ranks)."""
    ms = history.ms
    if ms.shape[0] < 2 or ms.shape[1] == 0:
        return None, None
    its = history.first_iteration + np.arange(ms.shape[1])
    if complete is None:
        complete = ~np.isnan(ms).any(axis=0)
    cols = np.flatnonzero(complete & (its >= settle))[-SKEW_ITERS:]
    if len(cols) == 0:
        return None, None
    sub = _columns(ms, cols)
    longest = sub.max(axis=0)
    skew = longest - sub.min(axis=0)
    overall = _event(history, order, cols, sub, longest, skew, np.arange(len(cols)))
    recent = None
    if since_ns and len(history.start_ns) == ms.shape[1]:
        picked = np.flatnonzero(history.start_ns[cols] >= since_ns)
        recent = _event(history, order, cols, sub, longest, skew, picked) if len(picked) else None
    return overall, recent


def _event(
    history: History,
    order: list[int],
    cols: np.ndarray,
    sub: np.ndarray,
    longest: np.ndarray,
    skew: np.ndarray,
    picked: np.ndarray,
) -> SkewEvent:
    """The largest skew among the ``picked`` positions of ``cols``."""
    j = int(picked[int(np.argmax(skew[picked]))])
    last = int(np.argmin(sub[:, j]))
    col = int(cols[j])
    return SkewEvent(
        iteration=history.first_iteration + col,
        rank=order[last],
        skew_ms=float(skew[j]),
        wait_ms=float(longest[j]),
        own_ms=float(sub[last, j]),
        typical_ms=median(longest[picked]),
        t_ns=int(history.start_ns[col]) if len(history.start_ns) > col else 0,
    )


def clock_offsets(
    order: list[int], ranks: Mapping[int, RankState], by_stream: bool = False
) -> tuple[str, dict[str, float]]:
    """(reference host, {host: its clock minus the reference's, ms}).

    Every rank of one collective leaves it at (nearly) the same instant, so ``start + dur``
    of one iteration must coincide across ranks: the median difference between a host's
    end times and the reference host's, over the recent iterations both have, is the offset
    of its clock. The reference is the host of the lowest rank. ``by_stream``: the ranks'
    iterations do not line up (RunState.interleaved), so records are matched by their
    stream and their place in it instead (:func:`stream_places`)."""
    first: dict[str, int] = {}
    for r in order:
        h = ranks[r].hello
        if h is not None and h.host not in first:
            first[h.host] = r
    if len(first) < 2:
        return "", {}
    ends: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for host, r in first.items():
        v = ranks[r].coll.view(CLOCK_ITERS, copy=False)
        end = v["start_ns"] + (v["dur_us"].astype(np.float64) * 1e3).astype(np.int64)
        if by_stream:
            key = stream_places(v["stream"], ranks[r].stream_counts)
            ends[host] = (key[key >= 0], end[key >= 0])
        else:
            ends[host] = (v["iteration"], end)
    ref = ranks[order[0]].hello.host if ranks[order[0]].hello is not None else next(iter(first))  # type: ignore[union-attr]
    ref_it, ref_end = ends[ref]
    offsets: dict[str, float] = {}
    for host, (it, end) in ends.items():
        _, i, j = np.intersect1d(it, ref_it, return_indices=True)  # a restarted rank repeats iterations
        if len(i) >= 8:
            offsets[host] = float(np.median(end[i] - ref_end[j])) / 1e6
    return ref, offsets


def stream_places(streams: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Per record of a rank's newest records (``streams``: their ring values, oldest first), a
    key naming the same collective on every rank of its group: ``stream << 40 | k`` for the
    rank's k-th record of that stream (numbered back from ``counts``, the rank's records per
    stream so far, as RunState.stream_history_matrix numbers them); -1 for a record whose
    group was not named when it came (UNNAMED: its place is not known)."""
    s = streams.astype(np.int64)
    order = np.argsort(s, kind="stable")
    ordered = s[order]
    within = np.arange(len(s)) - np.searchsorted(ordered, ordered, side="left")
    in_view = np.bincount(s, minlength=len(counts))
    places = np.empty(len(s), dtype=np.int64)
    places[order] = ordered << 40 | (counts[ordered] - in_view[ordered] + within)
    places[s == UNNAMED] = -1
    return places


def straggler(shares: np.ndarray | None, complete: np.ndarray | None, order: list[int]) -> int | None:
    """The rank most often last in the recent complete iterations, if clearly so (else None)."""
    if shares is None or len(order) < 2:
        return None
    best = int(np.argmax(shares))
    total = min(STRAGGLER_ITERS, int(complete.sum()) if complete is not None else 0)
    return order[best] if clearly_last(round(float(shares[best]) * total), total, len(order)) else None


def members_only(history: History | None) -> tuple[History | None, np.ndarray | None]:
    """``history`` without the rows of ranks that have no record in it (ranks outside a drawn
    stream's group), and which rows stayed (None: all)."""
    if history is None or history.ms.shape[0] < 2:
        return history, None
    rows = ~np.isnan(history.ms).all(axis=1)
    if rows.all() or not rows.any():
        return history, None
    return replace(history, ms=history.ms[rows], mode=history.mode[rows]), rows


def settle_iters(lead: Hello | None) -> int:
    """Iterations of the first step: left out of the straggler headline (warm-up is not
    reported, but the first step after it still carries the ranks' start-up skew)."""
    per_step = (lead.config.get("collectives_per_step") if lead else None) or SETTLE_ITERS
    return int(per_step) if isinstance(per_step, int) and per_step > 0 else SETTLE_ITERS
