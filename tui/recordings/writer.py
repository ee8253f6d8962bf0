"""Writing a recording: frames (with their checksums) onto an open file, and the run metadata
of its header. Synchronous and single-threaded; the live recorder (:mod:`tui.recordings.recorder`)
runs it on its own thread."""

from __future__ import annotations

import os
import socket
import struct
import time
import zlib
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import IO, Any

from tui.recordings import summary
from tui.recordings.codec import (
    CHUNK,
    CHUNK_PREFIX,
    FORMAT_VERSION,
    HEADER,
    MAGIC,
    MARKER,
    PREFIX,
    TRAILER,
    _pack,
    encode_chunk,
)
from tui.recordings.compression import compress
from workers.wire import protocol as p

SUFFIX = ".commtop"


def _frame(kind: int, payload: bytes, flags: int = 0) -> bytes:
    head = struct.pack("<BBI", kind, flags, len(payload))
    crc = zlib.crc32(payload, zlib.crc32(head))
    return MARKER + head + struct.pack("<I", crc) + payload


class RecordingWriter:
    """Writes frames to an open binary file. Synchronous; raises OSError (ENOSPC...)."""

    def __init__(self, fileobj: IO[bytes], meta: dict[str, Any], *, level: int = 6) -> None:
        self._f = fileobj
        self._level = level
        self.bytes_written = 0
        self.messages = 0
        self.records = 0
        self.first_ns = 0
        self.last_ns = 0
        meta = {**meta, summary.HEADER_KEY: summary.VERSION}  # every chunk's collectives summarised
        self._put(PREFIX.pack(MAGIC, FORMAT_VERSION, 0) + _frame(HEADER, _pack(meta)))

    def _put(self, data: bytes) -> None:
        self._f.write(data)
        self.bytes_written += len(data)

    def write_chunk(self, items: Sequence[tuple[int, Any]]) -> None:
        if not items:
            return
        body, n_coll, n_copy = encode_chunk(items)
        body, flags = compress(body, self._level)
        first, last = items[0][0], items[-1][0]
        self._put(_frame(CHUNK, CHUNK_PREFIX.pack(first, last, len(items), n_coll, n_copy) + body, flags))
        self.messages += len(items)
        self.records += n_coll + n_copy
        self.first_ns = self.first_ns or first
        self.last_ns = last

    def flush(self) -> None:
        self._f.flush()

    def close(self, trailer: dict[str, Any]) -> None:
        totals = {"messages": self.messages, "records": self.records, "first_ns": self.first_ns}
        self._put(_frame(TRAILER, _pack({**totals, "last_ns": self.last_ns, **trailer})))
        self._f.flush()
        try:
            os.fsync(self._f.fileno())
        except (OSError, ValueError, AttributeError):  # not a real file (tests) or no fsync
            pass
        self._f.close()

    def abort(self) -> None:
        """Close without a trailer after a write error (the file stays readable, incomplete)."""
        try:
            self._f.close()
        except OSError:  # the buffered tail cannot be written either
            pass


def run_metadata(hellos: dict[int, p.Hello], caps: dict[str, Any] | None = None) -> dict[str, Any]:
    """What a reader wants to know before reading the stream: from the Hellos seen so far."""
    ranked = [hellos[r] for r in sorted(hellos)]
    first = ranked[0] if ranked else None
    return {
        "ranks": sorted(hellos),
        "world_size": first.world_size if first else 0,
        "hosts": sorted({h.host for h in ranked}),
        "gpus": [
            {"rank": h.rank, "host": h.host, "device": h.device, "device_index": h.device_index, "uuid": h.gpu_uuid}
            for h in ranked
        ],
        "backend": first.backend if first else "",
        "config": first.config if first else {},
        "settings": first.settings if first else {},
        "epoch": first.epoch if first else 0,
        "torch_version": first.torch_version if first else "",
        "nccl_version": first.nccl_version if first else "",
        "telem_caps": caps or {},
    }


def default_path(
    directory: str | os.PathLike[str], collective: str, host: str | None = None, now: float | None = None
) -> Path:
    """recordings/<date>-<time>-<host>-<collective>.commtop, never an existing file."""
    stamp = datetime.fromtimestamp(time.time() if now is None else now).strftime("%Y%m%d-%H%M%S")
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in f"{host or socket.gethostname()}-{collective}")
    base = Path(directory) / f"{stamp}-{safe}"
    path = base.with_name(base.name + SUFFIX)
    n = 1
    while path.exists():
        path = base.with_name(f"{base.name}-{n}{SUFFIX}")
        n += 1
    return path
