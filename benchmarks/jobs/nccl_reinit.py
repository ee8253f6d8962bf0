"""Two phases in one process, each with its own NCCL default group: destroy_process_group(), then
init_process_group() again (an evaluation phase, a test harness); phase 2 also issues
all_reduce_coalesced (out of the Python hooks' sight). The job writes its own count.

    commtop run --headless -- python benchmarks/jobs/nccl_reinit.py COUNTS_PREFIX
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist


def main() -> None:
    prefix = sys.argv[1]
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    x = torch.ones(1 << 16, device="cuda")
    calls = 0
    dist.init_process_group("nccl")
    for _ in range(8):
        dist.all_reduce(x)
        calls += 1
    dist.barrier()
    calls += 1
    torch.cuda.synchronize()
    dist.destroy_process_group()
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), int(os.environ["WORLD_SIZE"]), is_master=False
    )
    dist.init_process_group(
        "nccl",
        store=dist.PrefixStore("phase2", store),
        rank=int(os.environ["RANK"]),
        world_size=int(os.environ["WORLD_SIZE"]),
    )
    for _ in range(4):
        dist.all_reduce(x)
        dist.all_reduce_coalesced([x[:100], x[100:300]])
        calls += 2
    torch.cuda.synchronize()
    with open(f"{prefix}.rank{dist.get_rank()}.json", "w") as fh:
        json.dump({"calls": calls}, fh)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
