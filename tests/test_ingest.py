"""LiveSource over real ZeroMQ and the IngestLoop: decoding, rejection by reason, floods,
sinks that fail, replay resets and the headless collector."""

from __future__ import annotations

import hashlib
import hmac
import shutil
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
from frozen_run import T0, FakePublisher, frozen_coll, frozen_hello, frozen_run, seal_message

from tui.ingest.interfaces import ResetModel
from tui.ingest.loop import IngestLoop
from tui.ingest.sources import LiveSource, SourceError
from tui.model.run_model import RunModel
from tui.run.headless import format_summary, run_headless
from workers.wire import protocol as p
from workers.wire.connection import Connection

KEY = bytes(range(32))
SESSION = "sess-1"


def make_connection(data: str) -> Connection:
    return Connection(
        run_id="t", session=SESSION, key_hex=KEY.hex(), data=data, control="", request="", host="h", created_ns=0
    )


@pytest.fixture
def ipc_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="ct-", dir="/tmp"))  # short: ipc paths max ~100 chars
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def source(ipc_dir: Path) -> Iterator[LiveSource]:
    src = LiveSource(make_connection(f"ipc://{ipc_dir}/data.sock"))
    yield src
    src.close()


def drain(src: LiveSource, want: int, timeout_s: float = 10.0) -> list[Any]:
    got: list[Any] = []
    deadline = time.monotonic() + timeout_s
    while len(got) + sum(src.rejected.values()) < want and time.monotonic() < deadline:
        got += src.poll(0.05)
    return got


def test_live_source_decodes_sealed_messages(source: LiveSource) -> None:
    pub = FakePublisher(source.endpoint, KEY, SESSION)
    pub.send([frozen_hello(0), frozen_coll(0, 0, [0, 1, 2], [1000, 2000, 3000])])
    got = drain(source, 2)
    pub.close()
    assert isinstance(got[0], p.Hello) and got[0].host == "node-a"
    assert isinstance(got[1], p.Batch) and got[1].columns["dur_us"].tolist() == [1000, 2000, 3000]
    assert not source.rejected


def test_bad_frames_are_counted_by_reason_and_good_ones_still_arrive(source: LiveSource) -> None:
    pub = FakePublisher(source.endpoint, KEY, SESSION)
    good = seal_message(KEY, SESSION, frozen_hello(0))
    body = good[1]
    wrong_version = msgpack.packb({"v": 99, "k": "hello", "s": SESSION})
    garbage = b"\xc1\xc1 not msgpack"

    def sign(payload: bytes) -> list[bytes]:
        return [hmac.new(KEY, payload, hashlib.sha256).digest(), payload]

    pub.send_frames([b"x" * 32, body])  # unsigned (wrong mac)
    pub.send_frames([body])  # one frame only
    pub.send_frames(sign(garbage))
    pub.send_frames(sign(wrong_version))
    pub.send_frames(seal_message(KEY, "other-session", frozen_hello(1)))
    pub.send_frames(sign(b"\x00" * (p.MAX_BODY_BYTES + 10)))  # oversized, within the socket's slack
    pub.send_frames(good)
    got = drain(source, 7)
    pub.close()
    assert source.rejected == Counter(
        {"signature": 1, "frames": 1, "malformed": 1, "version": 1, "session": 1, "oversized": 1}
    )
    assert len(got) == 1 and isinstance(got[0], p.Hello)


def test_a_frame_over_the_socket_limit_does_not_stop_other_peers(source: LiveSource) -> None:
    big = FakePublisher(source.endpoint, KEY, SESSION)
    big.send_frames([b"m" * 32, b"\x00" * (3 * p.MAX_BODY_BYTES)])  # libzmq drops this peer
    good = FakePublisher(source.endpoint, KEY, SESSION)
    good.send([frozen_hello(3)])
    got = drain(source, 1)
    big.close()
    good.close()
    assert [m.rank for m in got] == [3]


def test_bind_conflict_is_one_clear_line(source: LiveSource) -> None:
    with pytest.raises(SourceError) as info:
        LiveSource(make_connection(source.endpoint))
    text = str(info.value)
    assert "\n" not in text and "already in use" in text and source.endpoint in text


def test_tcp_port_conflict_is_one_clear_line() -> None:
    first = LiveSource(make_connection("tcp://127.0.0.1:*"))
    try:
        with pytest.raises(SourceError, match="cannot listen on tcp://127.0.0.1:"):
            LiveSource(make_connection(first.endpoint))
    finally:
        first.close()


