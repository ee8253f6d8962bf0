"""Recording file format: round trip, crash safety (cut anywhere, SIGKILL), corruption,
not-a-recording, a full disk, compactness; and the Recorder sink's behaviour."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from recording_synth import T0, assert_same_message, hello, synth_run, telem, write_recording

from tui.ingest.interfaces import RecordingStatus
from tui.recordings.codec import FORMAT_VERSION
from tui.recordings.reader import RecordingError, open_recording
from tui.recordings.recorder import CLOCK_SOURCE, Recorder
from tui.recordings.writer import default_path
from workers.wire import protocol as p

TESTS = Path(__file__).parent
ROOT = TESTS.parent


@pytest.fixture(scope="module")
def small() -> tuple[list, bytes, list]:
    """A 6 s, 4-rank synthetic run written as a recording: (items, file bytes, chunk infos)."""
    items = list(synth_run(duration_s=6.0, world=4))
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "small.commtop"
        write_recording(path, items, chunk_s=0.5)
        data = path.read_bytes()
        with open_recording(path) as rec:
            chunks = list(rec.chunks)
    return items, data, chunks


def read_all(path: Path) -> tuple[list, object]:
    rec = open_recording(path)
    got = list(rec.messages())
    return got, rec


def test_round_trip_gives_the_same_messages_and_receive_times(tmp_path: Path, small) -> None:
    items, data, chunks = small
    path = tmp_path / "r.commtop"
    path.write_bytes(data)
    got, rec = read_all(path)
    assert rec.complete and rec.problems == [] and rec.summary() == ""
    assert len(got) == len(items)
    for (t1, a), (t2, b) in zip(items, got, strict=True):
        assert t1 == t2
        assert_same_message(a, b)
    kinds = {type(m).__name__ for _, m in got}
    assert kinds == {"Batch", "Hello", "Bye", "dict"}
    assert rec.records == sum(len(m) for _, m in items if isinstance(m, p.Batch))
    assert rec.meta["schema_version"] == p.SCHEMA_VERSION
    assert rec.meta["ranks"] == [0, 1, 2, 3] and rec.meta["hosts"] == ["node0"]
    assert rec.format_version == FORMAT_VERSION


def test_round_trip_keeps_odd_values_exactly(tmp_path: Path) -> None:
    """NaN/inf durations, bandwidths that do not follow the formula, huge jumps, numpy in dicts."""
    n = 7
    cols = {
        "iteration": np.array([0, 1, 2, 10**12, -5, 3, 4], dtype="<i8"),
        "step": np.zeros(n, dtype="<i8"),
        "epoch": np.array([0, 0, 1, 1, 2, 2, 2], dtype="<i4"),
        "mode": np.array([0, 1, 2, 3, 0, 1, 2], dtype="u1"),
        "op": np.arange(n, dtype="u1"),
        "group": np.zeros(n, dtype="<u2"),
        "dtype": np.zeros(n, dtype="u1"),
        "nbytes": np.array([1, 2**40, 3, 0, 5, 6, 7], dtype="<i8"),
        "host_ns": np.array([T0, 0, -1, 2**62, T0, T0, T0], dtype="<i8"),
        "start_ns": np.array([T0, T0 + 1, T0 - 10**15, 0, T0, T0, 2**62], dtype="<i8"),
        "dur_us": np.array([1.5, np.nan, np.inf, -0.0, 0.0, 1e-30, 3e38], dtype="<f4"),
        "algbw": np.array([7.0, np.nan, 1.0, 2.0, 3.0, -1.0, 0.0], dtype="<f4"),
        "busbw": np.array([0.0, 1.0, 2.0, np.nan, 4.0, 5.0, 6.0], dtype="<f4"),
    }
    batch = p.Batch(p.COLL, 3, 9, 4, cols, epoch_in_force=2, pending_epoch=3, apply_at=640, t_ns=T0)
    empty = p.Batch(p.COPY, 1, 0, 0, {k: np.zeros(0, dtype=d) for k, d in p.COPY_COLUMNS.items()})
    body = telem(2, T0, 1, 54.0, 1980.0)
    body["extra"] = np.arange(3, dtype=np.float32)
    items = [(T0, batch), (T0 + 5, empty), (T0 + 5, body), (T0 + 7, p.Bye(3, -9, "killed", T0))]
    path = tmp_path / "odd.commtop"
    write_recording(path, items)
    got, rec = read_all(path)
    assert rec.complete
    assert [t for t, _ in got] == [t for t, _ in items]
    for (_, a), (_, b) in zip(items, got, strict=True):
        assert_same_message(a, b)


def test_every_column_is_in_the_table_with_rank_and_receive_time(tmp_path: Path, small) -> None:
    items, data, _ = small
    path = tmp_path / "r.commtop"
    path.write_bytes(data)
    tables = open_recording(path).tables()
    batches = [(t, m) for t, m in items if isinstance(m, p.Batch) and m.kind == p.COLL]
    for name in p.COLL_COLUMNS:
        want = np.concatenate([m.columns[name] for _, m in batches])
        assert tables.coll[name].tobytes() == want.astype(p.COLL_COLUMNS[name]).tobytes()
    assert tables.coll["rank"].tolist() == [m.rank for _, m in batches for _ in range(len(m))]
    assert tables.coll["recv_ns"].tolist() == [t for t, m in batches for _ in range(len(m))]
    assert len(tables.copy["gbps"]) == sum(len(m) for _, m in items if isinstance(m, p.Batch) and m.kind == p.COPY)
    assert len(tables.hellos) == sum(isinstance(m, p.Hello) for _, m in items)
    telem = [(t, m) for t, m in items if isinstance(m, dict) and m.get("k") == p.TELEM]
    assert [(t, tick.seq) for t, tick in tables.ticks] == [(t, m["seq"]) for t, m in telem] and telem
    assert tables.other == []  # every TELEM is decoded once, into ticks
    only = open_recording(path).tables(coll_columns=("epoch",)).coll
    assert set(only) == {"epoch", "rank"}
    assert only["epoch"].tolist() == tables.coll["epoch"].tolist()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(frac=st.floats(0.0, 1.0))
def test_a_recording_cut_at_any_byte_keeps_every_complete_frame(small, frac: float) -> None:
    items, data, chunks = small
    cut = int(frac * len(data))
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "cut.commtop"
        path.write_bytes(data[:cut])
        if cut < chunks[0].offset:  # inside the magic or the header frame (the first chunk follows it)
            with pytest.raises(RecordingError, match="not a commtop recording|ends inside its header"):
                open_recording(path)
            return
        got, rec = read_all(path)
    whole = [c for c in chunks if c.end <= cut]
    assert len(got) == sum(c.messages for c in whole)
    for (t1, a), (t2, b) in zip(items, got, strict=False):
        assert t1 == t2
        assert_same_message(a, b)
    assert rec.problems == []
    if cut < len(data):
        assert not rec.complete
        assert "recording incomplete" in rec.summary()
    else:
        assert rec.complete


def test_a_flipped_byte_is_reported_with_its_offset_and_the_rest_is_read(tmp_path: Path, small) -> None:
    items, data, chunks = small
    for victim, where in ((chunks[3], "body"), (chunks[5], "length")):
        broken = bytearray(data)
        offset = victim.offset + 6 if where == "length" else (victim.body + victim.end) // 2
        broken[offset] ^= 0x40
        path = tmp_path / f"flip-{where}.commtop"
        path.write_bytes(bytes(broken))
        got, rec = read_all(path)
        assert rec.problems == [f"corrupt frame at byte {victim.offset}: skipped {victim.end - victim.offset} bytes"]
        assert rec.complete  # the trailer is intact; only one frame was lost
        assert f"byte {victim.offset}" in rec.summary()
        expected = [it for c in chunks if c is not victim for it in _chunk_items(items, chunks, c)]
        assert len(got) == len(expected) == len(items) - victim.messages
        for (t1, a), (t2, b) in zip(expected, got, strict=True):
            assert t1 == t2
            assert_same_message(a, b)


def _chunk_items(items: list, chunks: list, chunk) -> list:
    start = sum(c.messages for c in chunks[: chunks.index(chunk)])
    return items[start : start + chunk.messages]


def test_garbage_in_the_middle_is_skipped(tmp_path: Path, small) -> None:
    items, data, chunks = small
    at = chunks[2].offset
    path = tmp_path / "garbage.commtop"
    path.write_bytes(data[:at] + os.urandom(1000) + data[at:])
    got, rec = read_all(path)
    assert rec.problems == [f"corrupt frame at byte {at}: skipped 1000 bytes"]
    assert len(got) == len(items)


@pytest.mark.parametrize(
    "content", [b"", b"hello world\n", b"\x89CMTREC", b"\x89PNG\r\n\x1a\n" + bytes(100), os.urandom(4096)]
)
def test_a_file_that_is_not_a_recording_gets_one_line(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "x.bin"
    path.write_bytes(content)
    with pytest.raises(RecordingError) as err:
        open_recording(path)
    assert str(err.value) == f"{path} is not a commtop recording"


def test_missing_file_directory_and_newer_version_get_one_line(tmp_path: Path, small) -> None:
    with pytest.raises(RecordingError, match="cannot read .*nope.commtop: No such file"):
        open_recording(tmp_path / "nope.commtop")
    with pytest.raises(RecordingError, match="is a directory"):
        open_recording(tmp_path)
    data = bytearray(small[1])
    data[8] = FORMAT_VERSION + 1
    (tmp_path / "new.commtop").write_bytes(bytes(data))
    with pytest.raises(RecordingError, match=f"version {FORMAT_VERSION + 1} recording; this commtop reads"):
        open_recording(tmp_path / "new.commtop")


def test_synthetic_100k_records_take_at_most_16_bytes_each(tmp_path: Path) -> None:
    items = []
    records = 0
    for item in synth_run(duration_s=120.0, world=8, telemetry=True, seed=3):
        items.append(item)
        records += len(item[1]) if isinstance(item[1], p.Batch) and item[1].kind == p.COLL else 0
        if records >= 100_000:
            break
    path = tmp_path / "big.commtop"
    write_recording(path, items, chunk_s=1.0)
    rec = open_recording(path)
    coll = sum(len(m) for _, m in items if isinstance(m, p.Batch) and m.kind == p.COLL)
    assert coll >= 100_000
    per_record = path.stat().st_size / coll  # everything in the file, charged to the collectives
    assert per_record <= 16, per_record
    assert rec.records == sum(len(m) for _, m in items if isinstance(m, p.Batch))


# --------------------------------------------------------------------------- Recorder (the sink)


def feed(recorder: Recorder, items: list) -> None:
    for _, msg in items:
        recorder.write(msg)


def test_recorder_round_trip_status_and_metadata(tmp_path: Path) -> None:
    items = list(synth_run(duration_s=3.0, world=2))
    recorder = Recorder(collective="all_gather", directory=tmp_path / "recs", flush_s=0.05)
    early = hello(0, 2, 0, synth_epoch(), T0)
    recorder.write(early)  # seen before recording starts: becomes metadata and the first message
    assert recorder.status() == RecordingStatus(active=False)
    path = Path(recorder.start())
    assert path.parent == tmp_path / "recs" and path.name.endswith("-all_gather.commtop")
    feed(recorder, items)
    deadline = time.monotonic() + 5
    while recorder.status().bytes_written < 5000 and time.monotonic() < deadline:
        time.sleep(0.02)
    status = recorder.status()
    assert status.active and status.path == str(path) and status.error == ""
    assert status.bytes_written == path.stat().st_size > 5000  # flushed while recording
    assert status.elapsed_s > 0
    recorder.stop()
    assert not recorder.status().active
    got, rec = read_all(path)
    assert rec.complete
    assert rec.meta["clock"] == CLOCK_SOURCE and rec.meta["schema_version"] == p.SCHEMA_VERSION
    assert rec.meta["ranks"] == [0, 1] and rec.meta["config"]["collective"] == "all_gather"
    assert rec.header["ranks"] == [0]  # known at start: the one Hello seen before
    assert_same_message(got[0][1], early)
    assert len(got) == len(items) + 1
    for (_, a), (_, b) in zip(items, got[1:], strict=True):
        assert_same_message(a, b)
    times = [t for t, _ in got]
    assert times == sorted(times)


def synth_epoch():
    from recording_synth import Epoch

    return Epoch(0.0, "none")


def test_default_path_names_date_host_collective_and_never_overwrites(tmp_path: Path) -> None:
    now = time.mktime((2026, 12, 2, 9, 30, 5, 0, 0, -1))
    first = default_path(tmp_path, "all_gather", host="node/7", now=now)
    assert first.name == "20261202-093005-node_7-all_gather.commtop"
    first.write_bytes(b"")
    assert (
        default_path(tmp_path, "all_gather", host="node/7", now=now).name
        == "20261202-093005-node_7-all_gather-1.commtop"
    )


def test_recorder_that_cannot_open_its_file_reports_it(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    recorder = Recorder(directory=tmp_path)
    recorder.start(str(tmp_path / "file" / "sub.commtop"))
    status = recorder.status()
    assert not status.active and status.error.startswith("cannot record to")
    recorder.write(hello(0, 1, 0, synth_epoch(), T0))  # still a harmless sink


def test_a_slow_disk_drops_messages_and_says_so(tmp_path: Path) -> None:
    items = [m for m in synth_run(duration_s=2.0, world=2) if isinstance(m[1], p.Batch)]
    recorder = Recorder(directory=tmp_path, flush_s=1.0, max_pending_records=200)
    recorder.start()
    feed(recorder, items)  # far more than 200 records before the writer wakes up
    assert "messages not recorded" in recorder.status().error
    recorder.stop()
    got, rec = read_all(Path(recorder.status().path))
    assert rec.complete and 0 < sum(len(m) for _, m in got) <= 200
    assert rec.trailer["lost_messages"] > 0


def test_a_chunk_is_written_once_enough_records_wait_not_only_at_the_interval(tmp_path: Path) -> None:
    """Chunks are seconds apart (few chunks read fast); a busy run writes one as soon as
    ``chunk_records`` wait, so the memory bound holds and a chunk stays a few MB."""
    items = [m for m in synth_run(duration_s=2.0, world=2) if isinstance(m[1], p.Batch)]
    recorder = Recorder(directory=tmp_path, flush_s=10.0, chunk_records=100)
    path = Path(recorder.start())
    empty = path.stat().st_size  # the header
    feed(recorder, items)
    deadline = time.monotonic() + 8.0  # well inside flush_s: only the count can have woken it
    while path.stat().st_size == empty and time.monotonic() < deadline:
        time.sleep(0.02)
    grown = path.stat().st_size > empty
    recorder.stop()
    assert grown
    got, rec = read_all(path)
    assert rec.complete and sum(len(m) for _, m in got if isinstance(m, p.Batch)) == sum(len(m) for _, m in items)


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[tuple[Path, object]]:
    """A real 64 KiB tmpfs (needs root and mount); else a FakeFullDisk file object."""
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    mounted = (
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], capture_output=True).returncode
        == 0
    )
    try:
        yield mnt, None if mounted else FakeFullDisk.opener(64 * 1024)
    finally:
        if mounted:
            subprocess.run(["umount", str(mnt)], check=True)


class FakeFullDisk:
    """A file whose writes fail with ENOSPC after ``room`` bytes (used only without mount)."""

    def __init__(self, path: str, room: int) -> None:
        self._f = open(path, "wb")  # noqa: SIM115
        self.room = room

    @classmethod
    def opener(cls, room: int):
        return lambda path, mode: cls(path, room)

    def write(self, data: bytes) -> int:
        if len(data) > self.room:
            self._f.write(data[: self.room])
            self.room = 0
            raise OSError(28, os.strerror(28))
        self.room -= len(data)
        return self._f.write(data)

    def flush(self) -> None:
        self._f.flush()

    def fileno(self) -> int:
        return self._f.fileno()

    def close(self) -> None:
        self._f.close()


@pytest.mark.e2e
def test_a_full_disk_stops_recording_visibly_and_the_run_goes_on(tiny_disk) -> None:
    mnt, opener = tiny_disk
    recorder = Recorder(directory=mnt, flush_s=0.02, opener=opener)
    recorder.start()
    source = synth_run(duration_s=600.0, world=8, seed=5)
    deadline = time.monotonic() + 20
    while not recorder.status().error and time.monotonic() < deadline:
        for _ in range(50):
            recorder.write(next(source)[1])
        time.sleep(0.005)
    status = recorder.status()
    assert status.error == "No space left on device: recording stopped"
    assert not status.active
    t = time.perf_counter()
    for _ in range(1000):
        recorder.write(next(source)[1])  # the ingest thread keeps calling: cheap no-ops
    assert time.perf_counter() - t < 1.0
    recorder.stop()
    path = Path(recorder.status().path)  # named after what ran (its collective) once it ended
    assert path.name.endswith("-all_gather.commtop")
    got, rec = read_all(path)
    rec.close()  # before the tmpfs is unmounted
    assert not rec.complete and rec.truncated_at is not None
    assert len(got) > 0 and "recording incomplete" in rec.summary()


# --------------------------------------------------------------------------- SIGKILL

WRITER = """
import sys, time
sys.path[:0] = [{tests!r}, {root!r}]
from recording_synth import synth_run
from tui.recordings.recorder import Recorder
rec = Recorder(flush_s=0.05)
rec.start({path!r})
for i, (_, msg) in enumerate(synth_run(duration_s=120.0, world=4, seed=9)):
    rec.write(msg)
    if i == 400:
        print("ready", flush=True)
    time.sleep(0.0005)
