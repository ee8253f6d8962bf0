"""The NVML layer: typed n/a with reasons, and the real 'NVML not available' path (this
machine has pynvml installed but no libnvidia-ml)."""

from __future__ import annotations

import logging
import math

import pynvml
import pytest

from workers.telemetry import nvml
from workers.telemetry.nvml import NA
from workers.telemetry.sampler import NodeSampler
from workers.wire.telemetry import caps_body, decode_caps, decode_tick, tick_body


@pytest.fixture(autouse=True)
def fresh_nvml():
    nvml._reset_for_tests()
    yield
    nvml._reset_for_tests()


def _has_libnvml() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


def test_machine_has_no_libnvidia_ml() -> None:
    """The tests below exercise the real missing-library path; they need a machine without NVML."""
    assert not _has_libnvml(), "this CI machine unexpectedly has libnvidia-ml"


def test_init_reports_nvml_not_available_and_is_sticky() -> None:
    first = nvml.init()
    assert isinstance(first, NA) and first.reason == nvml.NVML_MISSING
    assert "Library Not Found" in first.detail
    assert nvml.init() is first
    got = nvml.query(pynvml.nvmlDeviceGetCount)
    assert isinstance(got, NA) and got.reason == nvml.NVML_MISSING
    assert not got  # n/a is never truthy, so it cannot pass for a reading
    assert str(got) == "n/a: NVML not available"


class FakeNvmlCall:
    """Raises a real NVMLError code: the only way to get NotSupported without a GPU."""

    def __init__(self, code: int) -> None:
        self.code = code
        self.__name__ = f"fake_nvml_call_{code}"
        self.calls = 0

    def __call__(self, *args: object) -> int:
        self.calls += 1
        raise pynvml.NVMLError(self.code)


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        (pynvml.NVML_ERROR_NOT_SUPPORTED, nvml.NOT_SUPPORTED),
        (pynvml.NVML_ERROR_NO_PERMISSION, nvml.NO_PERMISSION),
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, nvml.NVML_MISSING),
        (pynvml.NVML_ERROR_UNINITIALIZED, nvml.NVML_MISSING),
        (pynvml.NVML_ERROR_GPU_IS_LOST, nvml.GPU_LOST),
    ],
)
def test_errors_map_to_reasons(code: int, reason: str) -> None:
    nvml.init()  # imports pynvml into the layer
    assert nvml.call(FakeNvmlCall(code)).reason == reason
    assert nvml.ret_na(code).reason == reason
    assert nvml.ret_na(0) is None


def test_unsupported_call_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    nvml.init()
    fake = FakeNvmlCall(pynvml.NVML_ERROR_NOT_SUPPORTED)
    with caplog.at_level(logging.INFO, logger="commtop.telemetry.nvml"):
        for _ in range(20):
            assert nvml.call(fake).reason == nvml.NOT_SUPPORTED
    assert fake.calls == 20
    assert sum(fake.__name__ in r.getMessage() for r in caplog.records) == 1


def test_sampler_without_nvml_reports_host_and_says_why() -> None:
    sampler = NodeSampler([], interval_s=0.1)
    try:
        tick = sampler.tick()
        caps = sampler.caps()
    finally:
        sampler.close()
    assert tick.nvml == nvml.NVML_MISSING and tick.uuids == ()
    assert all(len(v) == 0 for v in tick.metrics.values())
    assert tick.mem_total_bytes > 0 and 0 <= tick.cpu_pct <= 100 and not math.isnan(tick.cost_us)
    assert caps.nvml == nvml.NVML_MISSING and caps.gpus == ()
    assert any("NVML not available" in n for n in caps.notes)
    # and both survive the wire
    assert decode_tick(tick_body("s", tick)).nvml == nvml.NVML_MISSING
    assert decode_caps(caps_body("s", caps)).notes == caps.notes


def test_h200_link_states_mean_no_nvlink() -> None:
    """Real H200 answers: nvmlDeviceGetNvLinkState NotSupported on every link -> 'no NVLink',
    and the all-links NVLink fields 138/139 (scopeId 0xFFFFFFFF) -> not supported, never 0."""
    import json
    from pathlib import Path

    from workers.telemetry.gpu import nvlink_links

    nvml.init()
    cap = json.loads((Path(__file__).parent / "fixtures" / "nvml" / "h200_nvml.json").read_text())
    g = cap["gpus"][0]
    states = [s["ok"] if "ok" in s else nvml.ret_na(s["code"]) for s in g["nvlink_states"]]
    assert len(states) >= 18
    active, why = nvlink_links(states)
    assert active == 0 and why == NA(nvml.NO_NVLINK)
    for f in g["nvlink_fields"]["ok"]:
        if f["field"] in (138, 139) and f["scope"] == 0xFFFFFFFF:
            assert nvml.ret_na(f["ret"]) == NA(nvml.NOT_SUPPORTED)
    assert nvlink_links([0, 1, 1]) == (2, None)
    assert nvlink_links([0, 0])[1].reason == nvml.NO_NVLINK