def test_stale_ipc_file_is_reused(ipc_dir: Path) -> None:
    stale = ipc_dir / "data.sock"
    stale.write_bytes(b"")  # a crashed collector's leftover
    src = LiveSource(make_connection(f"ipc://{stale}"))
    src.close()


class RecordingSource:
    """Wraps a LiveSource and remembers how many messages each poll returned."""

    def __init__(self, inner: LiveSource) -> None:
        self.inner = inner
        self.rejected = inner.rejected
        self.sizes: list[int] = []

    def poll(self, timeout_s: float) -> list[Any]:
        got = self.inner.poll(timeout_s)
        self.sizes.append(len(got))
        return got

    def close(self) -> None:
        self.inner.close()


def test_flood_of_200k_records_is_drained_in_bounded_polls(ipc_dir: Path) -> None:
    inner = LiveSource(make_connection(f"ipc://{ipc_dir}/f.sock"), max_per_poll=500)
    src = RecordingSource(inner)
    model = RunModel()
    snaps: list[Any] = []
    loop = IngestLoop(src, model, on_snapshot=snaps.append, interval_s=0.02)
    loop.start()
    pub = FakePublisher(inner.endpoint, KEY, SESSION)
    batches = [frozen_coll(r, i, range(i * 50, i * 50 + 50), np.full(50, 1000.0)) for i in range(2000) for r in (0, 1)]
    sender = threading.Thread(target=pub.send, args=(batches,))
    sender.start()
    sender.join(30)
    deadline = time.monotonic() + 30
    while model.records < 200_000 and time.monotonic() < deadline:
        time.sleep(0.05)
    loop.stop()
    loop.join(5)
    pub.close()
    inner.close()
    assert model.records == 200_000  # 2 ranks x 2000 batches x 50
    assert max(src.sizes) <= 500
    assert snaps and snaps[-1].records <= 200_000
    assert not loop.running
    s = loop.snapshot()
    assert [r.count for r in s.ranks] == [100_000, 100_000] and s.drops == 0


class FrozenSource:
    """Test-only Source: hands out scripted lists of messages, one list per poll."""

    def __init__(self, script: list[list[Any]]) -> None:
        self.script = list(script)
        self.rejected: Counter[str] = Counter()

    def poll(self, timeout_s: float) -> list[Any]:
        if self.script:
            return self.script.pop(0)
        time.sleep(min(timeout_s, 0.01))
        return []

    def close(self) -> None:
        pass


class FakeFailingSink:
    def __init__(self) -> None:
        self.calls = 0

    def write(self, message: Any) -> None:
        self.calls += 1
        raise OSError("No space left on device")


class ListSink:
    def __init__(self) -> None:
        self.messages: list[Any] = []

    def write(self, message: Any) -> None:
        self.messages.append(message)


def test_sink_errors_are_reported_and_ingest_goes_on() -> None:
    msgs = frozen_run(world=2, iterations=100)
    src = FrozenSource([msgs[:3], msgs[3:]])
    bad, good = FakeFailingSink(), ListSink()
    loop = IngestLoop(src, RunModel(), sinks=[bad, good])
    loop.step(0)
    loop.step(0)
    assert len(good.messages) == len(msgs)
    assert bad.calls == 2  # once per poll, then skipped for that poll
    assert list(loop.errors) == ["FakeFailingSink: No space left on device"]
    assert [r.count for r in loop.snapshot().ranks] == [100, 100]


def test_reset_marker_clears_the_model_and_is_not_passed_to_sinks() -> None:
    first = [frozen_coll(0, 0, range(10), [1000] * 10)]
    again = [ResetModel(), frozen_coll(0, 0, range(3), [2000] * 3)]
    sink = ListSink()
    loop = IngestLoop(FrozenSource([first, again]), RunModel(), sinks=[sink])
    loop.step(0)
    loop.step(0)
    s = loop.snapshot()
    assert s.ranks[0].count == 3 and s.ranks[0].last_ms == pytest.approx(2.0)
    assert not any(isinstance(m, ResetModel) for m in sink.messages)


def test_source_clock_is_used_for_liveness() -> None:
    class ClockedSource(FrozenSource):
        t = T0

        def now_ns(self) -> int:
            return self.t

    src = ClockedSource([[frozen_coll(0, 0, [0], [1000])]])
    loop = IngestLoop(src, RunModel())
    loop.step(0)
    src.t += 10 * 1_000_000_000
    assert loop.snapshot().ranks[0].state == "stale"
    src.t = T0 + 1
    assert loop.snapshot().ranks[0].state == "live"


