"""The Flight Recorder decoded in a child process (workers.capture.fr_child): its frames, the cursor
it hands over, its answers, and the records the rank makes of them without a Python object per
collective. On a FAKE ring (tests/fake_flight_recorder.py) and fake dump readers; the real child
against torch's real worker server is tests/test_fr_gloo_ring.py."""

from __future__ import annotations

import json
import os
import pickle
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fake_flight_recorder import FakeRing

from workers.capture.flight_recorder import FrCursor, load_dump, read_all
from workers.capture.fr_batch import FR_ROW, FrBatch, batch_of, decode, encode
from workers.capture.fr_child import answer, serve
from workers.capture.fr_source import FlightRecorderSource, LocalDecoder
from workers.capture.rows import RowMaker, StepTimeline
from workers.monitor.records import MONITOR_COLL_ROW, OP_INDEX, MonitorBatcher
from workers.rank.groups import GroupTable
from workers.rank.publisher import NullPublisher
from workers.wire.protocol import COLL, MAX_BATCH_RECORDS

ROOT = Path(__file__).resolve().parent.parent


class FakeDump:
    """A DumpReader over the fake ring (pickled as torch's dump is); ``fail`` makes fetch raise."""

    how = "a fake ring"

    def __init__(self, ring: FakeRing) -> None:
        self.ring = ring
        self.fail = False

    def fetch(self) -> bytes:
        if self.fail:
            raise OSError("worker server: connection refused")
        return pickle.dumps(self.ring.dump(), protocol=2)

    def decode(self, raw: bytes) -> dict:
        return load_dump(raw)


def busy_ring(n: int, size: int = 4096) -> FakeRing:
    """``n`` finished collectives on two groups, three ops and sizes, one still running."""
    ring = FakeRing(size=size, world=4)
    ring.group("7", "tp", 2)
    for i in range(n):
        if i % 3 == 0:
            ring.collective("nccl:all_reduce", [[1024]], [[1024]], "Float")
        elif i % 3 == 1:
            ring.collective("nccl:_allgather_base", [[256]], [[1024]], "BFloat16", pg="7")
        else:
            ring.collective("nccl:broadcast", [[8]], [[8]], "Long")
    ring.complete(duration_ms=0.25)
    ring.collective("nccl:all_reduce", [[4]], [[4]], "Float")  # still running
    return ring


def test_a_frame_carries_the_rows_groups_and_cursor_of_a_read() -> None:
    ring = busy_ring(30)
    rows, cursor = read_all([ring.dump()])
    batch = decode(encode(batch_of(rows, cursor, len(ring.entries))))
    assert len(batch) == 30 and batch.held == 31 and batch.error == ""
    assert batch.groups == [("0", "default_pg", 4), ("7", "tp", 2)]
    assert [batch.groups[g][0] for g in batch.rows["group"]] == [r.pg for r in rows]
    assert batch.rows["op"].tolist() == [OP_INDEX[r.op] for r in rows]
    assert batch.rows["nbytes"].tolist() == [r.nbytes for r in rows]
    assert batch.rows["host_ns"].tolist() == [r.host_ns for r in rows]
    assert batch.rows["dur_us"].tolist() == pytest.approx([250.0] * 30)
    assert FrCursor.from_state(batch.state).state() == cursor.state()
    empty = decode(encode(FrBatch(state=cursor.state(), error="boom")))
    assert len(empty) == 0 and empty.error == "boom"


@pytest.mark.parametrize(
    ("frame", "says"),
    [
        (b"\x01\x00", "too short"),
        (b"\xff\xff\xff\x7f\x00\x00\x00\x00", "not a Flight Recorder frame"),
        (b"\x02\x00\x00\x00\x00\x00\x00\x00{}", "header is unreadable"),
        (b"\x02\x00\x00\x00\x00\x00\x00\x00{}extra", "bytes, not"),
        (b"\x00\x00\x00\x00\x05\x00\x00\x00", "not a Flight Recorder frame"),  # not whole rows
    ],
)
def test_a_broken_frame_is_one_clear_error(frame: bytes, says: str) -> None:
    with pytest.raises(ValueError, match=says) as info:
        decode(frame)
    assert "\n" not in str(info.value)


def test_a_frame_naming_a_group_it_does_not_list_is_refused() -> None:
    rows = np.zeros(1, FR_ROW)
    rows["group"] = 3
    with pytest.raises(ValueError, match="names a group it does not list"):
        decode(encode(FrBatch(rows, [("0", "default_pg", 2)], {}, 1)))


