"""One GPU, NCCL, where a rank's group names and torch's pg_ids part: a gloo side group takes
name "1" before an NCCL subgroup (name "2", pg_id 1). 5 all_reduces on the world group, 6 on the
NCCL subgroup, 3 on the gloo group (CPU tensors); the job writes its own count.

    commtop run --headless -- python benchmarks/jobs/nccl_side_groups.py COUNTS_PREFIX
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist


def main() -> None:
    torch.cuda.set_device(0)
    dist.init_process_group("nccl")
    side = dist.new_group(backend="gloo")
    sub = dist.new_group(ranks=[0])
    x = torch.ones(1 << 14, device="cuda")
    calls = 0
    for _ in range(5):
        dist.all_reduce(x)
        calls += 1
    for _ in range(6):
        dist.all_reduce(x, group=sub)
        calls += 1
    for _ in range(3):
        dist.all_reduce(torch.ones(8), group=side)
        calls += 1
    torch.cuda.synchronize()
    with open(f"{sys.argv[1]}.rank0.json", "w") as fh:
        json.dump({"calls": calls}, fh)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