def test_the_view_asks_for_whole_run_stats_and_the_ingest_thread_applies_it_before_a_snapshot() -> None:
    """The view does not write the model: its request waits in the loop until the next snapshot."""
    loop = IngestLoop(FrozenSource([[frozen_coll(0, 0, [0], [1000])]]), RunModel())
    loop.step(0)
    loop.request_whole_run_stats(False)
    loop.request_whole_run_stats(True)
    loop.request_whole_run_stats(False)
    assert loop.model.whole_run_stats  # queued, not applied by the asking thread
    loop.snapshot()
    assert not loop.model.whole_run_stats  # the newest request wins
    loop.request_whole_run_stats(True)
    loop.start()
    deadline = time.monotonic() + 5
    while not loop.model.whole_run_stats and time.monotonic() < deadline:
        time.sleep(0.01)
    loop.stop()
    loop.join(5)
    assert loop.model.whole_run_stats  # applied by the running thread (idle snapshots come anyway)


def test_snapshots_are_emitted_only_when_something_changed() -> None:
    src = FrozenSource([[frozen_coll(0, 0, [0], [1000])]])
    snaps: list[Any] = []
    loop = IngestLoop(src, RunModel(), on_snapshot=snaps.append, interval_s=0.0)
    loop.step(0)
    assert loop.maybe_emit() is not None
    assert loop.maybe_emit() is None  # nothing new, idle refresh not due
    assert len(snaps) == 1


def test_headless_collects_until_done_and_prints_a_summary(ipc_dir: Path) -> None:
    src = LiveSource(make_connection(f"ipc://{ipc_dir}/h.sock"))
    pub = FakePublisher(src.endpoint, KEY, SESSION)
    pub.send(frozen_run(world=2, iterations=400))
    stop = threading.Event()
    model = RunModel()
    snap = run_headless(src, model, stop, until=lambda: model.records >= 800)
    src.close()
    pub.close()
    assert [r.count for r in snap.ranks] == [400, 400]
    text = format_summary(snap)
    lines = text.splitlines()
    assert lines[0].startswith("commtop summary: backend gloo/cpu · world size 2 · all_gather 1024x1024 float32")
    assert "mode(s) none, overlap" in lines[0]
    assert lines[1].split()[:3] == ["rank", "host:gpu", "mode"]
    table = lines[: lines.index("")]  # the per-rank table; the overlap-class table follows
    rank0 = [ln for ln in table if ln.startswith("0 ")]
    assert len(rank0) == 1 and "node-a:cpu" in rank0[0]
    # two rows per rank (one per mode), the second row only has the per-mode numbers
    assert len(table[3:]) == 4
    # per rank and overlap class: every collective in exactly one class
    classes = lines[lines.index("") + 1 :]
    assert classes[0].split()[:3] == ["rank", "overlap", "class"]
    for rank in ("0", "1"):
        counts = [int(ln[len("rank  overlap class  ") :].split()[0]) for ln in classes[2:] if ln.startswith(rank + " ")]
        assert sum(counts) == 400 and len(counts) >= 2


def test_headless_stops_on_the_event() -> None:
    stop = threading.Event()
    stop.set()
    snap = run_headless(FrozenSource([]), RunModel(), stop)
    assert snap.ranks == () and "no rank reported" in format_summary(snap)


class EndlessSource:
    """Test fake: a publisher that never pauses (one new batch on every poll, however short)."""

    rejected: dict[str, int] = {}

    def __init__(self) -> None:
        self.seq = 0

    def poll(self, timeout_s: float) -> list[object]:
        self.seq += 1
        its = range(self.seq * 10, self.seq * 10 + 10)
        return [frozen_coll(0, self.seq, its, [2700.0] * 10, world=1)]


def test_headless_end_drain_takes_late_frames_but_a_flood_cannot_hold_the_exit() -> None:
    from tui.run import headless

    stop = threading.Event()
    stop.set()
    source = EndlessSource()
    started = time.monotonic()
    snap = run_headless(source, RunModel(), stop)
    took = time.monotonic() - started
    assert snap.ranks[0].count == 10 * source.seq > 10  # it drained beyond the first poll
    assert took < headless.DRAIN_MAX_S + 1.0, f"the drain took {took:.1f} s"


