"""Overlap classes in the live model: each collective is labelled once its copies are known.

Copies and collectives of a rank arrive in separate batches, and a copy that overlaps a
collective can finish (and be sent) well after it. So collectives wait in a small pending
buffer until they are *settled*, then are classified with workers.wire.overlap (the same
rule as the report and `commtop ab`) and folded into per-class aggregates. A collective of
step s is settled when

* a copy of a later step has arrived (the rank's copies come in step order), or
* the rank's collectives had reached step s + 2 one batch earlier (a worker harvests copies
  right after collectives and sends both in the same flush, collectives first; a copy of
  step s overlapping step s + 1 would be harvested with it at the latest), or
* the pending buffer is full (MAX_PENDING: bounded memory; the oldest go), or
* the run ends (``flush``).

Cost: a fixed number of numpy calls per batch (benchmarks/overlap_ingest.py).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from tui.model.stats import RunAggregate, RunStats
from workers.wire.overlap import CLASSES, classify, end_ns

#: Collectives waiting for their copies, at most (per rank).
MAX_PENDING = 16384
#: Copy intervals kept per rank to classify against.
COPY_KEEP = 2048
#: Epochs whose per-class aggregates are kept (the verdict line compares adjacent epochs).
EPOCHS_KEPT = 16


class RankOverlap:
    """One rank's pending collectives, recent copies and per-class aggregates."""

    def __init__(self) -> None:
        self._pending: list[tuple[np.ndarray, ...]] = []  # (start, end, step, dur_us, epoch)
        self._pending_n = 0
        self._copies = (np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64))
        self._max_copy_step = -1
        self._max_step = -1
        self._lagged_step = -1
        self.by_class = [RunAggregate() for _ in CLASSES]
        self.by_epoch: dict[int, list[RunAggregate]] = {}
        self.overlap_sum = 0.0  # sum of overlapped fractions of the collectives during copies

    def add_coll(self, cols: Mapping[str, np.ndarray]) -> None:
        start = np.asarray(cols["start_ns"], dtype=np.int64)
        step = np.asarray(cols["step"], dtype=np.int64)
        dur = cols["dur_us"]
        self._pending.append((start, end_ns(start, dur), step, dur, cols["epoch"]))
        self._pending_n += len(start)
        self._lagged_step = self._max_step
        self._max_step = max(self._max_step, int(step[-1]), int(step[0]))
        self._settle()

    def add_copy(self, cols: Mapping[str, np.ndarray]) -> None:
        start = np.asarray(cols["start_ns"], dtype=np.int64)
        step = np.asarray(cols["step"], dtype=np.int64)
        s, e, st = self._copies
        keep = max(0, len(s) + len(start) - COPY_KEEP)
        self._copies = (
            np.concatenate((s[keep:], start))[-COPY_KEEP:],
            np.concatenate((e[keep:], end_ns(start, cols["dur_us"])))[-COPY_KEEP:],
            np.concatenate((st[keep:], step))[-COPY_KEEP:],
        )
        self._max_copy_step = max(self._max_copy_step, int(step.max()))
        self._lagged_step = self._max_step
        self._settle()

    def flush(self) -> None:
        """Classify everything pending (the run is over: no copy can still come)."""
        self._settle(everything=True)

    def _settle(self, everything: bool = False) -> None:
        if not self._pending:
            return
        limit = max(self._max_copy_step - 1, self._lagged_step - 2)
        first_step = self._pending[0][2]
        if not everything and self._pending_n <= MAX_PENDING and int(first_step[0]) > limit:
            return  # nothing settles (the usual case between a step's batches): no numpy work
        parts = self._pending
        if len(parts) == 1:
            start, end, step, dur, epoch = parts[0]
        else:
            start, end, step, dur, epoch = (np.concatenate([p[i] for p in parts]) for i in range(5))
        if everything:
            done = np.ones(len(start), dtype=bool)
        else:
            done = step <= limit
            over = len(start) - MAX_PENDING
            if over > 0:
                done[:over] = True
        if not done.all():
            rest = ~done
            self._pending = [(start[rest], end[rest], step[rest], dur[rest], epoch[rest])]
            self._pending_n = int(rest.sum())
            start, end, step, dur, epoch = start[done], end[done], step[done], dur[done], epoch[done]
        else:
            self._pending, self._pending_n = [], 0
        if len(start) == 0:
            return
        cs, ce, cst = self._copies
        cls, frac = classify(start, end, step, cs, ce, cst)
        self._fold(cls, frac, dur, epoch)

    def _fold(self, cls: np.ndarray, frac: np.ndarray, dur: np.ndarray, epoch: np.ndarray) -> None:
        lo, hi = int(cls.min()), int(cls.max())
        e_lo, e_hi = int(epoch.min()), int(epoch.max())
        if lo == hi and e_lo == e_hi:  # one class, one epoch: the usual batch
            self.by_class[lo].add(dur)
            self._epoch(e_lo)[lo].add(dur)
        else:
            for c in np.unique(cls).tolist():
                sel = cls == c
                self.by_class[c].add(dur[sel])
                for e in np.unique(epoch[sel]).tolist():
                    self._epoch(e)[c].add(dur[sel & (epoch == e)])
        if hi >= 1:
            self.overlap_sum += float(frac.sum())

    def _epoch(self, epoch: int) -> list[RunAggregate]:
        aggs = self.by_epoch.get(epoch)
        if aggs is None:
            aggs = self.by_epoch[epoch] = [RunAggregate() for _ in CLASSES]
            if len(self.by_epoch) > EPOCHS_KEPT:
                del self.by_epoch[min(self.by_epoch)]
        return aggs

    @property
    def pending(self) -> int:
        return self._pending_n

    def stats(self) -> dict[str, RunStats]:
        """Whole-run statistics per class name (classes with records only)."""
        out = {}
        for name, agg in zip(CLASSES, self.by_class, strict=True):
            st = agg.stats()
            if st.count:
                out[name] = st
        return out

    def overlapped(self) -> float:
        """Mean overlapped fraction of the collectives that ran during copies (NaN: none)."""
        n = self.by_class[1].count
        return self.overlap_sum / n if n else float("nan")
