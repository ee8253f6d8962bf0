"""What a rank reports about its device: the GPU's UUID as NVML spells it, NCCL's version."""

from __future__ import annotations

import os

import torch

from workers.telemetry import nvml


def gpu_visible() -> bool:
    """Whether this process sees a GPU, asked without touching the CUDA runtime where NVML can
    answer: ``torch.cuda.is_available()`` calls cudaGetDeviceCount, after which torch refuses
    CUDA in every forked child ("Cannot re-initialize CUDA in forked subprocess"), so a script
    that forks its NCCL ranks failed under commtop and ran under plain python.
    ``torch.cuda.device_count()`` asks NVML first (the runtime only where NVML fails)."""
    try:
        return torch.cuda.device_count() > 0
    except (AssertionError, RuntimeError):  # a CPU build or a broken driver: no GPU to use
        return False


def gpu_uuid(index: int) -> str:
    """The GPU's UUID in NVML's spelling ("GPU-xxxxxxxx-..."), so samplers can match it."""
    try:
        text = str(torch.cuda.get_device_properties(index).uuid)
    except (AttributeError, RuntimeError):  # torch without .uuid: the sampler then watches every GPU
        return ""
    return text if text.startswith(("GPU-", "MIG-")) else f"GPU-{text}"


def nccl_version() -> str:
    try:
        version = torch.cuda.nccl.version()
    except Exception:
        return ""
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def visible_gpu_uuids(count: int) -> list[str]:
    """The UUIDs of the first ``count`` GPUs this process may use (``CUDA_VISIBLE_DEVICES``, as
    indices or UUID prefixes), read from NVML: torch's own device properties initialise CUDA in
    this process, and a process that did so before it forks makes every forked child that uses
    CUDA fail ("Cannot re-initialize CUDA in forked subprocess": a script that starts its NCCL
    ranks with a fork Process ran under plain python and failed under commtop). [] where NVML or
    the list cannot say (MIG, an unknown entry): the node sampler then watches every GPU."""
    if nvml.init() is not None or count <= 0:
        return []
    pynvml = nvml.pynvml
    try:
        uuids = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            uuid = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i))
            uuids.append(uuid.decode() if isinstance(uuid, bytes) else str(uuid))
    except Exception:  # noqa: BLE001 - no answer: every GPU is watched
        return []
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return uuids[:count]
    picked: list[str] = []
    for entry in (e.strip() for e in visible.split(",")):
        if entry.isdigit() and int(entry) < len(uuids):
            found = [uuids[int(entry)]]
        elif entry.startswith("GPU-"):
            found = [u for u in uuids if u.startswith(entry)]
        else:  # CUDA stops at the first entry it cannot read; MIG devices are not NVML's GPUs here
            break
        if len(found) != 1:
            return []
        picked.append(found[0])
    return picked[:count]
