"""commtop recordings: an append-only, crash-safe file of every message a collector accepted.

Layout (integers little-endian)::

    prefix  b"\\x89CMTREC\\n" + u16 format version + u16 reserved                 (12 bytes)
    frame   b"\\xd7CMF" | u8 type | u8 flags | u32 length | u32 crc32 | payload   (14 + length)

The crc32 covers type, flags, length and payload, so a flipped byte anywhere in a frame is
caught; a reader that meets a bad frame reports its offset, searches for the next marker and
reads on. A file cut at any byte keeps every frame before the cut. Frame types:

* HEADER: msgpack map of run metadata (tool and schema version, clock source, ranks, hosts,
  GPUs, config: whatever the recorder knew at start; the Hello messages are in the stream too).
* CHUNK: the messages received in about one flush interval. A 28-byte uncompressed prefix
  (first/last receive time, message and record counts) lets a reader index a file without
  decompressing it; the body is msgpack, zlib-compressed when that is smaller. Batches are
  stored columnar: every column of all batches in the chunk is concatenated, delta-encoded
  where values creep (iteration, step, start_ns, the bits of dur_us), narrowed to the fewest
  bytes that hold it and byte-shuffled, so zlib sees long runs of equal bytes. algbw/busbw/gbps
  are stored as the XOR of their bits with the value recomputed from nbytes and dur_us: zero
  (free) when the worker used the usual formula, and still exact when it did not. The
  collective part also holds a summary per (epoch, rank) (:mod:`tui.recordings.summary`):
  counts, sums and first/last times, so ``commtop report`` decodes durations, not every column.
* TRAILER: totals, written on a clean close only; without it the recording is "incomplete".

:class:`Recorder` is the collector's Sink: ``write`` only appends to a bounded in-memory list;
a writer thread encodes and writes a chunk at least once a second.
"""

from __future__ import annotations

import mmap
import os
import socket
import struct
import sys
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import IO, Any

import msgpack
import numpy as np

from tui.ingest.interfaces import RecordingStatus
from tui.recordings import summary
from workers.wire import protocol as p
from workers.wire.busbw import algbw_gbps
from workers.wire.telemetry import Tick, decode_tick

MAGIC = b"\x89CMTREC\n"
FORMAT_VERSION = 1
PREFIX = struct.Struct("<8sHH")
MARKER = b"\xd7CMF"
FRAME = struct.Struct("<4sBBII")  # marker, type, flags, length, crc32
CHUNK_PREFIX = struct.Struct("<qqIII")  # first recv_ns, last recv_ns, messages, coll records, copy records
HEADER, CHUNK, TRAILER = 1, 2, 3
FLAG_ZLIB = 1
MAX_FRAME = 256 * 1024 * 1024
CLOCK_SOURCE = "time.time_ns (CLOCK_REALTIME) per host; GPU events anchored"
SUFFIX = ".commtop"

# Kind codes of the messages in a chunk, in arrival order.
K_COLL, K_COPY, K_HELLO, K_BYE, K_DICT = 0, 1, 2, 3, 4

# How each column is stored: d = delta int, p = plain int, f = delta of float32 bits,
# h = host_ns - start_ns, a = algbw residual, b = busbw residual, g = gbps residual.
COLL_CODECS = {
    "iteration": "d",
    "step": "d",
    "epoch": "d",
    "mode": "p",
    "op": "p",
    "nbytes": "d",
    "start_ns": "d",
    "host_ns": "h",
    "dur_us": "f",
    "algbw": "a",
    "busbw": "b",
}
COPY_CODECS = {
    "step": "d",
    "epoch": "d",
    "nbytes": "d",
    "direction": "p",
    "pinned": "p",
    "start_ns": "d",
    "dur_us": "f",
    "gbps": "g",
}
# Batch header fields, stored as per-batch int columns.
BATCH_FIELDS = ("rank", "seq", "dropped", "epoch_in_force", "pending_epoch", "apply_at", "t_ns")


class RecordingError(ValueError):
    """The file cannot be read as a recording; the message is one line for the user."""


