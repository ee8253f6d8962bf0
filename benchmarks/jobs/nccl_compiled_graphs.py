"""A one-GPU NCCL job, nothing of commtop in it: (compile) a torch.compile'd function with two
functional all_reduces, called 10 times; 5 eager all_reduces; (graph) one all_gather captured in a
CUDA graph (out of place, so the one-rank graph is not empty), replayed 7 times. It ends with
sys.exit(CODE) and writes what it issued, by its own logic, to PREFIX.rank0.json.

    commtop run --headless -- python benchmarks/jobs/nccl_compiled_graphs.py PREFIX CODE compile|graph|all
"""

import json
import sys

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

prefix, code = sys.argv[1], int(sys.argv[2])
what = sys.argv[3] if len(sys.argv) > 3 else "all"
torch.cuda.set_device(0)
dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
issued = {}


def n(key: str, count: int = 1) -> None:
    issued[key] = issued.get(key, 0) + count


if what in ("all", "compile"):

    @torch.compile
    def f(x: torch.Tensor) -> torch.Tensor:
        y = funcol.all_reduce(x, "sum", dist.group.WORLD)
        z = funcol.all_reduce(y * 2, "sum", dist.group.WORLD)
        return z + 1

    x = torch.ones(1024, device="cuda")
    for _ in range(10):
        f(x)
        n("compiled funcol all_reduce", 2)
for _ in range(5):
    dist.all_reduce(torch.ones(1024, device="cuda"))
    n("eager all_reduce")
if what in ("all", "graph"):
    t, out = torch.ones(1024, device="cuda"), torch.empty(1024, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        dist.all_gather_into_tensor(out, t)
        n("warm-up all_gather")
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        dist.all_gather_into_tensor(out, t)
        n("captured all_gather")
    for _ in range(7):
        g.replay()
        n("graph replay of the all_gather")
torch.cuda.synchronize()
with open(f"{prefix}.rank0.json", "w") as fh:
    json.dump(issued, fh)
sys.exit(code)
