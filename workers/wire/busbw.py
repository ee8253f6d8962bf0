"""Bandwidth arithmetic of nccl-tests, so commtop's numbers compare with theirs.

algbw = S / t, busbw = algbw * factor(op, n). For all_gather and reduce_scatter S is the
total (gathered) size; see nccl-tests' doc/PERFORMANCE.md.
"""

from __future__ import annotations

import numpy as np

from workers.wire.protocol import COLLECTIVES


def bus_factor(op: str, world_size: int) -> float:
    """nccl-tests' busbw correction factor for ``op`` over ``world_size`` ranks."""
    n = world_size
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    if op in ("broadcast", "reduce"):
        return 1.0
    raise ValueError(f"unknown collective {op!r} (known: {', '.join(COLLECTIVES)})")


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