def test_a_change_is_snapshotted_when_due_not_after_a_whole_poll() -> None:
    """The thread waits for messages at most until the next snapshot is due once something
    changed: with a 5 s poll, the second change still shows after ~interval_s, not 5 s."""

    class BlockingSource(FrozenSource):  # test-only: like zmq, an empty poll waits its whole timeout
        released = threading.Event()  # set once measured, so the test does not wait out the last poll

        def poll(self, timeout_s: float) -> list[Any]:
            if self.script:
                return self.script.pop(0)
            self.released.wait(min(timeout_s, 5.0))
            return []

    msgs = [[frozen_coll(0, 0, [0], [1000])], [frozen_coll(0, 1, [1], [1000])]]
    snaps: list[Any] = []
    loop = IngestLoop(BlockingSource(msgs), RunModel(), on_snapshot=snaps.append, interval_s=0.2, poll_s=5.0)
    t0 = time.monotonic()
    loop.start()
    try:
        while len(snaps) < 2 and time.monotonic() - t0 < 10:
            time.sleep(0.01)
        elapsed = time.monotonic() - t0
    finally:
        BlockingSource.released.set()
        loop.stop()
        loop.join(6)
    assert len(snaps) >= 2 and snaps[-1].ranks[0].count == 2
    assert elapsed < 2.5  # 0.2 s due; waiting out the 5 s poll took > 5 s


class TrickleSource:
    """Test fake: ``per_poll`` new one-record batches on every poll, however short (a fleet
    whose batches arrive one by one); counts the polls."""

    rejected: dict[str, int] = {}

    def __init__(self, per_poll: int = 1) -> None:
        self.per_poll = per_poll
        self.polls = 0
        self.it = 0

    def poll(self, timeout_s: float) -> list[object]:
        self.polls += 1
        out = []
        for _ in range(self.per_poll):
            out.append(frozen_coll(0, self.it, [self.it], [1000.0], world=1))
            self.it += 1
        return out


def run_for(loop: IngestLoop, seconds: float) -> None:
    loop.start()
    time.sleep(seconds)
    loop.stop()
    loop.join(5)


def test_messages_gather_until_the_snapshot_is_due_not_one_wake_up_each() -> None:
    """While messages stream in, the thread sleeps until the next snapshot is due and then takes
    what queued: one poll per snapshot (waking for the first message after each snapshot made
    two), every record still applied, snapshots on time."""
    src = TrickleSource()
    snaps: list[Any] = []
    loop = IngestLoop(src, RunModel(), on_snapshot=snaps.append, interval_s=0.1)
    run_for(loop, 1.0)
    assert 6 <= len(snaps) <= 12  # ~10 at 0.1 s
    assert src.polls <= 1.5 * len(snaps) + 2  # busy polling would make thousands; two a snapshot, 20
    assert loop.model.records == src.it  # nothing skipped


def test_after_a_quiet_interval_the_thread_waits_for_the_first_message_again() -> None:
    """The stream stops for longer than a snapshot interval: the thread goes back to one long
    poll that returns with the first message (not a poll at every due time), and that message
    is snapshotted."""

    class PausingSource(TrickleSource):  # test-only: three batches, a pause, then one more
        resume = threading.Event()

        def poll(self, timeout_s: float) -> list[object]:
            if self.it < 3:
                return super().poll(timeout_s)
            self.polls += 1
            if self.resume.wait(timeout_s):
                self.resume.clear()
                self.polls -= 1  # counted by super() again
                return super().poll(timeout_s)
            return []

    src = PausingSource()
    snaps: list[Any] = []
    loop = IngestLoop(src, RunModel(), on_snapshot=snaps.append, interval_s=0.1, poll_s=5.0)
    loop.start()
    try:
        deadline = time.monotonic() + 10
        while (not snaps or snaps[-1].records < 3) and time.monotonic() < deadline:
            time.sleep(0.01)
        polls = src.polls
        time.sleep(1.0)  # quiet for ten intervals
        quiet_polls = src.polls - polls
        PausingSource.resume.set()
        while snaps[-1].records < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        loop.stop()
        PausingSource.resume.set()
        loop.join(6)
    assert snaps[-1].records == 4
    assert quiet_polls <= 2  # one due-time poll finds nothing, then one long poll (10 if it kept waking)


def test_a_backlog_is_drained_without_waiting_for_the_snapshot() -> None:
    """A poll that returns a whole chunk (a backlog) is followed by the next poll at once."""
    from tui.ingest.loop import APPLY_CHUNK

    src = TrickleSource(per_poll=APPLY_CHUNK)
    snaps: list[Any] = []
    loop = IngestLoop(src, RunModel(), on_snapshot=snaps.append, interval_s=0.5)
    run_for(loop, 1.0)
    assert src.polls > 4 * max(1, len(snaps))  # gathering would poll ~2 times per 0.5 s snapshot
    assert loop.model.records == src.it
