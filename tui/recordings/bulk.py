"""A whole recording's columns at once: one numpy pass per column over every chunk.

Decoding chunk by chunk (:func:`tui.recordings.codec.decode_chunk`) costs a dozen numpy calls
per column per chunk, and the live recorder writes a chunk a second, so ten million records are
some 7,000 chunks and that overhead was most of ``commtop report``'s read. Here each chunk is
only inflated, unpacked and checked (a little Python); then, per column, the byte planes of
every chunk are joined and decoded in one numpy pass (frame-of-reference base, delta sums that
restart at every chunk: :mod:`tui.recordings.int_columns`). The values are exactly the per-chunk decoder's: the same int64
arithmetic, wrapping where it wraps. A chunk this path does not take (damaged, or shaped in a
way the writer never writes) goes to the per-chunk decoder, in its place, with its note.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from tui.recordings import summary as chunk_summary
from tui.recordings.codec import (
    COLL_CODECS,
    COPY_CODECS,
    K_BYE,
    K_COLL,
    K_COPY,
    K_HELLO,
    OPTIONAL_COLUMNS,
    ChunkInfo,
    DecodedChunk,
    Tables,
    _f32_bits,
    _recomputed,
    _unpack,
    zeros_enc,
)
from tui.recordings.compression import decompress
from tui.recordings.int_columns import ColumnAt, Enc, decode_ints, runs_of_chunks
from workers.wire import protocol as p
from workers.wire.telemetry import decode_tick

_I64 = (-(1 << 63), 1 << 63)
#: Columns whose stored values are deltas (the rest are plain), by codec letter.
_DELTA = {"d": 1, "f": 1, "p": 0, "h": 0, "a": 0, "b": 0, "g": 0}
_PARTS = (("coll", "c", COLL_CODECS, p.COLL_COLUMNS, K_COLL), ("copy", "p", COPY_CODECS, p.COPY_COLUMNS, K_COPY))


class ChunkSource(Protocol):
    """What this reader needs of an open recording (:class:`tui.recordings.reader.Recording`,
    which reads through here): its chunk index, its notes, each chunk's stored body, and the
    per-chunk decoder for the chunks this path does not take."""

    chunks: list[ChunkInfo]
    problems: list[str]

    def chunk_body(self, info: ChunkInfo) -> bytes: ...

    def decode(self, info: ChunkInfo, coll_columns: Sequence[str] | None = None) -> DecodedChunk | None: ...


def _enc(value: Any, delta: int) -> Enc | None:
    """``value`` as a column encoding the writer could have written (the delta flag its codec
    gives), else None: the per-chunk decoder then judges it."""
    try:
        d, first, base, width, payload, n = value
    except (TypeError, ValueError):
        return None
    if (
        d != delta
        or type(n) is not int
        or n < 0
        or type(width) is not int
        or width not in (0, 1, 2, 4, 8)
        or type(payload) is not bytes
        or type(first) is not int
        or type(base) is not int
        or not (_I64[0] <= first < _I64[1] and _I64[0] <= base < _I64[1])
        or (n and width and len(payload) != width * (n - d))
    ):
        return None
    return value  # type: ignore[no-any-return]


@dataclass
class _Chunk:
    """What one chunk contributes, checked: its message table, its parts' encodings, others."""

    info: ChunkInfo
    t: Enc
    k: Enc
    other: list[Any]
    parts: dict[str, dict[str, Any]] = field(default_factory=dict)  # "coll"/"copy" -> meta, cols, bf