class _BadChunk(Exception):
    """A chunk passed its checksum but does not decode (a bug or a newer format)."""


def tool_version() -> str:
    try:
        from importlib.metadata import version

        return version("commtop")
    except Exception:  # not installed (running from a source tree)
        return "0+unknown"


# --------------------------------------------------------------------------- column codecs

_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def _shuffle(values: np.ndarray) -> bytes:
    """Bytes grouped by significance (all low bytes, then the next...): zlib loves it."""
    width = values.dtype.itemsize
    if width == 1:
        return values.tobytes()
    return values.view(np.uint8).reshape(-1, width).T.tobytes()


def _unshuffle(payload: bytes, width: int, count: int) -> np.ndarray:
    if len(payload) != width * count:
        raise _BadChunk(f"column holds {len(payload)} bytes, expected {count} x {width}")
    raw = np.frombuffer(payload, dtype=np.uint8)
    if width == 1:
        return raw
    return np.ascontiguousarray(raw.reshape(width, count).T).view(_UINT[width]).reshape(count)


def _enc_int(values: np.ndarray, delta: bool) -> list[Any]:
    """[delta, first, base, width, bytes, n]: frame-of-reference over the value or its delta,
    in the narrowest unsigned width (0 = all equal). Wrapping int64 arithmetic is exact."""
    a = np.asarray(values).astype(np.int64, copy=False)
    n = len(a)
    if n == 0:
        return [int(delta), 0, 0, 0, b"", 0]
    first = int(a[0])
    v = np.diff(a) if delta else a
    if len(v) == 0:
        return [int(delta), first, 0, 0, b"", n]
    base = int(v.min())
    u = (v - np.int64(base)).view(np.uint64)  # wraps (silently, for arrays) where the range is huge
    top = int(u.max())
    width = 0 if top == 0 else 1 if top < 1 << 8 else 2 if top < 1 << 16 else 4 if top < 1 << 32 else 8
    payload = b"" if width == 0 else _shuffle(u.astype(_UINT[width]))
    return [int(delta), first, base, width, payload, n]


def _dec_int(enc: Any) -> np.ndarray:
    try:
        delta, first, base, width, payload, n = enc
    except (TypeError, ValueError):
        raise _BadChunk("bad column") from None
    if width not in (0, 1, 2, 4, 8) or not isinstance(n, int) or n < 0:
        raise _BadChunk("bad column header")
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    m = n - 1 if delta else n
    # numpy integer arrays wrap silently on overflow, which is exactly what the encoder relied on.
    if width == 0:
        if delta:
            return np.arange(n, dtype=np.int64) * np.int64(base) + np.int64(first)
        return np.full(m, base, dtype=np.int64)
    u = _unshuffle(payload, width, m)
    v = u.view(np.int64) if width == 8 else u.astype(np.int64)
    if base:
        v += np.int64(base)
    if not delta:
        return v
    out = np.empty(n, dtype=np.int64)
    out[0] = first
    np.cumsum(v, out=out[1:])
    out[1:] += np.int64(first)
    return out


def _f32_bits(values: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)


def _recomputed(codec: str, cols: dict[str, np.ndarray], factor: np.ndarray | None) -> np.ndarray:
    """The float32 value an algbw/busbw/gbps column most likely holds."""
    if codec in ("a", "g"):
        return algbw_gbps(cols["nbytes"], cols["dur_us"]).astype(np.float32)
    assert factor is not None
    return (cols["algbw"].astype(np.float64) * factor).astype(np.float32)


def _busbw_factor(algbw: np.ndarray, busbw: np.ndarray) -> float:
    ok = np.flatnonzero(np.isfinite(algbw) & (algbw > 0))
    return float(busbw[ok[0]]) / float(algbw[ok[0]]) if len(ok) else 0.0


