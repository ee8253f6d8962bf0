"""NCCL ranks a script starts itself with multiprocessing.Process (one per GPU), its functions
bound by import, nothing of commtop in it; each rank counts what it issues (for a check of
workers.capture.spawned on a GPU, not commtop's count).

    commtop run --headless --nproc 1 --record R -- python benchmarks/jobs/nccl_process_ranks.py PREFIX spawn|fork

Per step: an all_reduce of 4 MiB, every 4th step a broadcast; a barrier at the end. Each rank
writes ``{"issued": n}`` to ``PREFIX.rankN.json``.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import torch
import torch.multiprocessing as mp
from torch.distributed import all_reduce, barrier, broadcast, destroy_process_group, init_process_group

STEPS = 40


def rank_main(rank: int, world: int, prefix: str) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = "29533"
    torch.cuda.set_device(rank)
    init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank))
    t = torch.ones(1 << 20, device="cuda")
    issued = 0
    for step in range(STEPS):
        all_reduce(t)
        issued += 1
        if step % 4 == 0:
            broadcast(t, 0)
            issued += 1
    barrier()
    issued += 1
    torch.cuda.synchronize()
    with open(f"{prefix}.rank{rank}.json", "w") as f:
        json.dump({"issued": issued}, f)
    destroy_process_group()


def main() -> int:
    prefix, method = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "spawn"
    world = torch.cuda.device_count()
    context: Any = mp.get_context(method)
    ranks = [context.Process(target=rank_main, args=(r, world, prefix)) for r in range(world)]
    for p in ranks:
        p.start()
    for p in ranks:
        p.join()
    print(f"nccl_process_ranks: exit codes {[p.exitcode for p in ranks]}", flush=True)
    return max(p.exitcode or 0 for p in ranks)


if __name__ == "__main__":
    sys.exit(main())