def _check_chunk(info: ChunkInfo, doc: Any, wanted: dict[str, set[str]]) -> _Chunk | None:
    if not isinstance(doc, dict):
        return None
    t, k = _enc(doc.get("t"), 1), _enc(doc.get("k"), 0)
    other = doc.get("o") or []
    if t is None or k is None or t[5] != k[5] or not isinstance(other, list):
        return None
    chunk = _Chunk(info, t, k, other)
    for name, key, codecs, _, _ in _PARTS:
        part = doc.get(key)
        if part is None:
            continue
        if not isinstance(part, dict) or not isinstance(part.get("m"), dict) or not isinstance(part.get("c"), dict):
            return None
        meta = {f: _enc(part["m"].get(f), 0) for f in ("n", "rank")}  # what a table needs
        if any(e is None for e in meta.values()):
            return None
        cols = {c: _enc(_stored(part["c"], c, meta["n"]), _DELTA[codecs[c]]) for c in wanted[name]}
        if any(e is None for e in cols.values()):
            return None
        bf = part.get("bf")
        if "busbw" in cols and (not isinstance(bf, bytes) or len(bf) != 8 * meta["n"][5]):  # type: ignore[index]
            return None
        chunk.parts[name] = {"meta": meta, "cols": cols, "bf": bf, "s": part.get("s")}
    return chunk


def _stored(encs: dict[str, Any], column: str, counts: Enc | None) -> Any:
    """A column's stored encoding; zeros for an optional column a chunk written before it lacks."""
    if column in encs or column not in OPTIONAL_COLUMNS or counts is None:
        return encs.get(column)
    return zeros_enc(int(decode_ints([counts]).view(np.int64).sum()))


def _needed(codecs: dict[str, str], wanted: Sequence[str] | None) -> set[str]:
    """The columns to decode for ``wanted`` (None: all), with what they are computed from."""
    need = set(codecs if wanted is None else wanted) & set(codecs)
    if need & {"algbw", "busbw", "gbps"}:
        need |= {"nbytes", "dur_us"}
    if "busbw" in need:
        need.add("algbw")
    if "host_ns" in need:
        need.add("start_ns")
    return need


#: Records per block where a column is recomputed from others (float64 temporaries): blocks
#: reuse the same memory where full-size temporaries would fault in fresh pages each time.
BLOCK = 1 << 18
#: Records of a part from which its stored columns decode on several threads (below, threads cost more than they save).
PARALLEL_RECORDS = 1 << 16
#: Records per piece at least where a column is decoded in pieces on several threads.
PIECE_RECORDS = 1 << 18
#: Threads at most for the columns' decode (memory-bound numpy passes, without the GIL).
MAX_COLUMN_THREADS = 4


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity, e.g. under taskset or a container's cpuset)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


def worker_threads(most: int) -> int:
    """Threads for a pool of numpy work: 2 (what a 2-core machine has, the floor every pool
    was tuned on), up to ``most`` where more CPUs are usable."""
    return max(2, min(most, usable_cpus()))


#: The dtype of a table's "rank" column.
RANK_DTYPE = "<i4"