def _encode_part(batches: list[p.Batch], codecs: dict[str, str], schema: dict[str, str]) -> dict[str, Any]:
    """Every batch of one kind in a chunk: per-batch headers plus concatenated columns."""
    counts = np.array([len(b) for b in batches], dtype=np.int64)
    meta = {
        name: _enc_int(np.array([getattr(b, name) for b in batches], dtype=np.int64), False) for name in BATCH_FIELDS
    }
    meta["n"] = _enc_int(counts, False)
    cols = {name: np.concatenate([np.asarray(b.columns[name], dtype=schema[name]) for b in batches]) for name in schema}
    part: dict[str, Any] = {"m": meta}
    factor = None
    if "busbw" in codecs:
        factors = np.array([_busbw_factor(b.columns["algbw"], b.columns["busbw"]) for b in batches])
        part["bf"] = factors.tobytes()
        factor = np.repeat(factors, counts)
    enc: dict[str, Any] = {}
    for name, codec in codecs.items():
        col = cols[name]
        if codec == "d" or codec == "p":
            enc[name] = _enc_int(col, codec == "d")
        elif codec == "h":
            enc[name] = _enc_int(col - cols["start_ns"], False)
        elif codec == "f":
            enc[name] = _enc_int(_f32_bits(col).view(np.int32), True)
        else:
            enc[name] = _enc_int(_f32_bits(col) ^ _f32_bits(_recomputed(codec, cols, factor)), False)
    part["c"] = enc
    if codecs is COLL_CODECS:
        rank = np.repeat(np.array([b.rank for b in batches], dtype=np.int64), counts)
        if summary.summarizable(rank):
            part["s"] = summary.summarize(rank, cols)
    return part


