"""One rank in the run model: its rings of recent records, whole-run aggregates and the counters
of what it lost, and how each of its messages changes them (the counting rules are in
:mod:`tui.model.run_model`'s docstring)."""

from __future__ import annotations

from collections import deque

import numpy as np

from tui.model.overlap_live import RankOverlap
from tui.model.stats import RING_SIZE, Ring, RunAggregate, uniform
from tui.model.steps import RankSteps
from tui.model.streams import record_shapes
from workers.wire.protocol import COLL, COLL_COLUMNS, COPY, COPY_COLUMNS, Batch, Bye, Hello, pick_columns

#: The columns of a collective batch a rank's ring keeps, with their wire dtypes, and each
#: record's stream (its ring value in :class:`tui.model.streams.StreamTable`) and shape
#: (:func:`tui.model.streams.record_shapes`).
COLL_RING = pick_columns(
    COLL_COLUMNS,
    ("iteration", "step", "epoch", "mode", "start_ns", "dur_us", "busbw", "stream", "shape"),
    extra={"stream": "u1", "shape": "<u2"},
)
#: The columns of a copy batch a rank's ring keeps.
COPY_RING = {name: COPY_COLUMNS[name] for name in ("epoch", "start_ns", "dur_us", "nbytes", "gbps")}
COPY_RING_SIZE = 1024
#: How long an iteration gap lasts before the live view counts it as missing. A rank numbers a
#: collective when it starts, so one that runs long on one thread is recorded after later ones
#: of another thread (or an irecv waited after a later all_reduce): a gap for a moment, not a
#: loss. The end (a fresh summary, the report) counts every gap.
GAP_SETTLE_NS = 1_000_000_000