def _columns(
    chunks: list[_Chunk],
    name: str,
    codecs: dict[str, str],
    schema: dict[str, str],
    need: set[str],
    counts: np.ndarray,
    side: ThreadPoolExecutor | None = None,
    group_by: Callable[[np.ndarray, np.ndarray, np.ndarray], Any] | None = None,
) -> tuple[dict[str, np.ndarray], Future[Any] | None]:
    """(per-record columns with "rank", ``group_by``'s future) of one part over ``chunks``,
    each column as the per-chunk decoder's ``_decode_part`` gives it.

    The stored columns decode on 2 to MAX_COLUMN_THREADS threads (numpy copies and sums
    without the GIL, the joins of byte planes with it, so one column's numpy runs while
    another's joins), a long part's columns in pieces, one run of chunks per thread, each into
    its slice of the column; the columns computed from others follow, in order. With ``group_by``
    (and ``side``, its thread), the epochs and the per-record ranks come first and
    ``group_by(epoch, rank, records per batch)`` runs on ``side`` while the rest decode: the
    report's grouping, its longest step on one thread, no longer waits for every column."""
    having = [c.parts[name] for c in chunks if name in c.parts]
    stored = [col for col, codec in codecs.items() if col in need and codec in ("d", "p", "f", "h")]

    def width(col: str) -> int:
        return 4 if codecs[col] == "f" else 8 if codecs[col] == "h" else np.dtype(schema[col]).itemsize

    def dtype(col: str) -> np.dtype:
        return np.dtype(np.float32 if codecs[col] == "f" else np.int64 if codecs[col] == "h" else schema[col])

    ranks = decode_ints([h["meta"]["rank"] for h in having]).view(np.int64)  # one per batch
    cols: dict[str, np.ndarray] = {"rank": np.repeat(ranks.astype(RANK_DTYPE), counts)}
    done: dict[str, np.ndarray] = {}
    grouped: Future[Any] | None = None
    records = int(counts.sum())
    if len(stored) > 1 and records >= PARALLEL_RECORDS and usable_cpus() > 1:
        threads = worker_threads(MAX_COLUMN_THREADS)
        pieces = runs_of_chunks(
            [h["cols"][stored[0]][5] for h in having], threads if records >= PIECE_RECORDS * threads else 1
        )
        # the epochs first (the grouping waits for them), then the widest, so that the threads end together
        first = ["epoch"] if group_by is not None and side is not None and "epoch" in stored else []
        widest = sorted(
            (col for col in stored if col not in first),
            key=lambda col: -max((h["cols"][col][3] for h in having), default=0),
        )
        with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="commtop-columns") as pool:
            tasks: dict[str, list[Future[Any]]] = {}
            for col in [*first, *widest]:
                done[col] = np.empty(records, dtype=dtype(col))
                tasks[col] = [
                    pool.submit(decode_ints, [h["cols"][col] for h in having[a:b]], width(col), done[col][ra:rb])
                    for a, b, ra, rb in pieces
                ]
            if first and group_by is not None and side is not None:
                for task in tasks["epoch"]:
                    task.result()
                grouped = side.submit(group_by, done["epoch"], cols["rank"], counts)
            for col in widest:
                for task in tasks[col]:
                    task.result()
    else:
        done = {col: decode_ints([h["cols"][col] for h in having], width(col)).view(dtype(col)) for col in stored}
    for col, codec in codecs.items():  # dict order puts every dependency first
        if col not in need:
            continue
        if codec in ("d", "p", "f"):
            cols[col] = done[col]
        elif codec == "h":
            cols[col] = done[col] + cols["start_ns"]
        else:
            bits = decode_ints([h["cols"][col] for h in having], 4)
            factor: Any = None
            if codec == "b":
                bf = np.frombuffer(b"".join(h["bf"] for h in having), dtype=np.float64)
                same = len(bf) and bool((bf.view(np.uint64) == bf.view(np.uint64)[0]).all())
                factor = bf[0] if same else np.repeat(bf, counts)
            for a in range(0, len(bits), BLOCK):
                part = {c: v[a : a + BLOCK] for c, v in cols.items()}
                f = factor[a : a + BLOCK] if isinstance(factor, np.ndarray) else factor
                bits[a : a + BLOCK] ^= _f32_bits(_recomputed(codec, part, f))
            cols[col] = bits.view(np.float32)
    return cols, grouped


def _segment_sums(values: np.ndarray, sizes: list[int]) -> np.ndarray:
    """Sum of ``values`` over consecutive segments of ``sizes`` (empty segments: 0)."""
    out = np.zeros(len(sizes), dtype=np.int64)
    sz = np.array(sizes, dtype=np.int64)
    nonempty = sz > 0
    if nonempty.any():
        starts = np.cumsum(sz) - sz
        out[nonempty] = np.add.reduceat(values.astype(np.int64), starts[nonempty])
    return out