def _decode_part(
    part: Any, codecs: dict[str, str], schema: dict[str, str], wanted: Sequence[str] | None = None
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(per-batch headers incl. "n", per-record columns); ``wanted`` limits the columns decoded."""
    if not isinstance(part, dict) or not isinstance(part.get("m"), dict) or not isinstance(part.get("c"), dict):
        raise _BadChunk("bad batch table")
    meta = {name: _dec_int(part["m"].get(name)) for name in (*BATCH_FIELDS, "n")}
    counts = meta["n"]
    total = int(counts.sum())
    need = set(schema if wanted is None else wanted)
    if need & {"algbw", "busbw", "gbps"}:
        need |= {"nbytes", "dur_us"}
    if "busbw" in need:
        need.add("algbw")
    if "host_ns" in need:
        need.add("start_ns")
    enc = part["c"]
    cols: dict[str, np.ndarray] = {}
    factor = None
    for name, codec in codecs.items():  # dict order puts every dependency first
        if name not in need:
            continue
        raw = _dec_int(enc.get(name))
        if len(raw) != total:
            raise _BadChunk(f"column {name} has {len(raw)} values for {total} records")
        if codec in ("d", "p"):
            cols[name] = raw.astype(schema[name])
        elif codec == "h":
            cols[name] = raw + cols["start_ns"]
        elif codec == "f":
            cols[name] = raw.astype(np.int32).view(np.float32)
        else:
            if codec == "b":
                bf = part.get("bf")
                if not isinstance(bf, bytes) or len(bf) != 8 * len(counts):
                    raise _BadChunk("bad busbw factors")
                factor = np.repeat(np.frombuffer(bf, dtype=np.float64), counts)
            bits = raw.astype(np.uint32) ^ _f32_bits(_recomputed(codec, cols, factor))
            cols[name] = bits.view(np.float32)
    return meta, cols


def _nd_default(obj: Any) -> Any:
    """msgpack hook: numpy values inside TELEM dicts survive the round trip."""
    if isinstance(obj, np.ndarray):
        return {"__nd__": obj.dtype.str, "shape": list(obj.shape), "data": np.ascontiguousarray(obj).tobytes()}
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    return repr(obj)  # something unexpected in a dict: keep a readable trace of it


def _nd_hook(obj: dict[str, Any]) -> Any:
    if "__nd__" in obj and len(obj) == 3:
        return np.frombuffer(obj["data"], dtype=np.dtype(obj["__nd__"])).reshape(obj["shape"]).copy()
    return obj


def _pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True, default=_nd_default)


def _unpack(data: bytes | memoryview) -> Any:
    return msgpack.unpackb(data, raw=False, strict_map_key=False, object_hook=_nd_hook)


def encode_chunk(items: Sequence[tuple[int, Any]]) -> tuple[bytes, int, int]:
    """(chunk body, collective records, copy records) for (recv_ns, message) pairs in arrival order."""
    kinds = np.empty(len(items), dtype=np.uint8)
    coll: list[p.Batch] = []
    copy: list[p.Batch] = []
    other: list[Any] = []
    for i, (_, msg) in enumerate(items):
        if isinstance(msg, p.Batch):
            if msg.kind == p.COLL:
                kinds[i] = K_COLL
                coll.append(msg)
            else:
                kinds[i] = K_COPY
                copy.append(msg)
        elif isinstance(msg, p.Hello):
            kinds[i] = K_HELLO
            other.append(p.hello_body("", msg))
        elif isinstance(msg, p.Bye):
            kinds[i] = K_BYE
            other.append(p.bye_body("", msg))
        else:
            kinds[i] = K_DICT
            other.append(msg)
    body: dict[str, Any] = {
        "t": _enc_int(np.array([t for t, _ in items], dtype=np.int64), True),
        "k": _enc_int(kinds, False),
        "o": other,
    }
    if coll:
        body["c"] = _encode_part(coll, COLL_CODECS, p.COLL_COLUMNS)
    if copy:
        body["p"] = _encode_part(copy, COPY_CODECS, p.COPY_COLUMNS)
    return _pack(body), sum(len(b) for b in coll), sum(len(b) for b in copy)


@dataclass
class DecodedChunk:
    """One chunk, columnar: what ``Recording.tables`` concatenates and ``messages`` slices."""

    recv_ns: np.ndarray  # per message
    kinds: np.ndarray  # per message (K_*)
    coll_meta: dict[str, np.ndarray]
    coll: dict[str, np.ndarray]
    copy_meta: dict[str, np.ndarray]
    copy: dict[str, np.ndarray]
    other: list[Any]  # decoded Hello / Bye / dict, in order


def decode_chunk(body: bytes | memoryview, coll_columns: Sequence[str] | None = None) -> DecodedChunk:
    try:
        doc = _unpack(body)
    except Exception as exc:
        raise _BadChunk(f"chunk body does not unpack ({type(exc).__name__})") from None
    if not isinstance(doc, dict):
        raise _BadChunk("chunk body is not a map")
    recv = _dec_int(doc.get("t"))
    kinds = _dec_int(doc.get("k")).astype(np.uint8)
    if len(recv) != len(kinds):
        raise _BadChunk("message table lengths differ")
    empty: tuple[dict[str, np.ndarray], dict[str, np.ndarray]] = ({}, {})
    cm, cc = _decode_part(doc["c"], COLL_CODECS, p.COLL_COLUMNS, coll_columns) if "c" in doc else empty
    pm, pc = _decode_part(doc["p"], COPY_CODECS, p.COPY_COLUMNS) if "p" in doc else empty
    other: list[Any] = []
    for kind, raw in zip(kinds[kinds >= K_HELLO], doc.get("o") or [], strict=False):
        try:
            if kind == K_HELLO:
                other.append(p.decode_hello(raw))
            elif kind == K_BYE:
                other.append(p.decode_bye(raw))
            else:
                other.append(raw)
        except p.ProtocolError as exc:
            raise _BadChunk(f"bad message in chunk: {exc}") from None
    if len(other) != int(np.count_nonzero(kinds >= K_HELLO)):
        raise _BadChunk("message count mismatch")
    if len(cm.get("n", ())) != int(np.count_nonzero(kinds == K_COLL)) or len(pm.get("n", ())) != int(
        np.count_nonzero(kinds == K_COPY)
    ):
        raise _BadChunk("batch count mismatch")
    return DecodedChunk(recv, kinds, cm, cc, pm, pc, other)


def _batches(kind: str, meta: dict[str, np.ndarray], cols: dict[str, np.ndarray]) -> list[p.Batch]:
    if not meta:
        return []
    counts = meta["n"]
    bounds = np.concatenate([[0], np.cumsum(counts)]).tolist()
    fields = {name: meta[name].tolist() for name in BATCH_FIELDS}
    out = []
    for i in range(len(counts)):
        a, b = bounds[i], bounds[i + 1]
        out.append(
            p.Batch(
                kind=kind,
                columns={name: col[a:b] for name, col in cols.items()},
                **{name: fields[name][i] for name in BATCH_FIELDS},
            )
        )
    return out


def chunk_messages(chunk: DecodedChunk) -> list[tuple[int, Any]]:
    """The chunk's messages as the live ingest would have received them, with receive times."""
    coll = iter(_batches(p.COLL, chunk.coll_meta, chunk.coll))
    copy = iter(_batches(p.COPY, chunk.copy_meta, chunk.copy))
    other = iter(chunk.other)
    out = []
    for t, kind in zip(chunk.recv_ns.tolist(), chunk.kinds.tolist(), strict=True):
        msg = next(coll) if kind == K_COLL else next(copy) if kind == K_COPY else next(other)
        out.append((t, msg))
    return out


# --------------------------------------------------------------------------- writing


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
        packed = zlib.compress(body, self._level)
        flags = 0
        if len(packed) < len(body):
            body, flags = packed, FLAG_ZLIB
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


class Recorder:
    """The collector's Sink that records: ``r`` in the TUI, ``--record`` on the command line.

    ``write`` (ingest thread) appends to a bounded list and returns; a writer thread turns
    that list into a chunk every ``flush_s`` (at most a second). When the disk fails (ENOSPC,
    EIO) recording stops, ``status().error`` says why, and the live view goes on.
    """

    def __init__(
        self,
        collective: str = "run",
        directory: str | os.PathLike[str] = "recordings",
        *,
        flush_s: float = 0.9,
        max_pending_records: int = 2_000_000,
        max_pending_messages: int = 200_000,
        opener: Callable[[str, str], IO[bytes]] | None = None,
        level: int = 6,
    ) -> None:
        self.collective = collective
        self.directory = directory
        self.flush_s = min(flush_s, 1.0)
        self.max_pending_records = max_pending_records
        self.max_pending_messages = max_pending_messages
        self._opener = opener or (lambda path, mode: open(path, mode))  # noqa: SIM115
        self._level = level
        self._lock = threading.Lock()
        self._pending: list[tuple[int, Any]] = []
        self._pending_records = 0
        self._hellos: dict[int, p.Hello] = {}
        self._caps: dict[str, Any] = {}
        self._active = False
        self._path = ""
        self._started = 0.0
        self._error = ""
        self._lost = 0
        self._writer: RecordingWriter | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    # ---- Sink (ingest thread)
    def write(self, message: p.Message) -> None:
        if isinstance(message, p.Hello):
            self._hellos[message.rank] = message
        elif isinstance(message, dict) and message.get("k") == p.TELEM_CAPS:
            self._caps[str(message.get("host", ""))] = message
        if not self._active:
            return
        n = len(message) if isinstance(message, p.Batch) else 1
        with self._lock:
            if self._pending_records + n > self.max_pending_records or len(self._pending) >= self.max_pending_messages:
                self._lost += 1
                return
            self._pending.append((time.time_ns(), message))
            self._pending_records += n

    # ---- RecorderLike
    def start(self, path: str | None = None) -> str:
        """Start recording to ``path`` (default under ``recordings/``); returns the path.
        A file that cannot be opened leaves the recorder stopped with ``status().error`` set."""
        if self._active:
            return self._path
        if self._thread is not None:
            self._thread.join()
        collective = next(
            (str(h.config.get("collective")) for h in self._hellos.values() if h.config.get("collective")),
            self.collective,
        )
        target = Path(path) if path else default_path(self.directory, collective)
        self._path = str(target)
        self._error = ""
        self._lost = 0
        meta = {
            "tool": "commtop",
            "tool_version": tool_version(),
            "schema_version": p.SCHEMA_VERSION,
            "format_version": FORMAT_VERSION,
            "clock": CLOCK_SOURCE,
            "created_ns": time.time_ns(),
            "recorder_host": socket.gethostname(),
            "recorder_pid": os.getpid(),
            **run_metadata(dict(self._hellos), dict(self._caps)),
        }
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            self._writer = RecordingWriter(self._opener(str(target), "wb"), meta, level=self._level)
            self._writer.flush()
        except OSError as exc:
            self._error = f"cannot record to {target}: {exc.strerror or exc}"
            self._writer = None
            return self._path
        now = time.time_ns()
        with self._lock:  # start with what a reader needs: every rank's Hello, the node caps
            self._pending = [(now, h) for _, h in sorted(self._hellos.items())]
            self._pending += [(now, c) for c in self._caps.values()]
            self._pending_records = 0
            self._active = True
        self._started = time.monotonic()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="commtop-recorder", daemon=True)
        self._thread.start()
        return self._path

    def stop(self) -> None:
        """Write what is buffered and the trailer, then close the file."""
        self._active = False
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    close = stop

    def status(self) -> RecordingStatus:
        writer = self._writer
        error = self._error
        if not error and self._lost:
            error = f"recording fell behind: {self._lost} messages not recorded"
        return RecordingStatus(
            active=self._active,
            path=self._path,
            bytes_written=writer.bytes_written if writer else 0,
            elapsed_s=time.monotonic() - self._started if self._active else 0.0,
            error=error,
        )

    # ---- writer thread
    def _take(self) -> list[tuple[int, Any]]:
        with self._lock:
            items, self._pending, self._pending_records = self._pending, [], 0
        return items

    def _run(self) -> None:
        writer = self._writer
        assert writer is not None
        try:
            while True:
                stopping = self._stop.wait(self.flush_s)
                items = self._take()
                for i in range(0, len(items), 20_000):  # bounded chunk size
                    writer.write_chunk(items[i : i + 20_000])
                writer.flush()
                if stopping:
                    hellos = dict(self._hellos)
                    writer.close({"complete": True, "lost_messages": self._lost, **run_metadata(hellos, self._caps)})
                    return
        except Exception as exc:  # ENOSPC, EIO, ...: stop recording, never the run
            reason = os.strerror(exc.errno) if isinstance(exc, OSError) and exc.errno else str(exc)
            self._error = f"{reason}: recording stopped"
            self._active = False
            self._take()
            writer.abort()
            print(f"commtop: recording to {self._path} stopped: {reason}", file=sys.stderr)


