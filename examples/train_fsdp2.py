"""An FSDP2 training job (``fully_shard``), nothing of commtop in it: gloo on the CPU, NCCL on GPUs.

    torchrun --standalone --nproc-per-node 2 examples/train_fsdp2.py --steps 4
    commtop run --nproc 2 -- python examples/train_fsdp2.py --steps 4

Each Linear layer and the whole model are ``fully_shard``-ed, parameters in bf16 and gradients
reduced in fp32 (``MixedPrecisionPolicy``): per step FSDP2 all-gathers every layer's parameters in
the forward and again in the backward (resharded after the forward), and reduce-scatters its
gradients; the script adds a loss all_reduce of its own.

``--count PREFIX`` counts the collectives the ranks ran, independently of any monitor: with
torch.profiler, every c10d op the dispatcher ran (``c10d::_allgather_base_``,
``c10d::_reduce_scatter_base_``, ``c10d::allreduce_``, ...) with its input shapes and dtypes, per
(op, dtype, nbytes as nccl-tests count them), written to ``PREFIX.rankN.json``.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

#: FSDP2's c10d dispatcher ops -> (op as commtop names it, index of the tensor whose bytes are S).
C10D_OPS = {
    "c10d::_allgather_base_": ("all_gather", 0),  # (output, input, ...): S = the gathered output
    "c10d::_reduce_scatter_base_": ("reduce_scatter", 1),  # (output, input, ...): S = the input
}
#: The job's own all_reduce (a tensor list: the profiler records no shape): the loss, a float32 scalar.
LOSS = ("all_reduce", "float32", 4)
ELEMENT = {"float": (4, "float32"), "c10::BFloat16": (2, "bfloat16"), "c10::Half": (2, "float16")}


def count_c10d_ops(prof: torch.profiler.profile) -> list[list[object]]:
    """[(op, dtype, nbytes, count)] of the c10d ops torch.profiler saw."""
    counts: collections.Counter[tuple[str, str, int]] = collections.Counter()
    for event in prof.events():
        if event.name == "c10d::allreduce_":
            counts[LOSS] += 1
        spec = C10D_OPS.get(event.name)
        if spec is None:
            continue
        op, index = spec
        dims = event.input_shapes[index]
        size, dtype = ELEMENT[event.input_dtypes[index]]
        n = 1
        for d in dims:
            n *= d
        counts[(op, dtype, n * size)] += 1
    return [[op, dtype, nbytes, n] for (op, dtype, nbytes), n in sorted(counts.items())]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--count", default="", help="write the ranks' c10d op counts (torch.profiler) to PREFIX.rankN.json")
    args = ap.parse_args(argv)
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device("cuda") if cuda else torch.device("cpu")
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(args.hidden, args.hidden) for _ in range(args.layers)]).to(device)
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model:
        fully_shard(layer, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(8, args.hidden, device=device, generator=torch.Generator(device).manual_seed(dist.get_rank()))
    activities = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=activities, record_shapes=True) as prof:
        for _ in range(args.steps):
            loss = model(x).float().pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            dist.all_reduce(loss.detach())  # the job's own: the mean loss, for its log
    if args.count:
        with open(f"{args.count}.rank{dist.get_rank()}.json", "w") as f:
            json.dump(count_c10d_ops(prof), f)
    if dist.get_rank() == 0:
        print(f"train_fsdp2: {args.steps} steps, loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
