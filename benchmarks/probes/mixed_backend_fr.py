"""Where a job's collectives land in torch's Flight Recorder when it calls ``init_process_group()``
with no backend on a GPU (torch's device map ``cpu:gloo,cuda:nccl``): CUDA tensors go to NCCL,
CPU tensors to gloo. Prints one JSON line: what the NCCL dump (``_dump_nccl_trace``, what the
capture reads) and the generic ring (``_dump_fr_trace_json``, gloo's) hold, by profiling name,
and whether NCCL's entries are timed. Needs a GPU.

    torchrun --standalone --nproc-per-node 1 benchmarks/probes/mixed_backend_fr.py
"""

from __future__ import annotations

import json
import os
import pickle
from collections import Counter

import torch
import torch.distributed as dist

os.environ.setdefault("TORCH_NCCL_ENABLE_TIMING", "1")
CUDA_OPS, CPU_OPS = 5, 3


def main() -> None:
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group()
    from workers.monitor.rank_info import backend_name

    g = torch.ones(1024, device="cuda")
    c = torch.ones(16)
    for _ in range(CUDA_OPS):
        dist.all_reduce(g)
    out: dict = {"backend": backend_name(dist), "torch": torch.__version__}
    try:
        for _ in range(CPU_OPS):
            dist.all_reduce(c)
    except RuntimeError as exc:  # torch 2.11 makes an NCCL-only group when no backend is named
        out["cpu_all_reduce"] = str(exc)[:200]
    torch.cuda.synchronize()
    import time

    time.sleep(1.0)  # the watchdog retires the NCCL entries
    c10d = torch._C._distributed_c10d
    nccl = pickle.loads(c10d._dump_nccl_trace(includeCollectives=True, includeStackTraces=False, onlyActive=False))
    ents = nccl.get("entries") or []
    out["nccl_dump"] = dict(Counter(e.get("profiling_name") for e in ents))
    out["nccl_timed"] = sum(1 for e in ents if e.get("duration_ms") is not None)
    gen = getattr(c10d, "_dump_fr_trace_json", None)
    if gen is not None:
        data = json.loads(gen(includeCollectives=True, onlyActive=False))
        out["generic_ring"] = dict(Counter(e.get("profiling_name") for e in data.get("entries") or []))
    print("mixed_backend_fr: " + json.dumps(out), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