# --------------------------------------------------------------------------- reading


@dataclass(frozen=True)
class ChunkInfo:
    offset: int  # of the frame
    body: int  # offset of the (maybe compressed) body
    end: int
    flags: int
    first_ns: int
    last_ns: int
    messages: int
    coll_records: int
    copy_records: int

    @property
    def records(self) -> int:
        return self.coll_records + self.copy_records


@dataclass
class Tables:
    """A whole recording, columnar: collective and copy records with their rank and receive time."""

    coll: dict[str, np.ndarray]
    copy: dict[str, np.ndarray]
    hellos: list[tuple[int, p.Hello]] = field(default_factory=list)
    byes: list[tuple[int, p.Bye]] = field(default_factory=list)
    ticks: list[tuple[int, Tick]] = field(default_factory=list)  # node telemetry, decoded once
    other: list[tuple[int, dict[str, Any]]] = field(default_factory=list)  # TELEM_CAPS, ...
    #: Every chunk's collective summary rows (tui.recordings.summary), when asked for and every
    #: chunk has one; else None.
    coll_summary: dict[str, np.ndarray] | None = None


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

    def decode(self, info: ChunkInfo, coll_columns: Sequence[str] | None = None) -> DecodedChunk | None:
        """One chunk, or None (and a note in ``problems``) if it does not decode."""
        body: Any = self._data[info.body : info.end]
        try:
            if info.flags & FLAG_ZLIB:
                body = zlib.decompress(body)
            chunk = decode_chunk(body, coll_columns)
        except (zlib.error, _BadChunk) as exc:
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

    def tables(self, coll_columns: Sequence[str] | None = None, *, summary: bool = False) -> Tables:
        """The whole recording as numpy columns (+ "rank" and "recv_ns" per record).
        ``coll_columns`` limits the collective columns decoded (faster, less memory); "rank"
        always comes, "recv_ns" only when named. ``summary``: also the chunks' collective
        summaries (``Tables.coll_summary``). Read in bulk (:mod:`tui.recordings.bulk`):
        one numpy pass per column over every chunk."""
        from tui.recordings.bulk import read_tables

        return read_tables(self, coll_columns, summary=summary)

    @property
    def has_summaries(self) -> bool:
        """Whether its writer summarised every chunk's collectives (tui.recordings.summary)."""
        return self.header.get(summary.HEADER_KEY) == summary.VERSION

    def tables_by_chunk(self, coll_columns: Sequence[str] | None = None) -> Tables:
        """:meth:`tables`, chunk by chunk with :func:`decode_chunk`: the reference the bulk
        reader must equal, bit for bit (tests compare them).
        Chunks decode straight into arrays sized from the chunk prefixes (no second copy)."""
        tables = Tables({}, {})
        out: dict[str, dict[str, np.ndarray]] = {}
        fill = {"coll": 0, "copy": 0}
        for name, schema, wanted, total in (
            ("coll", p.COLL_COLUMNS, coll_columns, sum(c.coll_records for c in self.chunks)),
            ("copy", p.COPY_COLUMNS, None, sum(c.copy_records for c in self.chunks)),
        ):
            dtypes = {n: d for n, d in {**schema, "recv_ns": "<i8"}.items() if wanted is None or n in wanted}
            out[name] = {n: np.empty(total, d) for n, d in {**dtypes, "rank": "<i4"}.items()}
        for info in self.chunks:
            chunk = self.decode(info, coll_columns)
            if chunk is None:
                continue
            for name, meta, cols, kind in (
                ("coll", chunk.coll_meta, chunk.coll, K_COLL),
                ("copy", chunk.copy_meta, chunk.copy, K_COPY),
            ):
                if not meta:
                    continue
                counts = meta["n"]
                a = fill[name]
                b = a + int(counts.sum())
                table = out[name]
                if b > len(table["rank"]):  # prefix and body disagree: only a bug can do this
                    self.problems.append(f"undecodable chunk at byte {info.offset}: record count mismatch")
                    continue
                for col, arr in table.items():
                    if col == "rank":
                        arr[a:b] = np.repeat(meta["rank"], counts)
                    elif col == "recv_ns":
                        arr[a:b] = np.repeat(chunk.recv_ns[chunk.kinds == kind], counts)
                    else:
                        arr[a:b] = cols[col]
                fill[name] = b
            if chunk.other:
                times = chunk.recv_ns[chunk.kinds >= K_HELLO].tolist()
                for t, msg in zip(times, chunk.other, strict=True):
                    if isinstance(msg, p.Hello):
                        tables.hellos.append((t, msg))
                    elif isinstance(msg, p.Bye):
                        tables.byes.append((t, msg))
                    elif isinstance(msg, dict) and msg.get("k") == p.TELEM:
                        try:
                            tables.ticks.append((t, decode_tick(msg)))
                        except p.ProtocolError as exc:
                            self.problems.append(f"telemetry tick skipped at byte {info.offset}: {exc}")
                    else:
                        tables.other.append((t, msg))
        tables.coll = {n: arr[: fill["coll"]] for n, arr in out["coll"].items()}
        tables.copy = {n: arr[: fill["copy"]] for n, arr in out["copy"].items()}
        return tables


def open_recording(path: str | os.PathLike[str]) -> Recording:
    """Open a recording for reading; raises RecordingError (one line) if it is not one, or if
    it ends before its header did (nothing in it to report or replay)."""
    rec = Recording(path)
    if not rec.header and not rec.chunks:
        where = f"at byte {rec.truncated_at}" if rec.truncated_at is not None else "damaged"
        rec.close()
        raise RecordingError(f"{rec.path} ends inside its header ({where} of {rec.size}): no records to read")
    return rec
