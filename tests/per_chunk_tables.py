"""The per-chunk reader: a recording's tables decoded chunk by chunk with ``decode_chunk``,
the reference that the bulk reader (``Recording.tables``, tui.recordings.bulk) must equal, bit
for bit. Only tests compare the two, so it lives here, not in the product."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tui.recordings.codec import K_COLL, K_COPY, K_HELLO, Tables
from tui.recordings.reader import Recording
from workers.wire import protocol as p
from workers.wire.telemetry import decode_tick


def tables_by_chunk(rec: Recording, coll_columns: Sequence[str] | None = None) -> Tables:
    """``rec.tables(coll_columns)``, chunk by chunk with :func:`decode_chunk`.
    Chunks decode straight into arrays sized from the chunk prefixes (no second copy)."""
    tables = Tables({}, {})
    out: dict[str, dict[str, np.ndarray]] = {}
    fill = {"coll": 0, "copy": 0}
    for name, schema, wanted, total in (
        ("coll", p.COLL_COLUMNS, coll_columns, sum(c.coll_records for c in rec.chunks)),
        ("copy", p.COPY_COLUMNS, None, sum(c.copy_records for c in rec.chunks)),
    ):
        dtypes = {n: d for n, d in {**schema, "recv_ns": "<i8"}.items() if wanted is None or n in wanted}
        out[name] = {n: np.empty(total, d) for n, d in {**dtypes, "rank": "<i4"}.items()}
    for info in rec.chunks:
        chunk = rec.decode(info, coll_columns)
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
                rec.problems.append(f"undecodable chunk at byte {info.offset}: record count mismatch")
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
                        rec.problems.append(f"telemetry tick skipped at byte {info.offset}: {exc}")
                else:
                    tables.other.append((t, msg))
    tables.coll = {n: arr[: fill["coll"]] for n, arr in out["coll"].items()}
    tables.copy = {n: arr[: fill["copy"]] for n, arr in out["copy"].items()}
    return tables
