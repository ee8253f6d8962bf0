"""One GPU, NCCL: DDP with ZeroRedundancyOptimizer (Adam inside) for STEPS steps, then, with
``raise``, a ValueError of the job's own after them. Writes what it did, by its own logic, to
PREFIX.rank0.json: the steps it took. commtop should show STEPS steps (ZeRO stepping its inner
Adam counted each step twice) and, with ``raise``, the job's traceback as the script alone prints it.

    commtop run --headless --record R.commtop -- python benchmarks/jobs/nccl_zero_raise.py PREFIX STEPS [raise]
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    prefix, steps = sys.argv[1], int(sys.argv[2])
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    torch.cuda.set_device(rank % torch.cuda.device_count())
    model = DDP(torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8)).cuda())
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=0.01)
    for _ in range(steps):
        loss = model(torch.randn(32, 256, device="cuda")).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
    torch.cuda.synchronize()
    with open(f"{prefix}.rank{rank}.json", "w") as fh:
        json.dump({"steps": steps}, fh)
    if sys.argv[3:] == ["raise"]:
        raise ValueError("the job's own error after its steps")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
