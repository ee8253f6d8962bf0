"""What a rank reports about its device: the GPU's UUID as NVML spells it, NCCL's version."""

from __future__ import annotations

import torch


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
