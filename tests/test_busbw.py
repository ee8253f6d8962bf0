"""busbw factors and sizes match nccl-tests' PERFORMANCE.md, computed by hand."""

from __future__ import annotations

import numpy as np
import pytest

from workers.wire.busbw import algbw_gbps, bus_factor, bus_factors, collective_bytes
from workers.wire.protocol import OP_NAMES


@pytest.mark.parametrize(
    ("op", "n", "factor"),
    [
        ("all_reduce", 8, 2 * 7 / 8),  # 1.75
        ("all_reduce", 2, 1.0),
        ("all_gather", 8, 7 / 8),
        ("reduce_scatter", 4, 3 / 4),
        ("all_to_all", 8, 7 / 8),
        ("broadcast", 8, 1.0),
        ("all_gather", 1, 0.0),
    ],
)
def test_bus_factor(op: str, n: int, factor: float) -> None:
    assert bus_factor(op, n) == pytest.approx(factor)


def test_forum_all_gather_numbers() -> None:
    # 8 x 128 MiB bf16 all_gather in 2.7 ms (the forum) is ~398 GB/s algbw, ~348 GB/s busbw.
    tensor = 8192 * 8192 * 2
    s = collective_bytes("all_gather", tensor, 8)
    assert s == 8 * 134217728
    algbw = float(algbw_gbps(s, 2700.0))
    assert algbw == pytest.approx(1073741824 / 2.7e-3 / 1e9)
    assert algbw * bus_factor("all_gather", 8) == pytest.approx(348.0, abs=1.0)


def test_sizes_per_collective() -> None:
    assert collective_bytes("reduce_scatter", 100, 4) == 400
    assert collective_bytes("all_reduce", 100, 4) == 100
    assert collective_bytes("broadcast", 100, 4) == 100
    assert collective_bytes("all_to_all", 100, 4) == 100
    with pytest.raises(ValueError):
        collective_bytes("gather", 100, 4)


def test_point_to_point_records_move_their_bytes_once() -> None:
    """send and recv records (the hooks' blocking p2p): busbw = algbw, as nccl-tests' sendrecv;
    barrier moves nothing; a code past the names is 0, not an error."""
    ops = np.array([OP_NAMES.index("send"), OP_NAMES.index("recv"), OP_NAMES.index("barrier"), 250], dtype=np.uint8)
    assert bus_factors(ops, np.array([2, 8, 8, 8])).tolist() == [1.0, 1.0, 0.0, 0.0]