def test_a_cursor_restored_from_its_state_goes_on_as_if_it_had_never_stopped() -> None:
    """The child's cursor crosses the pipe after every read; a rank that takes over from it
    reads nothing twice and loses nothing more than the child would have."""
    ring = FakeRing(size=64, world=2)
    whole, handed = FrCursor(), FrCursor()
    got_whole: list[Any] = []
    got_handed: list[Any] = []
    for round_ in range(12):
        for i in range(40 if round_ != 6 else 100):  # round 6 overwrites part of the ring unread
            ring.collective("nccl:all_reduce", [[i + 1]], [[i + 1]], done=i % 7 != 0)
        ring.coalescing_block([("nccl:all_reduce", [[8]], [[8]]), ("nccl:all_reduce", [[8]], [[8]])], "Float")
        ring.send(1, 16)
        ring.complete(upto=ring.next_id - 5)  # the newest few still running
        if round_ == 5:
            continue  # nobody reads this round
        dump = ring.dump()
        got_whole += whole.read(dump)
        got_handed += handed.read(dump)
        handed = FrCursor.from_state(json.loads(json.dumps(handed.state())))  # across a pipe
    assert got_handed == got_whole and len(got_whole) > 300
    issued = dict(ring.status()["pg_status"])
    counts = {g: int(v["last_enqueued_collective"]) for g, v in issued.items()}
    assert handed.finish(counts) == whole.finish(counts)
    assert handed.state() == whole.state() and handed.overwritten > 0 and handed.p2p > 0


def test_a_state_that_is_not_a_cursor_s_is_refused() -> None:
    for bad in ({}, {"groups": {"0": [1]}}, {**FrCursor().state(), "counts": [1, 2]}):
        with pytest.raises(ValueError, match="not a Flight Recorder cursor state"):
            FrCursor.from_state(bad)


def test_the_child_answers_read_and_finish_and_says_what_it_cannot_do() -> None:
    ring = busy_ring(10)
    dump = FakeDump(ring)
    decoder = LocalDecoder(dump)
    first = answer("read\n", decoder)
    assert len(first) == 10 and first.error == "" and decoder.cursor.pending == 1
    assert len(answer("read", decoder)) == 0  # each collective once
    ring.complete()
    assert len(answer("read", decoder)) == 1
    done = answer('finish {"0": 10, "7": 3}', decoder)  # group 0 issued 2 more that no read saw
    assert done.error == "" and FrCursor.from_state(done.state).unread == 2
    assert answer("jump", decoder).error == "unknown request 'jump'"
    assert answer("state {}", decoder).error == "unknown request 'state'"  # the rank never sends one
    dump.fail = True
    failed = answer("read", decoder)
    assert failed.error == "OSError: worker server: connection refused" and failed.state == decoder.cursor.state()
    assert answer("finish {nope", decoder).error.startswith("JSONDecodeError")


def test_serve_answers_each_request_with_one_frame_and_ends_at_eof() -> None:
    ring = busy_ring(20)
    req_r, req_w = os.pipe()
    rep_r, rep_w = os.pipe()
    os.write(req_w, b"read\nread\nfinish null\n")
    os.close(req_w)
    with os.fdopen(req_r, "rb") as rfile, os.fdopen(rep_w, "wb") as wfile:
        serve(FakeDump(ring), rfile, wfile, os.getppid())  # returns at EOF
    with os.fdopen(rep_r, "rb") as replies:
        data = replies.read()
    frames = []
    while data:
        h, a = int.from_bytes(data[:4], "little"), int.from_bytes(data[4:8], "little")
        frames.append(decode(data[: 8 + h + a]))
        data = data[8 + h + a :]
    assert [len(f) for f in frames] == [20, 0, 0] and all(f.error == "" for f in frames)
    assert FrCursor.from_state(frames[-1].state).unread == 1  # the running one: never seen finished


def test_a_read_becomes_records_with_their_steps_groups_and_iterations() -> None:
    ring = busy_ring(40)
    rows, cursor = read_all([ring.dump()])
    timeline = StepTimeline()
    timeline.mark(rows[10].host_ns, 0)
    timeline.mark(rows[25].host_ns, 1)
    groups = GroupTable()
    groups.world(("0", "default_pg", 4))
    maker = RowMaker(timeline, groups)
    maker.iteration = 100
    arr = maker.coll_array(decode(encode(batch_of(rows, cursor, 41))), epoch=3, mode=1)
    assert arr.dtype == MONITOR_COLL_ROW and len(arr) == 40 and maker.iteration == 140
    assert arr["iteration"].tolist() == list(range(100, 140))
    assert arr["step"].tolist() == [timeline.step_at(r.host_ns) for r in rows] == [-1] * 10 + [0] * 15 + [1] * 15
    assert arr["group"].tolist() == [0 if r.pg == "0" else 1 for r in rows] and groups.table[1] == ("7", "tp", 2)
    assert set(arr["epoch"].tolist()) == {3} and set(arr["mode"].tolist()) == {1}
    assert arr["start_ns"].tolist() == arr["host_ns"].tolist() == [r.host_ns for r in rows]
    assert arr["ranks"].tolist() == [r.ranks for r in rows]
    assert len(maker.coll_array(FrBatch(), 0, 0)) == 0 and maker.iteration == 140


