"""Chunk compression: new recordings in zstd, the committed zlib ones still read the same, and
a machine without the zstandard package writes zlib and says in one line what a zstd chunk needs."""

from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np
import pytest
from recording_synth import synth_run

from tui.recordings import compression
from tui.recordings.compression import FLAG_ZLIB, FLAG_ZSTD, CompressionError, compress, decompress
from tui.recordings.reader import open_recording
from tui.recordings.writer import RecordingWriter
from workers.wire import protocol as p

ROOT = Path(__file__).resolve().parent.parent


def _write(path: Path, seconds: float = 3.0) -> int:
    """A synthetic run in 0.5 s chunks; returns the records written."""
    with open(path, "wb") as f:
        writer = RecordingWriter(f, {"schema_version": p.SCHEMA_VERSION})
        chunk: list = []
        for item in synth_run(duration_s=seconds, world=2, seed=3):
            if chunk and item[0] - chunk[0][0] >= 5e8:
                writer.write_chunk(chunk)
                chunk = []
            chunk.append(item)
        writer.write_chunk(chunk)
        records = writer.records
        writer.close({"complete": True})
    return records


def test_new_chunks_are_zstd_and_read_back_as_written(tmp_path: Path) -> None:
    path = tmp_path / "new.commtop"
    records = _write(path)
    with open_recording(path) as rec:
        assert {c.flags for c in rec.chunks} == {FLAG_ZSTD}
        tables = rec.tables()
        assert rec.problems == [] and rec.complete
    assert len(tables.coll["dur_us"]) + len(tables.copy["dur_us"]) == records


def test_without_zstandard_chunks_are_zlib_and_read_the_same(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    zstd_path, zlib_path = tmp_path / "zstd.commtop", tmp_path / "zlib.commtop"
    _write(zstd_path)
    monkeypatch.setattr(compression, "_zstd", lambda: None)
    _write(zlib_path)
    monkeypatch.undo()
    with open_recording(zlib_path) as old, open_recording(zstd_path) as new:
        assert {c.flags for c in old.chunks} == {FLAG_ZLIB}
        a, b = old.tables(), new.tables()
    for part in ("coll", "copy"):
        for name in a.coll if part == "coll" else a.copy:
            assert np.array_equal(getattr(a, part)[name], getattr(b, part)[name]), (part, name)


def test_a_zstd_chunk_without_zstandard_is_one_line_and_loses_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "new.commtop"
    _write(path)
    monkeypatch.setattr(compression, "_zstd", lambda: None)
    with open_recording(path) as rec:
        rec.tables()
        assert rec.problems and all("install the zstandard package" in note for note in rec.problems)
        assert len(rec.problems) == len(rec.chunks)  # every chunk said, one line each
        assert all("\n" not in note for note in rec.problems)


def test_the_committed_zlib_recordings_still_read() -> None:
    """Recordings made before zstd (the ones in recordings/) read without a problem."""
    path = ROOT / "recordings" / "h200-ddp_offload-unmodified.commtop"
    with open_recording(path) as rec:
        assert FLAG_ZLIB in {c.flags for c in rec.chunks}
        tables = rec.tables()
        assert rec.problems == [] and len(tables.coll["dur_us"]) > 0


def test_a_body_that_does_not_inflate_is_a_compression_error() -> None:
    body = b"x" * 4096
    for stored, flags in (compress(body), (zlib.compress(body), FLAG_ZLIB)):
        assert decompress(stored, flags) == body
        with pytest.raises(CompressionError):
            decompress(stored[:10] + b"\x00" * 10 + stored[20:], flags)


def test_a_zstd_frame_claiming_more_than_the_limit_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    stored, flags = compress(b"y" * 100_000)
    monkeypatch.setattr(compression, "MAX_INFLATED", 1000)
    with pytest.raises(CompressionError, match="claims 100000 bytes"):
        decompress(stored, flags)


def test_an_incompressible_body_is_stored_as_it_is() -> None:
    body = np.random.default_rng(0).bytes(1000)
    assert compress(body) == (body, 0) and decompress(body, 0) == body