def _bad_counts(chunks: list[_Chunk], kinds: np.ndarray, counts: dict[str, np.ndarray]) -> set[int]:
    """Indices of chunks whose tables disagree with each other or with their prefix counts."""
    bad: set[int] = set()
    msgs = [c.t[5] for c in chunks]
    for name, _, _, _, kind in _PARTS:
        batches = [c.parts[name]["meta"]["n"][5] if name in c.parts else 0 for c in chunks]
        kind_n = _segment_sums(kinds == kind, msgs)
        records = _segment_sums(counts[name], batches)
        negative = _segment_sums(counts[name] < 0, batches)
        prefix = np.array([c.info.coll_records if kind == K_COLL else c.info.copy_records for c in chunks])
        ok = (kind_n == np.array(batches)) & (records == prefix) & (negative == 0)
        having = [i for i, c in enumerate(chunks) if name in c.parts]
        if having:  # every column of a chunk holds one value per record, every header one per batch
            parts = [chunks[i].parts[name] for i in having]
            for group, want in (("meta", np.array(batches)[having]), ("cols", records[having])):
                for col in parts[0][group]:
                    ok[having] &= np.array([pt[group][col][5] for pt in parts]) == want
        bad.update(np.flatnonzero(~ok).tolist())
    return bad


#: Chunks per task of the reading threads. Each thread inflates (zstd or zlib, without the GIL)
#: then unpacks and checks (Python, with it), so one inflates while another unpacks; this
#: thread only waits. (Were it unpacking while they inflate, each worker would wait out the
#: interpreter's switch interval, 5 ms, for the GIL after every chunk.)
READ_TASK = 32
#: Reading threads at most: inflating is ~80 % of a chunk's read (VM, zstd), so more CPUs read faster.
MAX_READ_THREADS = 4


def _read(
    stored: Callable[[ChunkInfo], bytes], infos: Sequence[ChunkInfo], wanted: dict[str, set[str]]
) -> list[_Chunk | None]:
    """The chunks ``infos`` inflated, unpacked and checked (None: for the per-chunk decoder)."""
    out: list[_Chunk | None] = []
    for info in infos:
        try:
            out.append(_check_chunk(info, _unpack(decompress(stored(info), info.flags)), wanted))
        except Exception:  # the per-chunk decoder says what is wrong with it
            out.append(None)
    return out


def _read_all(rec: ChunkSource, wanted: dict[str, set[str]]) -> list[_Chunk | None]:
    chunks, stored = rec.chunks, rec.chunk_body
    if len(chunks) < 4 * READ_TASK or usable_cpus() < 2:
        return _read(stored, chunks, wanted)
    out: list[_Chunk | None] = []
    with ThreadPoolExecutor(max_workers=worker_threads(MAX_READ_THREADS), thread_name_prefix="commtop-read") as pool:
        tasks = [chunks[i : i + READ_TASK] for i in range(0, len(chunks), READ_TASK)]
        for part in pool.map(lambda infos: _read(stored, infos, wanted), tasks):
            out += part
    return out


