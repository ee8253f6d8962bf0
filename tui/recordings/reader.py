"""Reading a recording: the file mapped into memory, its frames indexed and checked, every
intact one read (the damaged ones noted with their offsets), and its contents as messages
(for replay) or as whole columns (:mod:`tui.recordings.bulk`, for the report)."""

from __future__ import annotations

import mmap
import os
import zlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from tui.recordings import summary
from tui.recordings.bulk import read_tables
from tui.recordings.codec import (
    CHUNK,
    CHUNK_PREFIX,
    FORMAT_VERSION,
    FRAME,
    HEADER,
    MAGIC,
    MARKER,
    MAX_FRAME,
    PREFIX,
    TRAILER,
    ChunkInfo,
    DecodedChunk,
    Tables,
    _BadChunk,
    _unpack,
    chunk_messages,
    decode_chunk,
)
from tui.recordings.compression import CompressionError, decompress
from workers.wire import protocol as p


class RecordingError(ValueError):
    """The file cannot be read as a recording; the message is one line for the user."""


class Recording:
    """A recording opened for reading. Tolerant: every complete, intact frame is read;
    ``problems`` lists what was skipped (with byte offsets) and ``complete`` is False when
    the trailer is missing (the writer was killed, or the disk filled)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = str(path)
        try:
            with open(self.path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                head = f.read(PREFIX.size)
                if len(head) < PREFIX.size or not head.startswith(MAGIC):
                    raise RecordingError(f"{self.path} is not a commtop recording")
                self._data: Any = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except IsADirectoryError:
            raise RecordingError(f"{self.path} is a directory, not a commtop recording") from None
        except OSError as exc:
            raise RecordingError(f"cannot read {self.path}: {exc.strerror or exc}") from None
        _, self.format_version, _ = PREFIX.unpack(head)
        if self.format_version > FORMAT_VERSION:
            self.close()
            raise RecordingError(
                f"{self.path} is a version {self.format_version} recording; this commtop reads version {FORMAT_VERSION}"
            )
        self.size = size
        self.header: dict[str, Any] = {}
        self.trailer: dict[str, Any] | None = None
        self.chunks: list[ChunkInfo] = []
        self.problems: list[str] = []
        self.truncated_at: int | None = None
        self._scan()

    @property
    def complete(self) -> bool:
        return self.trailer is not None and self.truncated_at is None

    @property
    def meta(self) -> dict[str, Any]:
        """Header metadata, updated by the trailer's (it knows every rank that said Hello)."""
        merged = dict(self.header)
        if self.trailer:
            merged.update({k: v for k, v in self.trailer.items() if v not in (None, [], {}, "")})
        return merged

    def summary(self) -> str:
        """One line on the state of the file, for warnings ("" when it is clean)."""
        notes = self.problems[:2] + (
            [f"{len(self.problems) - 2} more damaged frames"] if len(self.problems) > 2 else []
        )
        if self.truncated_at is not None:
            notes.append(f"recording incomplete: cut at byte {self.truncated_at} (writer killed or disk full)")
        elif self.trailer is None:
            notes.append("recording incomplete: no trailer")
        return "; ".join(notes)

    def close(self) -> None:
        data, self._data = self._data, None
        if data is not None:
            data.close()

    def __enter__(self) -> Recording:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- frames
    def _frame_at(self, pos: int) -> tuple[str, int, int, int]:
        """("ok"|"bad"|"short", type, flags, end) of the frame at ``pos``."""
        data = self._data
        if pos + FRAME.size > self.size:
            return "short", 0, 0, 0
        marker, kind, flags, length, crc = FRAME.unpack_from(data, pos)
        if marker != MARKER or kind not in (HEADER, CHUNK, TRAILER) or length > MAX_FRAME:
            return "bad", 0, 0, 0
        end = pos + FRAME.size + length
        if end > self.size:
            return "short", kind, flags, end
        view = memoryview(data)[pos + 4 : end]
        try:
            got = zlib.crc32(view[FRAME.size - 4 :], zlib.crc32(view[:6]))
        finally:
            view.release()
        return ("ok" if got == crc else "bad"), kind, flags, end

    def _resync(self, pos: int) -> int | None:
        """The next offset after ``pos`` where an intact frame starts."""
        q = pos
        while True:
            q = self._data.find(MARKER, q + 1)
            if q < 0:
                return None
            if self._frame_at(q)[0] == "ok":
                return q

    def _scan(self) -> None:
        pos = PREFIX.size
        while pos < self.size:
            state, kind, flags, end = self._frame_at(pos)
            if state == "short":  # the cut-off last frame, or a length field hit by corruption
                if self._resync(pos) is None:
                    self.truncated_at = pos
                    return
                state = "bad"
            if state == "bad":
                nxt = self._resync(pos)
                if nxt is None:
                    self.problems.append(f"corrupt data at byte {pos}: no intact frame after it")
                    self.truncated_at = None if self.trailer else pos
                    return
                self.problems.append(f"corrupt frame at byte {pos}: skipped {nxt - pos} bytes")
                pos = nxt
                continue
            body = pos + FRAME.size
            if kind == CHUNK:
                if end - body < CHUNK_PREFIX.size:
                    self.problems.append(f"empty chunk at byte {pos}")
                else:
                    first, last, messages, n_coll, n_copy = CHUNK_PREFIX.unpack_from(self._data, body)
                    if n_coll + n_copy > messages * p.MAX_BATCH_RECORDS or last < first:
                        self.problems.append(f"implausible chunk at byte {pos}: skipped")  # a bug, not damage
                    else:
                        info = ChunkInfo(
                            pos, body + CHUNK_PREFIX.size, end, flags, first, last, messages, n_coll, n_copy
                        )
                        self.chunks.append(info)
            else:
                try:
                    doc = _unpack(self._data[body:end])
                except Exception:
                    doc = None
                if not isinstance(doc, dict):
                    self.problems.append(f"unreadable {'header' if kind == HEADER else 'trailer'} at byte {pos}")
                elif kind == HEADER:
                    self.header = doc
                else:
                    self.trailer = doc
            pos = end

    # ---- contents
    @property
    def records(self) -> int:
        return sum(c.records for c in self.chunks)

    @property
    def first_ns(self) -> int:
        return self.chunks[0].first_ns if self.chunks else 0

    @property
    def last_ns(self) -> int:
        return self.chunks[-1].last_ns if self.chunks else 0

    def chunk_body(self, info: ChunkInfo) -> bytes:
        """The chunk's body as stored (compressed as ``info.flags`` say: tui.recordings.compression)."""
        body: bytes = self._data[info.body : info.end]
        return body

    def decode(self, info: ChunkInfo, coll_columns: Sequence[str] | None = None) -> DecodedChunk | None:
        """One chunk, or None (and a note in ``problems``) if it does not decode."""
        body: Any = self.chunk_body(info)
        try:
            chunk = decode_chunk(decompress(body, info.flags), coll_columns)
        except (CompressionError, _BadChunk) as exc:
            note = f"undecodable chunk at byte {info.offset}: {exc}"
            if note not in self.problems:
                self.problems.append(note)
            return None
        return chunk

    def messages(self, start: int = 0) -> Iterator[tuple[int, Any]]:
        """(recv_ns, message) for every message from chunk ``start`` on, in arrival order."""
        for info in self.chunks[start:]:
            chunk = self.decode(info)
            if chunk is not None:
                yield from chunk_messages(chunk)

    def tables(
        self,
        coll_columns: Sequence[str] | None = None,
        *,
        summary: bool = False,
        group_by: Callable[[np.ndarray, np.ndarray, np.ndarray], Any] | None = None,
        sparse: Sequence[str] = (),
    ) -> Tables:
        """The whole recording as numpy columns (+ "rank" and "recv_ns" per record).
        ``coll_columns`` limits the collective columns decoded (faster, less memory); "rank"
        always comes, "recv_ns" only when named. ``summary``: also the chunks' collective
        summaries (``Tables.coll_summary``). ``group_by``: called with the collectives' epoch
        and rank columns and the records per batch on a side thread while the others decode
        (``Tables.coll_grouped``). ``sparse``: collective columns read at a few records only
        (``Tables.coll_values``), left encoded where they can be.
        Read in bulk (:mod:`tui.recordings.bulk`): one numpy pass per column over every chunk."""
        return read_tables(self, coll_columns, summary=summary, group_by=group_by, sparse=sparse)

    @property
    def has_summaries(self) -> bool:
        """Whether its writer summarised every chunk's collectives (tui.recordings.summary)."""
        return self.header.get(summary.HEADER_KEY) == summary.VERSION


def open_recording(path: str | os.PathLike[str]) -> Recording:
    """Open a recording for reading; raises RecordingError (one line) if it is not one, or if
    it ends before its header did (nothing in it to report or replay)."""
    rec = Recording(path)
    if not rec.header and not rec.chunks:
        where = f"at byte {rec.truncated_at}" if rec.truncated_at is not None else "damaged"
        rec.close()
        raise RecordingError(f"{rec.path} ends inside its header ({where} of {rec.size}): no records to read")
    return rec
