"""GPU collectives from three threads of each rank, nothing of commtop in it; each rank counts
what it issues (for a check of the Python hooks' per-thread CUDA rings on a GPU, not commtop's
count).

    commtop run --headless --record R -- python benchmarks/jobs/nccl_threads.py PREFIX
    COMMTOP_CAPTURE=hooks commtop run --headless --record R -- python benchmarks/jobs/nccl_threads.py PREFIX

Per step: DDP's gradient all_reduce through a comm hook of the job's own (it counts its calls
and says which thread ran it: autograd's device thread for CUDA tensors), an all_reduce of the
loss on the main thread; beside the loop, a saver thread all_reduces 1 MiB on a group of its
own, ``SAVES`` times. Each rank writes ``{"issued": n, "hook_threads": [...]}`` to
``PREFIX.rankN.json`` (n: every collective the job's logic issued).
"""

from __future__ import annotations

import json
import sys
import threading

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

STEPS = 60
SAVES = 40


def main() -> int:
    prefix = sys.argv[1]
    gpu = torch.cuda.is_available()
    dist.init_process_group("nccl" if gpu else "gloo")  # gloo on the CPU: a dry run of the job
    rank = dist.get_rank()
    device = torch.device("cuda", rank % torch.cuda.device_count()) if gpu else torch.device("cpu")
    if gpu:
        torch.cuda.set_device(device)
    saver_group = dist.new_group(list(range(dist.get_world_size())))
    counts = {"hook": 0, "loop": 0, "saver": 0}
    hook_threads: set[str] = set()

    def counted_hook(state, bucket):  # no annotations: DDP refuses any but its own types
        counts["hook"] += 1
        hook_threads.add("main" if threading.current_thread() is threading.main_thread() else "other")
        return default_hooks.allreduce_hook(state, bucket)

    model = DistributedDataParallel(torch.nn.Linear(1024, 1024).to(device), device_ids=[device.index] if gpu else None)
    model.register_comm_hook(None, counted_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def saver() -> None:
        buf = torch.ones(1 << 18, device=device)
        for _ in range(SAVES):
            dist.all_reduce(buf, group=saver_group)
            counts["saver"] += 1

    thread = threading.Thread(target=saver, name="saver")
    thread.start()
    for _ in range(STEPS):
        loss = model(torch.randn(64, 1024, device=device)).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        dist.all_reduce(loss.detach())
        counts["loop"] += 1
    thread.join()
    if gpu:
        torch.cuda.synchronize()
    with open(f"{prefix}.rank{rank}.json", "w") as f:
        json.dump({"issued": sum(counts.values()), **counts, "hook_threads": sorted(hook_threads)}, f)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
