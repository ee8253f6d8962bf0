"""Bandwidth arithmetic of nccl-tests, so commtop's numbers compare with theirs.

algbw = S / t, busbw = algbw * factor(op, n). For all_gather and reduce_scatter S is the
total (gathered) size; see nccl-tests' doc/PERFORMANCE.md. For gather and scatter it is one
rank's tensor times n, as gather_perf and scatter_perf count it (the capture sets S so:
workers.capture.flight_recorder.entry_nbytes, workers.monitor.timers). This module owns the factor rule:
the synthetic loop asks it for its one collective (:func:`bus_factor`), a monitored job for
every row it records (:func:`bus_factors`).
"""

from __future__ import annotations

import numpy as np

from workers.wire.protocol import COLLECTIVES, OP_NAMES

#: Ops nccl-tests' PERFORMANCE.md gives a busbw factor for.
NCCL_TESTS_OPS: tuple[str, ...] = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce")


def _factor(op: str, n: int) -> float:
    """The rule: nccl-tests' factor; gather and scatter move (n-1)/n of S like all_gather;
    send and recv move S once (nccl-tests' sendrecv: busbw = algbw); any other op (barrier)
    moves no data, 0."""
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all", "gather", "scatter"):
        return (n - 1) / n
    if op in ("broadcast", "reduce", "send", "recv"):
        return 1.0
    return 0.0


def bus_factor(op: str, world_size: int) -> float:
    """nccl-tests' busbw correction factor for ``op`` over ``world_size`` ranks; raises
    ValueError for an op nccl-tests has none for."""
    if op not in NCCL_TESTS_OPS:
        raise ValueError(f"unknown collective {op!r} (known: {', '.join(COLLECTIVES)})")
    return _factor(op, world_size)


def bus_factors(op: np.ndarray, ranks: np.ndarray) -> np.ndarray:
    """Per-row busbw factor of records that each carry their op (a code into ``OP_NAMES``)
    and group size, one scalar computation per distinct (op, group size). 0 where the group
    is empty, the op moves no data (barrier) or its code is unknown."""
    out = np.zeros(len(op), dtype=np.float64)
    if not len(op):
        return out
    key = op.astype(np.int64) << 32 | ranks.astype(np.int64)
    for k in np.unique(key):
        code, n = int(k >> 32), int(k & 0xFFFFFFFF)
        out[key == k] = _factor(OP_NAMES[code], n) if code < len(OP_NAMES) and n > 0 else 0.0
    return out


def collective_bytes(op: str, tensor_bytes: int, world_size: int) -> int:
    """S of nccl-tests for one collective on a per-rank tensor of ``tensor_bytes``.

    all_gather gathers world_size tensors; reduce_scatter reduces world_size tensors into
    one; all_reduce, broadcast and all_to_all move one tensor's worth per rank.
    """
    if op in ("all_gather", "reduce_scatter"):
        return tensor_bytes * world_size
    bus_factor(op, world_size)  # validates op
    return tensor_bytes


def algbw_gbps(nbytes: np.ndarray | float, dur_us: np.ndarray | float) -> np.ndarray:
    """GB/s (1e9 bytes per second) of moving ``nbytes`` in ``dur_us`` microseconds."""
    dur = np.maximum(np.asarray(dur_us, dtype=np.float64), 1e-3)
    return np.asarray(nbytes, dtype=np.float64) / dur / 1e3
