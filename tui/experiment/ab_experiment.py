"""An A/B experiment on a live run: alternate settings A and B in blocks of whole steps, in
random AB/BA pairs, through the run's live control, and collect each block's records.

Plain Python (no Textual, no torch, no sockets of its own): ``commtop ab`` drives it from the
headless collector's loop, the TUI from a timer. It is a Sink (the ingest thread hands it
every accepted message) and talks to the run through a controller (``request(changes)`` and
``desired``, as tui.run.control_server.ControlServer offers them). The live control switches
every rank at the same iteration and stamps each record with its settings epoch, so a block
is exactly the records of one epoch, and no record is attributed by wall time.

Marks (``ab`` dict messages) go to ``mark``, normally the recorder, so `commtop report` on
the recording finds the blocks and reproduces the verdict.
"""

from __future__ import annotations

import math
import random
import secrets
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tui.experiment.ab_stats import AB_MARK, WARMUP, ABResult, Block, analyse
from tui.ingest.interfaces import ControllerLike
from workers.wire.overlap import classify_columns
from workers.wire.protocol import COLL, TELEM, Batch, ProtocolError
from workers.wire.settings import knob_name
from workers.wire.telemetry import decode_tick

#: Records kept at most (all blocks); past this the experiment ends with what it has.
MAX_RECORDS = 20_000_000
#: Telemetry ticks kept (10 Hz: over an hour).
MAX_TICKS = 40_000
#: Least complete pairs before ``--until-ci`` may end the experiment.
MIN_PAIRS = 3
#: Give up when a requested block has not shown up in the records after this long (or when the
#: workers, once they reported, have not settled what they can change: a job declares its knobs
#: before its loop).
SWITCH_TIMEOUT_S = 30.0
#: Give up when no worker has reported at all after this long: ranks start slowly on a loaded
#: machine (two torch ranks beside a CPU hog on 2 cores took over 30 s), and a job that ends
#: first is said as such by the runner.
START_TIMEOUT_S = 120.0
#: Refusals worth another try next tick (the run is busy); any other refusal ends the experiment.
TRANSIENT = (
    "the workers are still switching",
    "the workers have not reported",
    "stale request",
    "other changes kept coming",
    "no reply from the collector",
)

_COLL_KEEP = ("rank", "epoch", "step", "start_ns", "dur_us")
_COPY_KEEP = ("rank", "epoch", "step", "start_ns", "dur_us", "nbytes")


def parse_arm(text: str) -> dict[str, str]:
    """ "mode=overlap copies=3" or "mode=overlap,copies=3" -> {"mode": "overlap", "copies": "3"}."""
    out: dict[str, str] = {}
    for part in text.replace(",", " ").split():
        name, sep, value = part.partition("=")
        if not sep or not name or not value:
            raise ValueError(f"expected name=value, got {part!r}")
        out[name.strip()] = value.strip()
    if not out:
        raise ValueError("an arm needs at least one name=value")
    return out