def read_tables(
    rec: ChunkSource,
    coll_columns: Sequence[str] | None = None,
    *,
    summary: bool = False,
    group_by: Callable[[np.ndarray, np.ndarray, np.ndarray], Any] | None = None,
    sparse: Sequence[str] = (),
) -> Tables:
    """``rec.tables(coll_columns)``, every chunk the per-chunk decoder reads read in bulk;
    ``summary``: with the chunks' collective summaries where every chunk has a valid one;
    ``group_by``: ``Tables.coll_grouped`` (see :func:`_columns`); ``sparse``: integer
    collective columns (not in ``coll_columns``) read at a few records only: left encoded
    (``Tables.coll_at``) where every chunk is read in bulk, else decoded as the others."""
    sparse = [c for c in sparse if COLL_CODECS.get(c) in ("d", "p") and coll_columns is not None]
    asked = None if coll_columns is None else [*coll_columns, *sparse]
    wanted = {"coll": _needed(COLL_CODECS, asked), "copy": _needed(COPY_CODECS, None)}
    checked = _read_all(rec, wanted)
    while True:
        good = [c for c in checked if c is not None]
        # Receive times: for the others, copy records and a wanted recv_ns column only.
        timed = coll_columns is None or "recv_ns" in coll_columns or any(c.other or "copy" in c.parts for c in good)
        t = decode_ints([c.t for c in good]).view(np.int64) if timed else np.zeros(sum(c.t[5] for c in good), np.int64)
        kinds = decode_ints([c.k for c in good], 1)
        counts = {
            name: decode_ints([c.parts[name]["meta"]["n"] for c in good if name in c.parts]).view(np.int64)
            for name in ("coll", "copy")
        }
        bad = _bad_counts(good, kinds, counts)
        others, bad_other = _others(good, t, kinds)
        bad |= bad_other
        if not bad:
            break
        drop = {id(good[i]) for i in bad}
        checked = [None if c is not None and id(c) in drop else c for c in checked]
    encoded = {c for c in sparse if c not in _needed(COLL_CODECS, coll_columns)}
    if not all(c is not None for c in checked):  # the per-chunk decoder decodes them: all of them, here too
        encoded, coll_columns = set(), asked
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="commtop-group") as side:
        have, grouped = {}, None
        for name, _, codecs, schema, _ in _PARTS:
            mine = group_by if name == "coll" else None
            need = wanted[name] - encoded if name == "coll" else wanted[name]
            cols, future = _columns(good, name, codecs, schema, need, counts[name], side, mine)
            have[name] = (counts[name], cols)
            if future is not None:
                grouped = future
        tables = _assemble(rec, checked, t, kinds, have, others, coll_columns)
        having = [c.parts["coll"] for c in good if "coll" in c.parts]
        tables.coll_at = {
            col: ColumnAt([h["cols"][col] for h in having], np.dtype(p.COLL_COLUMNS[col])) for col in sorted(encoded)
        }
        if grouped is not None and all(c is not None for c in checked):  # the columns it was given
            tables.coll_grouped = grouped.result()
    if summary and all(c is not None for c in checked):
        parts = [c.parts["coll"]["s"] for c in good if "coll" in c.parts]
        if all(chunk_summary.valid(s) for s in parts):
            tables.coll_summary = chunk_summary.join(parts)
    return tables


def _others(chunks: list[_Chunk], t: np.ndarray, kinds: np.ndarray) -> tuple[list[list[tuple[int, Any]]], set[int]]:
    """Per chunk: its (recv_ns, Hello/Bye/dict) in order; and the chunks whose others do not
    decode (or are fewer than their kinds say), as the per-chunk decoder judges them."""
    msgs = [c.t[5] for c in chunks]
    counts = _segment_sums(kinds >= K_HELLO, msgs).tolist()
    starts = np.cumsum([0, *msgs[:-1]]).tolist()
    out: list[list[tuple[int, Any]]] = [[] for _ in chunks]
    bad: set[int] = set()
    for i, c in enumerate(chunks):
        count = counts[i]
        if not count:
            continue
        if len(c.other) < count:
            bad.add(i)
            continue
        a, b = starts[i], starts[i] + msgs[i]
        sel = kinds[a:b] >= K_HELLO
        try:
            for time_ns, kind, raw in zip(t[a:b][sel].tolist(), kinds[a:b][sel].tolist(), c.other, strict=False):
                msg = p.decode_hello(raw) if kind == K_HELLO else p.decode_bye(raw) if kind == K_BYE else raw
                out[i].append((time_ns, msg))
        except p.ProtocolError:
            bad.add(i)
    return out, bad


def _table_columns(schema: dict[str, str], wanted: Sequence[str] | None) -> dict[str, str]:
    """The table's columns and dtypes, in the order ``Recording.tables`` has always given."""
    dtypes = {n: d for n, d in {**schema, "recv_ns": "<i8"}.items() if wanted is None or n in wanted}
    return {**dtypes, "rank": RANK_DTYPE}