def test_steps_at_agrees_with_step_at() -> None:
    timeline = StepTimeline(capacity=50)
    rng = random.Random(7)
    t = 1000
    for step in range(80):  # more marks than it keeps: the oldest are gone
        t += rng.randint(1, 100)
        timeline.mark(t, step)
    times = np.array([rng.randint(0, t + 200) for _ in range(500)], np.int64)
    assert timeline.steps_at(times).tolist() == [timeline.step_at(int(x)) for x in times]
    assert StepTimeline().steps_at(times[:3]).tolist() == [-1, -1, -1]


class KeepingPublisher(NullPublisher):
    """A FAKE publisher (no socket) that keeps every batch."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[tuple[str, dict, int]] = []

    def publish(self, kind, columns, n, status) -> bool:
        self.batches.append((kind, columns, n))
        return True


def records(n: int, first: int = 0) -> np.ndarray:
    arr = np.zeros(n, MONITOR_COLL_ROW)
    arr["iteration"] = np.arange(first, first + n)
    arr["nbytes"] = 1 << 20
    arr["dur_us"] = 100.0
    arr["ranks"] = 4
    arr["op"] = OP_INDEX["all_reduce"]
    return arr


def test_arrays_are_batched_with_rows_in_order_and_split_at_the_wire_s_limit() -> None:
    pub = KeepingPublisher()
    b = MonitorBatcher(pub, lambda: None, batch_ms=1e9, max_records=100)
    b.add_array(records(60))
    assert not b.due()
    b.add_array(records(50, first=60))
    assert b.due()  # 110 records waiting: a batch is due
    b.coll_rows.append(tuple(records(1, first=110)[0].tolist()))
    b.flush()
    assert [(k, n) for k, _c, n in pub.batches] == [(COLL, 111)]
    cols = pub.batches[0][1]
    assert cols["iteration"].tolist() == list(range(111))
    assert cols["busbw"][0] == pytest.approx(cols["algbw"][0] * 2 * 3 / 4)  # all_reduce on 4 ranks
    assert not b.coll_arrays and b.array_records == 0 and not b.coll_rows
    pub.batches.clear()
    b.add_array(records(MAX_BATCH_RECORDS + 5))
    b.flush()
    assert [n for _k, _c, n in pub.batches] == [MAX_BATCH_RECORDS, 5]


def test_the_source_falls_back_to_the_rank_from_the_child_s_cursor() -> None:
    """A decoder that fails hands over to the next reader, which starts from its cursor."""
    ring = busy_ring(10)

    class Dying(LocalDecoder):
        def read_batch(self) -> FrBatch:
            if self.cursor.last_record >= 0:
                raise OSError("decoder child: the decoder child ended")
            return super().read_batch()

    dying = Dying(FakeDump(ring))
    dying.how = "a decoder that dies"
    source = FlightRecorderSource(dying, ring.status, 64, fallbacks=[FakeDump(ring)])
    assert len(source.read(0.0)) == 10 and source.how == "a decoder that dies"
    ring.complete()
    for _ in range(5):
        ring.collective("nccl:all_reduce", [[4]], [[4]], done=True)
    assert len(source.read(1.0)) == 6 and source.how == "a fake ring"  # the running one + 5: none twice
    assert source.finish() == 0 and source.lost == 0


@pytest.mark.e2e
def test_the_child_ends_when_its_rank_is_killed(tmp_path: Path) -> None:
    """A rank killed by SIGKILL leaves no decoder child behind."""
    code = (
        "import sys, time\n"
        "from workers.capture.fr_child import ChildDecoder\n"
        f"d = ChildDecoder({str(tmp_path / 'none.sock')!r})\n"
        "print(d.proc.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    rank = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert rank.stdout is not None
    child = int(rank.stdout.readline())
    os.kill(child, 0)  # it runs
    rank.send_signal(signal.SIGKILL)
    rank.wait()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        os.kill(child, signal.SIGKILL)
        pytest.fail("the decoder child outlived its rank")


@pytest.mark.e2e
def test_the_child_outlives_a_stop_signal_and_ends_with_its_rank(tmp_path: Path) -> None:
    """SIGTERM and SIGINT reach the job's whole group at a stop: the decoder child lives on for
    the rank's last read (it used to die of them), then ends when the rank closes its pipe."""
    from workers.capture.fr_child import ChildDecoder

    decoder = ChildDecoder(str(tmp_path / "none.sock"))
    proc = decoder.proc
    assert proc is not None
    time.sleep(0.5)  # (a signal before its handlers are set would end it: not what is tested)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:  # started: python and the imports take a while under load
        status = Path(f"/proc/{proc.pid}/status").read_text()
        ignored = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigIgn:")), 16)
        if ignored & (1 << (signal.SIGTERM - 1)) and ignored & (1 << (signal.SIGINT - 1)):
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.3)
    assert proc.poll() is None  # still there
    decoder.close()
    assert proc.wait(timeout=15) == 0