def arm_label(changes: Mapping[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in changes.items())


def refused_arm(check: Callable[[Mapping[str, Any]], str], a: Mapping[str, Any], b: Mapping[str, Any]) -> str:
    """The first arm ``check`` refuses (tui.model.changeable), in one line; "" when neither."""
    for arm, changes in (("A", a), ("B", b)):
        why = check(changes)
        if why:
            return f"arm {arm} ({arm_label(changes)}): {why}"
    return ""


@dataclass(frozen=True)
class Progress:
    """What the TUI's verdict line and `commtop ab` show while it runs."""

    state: str  # "running" | "done" | "failed"
    pairs: int
    blocks: int
    elapsed_s: float
    duration_s: float
    note: str = ""
    latest: ABResult | None = None


class ABExperiment:
    """One experiment; ``tick()`` advances it (call it every ~0.1 s), ``write`` feeds it."""

    def __init__(
        self,
        controller: ControllerLike,
        a: Mapping[str, Any],
        b: Mapping[str, Any],
        *,
        duration_s: float = 30.0,
        until_ci_pct: float = 0.0,
        block_s: float = 1.0,
        seed: int | None = None,
        warmup: bool = True,
        mark: Callable[[dict[str, Any]], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.controller = controller
        self.a, self.b = dict(a), dict(b)
        self.label_a, self.label_b = arm_label(a), arm_label(b)
        self.duration_s = duration_s
        self.until_ci_pct = until_ci_pct
        self.block_s = block_s
        #: one unscored block before the first pair and one after the last (arm WARMUP;
        #: analyse and the reports skip them)
        self.warmup = warmup
        self._cooling = False
        self._finish_note = ""
        self.seed = secrets.randbits(32) if seed is None else seed
        self.rng = random.Random(self.seed)
        self.mark = mark
        self.clock = clock
        self.id = secrets.token_hex(4)
        self.blocks: list[Block] = []
        self.state = "starting"
        self.note = ""
        #: An arm the run cannot set (tui.model.changeable): the experiment never started.
        self.refused = ""
        #: The job ended before the experiment did (the runner says so; the note says what to do).
        self.job_ended = False
        self._lock = threading.Lock()
        self._coll: list[dict[str, np.ndarray]] = []
        self._copy: list[dict[str, np.ndarray]] = []
        self._records = 0
        self._epochs: set[int] = set()
        self._seen_epochs: set[int] = set()
        self._windows: dict[int, tuple[int, int]] = {}  # epoch -> (first, last) collective start
        self._ticks: list[tuple[int, float, float, float]] = []  # (t_ns, PCIe tx, NVLink tx GB/s, HBM %) per GPU
        self._restore: dict[str, Any] = {}
        self.restore_error: str | None = None  # None: not restored (yet); "": accepted
        self._order: list[str] = []  # arms still to run in the current pair
        self._pair = -1
        self._started = 0.0
        self._block_seen_at = math.nan  # when the current block's first record arrived
        self._requested_at = 0.0
        self._waiting_since = math.nan  # first tick; then since a refused switch was first retried
        self._reported_at = math.nan  # when the workers' settings were first known
        self._last_result: ABResult | None = None
        self._result_at = -math.inf
        self._refresher: threading.Thread | None = None

    # ------------------------------------------------------------------ Sink (ingest thread)

    def write(self, message: Any) -> None:
        if isinstance(message, dict) and message.get("k") == TELEM:
            self._telemetry(message)
            return
        if not isinstance(message, Batch) or len(message) == 0:
            return
        cols = message.columns
        epoch = cols["epoch"]
        with self._lock:
            if not self._epochs or self._records >= MAX_RECORDS:
                return
            lo, hi = int(epoch.min()), int(epoch.max())
            if lo == hi and lo not in self._epochs:
                return
            keep = np.isin(epoch, list(self._epochs)) if lo != hi else slice(None)
            part: dict[str, np.ndarray] = {}
            names = _COLL_KEEP if message.kind == COLL else _COPY_KEEP
            for name in names:
                if name == "rank":
                    continue
                part[name] = np.array(cols[name][keep])
            n = len(part["epoch"])
            if n == 0:
                return
            part["rank"] = np.full(n, message.rank, dtype=np.int32)
            (self._coll if message.kind == COLL else self._copy).append(part)
            self._records += n
            if message.kind == COLL:
                self._seen_epochs.update(np.unique(part["epoch"]).tolist())
                for e in np.unique(part["epoch"]).tolist():
                    # each epoch's own records: a batch at a switch holds two blocks' records
                    starts = part["start_ns"][part["epoch"] == e] if lo != hi else part["start_ns"]
                    lo_t, hi_t = int(starts.min()), int(starts.max())
                    w = self._windows.get(e)
                    self._windows[e] = (lo_t, hi_t) if w is None else (min(w[0], lo_t), max(w[1], hi_t))

    def _telemetry(self, body: dict[str, Any]) -> None:
        """PCIe (and NVLink) tx per GPU from a node tick, kept to average over each arm's blocks."""
        try:
            tick = decode_tick(body)
        except ProtocolError:
            return
        if not len(tick.uuids):
            return
        pcie = _finite_mean(tick.metrics["pcie_tx_gbps"])
        nvl = _finite_mean(tick.metrics["nvlink_tx_gbps"])
        hbm = _finite_mean(tick.metrics["dram_bw_util_pct"])
        with self._lock:
            if len(self._ticks) < MAX_TICKS:
                self._ticks.append((tick.t_ns, pcie, nvl, hbm))

    # ------------------------------------------------------------------ schedule

    def tick(self) -> bool:
        """Advance the schedule; True once the experiment is over (done or failed)."""
        if self.state in ("done", "failed"):
            return True
        now = self.clock()
        if self.state == "starting":
            return self._start(now)
        if self.state == "switching":
            return self._next_block(now)
        # running: is the current block in, and long enough?
        current = self.blocks[-1].epoch if self.blocks else -1
        with self._lock:
            seen = current in self._seen_epochs
            full = self._records >= MAX_RECORDS
        if not seen:
            if now - self._requested_at > SWITCH_TIMEOUT_S:
                return self._fail(f"block {len(self.blocks)} (epoch {current}) never showed up in the records")
            return False
        if self._cooling:  # the last scored block has ended on every rank
            return self._finish(self._finish_note)
        if math.isnan(self._block_seen_at):
            self._block_seen_at = now
        if now - self._block_seen_at < self.block_s:
            return False
        if not self._order and (full or self._should_stop(now)):
            note = "record limit reached" if full else self._target_missed()
            return self._cool_down(now, note) if self.warmup else self._finish(note)
        return self._next_block(now)

    def _start(self, now: float) -> bool:
        """Check both arms against what the run can change, before the first block; remember
        the settings in force (the end puts them back)."""
        if math.isnan(self._waiting_since):
            self._waiting_since = now
        view = self.controller.view()
        can = view.can_change
        if view.requested is None or can.kind == "unknown":  # no worker has reported yet
            if now - self._waiting_since > START_TIMEOUT_S:
                return self._fail("the workers never reported their settings")
            self.note = "waiting for the workers to report their settings"
            return False
        if math.isnan(self._reported_at):
            self._reported_at = now
        if not can.known and now - self._reported_at <= SWITCH_TIMEOUT_S:
            self.note = "waiting for the job to declare its knobs"
            return False
        self.refused = refused_arm(can.check, self.a, self.b)
        if self.refused:
            return self._fail(self.refused)
        in_force = view.requested.as_dict() if view.requested is not None else {}
        knobs = dict(in_force.get("knobs") or {})
        self._restore = {}
        for key in dict.fromkeys([*self.a, *self.b]):
            knob = knob_name(key, can.knobs) if key not in in_force else None
            if knob is not None and knob in knobs:
                self._restore[key] = knobs[knob]
            elif key in in_force:
                self._restore[key] = in_force[key]
        self._started = now
        self.state = "running"
        self._emit("start", a=self.label_a, b=self.label_b, seed=self.seed, block_s=self.block_s)
        return self._next_block(now)

    def _cool_down(self, now: float, note: str) -> bool:
        """End the last scored block with an unscored one in its settings before finishing: what
        the end costs (the result computed, the settings restored) then runs beside records
        nobody scores. On CPU gloo the last block had run ~15 % off the run's median
        (benchmarks/ab_aa_position.py), weighing on whichever arm came last."""
        last = self.blocks[-1]
        changes = {**self._restore, **(self.a if last.arm == "A" else self.b)}
        if self.controller.request(dict(changes), new_epoch=True):
            return self._finish(note)  # could not switch: finish as before
        desired = getattr(self.controller, "desired", None)
        if desired is None:
            return self._finish(note)
        block = Block(int(desired[0]), WARMUP, -1)
        with self._lock:
            self.blocks.append(block)
            self._epochs.add(block.epoch)
        self._emit("block", epoch=block.epoch, arm=block.arm, pair=block.pair)
        self._cooling, self._finish_note = True, note
        self._requested_at = now
        return False

    def _should_stop(self, now: float) -> bool:
        if self.until_ci_pct > 0:
            pairs = self._complete_pairs()
            if pairs >= MIN_PAIRS:
                res = self.result()
                if res.overall.p50.half_width_pct <= self.until_ci_pct:
                    return True
            return self.duration_s > 0 and now - self._started >= self.duration_s
        return now - self._started >= self.duration_s

    def _target_missed(self) -> str:
        """With ``--until-ci``, stopped by the duration: the target missed, and what was reached."""
        if self.until_ci_pct <= 0:
            return ""
        reached = self.result().overall.p50.half_width_pct if self._complete_pairs() >= 2 else math.nan
        if reached <= self.until_ci_pct:
            return ""
        got = f"the p50 interval reached +/-{reached:.1f} %" if math.isfinite(reached) else "fewer than 2 pairs"
        return (
            f"target +/-{self.until_ci_pct:g} % missed: {got} in {self.duration_s:g} s "
            "(a longer --duration, or a looser --until-ci)"
        )

    def _next_block(self, now: float) -> bool:
        if not self._order:
            self._order = ["A", "B"] if self.rng.random() < 0.5 else ["B", "A"]
            self._pair += 1
        arm = self._order[0]
        changes = {**self._restore, **(self.a if arm == "A" else self.b)}
        error = self.controller.request(dict(changes), new_epoch=True)  # a block is exactly one epoch
        if error:
            if not error.startswith(TRANSIENT):
                return self._fail(error)  # refused: another try would be refused the same way
            if self.state != "switching":
                self._waiting_since = now
            self.state = "switching"  # e.g. the workers are still switching: retry next tick
            self.note = error
            if now - self._waiting_since > SWITCH_TIMEOUT_S:
                return self._fail(error)
            return False
        desired = getattr(self.controller, "desired", None)
        if desired is None:
            return self._fail("the controller does not say which settings epoch it created")
        epoch = int(desired[0])
        if self.warmup and not self.blocks:
            # An unscored block first, in the settings of the first scored one: the first block
            # after the start ran up to ~25 % slower on CPU gloo (switching from the run's own
            # settings, copies still draining; benchmarks/ab_aa_position.py), which weighed on
            # whichever arm pair 0 put first.
            block = Block(epoch, WARMUP, -1)
        else:
            self._order.pop(0)
            block = Block(epoch, arm, self._pair)
        with self._lock:
            self.blocks.append(block)
            self._epochs.add(epoch)
        self._emit("block", epoch=epoch, arm=block.arm, pair=block.pair)
        self.state = "running"
        self.note = ""
        self._requested_at = now
        self._block_seen_at = math.nan
        return False

    @property
    def restore(self) -> dict[str, Any]:
        """The settings in force before the first block (what the end puts back)."""
        return dict(self._restore)

    def _put_back(self) -> None:
        """Restore the settings from before the experiment (done, stopped or failed);
        ``restore_error`` says how that went ("" accepted)."""
        if self._restore:
            self.restore_error = self.controller.request(dict(self._restore))

    def _finish(self, note: str) -> bool:
        self._put_back()
        self.state = "done"
        self.note = note
        self._emit("end", pairs=self._complete_pairs())
        return True

    def _fail(self, note: str) -> bool:
        self._put_back()
        self.state = "failed"
        self.note = note
        self._emit("end", pairs=self._complete_pairs(), error=note)
        return True

    def stop(self) -> None:
        """End early (Ctrl-C, a TUI key): the blocks so far still make a result."""
        if self.state not in ("done", "failed"):
            self._finish("stopped early")

    def _emit(self, event: str, **fields: Any) -> None:
        if self.mark is not None:
            self.mark({"k": AB_MARK, "v": 1, "id": self.id, "event": event, "t_ns": time.time_ns(), **fields})

    def _complete_pairs(self) -> int:
        with self._lock:
            seen = self._seen_epochs
            counts: dict[int, int] = {}
            for blk in self.blocks:
                if blk.epoch in seen:
                    counts[blk.pair] = counts.get(blk.pair, 0) + 1
        return sum(1 for c in counts.values() if c == 2)

    # ------------------------------------------------------------------ results

    def columns(self) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """(collective, copy) columns collected so far, the collectives with their class."""
        with self._lock:
            coll_parts, copy_parts = list(self._coll), list(self._copy)
        coll = _concat(coll_parts, _COLL_KEEP)
        copy = _concat(copy_parts, _COPY_KEEP)
        coll["cls"], coll["frac"] = classify_columns(coll, copy)
        return coll, copy

    def result(self) -> ABResult:
        coll, copy = self.columns()
        with self._lock:
            blocks = list(self.blocks)
        seconds = (self.clock() - self._started) if self._started else 0.0
        with self._lock:
            windows, ticks = dict(self._windows), list(self._ticks)
        res = analyse(
            blocks,
            coll,
            copy,
            a=self.label_a,
            b=self.label_b,
            seconds=seconds,
            link_gbps=arm_link(blocks, windows, ticks),
            hbm_util_pct=arm_hbm(blocks, windows, ticks),
        )
        self._last_result = res
        return res

    def progress(self, refresh_s: float = 1.0, background: bool = True) -> Progress:
        """For a live display: the state and the latest result, refreshed at most every
        ``refresh_s``. With ``background`` the refresh runs on a thread of its own (labelling
        a long experiment's records takes a moment the UI thread must not wait for)."""
        now = self.clock()
        busy = self._refresher is not None and self._refresher.is_alive()
        if self._complete_pairs() >= 2 and now - self._result_at >= refresh_s and not busy:
            self._result_at = now
            if background:
                self._refresher = threading.Thread(target=self.result, name="commtop-ab-result", daemon=True)
                self._refresher.start()
            else:
                self.result()
        return Progress(
            state=self.state,
            pairs=self._complete_pairs(),
            blocks=len(self.blocks),
            elapsed_s=(now - self._started) if self._started else 0.0,
            duration_s=self.duration_s,
            note=self.note,
            latest=self._last_result,
        )


def _finite_mean(values: np.ndarray) -> float:
    """Mean of the finite values (NaN = n/a, e.g. NVLink on a machine without it)."""
    ok = values[np.isfinite(values)]
    return float(ok.mean()) if len(ok) else math.nan


def arm_link(
    blocks: list[Block], windows: Mapping[int, tuple[int, int]], ticks: Sequence[tuple[int, float, float, float]]
) -> tuple[float, float]:
    """Link tx GB/s per GPU (PCIe, plus NVLink where there is any): per arm, the mean over its
    blocks of each block's mean (as `commtop report` computes it from a recording)."""
    if not ticks:
        return (math.nan, math.nan)
    pcie = np.array([x[1] for x in ticks])
    nvl = np.array([x[2] for x in ticks])
    value = np.where(np.isfinite(nvl) & (nvl > 0), np.nan_to_num(pcie) + nvl, pcie)
    return _per_arm(blocks, windows, np.array([x[0] for x in ticks], dtype=np.int64), value)


def arm_hbm(
    blocks: list[Block], windows: Mapping[int, tuple[int, int]], ticks: Sequence[tuple[int, float, float, float]]
) -> tuple[float, float]:
    """HBM bandwidth utilisation % (GPM) per arm, averaged like :func:`arm_link`; NaN without GPM."""
    if not ticks:
        return (math.nan, math.nan)
    t = np.array([x[0] for x in ticks], dtype=np.int64)
    return _per_arm(blocks, windows, t, np.array([x[3] for x in ticks]))


def _per_arm(
    blocks: list[Block], windows: Mapping[int, tuple[int, int]], t: np.ndarray, value: np.ndarray
) -> tuple[float, float]:
    order = np.argsort(t, kind="stable")
    t, value = t[order], value[order]
    out = []
    for arm in ("A", "B"):
        means = []
        for blk in blocks:
            w = windows.get(blk.epoch)
            if blk.arm == arm and w is not None:
                a, b = np.searchsorted(t, [w[0], w[1] + 1])
                mean = _finite_mean(value[a:b])
                if math.isfinite(mean):
                    means.append(mean)
        out.append(sum(means) / len(means) if means else math.nan)
    return (out[0], out[1])


def _concat(parts: list[dict[str, np.ndarray]], names: tuple[str, ...]) -> dict[str, np.ndarray]:
    if not parts:
        dtypes = {"rank": np.int32, "epoch": np.int32, "step": np.int64, "start_ns": np.int64}
        return {n: np.zeros(0, dtype=dtypes.get(n, np.float32 if n == "dur_us" else np.int64)) for n in names}
    return {n: np.concatenate([p[n] for p in parts]) for n in names}


class ABSlot:
    """The TUI's one experiment at a time: a permanent sink that forwards to the current
    experiment, and its progress (the last experiment's result stays until the next starts)."""

    def __init__(self) -> None:
        self.experiment: ABExperiment | None = None
        self._final: Progress | None = None

    @property
    def running(self) -> bool:
        return self.experiment is not None and self.experiment.state not in ("done", "failed")

    def start(self, controller: ControllerLike, a: Mapping[str, Any], b: Mapping[str, Any], **kw: Any) -> ABExperiment:
        self.experiment = ABExperiment(controller, a, b, **kw)
        self._final = None
        return self.experiment

    def write(self, message: Any) -> None:
        exp = self.experiment
        if exp is not None:
            exp.write(message)

    def tick(self) -> None:
        exp = self.experiment
        if exp is not None and self._final is None and exp.tick():
            self._finalise(exp)

    def stop(self) -> None:
        exp = self.experiment
        if exp is not None and self._final is None:
            exp.stop()
            self._finalise(exp)

    def _finalise(self, exp: ABExperiment) -> None:
        result = exp.result()
        progress = exp.progress(background=False)
        self._final = Progress(
            progress.state, progress.pairs, progress.blocks, progress.elapsed_s, progress.duration_s, exp.note, result
        )

    def progress(self) -> Progress | None:
        if self._final is not None:
            return self._final
        return self.experiment.progress() if self.experiment is not None else None