class RankState:
    """Everything the model keeps of one rank; ``version`` changes with every message of it."""

    def __init__(self, rank: int, step_times: RunAggregate | None = None) -> None:
        """``step_times``: the aggregate its step times go to (see :class:`RankSteps`; the run
        model shares one among its ranks)."""
        self.rank = rank
        self.hello: Hello | None = None
        self.bye: Bye | None = None
        self.last_seen_ns = 0
        self.last_record_ns = 0  # arrival of the newest collective batch (the loop is moving)
        self.coll = Ring(COLL_RING, RING_SIZE)
        self.copy = Ring(COPY_RING, COPY_RING_SIZE)
        self.run_by_mode: dict[int, RunAggregate] = {}
        self.copy_run = RunAggregate()
        self.first_iteration = -1
        self.last_iteration = -1
        self.received = 0
        self.dropped = 0
        self.max_seq = {COLL: -1, COPY: -1}
        self.batches = {COLL: 0, COPY: 0}
        self.sent_hint = {COLL: 0, COPY: 0}  # batches sent so far, from the hello
        self.version = 0  # bumped by every message of this rank (snapshot caching)
        self.overlap = RankOverlap()
        self.steps = RankSteps(step_times)
        #: Collectives the rank says it issued and never recorded (its Hello's ``lost``).
        self.lost = 0
        #: Records per stream ring value so far (tui.model.streams): the per-stream history's columns.
        self.stream_counts = np.zeros(256, dtype=np.int64)
        self.first_start_ns = 0  # start of its first collective record
        #: The lowest and highest iteration of its newest collective batch.
        self.batch_iterations = (-1, -1)
        self.last_end_ns = 0  # latest end of its collective records
        #: (snapshot ns, last iteration, received) from the newest sample at or before
        #: GAP_SETTLE_NS ago on (settled_gaps)
        self._gap_samples: deque[tuple[int, int, int]] = deque(maxlen=256)

    @property
    def gaps(self) -> int:
        """Iterations never received, from gaps in the ``iteration`` column."""
        if self.received == 0:
            return 0
        return max(0, self.last_iteration - self.first_iteration + 1 - self.received)

    def settled_gaps(self, now: int) -> int:
        """The gaps among the iterations this rank had reached GAP_SETTLE_NS ago: younger ones
        may still fill (a late record). Read from a sample of (time, last iteration, records
        received) per call (a snapshot of the rank): of the iterations up to the top of the
        newest sample at or before ``now - GAP_SETTLE_NS``, those not received then nor since.
        Samples are kept only while there are gaps: a gap shows once it lasted that long; past
        the ring's reach, every gap counts."""
        samples = self._gap_samples
        gaps = self.gaps
        if not gaps:  # the usual case: no sample kept (the next gap's first sample is its anchor)
            samples.clear()
            return 0
        samples.append((now, self.last_iteration, self.received))
        while len(samples) > 1 and samples[1][0] <= now - GAP_SETTLE_NS:
            samples.popleft()
        at, top, got = samples[0]
        if at > now - GAP_SETTLE_NS or got == 0:
            return 0
        since = self.received - got
        if since < 0 or since > self.coll.size:
            return gaps  # a restarted rank (its counts began again), or more than the ring holds
        late = 0
        if since:
            late = int(np.count_nonzero(self.coll.view(since, copy=False, columns=("iteration",))["iteration"] <= top))
        return max(0, min(gaps, top - self.first_iteration + 1 - got - late))

    @property
    def missing(self) -> int:
        """What users are told is missing: the gaps plus what the rank itself never recorded."""
        return self.gaps + self.lost

    @property
    def time_ns(self) -> int:
        """Its time so far: first collective start to the latest collective end."""
        return max(0, self.last_end_ns - self.first_start_ns) if self.received else 0

    @property
    def lost_batches(self) -> int:
        lost = 0
        for kind in (COLL, COPY):
            expected = max(self.max_seq[kind] + 1, self.sent_hint[kind])
            lost += max(0, expected - self.batches[kind])
        return lost

    def revive_if_newer(self, t_ns: int) -> None:
        """A message sent after the rank's Bye means it came back (restarted)."""
        if self.bye is not None and t_ns > self.bye.t_ns:
            self.bye = None

    def add_batch(
        self,
        batch: Batch,
        now: int,
        streams: np.ndarray | None = None,
        single: int = -1,
        shapes: np.ndarray | None = None,
    ) -> tuple[int, ...]:
        """Count a batch and keep its records (``streams``: each collective's stream ring value;
        ``single``: the one value of them all, or -1; ``shapes``: their record_shapes, computed
        here when not given); returns the modes of its collectives."""
        self.last_seen_ns = now
        self.version += 1
        self.revive_if_newer(batch.t_ns)
        kind = batch.kind
        self.max_seq[kind] = max(self.max_seq[kind], batch.seq)
        self.batches[kind] += 1
        self.dropped = max(self.dropped, batch.dropped)
        n = len(batch)
        if n == 0:
            return ()
        cols = batch.columns
        if kind != COLL:
            self.copy.append(cols)
            self.copy_run.add(cols["dur_us"], cols["gbps"])
            self.overlap.add_copy(cols)
            self.steps.add_copy(cols["direction"], cols["pinned"], cols["nbytes"], cols["dur_us"])
            return ()
        self.last_record_ns = now
        if streams is None:
            streams, single = np.zeros(n, dtype=np.uint8), 0
        self.coll.append({**cols, "stream": streams, "shape": record_shapes(cols) if shapes is None else shapes})
        if single >= 0:
            self.stream_counts[single] += n
        else:
            self.stream_counts += np.bincount(streams, minlength=256)
        self.overlap.add_coll(cols)
        start, dur = cols["start_ns"], cols["dur_us"]
        self.steps.add_coll(cols["step"], start, dur)
        if self.received == 0:
            self.first_start_ns = int(start[0])
        # the newest record's end (records come in issue order): the share's denominator
        self.last_end_ns = max(self.last_end_ns, int(start[-1]) + round(float(dur[-1]) * 1e3))
        it = cols["iteration"]
        lo, hi = int(it.min()), int(it.max())
        self.batch_iterations = (lo, hi)
        self.first_iteration = lo if self.first_iteration < 0 else min(self.first_iteration, lo)
        self.last_iteration = max(self.last_iteration, hi)
        self.received += n
        modes = cols["mode"]
        if uniform(modes):  # one mode (the usual batch): a bytes compare, not two reductions
            m = int(modes[0])
            self._agg(m).add(cols["dur_us"], cols["busbw"])
            return (m,)
        seen = []
        for m in np.unique(modes):
            sel = modes == m
            self._agg(int(m)).add(cols["dur_us"][sel], cols["busbw"][sel])
            seen.append(int(m))
        return tuple(seen)

    def _agg(self, mode: int) -> RunAggregate:
        agg = self.run_by_mode.get(mode)
        if agg is None:
            agg = self.run_by_mode[mode] = RunAggregate()
        return agg

    def add_hello(self, hello: Hello, now: int) -> None:
        self.last_seen_ns = now
        self.version += 1
        self.revive_if_newer(hello.t_ns)
        if self.hello is None or hello.t_ns >= self.hello.t_ns:
            self.hello = hello
        self.dropped = max(self.dropped, hello.dropped)
        self.lost = max(self.lost, hello.lost)
        self.sent_hint[COLL] = max(self.sent_hint[COLL], hello.seq_coll)
        self.sent_hint[COPY] = max(self.sent_hint[COPY], hello.seq_copy)

    def add_bye(self, bye: Bye, now: int) -> None:
        self.bye = bye
        self.last_seen_ns = now
        self.version += 1
