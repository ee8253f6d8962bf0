"""Who a monitored rank is, as its Hellos say: rank, backend, device, knobs, how it is captured,
its default process group (code 0 of the records' ``group`` column).

Read again whenever one of them appears (the process group, the first GPU record, a knob, a
named copy, the capture the bootstrap picked), so the collector learns them as they become known.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from workers.monitor.knobs import Knobs
from workers.monitor.records import OPS
from workers.rank.groups import Group, describe
from workers.rank.heartbeat import RunInfo, reported_hostname


def script_name(argv0: str) -> str:
    """What names the job: its script's file name; a package's when python runs its
    ``__main__.py`` (``python -m pkg``: runpy puts that file's path in ``sys.argv[0]``)."""
    name = os.path.basename(argv0 or "python")
    if name == "__main__.py" and os.path.dirname(argv0):
        return os.path.basename(os.path.dirname(os.path.abspath(argv0)))
    return name


def run_info(
    *,
    rank: int,
    world_size: int,
    local_rank: int,
    local_world_size: int,
    on_gpu: bool,
    knobs: Knobs,
    copy_names: list[str],
    capture: str,
    live: bool = True,
) -> RunInfo:
    """This rank's RunInfo; ``rank`` and ``world_size`` are the process group's once it exists.
    ``on_gpu``: the monitor has timed a GPU record (the device is then reported without NCCL);
    ``live``: its knobs follow the collector (False: fixed, and the collector refuses changes)."""
    backend, device, index, uuid, torch_version, nccl = "unknown", "cpu", -1, "", "", ""
    torch = sys.modules.get("torch")
    if torch is not None:
        torch_version = str(torch.__version__)
        dist = sys.modules.get("torch.distributed")
        if dist is not None and dist.is_available() and dist.is_initialized():
            backend = backend_name(dist)
            rank, world_size = dist.get_rank(), dist.get_world_size()
        if on_gpu or backend == "nccl":
            from workers.rank.device import gpu_uuid, nccl_version

            index = torch.cuda.current_device()
            device, uuid, nccl = torch.cuda.get_device_name(index), gpu_uuid(index), nccl_version()
    config = {
        "source": "monitor",
        "collective": f"monitor: {script_name(sys.argv[0] if sys.argv else '')}",
        "op_names": list(OPS),
        "knobs": {k: list(v) for k, v in knobs.choices.items()},
        "mode_knob": knobs.mode_knob,
        "knobs_final": knobs.final,  # a step has ended: knobs are declared before the loop
        "live_control": live,
        "copy_names": list(copy_names),
        "control_unit": "step",
        "capture": capture or "monitor hooks",
    }
    return RunInfo(
        rank=rank,
        world_size=world_size,
        local_rank=local_rank,
        local_world_size=local_world_size,
        host=reported_hostname(),
        pid=os.getpid(),
        backend=backend if backend != "gloo" else "gloo/cpu",
        device=device,
        device_index=index,
        gpu_uuid=uuid,
        torch_version=torch_version,
        nccl_version=nccl,
        config=config,
    )


def world_group() -> Group | None:
    """The default process group's (name, description, size), None before it exists."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    return describe(None)


def node_gpus(local_world_size: int) -> list[str]:
    """This node's GPUs, for the node sampler (none seen yet: it watches every GPU). Read from
    NVML, never through torch's device properties: the monitor starts before the job's script,
    and initialising CUDA here would make the script's forked CUDA processes fail."""
    if sys.modules.get("torch") is None:
        return []
    from workers.rank.device import gpu_visible, visible_gpu_uuids

    return visible_gpu_uuids(local_world_size) if gpu_visible() else []


def env_int(name: str, default: int) -> int:
    """An integer torchrun sets ($RANK, $WORLD_SIZE, ...), ``default`` when unset or not one."""
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


def backend_name(dist: Any) -> str:
    """torch's name of the default group's backend. A group made without one
    (``init_process_group()``, ``init_device_mesh``) is "undefined" to torch: then what its
    device map holds, "gloo" (cpu:gloo), "nccl" (cuda:nccl) or "nccl+gloo" (both)."""
    name = str(dist.get_backend())
    if name != "undefined":
        return name
    try:
        config = str(dist.get_backend_config())
    except Exception:  # noqa: BLE001 - an older torch: keep its word
        return name
    backends = {part.partition(":")[2] or part for part in config.split(",") if part}
    ordered = sorted(backends, key=lambda b: (b != "nccl", b))
    return "+".join(ordered) or name