def _assemble(
    rec: ChunkSource,
    checked: list[_Chunk | None],
    t: np.ndarray,
    kinds: np.ndarray,
    have: dict[str, tuple[np.ndarray, dict[str, np.ndarray]]],
    others: list[list[tuple[int, Any]]],
    coll_columns: Sequence[str] | None,
) -> Tables:
    tables = Tables({}, {})
    bulk: dict[str, dict[str, np.ndarray]] = {}
    layout = {}
    for name, _, _, schema, kind in _PARTS:
        counts, cols = have[name]
        columns = _table_columns(schema, coll_columns if name == "coll" else None)
        out = {}
        for col in columns:
            if col == "recv_ns":
                out[col] = np.repeat(t[kinds == kind], counts)
            else:
                out[col] = cols[col]
        bulk[name] = out
        layout[name] = columns
    if all(c is not None for c in checked):
        tables.coll, tables.copy = bulk["coll"], bulk["copy"]
        for chunk, mine in zip(checked, others, strict=True):
            assert chunk is not None
            _route(rec, tables, mine, chunk.info)
        return tables
    # Some chunks need the per-chunk decoder: records in file order, pieces of the bulk
    # arrays between them (what decoding every chunk on its own would have filled).
    pieces: dict[str, list[dict[str, np.ndarray]]] = {"coll": [], "copy": []}
    total = {"coll": sum(c.coll_records for c in rec.chunks), "copy": sum(c.copy_records for c in rec.chunks)}
    fill = {"coll": 0, "copy": 0}
    at = {"coll": 0, "copy": 0}  # position in the bulk arrays
    j = 0
    for info, chunk in zip(rec.chunks, checked, strict=True):
        if chunk is not None:
            for name in pieces:
                n = info.coll_records if name == "coll" else info.copy_records
                if n:
                    pieces[name].append({c: a[at[name] : at[name] + n] for c, a in bulk[name].items()})
                at[name] += n
                fill[name] += n
            _route(rec, tables, others[j], info)
            j += 1
            continue
        decoded = rec.decode(info, coll_columns)
        if decoded is None:
            continue
        for name, meta, cols, kind in (
            ("coll", decoded.coll_meta, decoded.coll, K_COLL),
            ("copy", decoded.copy_meta, decoded.copy, K_COPY),
        ):
            if not meta:
                continue
            counts = meta["n"]
            n = int(counts.sum())
            if fill[name] + n > total[name]:  # prefix and body disagree: only a bug can do this
                rec.problems.append(f"undecodable chunk at byte {info.offset}: record count mismatch")
                continue
            piece = {}
            for col, dtype in layout[name].items():
                if col == "rank":
                    piece[col] = np.repeat(meta["rank"], counts).astype(dtype)
                elif col == "recv_ns":
                    piece[col] = np.repeat(decoded.recv_ns[decoded.kinds == kind], counts).astype(dtype)
                else:
                    piece[col] = cols[col].astype(dtype, copy=False)
            pieces[name].append(piece)
            fill[name] += n
        if decoded.other:
            times = decoded.recv_ns[decoded.kinds >= K_HELLO].tolist()
            _route(rec, tables, list(zip(times, decoded.other, strict=True)), info)
    for name in pieces:
        joined = {
            col: np.concatenate([pc[col] for pc in pieces[name]]) if pieces[name] else np.empty(0, dtype)
            for col, dtype in layout[name].items()
        }
        if name == "coll":
            tables.coll = joined
        else:
            tables.copy = joined
    return tables


def _route(rec: ChunkSource, tables: Tables, messages: list[tuple[int, Any]], info: ChunkInfo) -> None:
    """Hellos, Byes, telemetry ticks and other dicts into their lists, in order."""
    for time_ns, msg in messages:
        if isinstance(msg, p.Hello):
            tables.hellos.append((time_ns, msg))
        elif isinstance(msg, p.Bye):
            tables.byes.append((time_ns, msg))
        elif isinstance(msg, dict) and msg.get("k") == p.TELEM:
            try:
                tables.ticks.append((time_ns, decode_tick(msg)))
            except p.ProtocolError as exc:
                rec.problems.append(f"telemetry tick skipped at byte {info.offset}: {exc}")
        else:
            tables.other.append((time_ns, msg))
