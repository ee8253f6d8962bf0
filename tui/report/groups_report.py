"""Groups and ranks in `commtop report`: per process group its ranks, streams, records and
straggler; per rank what is missing (iteration gaps + the collectives it says it lost).

The straggler of a group: all ranks of a group leave a collective together, so the rank that
arrived last waited least. Per step, the rank whose collectives of that group took least time in
all is the step's last arrival; over the steps in which every rank of the group recorded the
same number of its collectives, the rank most often last is the straggler when clearly so
(:func:`tui.model.skew.clearly_last`, the live view's test). The per-(rank, step) sums come
from the step pass (:class:`tui.report.steps_report.RunWalk`); past SAMPLE_CELLS (steps x
ranks) every k-th step is compared.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from tui.model.skew import clearly_last
from tui.report.rows import GroupRow, RankRow
from tui.report.steps_report import GroupSteps
from tui.report.streams import GroupNames, combo_parts
from workers.wire import protocol as p

SAMPLE_CELLS = 4_000_000


def group_rows(names: GroupNames, combos: Sequence[int], steps: dict[int, GroupSteps]) -> list[GroupRow]:
    """One row per group with records."""
    out = []
    streams_of: dict[int, int] = {}
    for c in combos:
        g = combo_parts(c)[0]
        streams_of[g] = streams_of.get(g, 0) + 1
    if names.single:  # every record in one group: no pass over them
        counts = np.zeros(len(names.groups), dtype=np.int64)
        if len(names.index):
            counts[int(names.index[0])] = len(names.index)
    else:
        counts = np.bincount(names.index, minlength=len(names.groups))
    for g, (name, desc, size) in enumerate(names.groups):
        n = int(counts[g]) if len(counts) > g else 0
        if not n:
            continue
        found = steps.get(g, GroupSteps())
        straggler, share, compared = _straggler(found)
        ranks = tuple(sorted(set(found.ranks)))
        out.append(GroupRow(name, desc, size, ranks, streams_of.get(g, 0), n, straggler, share, compared))
    return out


def _straggler(found: GroupSteps) -> tuple[int | None, float, int]:
    """(straggler or None, its share of the steps compared, steps compared)."""
    ranks = sorted(set(found.ranks))
    m = len(ranks)
    if m < 2:
        return None, math.nan, 0
    index = {r: i for i, r in enumerate(ranks)}
    who = np.concatenate([np.full(len(s), index[r]) for r, s in zip(found.ranks, found.steps, strict=True)])
    step = np.concatenate(found.steps)
    time_us = np.concatenate(found.time_us)
    count = np.concatenate(found.count)
    lo, hi = int(step.min()), int(step.max())
    k = max(1, -(-(hi - lo + 1) * m // SAMPLE_CELLS))
    if k > 1:
        take = (step - lo) % k == 0
        who, step, time_us, count = who[take], step[take], time_us[take], count[take]
    uniq, inverse = np.unique(step, return_inverse=True)
    cell = inverse.ravel() * m + who
    size = len(uniq) * m
    total = np.bincount(cell, weights=time_us, minlength=size).reshape(-1, m)
    counts = np.bincount(cell, weights=count, minlength=size).reshape(-1, m)
    complete = (counts.min(axis=1) > 0) & (counts.min(axis=1) == counts.max(axis=1))
    compared = int(np.count_nonzero(complete))
    if not compared:
        return None, math.nan, 0
    last = np.bincount(np.argmin(total[complete], axis=1), minlength=m)
    top = int(np.argmax(last))
    share = float(last[top]) / compared
    return (ranks[top] if clearly_last(int(last[top]), compared, m) else None), share, compared


def rank_rows(
    ranks: Sequence[int],
    records: dict[int, int],
    iterations: dict[int, tuple[int, int]],
    hellos: Sequence[tuple[int, p.Hello]],
) -> list[RankRow]:
    """Per rank: records, iteration gaps within the recording, and the collectives it lost while
    it was recorded (the growth of its Hellos' ``lost``; all of it when the recording holds the
    rank's first Hello)."""
    first: dict[int, p.Hello] = {}
    top: dict[int, int] = {}
    host: dict[int, str] = {}
    for _, h in hellos:  # in file order
        first.setdefault(h.rank, h)
        top[h.rank] = max(top.get(h.rank, 0), h.lost)
        host[h.rank] = f"{h.host}:{'cpu' if h.device_index < 0 else h.device_index}"
    out = []
    for r in ranks:
        n = records.get(r, 0)
        lo, hi = iterations.get(r, (0, -1))
        gaps = max(0, hi - lo + 1 - n) if n else 0
        h0 = first.get(r)
        # recorded from its start (its first Hello, or its first collective: a Hello may come after
        # a few on a loaded machine): all of it
        base = 0 if h0 is None or h0.iteration <= 0 or (n and lo == 0) else h0.lost
        out.append(RankRow(r, host.get(r, "?"), n, gaps, max(0, top.get(r, 0) - base)))
    return out
