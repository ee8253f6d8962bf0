"""A one-GPU NCCL job whose stream stalls: 5 all_reduces, then a kernel that spins for SECONDS on
the stream, an all_gather queued behind it (it cannot start: what a collective a peer never
joined looks like on this rank's GPU), a device sync that waits for both, and 5 more all_reduces.
Nothing of commtop in it; it writes what it issued to PREFIX.rank0.json.

    commtop run --headless --record x.commtop -- python benchmarks/jobs/nccl_stuck.py PREFIX SECONDS
"""

import json
import sys
import time

import torch
import torch.distributed as dist

prefix, seconds = sys.argv[1], float(sys.argv[2])
torch.cuda.set_device(0)
dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
x = torch.ones(1 << 20, device="cuda")
for _ in range(5):
    dist.all_reduce(x)
torch.cuda.synchronize()
t0 = time.perf_counter()
torch.cuda._sleep(100_000_000)  # calibrate: cycles per second of this GPU's spin kernel
torch.cuda.synchronize()
per_s = 100_000_000 / (time.perf_counter() - t0)
torch.cuda._sleep(int(per_s * seconds))
out = torch.empty(1 << 20, device="cuda")
created_ns = time.time_ns()
dist.all_gather_into_tensor(out, x)
torch.cuda.synchronize()
stalled_s = time.perf_counter() - t0
for _ in range(5):
    dist.all_reduce(x)
torch.cuda.synchronize()
with open(f"{prefix}.rank0.json", "w") as fh:
    json.dump({"all_reduce": 10, "all_gather": 1, "all_gather created_ns": created_ns, "stalled_s": stalled_s}, fh)
dist.destroy_process_group()
