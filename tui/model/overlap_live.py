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

Cost: adding a batch appends it; labelling runs for thousands of records at once (when
SETTLE_BATCH wait, or when the model's once-a-second statistics ask), so it costs a fixed
number of numpy calls per settle, not per batch (benchmarks/overlap_ingest.py).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from tui.model.stats import RunAggregate, RunStats, pooled_stats
from workers.wire.overlap import CLASSES, DURING, classify, end_ns

#: Collectives waiting for their copies, at most (per rank): past this the oldest settle.
MAX_PENDING = 16384
#: Labelling runs when this many collectives wait (or when statistics are asked for, at
#: most once a second per rank): per record it then costs a fraction of a numpy call.
SETTLE_BATCH = 4096
#: Copy intervals kept per rank to classify against (the newest).
COPY_KEEP = 4096
#: Epochs whose per-class aggregates are kept (the verdict line compares adjacent epochs).
EPOCHS_KEPT = 16

_I64_MIN = -(2**63)


def _empty() -> np.ndarray:
    return np.zeros(0, dtype=np.int64)


class RankOverlap:
    """One rank's pending collectives, recent copies and per-class aggregates.

    Adding a batch only appends it (no numpy work); labelling happens in :meth:`settle`,
    for many batches at once."""

    def __init__(self) -> None:
        self._pending: list[tuple[np.ndarray, ...]] = []  # (start, dur_us, step, epoch, mode) per batch
        self._pending_n = 0
        self._new_copies: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # (start, dur_us, step)
        self._copies = (_empty(), _empty(), _empty())  # start, end, step of copies still useful
        self._max_copy_step = -1
        self._max_step = -1
        self._lagged_step = -1
        self.by_epoch: dict[int, list[RunAggregate]] = {}  # per class, the newest EPOCHS_KEPT epochs
        self.retired = [RunAggregate() for _ in CLASSES]  # per class, older epochs
        self.overlap_sum = 0.0  # sum of overlapped fractions of the collectives during copies
        self.during = 0
        self.epoch_mode: dict[int, int] = {}  # mode index of each epoch seen (bounded like by_epoch)

    def add_coll(self, cols: Mapping[str, np.ndarray]) -> None:
        step = cols["step"]
        self._pending.append((cols["start_ns"], cols["dur_us"], step, cols["epoch"], cols["mode"]))
        self._pending_n += len(step)
        self._lagged_step = self._max_step
        last = int(step[-1])
        if last > self._max_step:
            self._max_step = last
        if self._pending_n >= SETTLE_BATCH or self._pending_n > MAX_PENDING:
            self.settle()

    def add_copy(self, cols: Mapping[str, np.ndarray]) -> None:
        step = cols["step"]
        self._new_copies.append((cols["start_ns"], cols["dur_us"], step))
        last = int(step[-1])
        if last > self._max_copy_step:
            self._max_copy_step = last
        self._lagged_step = self._max_step

    def flush(self) -> None:
        """Label everything pending (the run is over: no copy can still come)."""
        self.settle(everything=True)

    def settle(self, everything: bool = False) -> None:
        """Label the pending collectives whose copies are all known (see the module doc)."""
        if not self._pending:
            return
        limit = max(self._max_copy_step - 1, self._lagged_step - 2)
        if not everything and self._pending_n <= MAX_PENDING and int(self._pending[0][2][0]) > limit:
            return  # nothing settles yet: no numpy work
        parts = self._pending
        if len(parts) == 1:
            start, dur, step, epoch, mode = parts[0]
        else:
            start, dur, step, epoch, mode = (np.concatenate([p[i] for p in parts]) for i in range(5))
        start = np.asarray(start, dtype=np.int64)
        done = np.ones(len(start), dtype=bool) if everything else np.asarray(step) <= limit
        over = len(start) - MAX_PENDING
        if over > 0:
            done[:over] = True
        if done.all():
            self._pending, self._pending_n = [], 0
            rest_start = rest_step = None
        else:
            rest = ~done
            self._pending = [(start[rest], dur[rest], step[rest], epoch[rest], mode[rest])]
            self._pending_n = int(rest.sum())
            rest_start, rest_step = int(start[rest][0]), int(step[rest][0])
            start, dur, step, epoch, mode = start[done], dur[done], step[done], epoch[done], mode[done]
        copies = self._take_copies()
        if len(start):
            cls, frac = classify(start, end_ns(start, dur), step, *copies)
            self._fold(cls, frac, dur, epoch)
            firsts = np.flatnonzero(np.concatenate(([True], epoch[1:] != epoch[:-1])))
            for e, m in zip(epoch[firsts].tolist(), mode[firsts].tolist(), strict=True):
                self.epoch_mode.setdefault(e, m)
        # keep the copies a later collective may still need: of its step, or not yet ended
        keep_step = rest_step if rest_step is not None else (int(step[-1]) if len(step) else _I64_MIN)
        keep_t = rest_start if rest_start is not None else (int(start[-1]) if len(start) else _I64_MIN)
        cs, ce, cst = copies
        useful = (cst >= keep_step) | (ce > keep_t)
        if not useful.all():
            cs, ce, cst = cs[useful], ce[useful], cst[useful]
        self._copies = (cs[-COPY_KEEP:], ce[-COPY_KEEP:], cst[-COPY_KEEP:])

    def _take_copies(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if not self._new_copies:
            return self._copies
        new = self._new_copies
        self._new_copies = []
        s = np.concatenate([np.asarray(p[0], dtype=np.int64) for p in new])
        e = end_ns(s, np.concatenate([p[1] for p in new]))
        st = np.concatenate([np.asarray(p[2], dtype=np.int64) for p in new])
        cs, ce, cst = self._copies
        return np.concatenate((cs, s)), np.concatenate((ce, e)), np.concatenate((cst, st))

    def _fold(self, cls: np.ndarray, frac: np.ndarray, dur: np.ndarray, epoch: np.ndarray) -> None:
        lo, hi = int(cls.min()), int(cls.max())
        e_lo, e_hi = int(epoch.min()), int(epoch.max())
        if lo == hi and e_lo == e_hi:  # one class, one epoch: the usual case
            self._epoch(e_lo)[lo].add(dur)
        else:
            for c in np.unique(cls).tolist():
                sel = cls == c
                for e in np.unique(epoch[sel]).tolist():
                    self._epoch(e)[c].add(dur[sel & (epoch == e)])
        if hi >= 1:
            self.overlap_sum += float(frac.sum())
            self.during += int(np.count_nonzero(cls == DURING))

    def _epoch(self, epoch: int) -> list[RunAggregate]:
        """Aggregates per class of one epoch; the oldest epoch past EPOCHS_KEPT is merged into
        ``retired`` (whole-run statistics = retired + kept epochs, each record folded once)."""
        aggs = self.by_epoch.get(epoch)
        if aggs is None:
            aggs = self.by_epoch[epoch] = [RunAggregate() for _ in CLASSES]
            if len(self.by_epoch) > EPOCHS_KEPT:
                oldest = min(self.by_epoch)
                old = self.by_epoch.pop(oldest)
                for e in [e for e in self.epoch_mode if e <= oldest]:
                    del self.epoch_mode[e]
                for total, agg in zip(self.retired, old, strict=True):
                    total.merge(agg)
        return aggs

    @property
    def pending(self) -> int:
        return self._pending_n

    def stats(self) -> dict[str, RunStats]:
        """Whole-run statistics per class name (classes with records only); labels what can be."""
        self.settle()
        out = {}
        for c, name in enumerate(CLASSES):
            st = pooled_stats([self.retired[c], *(aggs[c] for aggs in self.by_epoch.values())])
            if st.count:
                out[name] = st
        return out

    def epoch_stats(self, epoch: int) -> dict[str, RunStats]:
        """Per class statistics of one recent epoch (empty when not kept)."""
        aggs = self.by_epoch.get(epoch)
        if aggs is None:
            return {}
        return {name: st for name, agg in zip(CLASSES, aggs, strict=True) if (st := agg.stats()).count}

    def overlapped(self) -> float:
        """Mean overlapped fraction of the collectives that ran during copies (NaN: none)."""
        return self.overlap_sum / self.during if self.during else float("nan")
