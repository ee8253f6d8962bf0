"""How many GPUs this node offers, and how much memory each has, without importing torch.

`commtop run` picks NCCL with one rank per visible GPU, or gloo ranks on the CPU when
there is none. NVML ignores CUDA_VISIBLE_DEVICES, so the variable is applied here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class GpuInventory:
    count: int
    memory_bytes: tuple[int, ...] = ()
    names: tuple[str, ...] = ()
    reason: str = ""  # why there are none ("NVML not available", "CUDA_VISIBLE_DEVICES is empty", ...)


def visible_gpus() -> GpuInventory:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return GpuInventory(0, reason="CUDA_VISIBLE_DEVICES hides every GPU")
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:  # the library is missing or the driver is not loaded
        return GpuInventory(0, reason=f"NVML not available ({type(exc).__name__})")
    try:
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        if visible is not None:
            picked = []
            for token in (t.strip() for t in visible.split(",")):
                if token.isdigit() and int(token) < len(handles):
                    picked.append(handles[int(token)])
                elif token.startswith(("GPU-", "MIG-")):
                    picked.extend(h for h in handles if _uuid(pynvml, h).startswith(token))
            handles = picked
        memory = tuple(int(pynvml.nvmlDeviceGetMemoryInfo(h).total) for h in handles)
        names = tuple(_name(pynvml, h) for h in handles)
        return GpuInventory(len(handles), memory, names, "" if handles else "no GPU found by NVML")
    except Exception as exc:
        return GpuInventory(0, reason=f"NVML query failed ({type(exc).__name__})")
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def _uuid(pynvml, handle) -> str:  # type: ignore[no-untyped-def]
    value = pynvml.nvmlDeviceGetUUID(handle)
    return value.decode() if isinstance(value, bytes) else str(value)


def _name(pynvml, handle) -> str:  # type: ignore[no-untyped-def]
    value = pynvml.nvmlDeviceGetName(handle)
    return value.decode() if isinstance(value, bytes) else str(value)
