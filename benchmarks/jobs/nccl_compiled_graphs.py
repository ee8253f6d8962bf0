"""A one-GPU NCCL job, nothing of commtop in it: (compile) a torch.compile'd function with two
functional all_reduces, called 10 times; 5 eager all_reduces; (graph) one all_gather captured in a
CUDA graph (out of place, so the one-rank graph is not empty), replayed 7 times (the job counts
what runs: the capture runs nothing); (trees) a
function with one functional all_reduce under ``torch.compile(mode="reduce-overhead")`` (torch's
CUDA graph trees), called 12 times; (ddp) a DDP model, 10 steps, and 3 ``all_reduce_coalesced``:
what DDP issues from C++ is not the job's to count, so torch.profiler's ``c10d::`` ops are its
reference there. It ends with sys.exit(CODE) and writes what it issued, by its own logic (and
the profiler's count), to PREFIX.rank0.json.

    commtop run --headless -- python benchmarks/jobs/nccl_compiled_graphs.py PREFIX CODE compile|graph|trees|ddp|all
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
        dist.all_gather_into_tensor(out, t)  # recorded into the graph: it runs at each replay
    for _ in range(7):
        g.replay()
        n("graph replay of the all_gather")
if what in ("all", "trees"):

    @torch.compile(mode="reduce-overhead")
    def h(x: torch.Tensor) -> torch.Tensor:
        return funcol.all_reduce(x * 2, "sum", dist.group.WORLD) + 1

    x = torch.ones(4096, device="cuda")
    for _ in range(12):
        h(x).sum().item()
        n("reduce-overhead funcol all_reduce")
if what in ("all", "ddp"):
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(256, 256).cuda())
        for _ in range(10):
            model(torch.randn(8, 256, device="cuda")).sum().backward()
        for _ in range(3):
            dist.all_reduce_coalesced([torch.ones(8, device="cuda"), torch.ones(4, device="cuda")])
        torch.cuda.synchronize()
    ops = [e.name for e in prof.events() if e.name.startswith("c10d::") and "wait" not in e.name]
    n("ddp part, torch.profiler's c10d ops", len(ops))
torch.cuda.synchronize()
with open(f"{prefix}.rank0.json", "w") as fh:
    json.dump(issued, fh)
sys.exit(code)