"""


@pytest.mark.e2e
def test_sigkill_of_a_writing_process_leaves_a_readable_recording(tmp_path: Path) -> None:
    path = tmp_path / "killed.commtop"
    code = WRITER.format(tests=str(TESTS), root=str(ROOT), path=str(path))
    with subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
            # 0.3 s (6 flush intervals) and the file grown 3 times after "ready": a starved writer
            # still gets to write messages past 400 before the kill
            size, grown, deadline = path.stat().st_size, 0, time.monotonic() + 10
            min_end = time.monotonic() + 0.3
            while (grown < 3 or time.monotonic() < min_end) and time.monotonic() < deadline:
                time.sleep(0.01)
                if path.stat().st_size > size:
                    size, grown = path.stat().st_size, grown + 1
            os.kill(proc.pid, signal.SIGKILL)
        finally:
            proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    got, rec = read_all(path)
    assert not rec.complete and "recording incomplete" in rec.summary()
    assert rec.problems == []
    assert len(got) > 400
    for (_, a), (_, b) in zip(synth_run(duration_s=120.0, world=4, seed=9), got, strict=False):
        assert_same_message(a, b)


def test_a_chunk_whose_counts_cannot_be_true_is_skipped_not_allocated(tmp_path: Path, small) -> None:
    """A checksummed chunk claiming 4 billion records (only a bug can write one) costs no memory."""
    from tui.recordings.codec import CHUNK, CHUNK_PREFIX
    from tui.recordings.writer import _frame

    items, data, chunks = small
    bogus = _frame(CHUNK, CHUNK_PREFIX.pack(T0, T0, 1, 2**32 - 1, 0) + b"\0" * 16)
    at = chunks[1].offset
    path = tmp_path / "bogus.commtop"
    path.write_bytes(data[:at] + bogus + data[at:])
    got, rec = read_all(path)
    assert rec.problems == [f"implausible chunk at byte {at}: skipped"]
    assert len(got) == len(items) and len(rec.tables().coll["rank"]) == sum(c.coll_records for c in rec.chunks)


def test_the_chunk_interval_comes_from_the_environment_and_a_bad_one_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tui.recordings.recorder import FLUSH_S

    assert Recorder().flush_s == FLUSH_S
    monkeypatch.setenv("COMMTOP_RECORD_FLUSH_S", "0.5")
    assert Recorder().flush_s == 0.5
    for bad in ("soon", "0", "60", "nan"):
        monkeypatch.setenv("COMMTOP_RECORD_FLUSH_S", bad)
        assert Recorder().flush_s == FLUSH_S
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "COMMTOP_RECORD_FLUSH_S" in err


def test_a_recording_no_rank_reported_to_is_removed_with_one_line(tmp_path: Path, capsys) -> None:
    """A job that never started (a script that fails before init_process_group) leaves no empty
    recording behind; its log, beside where the recording was, says why."""
    recorder = Recorder(directory=tmp_path)
    path = Path(recorder.start())
    recorder.write({"k": p.TELEM_CAPS, "host": "node"})  # the node's telemetry is no rank's
    recorder.stop()
    recorder.stop()  # a second stop (close after a hang-up) changes nothing
    assert not path.exists() and list(tmp_path.iterdir()) == []
    assert capsys.readouterr().err.count(f"the empty recording {path} was removed") == 1
    kept = Recorder(directory=tmp_path)
    kept.start()
    kept.write(hello(0, 1, 0, synth_epoch(), T0))
    kept.stop()
    assert Path(kept.status().path).exists()
