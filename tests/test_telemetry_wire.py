"""TELEM / TELEM_CAPS bodies survive seal -> open_frames -> decode, and malformed ones are refused."""

from __future__ import annotations

import math

import numpy as np
import pytest

from workers.wire import protocol
from workers.wire.protocol import ProtocolError
from workers.wire.telemetry import Caps, GpuCaps, ProcInfo, Tick, caps_body, decode_caps, decode_tick, tick_body

KEY = protocol.new_key()


def _tick(n: int = 2) -> Tick:
    metrics = {name: np.arange(n, dtype=float) + i for i, name in enumerate(protocol.TELEM_GPU_METRICS)}
    metrics["nvlink_tx_gbps"][:] = np.nan
    return Tick(
        host="node-a",
        pid=42,
        seq=7,
        t_ns=1_700_000_000_000_000_000,
        cost_us=812.5,
        uuids=tuple(f"GPU-{i}" for i in range(n)),
        metrics=metrics,
        gpu_cost_us=np.full(n, 400.0),
        pcie_peak_gbps=np.full(n, 63.0),
        nvlink_peak_gbps=np.full(n, np.nan),
        cpu_pct=12.5,
        mem_used_bytes=3 << 30,
        mem_total_bytes=16 << 30,
        procs=(ProcInfo(100, "running", 99.0, 1 << 30), ProcInfo(101, "stopped", 0.0, 1 << 29)),
    )


def _roundtrip(body: dict) -> dict:
    return protocol.open_frames(KEY, protocol.seal(KEY, body), "sess")


def test_tick_roundtrip_keeps_nan_as_na() -> None:
    tick = _tick()
    got = decode_tick(_roundtrip(tick_body("sess", tick)))
    assert got.uuids == tick.uuids and got.procs == tick.procs and got.seq == 7
    for name in protocol.TELEM_GPU_METRICS:
        np.testing.assert_array_equal(got.metrics[name], tick.metrics[name])
    assert all(math.isnan(v) for v in got.metrics["nvlink_tx_gbps"])


def test_caps_roundtrip() -> None:
    caps = Caps(
        host="node-a",
        pid=42,
        t_ns=1,
        interval_s=0.1,
        nvml="",
        driver="580",
        gpus=(
            GpuCaps(
                "GPU-0",
                0,
                "NVIDIA H200",
                5,
                16,
                63.0,
                0,
                math.nan,
                {"pcie_tx_gbps": "gpm"},
                {"nvlink_tx_gbps": "no NVLink"},
            ),
        ),
        notes=("GPM ok",),
    )
    got = decode_caps(_roundtrip(caps_body("sess", caps)))
    assert got.gpus[0].na == {"nvlink_tx_gbps": "no NVLink"} and got.gpus[0].sources == {"pcie_tx_gbps": "gpm"}
    assert math.isnan(got.gpus[0].nvlink_peak_gbps) and got.notes == ("GPM ok",)


@pytest.mark.parametrize(
    "mutate",
    [
        lambda b: b["m"].__setitem__("pcie_tx_gbps", b"\x00" * 8),  # wrong length for 2 GPUs
        lambda b: b["m"].pop("power_w"),
        lambda b: b.__setitem__("procs", [[1, "flying", 0.0, 0]]),
        lambda b: b.__setitem__("uuids", "GPU-0"),
        lambda b: b.__setitem__("cpu", "high"),
    ],
)
def test_malformed_tick_is_refused(mutate) -> None:
    body = tick_body("sess", _tick())
    mutate(body)
    with pytest.raises(ProtocolError):
        decode_tick(_roundtrip(body))


def test_tick_respects_protocol_limits() -> None:
    body = tick_body("sess", _tick(64))
    assert len(protocol.seal(KEY, body)[1]) < protocol.MAX_BODY_BYTES
    assert decode_tick(_roundtrip(body)).uuids[-1] == "GPU-63"


def test_hbm_utilisation_is_optional_on_the_wire() -> None:
    """dram_bw_util_pct (GPM) travels where some GPU has it; a tick without it (an older sampler,
    an old recording, a machine without GPM) still decodes, with NaN for it."""
    tick = _tick()
    old_body = tick_body("sess", tick)  # no HBM metric at all: what an older sampler sent
    assert "dram_bw_util_pct" not in old_body["m"]
    got = decode_tick(_roundtrip(old_body))
    assert np.isnan(got.metrics["dram_bw_util_pct"]).all()
    with_nan = Tick(**{**tick.__dict__, "metrics": {**tick.metrics, "dram_bw_util_pct": np.full(2, np.nan)}})
    assert "dram_bw_util_pct" not in tick_body("sess", with_nan)["m"]  # n/a everywhere: absent
    hbm = np.array([37.5, np.nan])
    with_hbm = Tick(**{**tick.__dict__, "metrics": {**tick.metrics, "dram_bw_util_pct": hbm}})
    got = decode_tick(_roundtrip(tick_body("sess", with_hbm)))
    np.testing.assert_array_equal(got.metrics["dram_bw_util_pct"], hbm)
    bad = tick_body("sess", with_hbm)
    bad["m"]["dram_bw_util_pct"] = b"\x00" * 3  # present but malformed: refused like any metric
    with pytest.raises(ProtocolError):
        decode_tick(_roundtrip(bad))
