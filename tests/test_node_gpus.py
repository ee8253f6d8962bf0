"""Which GPUs a rank's node sampler watches, read from NVML without initialising CUDA in the rank:
torch's device properties (used before) initialise CUDA, and a process that did so before it
forks makes its forked CUDA children fail (a script that started its NCCL ranks with a fork
Process failed under commtop on an H100, "Cannot re-initialize CUDA in forked subprocess", and
ran under plain python). ``torch.cuda.is_available()`` does the same harm (it calls
cudaGetDeviceCount, and torch then refuses CUDA in forked children: found on the H100 after the
first fix). CI has no GPU: NVML is a stand-in here (FakeNvml), torch.cuda counts four GPUs (as
its NVML path does) and refuses every call that would touch the CUDA runtime."""

from __future__ import annotations

import pytest
import torch

from workers.monitor.rank_info import node_gpus
from workers.rank import device
from workers.telemetry import nvml

UUIDS = ["GPU-aaaa-0", "GPU-bbbb-1", "GPU-cccc-2", "GPU-ccdd-3"]


class FakeNvml:
    """The pynvml calls visible_gpu_uuids makes, over four GPUs."""

    def nvmlDeviceGetCount(self) -> int:
        return len(UUIDS)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetUUID(self, handle: int) -> bytes:
        return UUIDS[handle].encode()


@pytest.fixture
def fake_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nvml, "init", lambda: None)
    monkeypatch.setattr(nvml, "pynvml", FakeNvml())
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(UUIDS))

    def no_cuda_init(*args: object) -> None:
        raise AssertionError("CUDA touched in the rank before the job's script")

    monkeypatch.setattr(torch.cuda, "is_available", no_cuda_init)
    monkeypatch.setattr(torch.cuda, "get_device_properties", no_cuda_init)
    monkeypatch.setattr(torch.cuda, "current_device", no_cuda_init)


@pytest.mark.parametrize(
    ("visible", "count", "watched"),
    [
        (None, 2, UUIDS[:2]),
        ("2,3", 8, UUIDS[2:]),
        ("3,0", 1, [UUIDS[3]]),
        ("GPU-bbbb,GPU-ccdd", 2, [UUIDS[1], UUIDS[3]]),
        ("1,7,2", 4, [UUIDS[1]]),  # CUDA stops at the first entry it cannot use: so does this
        ("GPU-cc", 2, []),  # two GPUs match: every GPU is watched rather than the wrong one
        ("MIG-0123", 1, []),
    ],
)
def test_the_sampler_watches_the_gpus_this_rank_may_use(fake_gpus, monkeypatch, visible, count, watched) -> None:
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert node_gpus(count) == watched


def test_without_nvml_every_gpu_is_watched(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nvml, "init", lambda: nvml.NA(nvml.NVML_MISSING, "no driver"))
    assert device.visible_gpu_uuids(4) == []


def test_the_capture_sizes_the_flight_recorder_ring_without_touching_cuda(fake_gpus, monkeypatch) -> None:
    """The capture's set-up before the script (the ring size NCCL's Flight Recorder reads once)
    asks whether a GPU is there the way that leaves forked children free to use CUDA."""
    from types import SimpleNamespace

    from workers.capture.capture import Capture
    from workers.capture.fr_source import RING_ENV

    for name in RING_ENV:
        monkeypatch.setenv(name, "")  # no size of the user's (restored after the test)
    holder = SimpleNamespace(ring_note="")
    Capture._size_ring(holder)  # type: ignore[arg-type]
    assert holder.ring_note  # a GPU is there: the ring was sized (and said so)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    holder = SimpleNamespace(ring_note="")
    Capture._size_ring(holder)  # type: ignore[arg-type]
    assert holder.ring_note == ""
