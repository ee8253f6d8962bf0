"""A user's job: N optimizer steps (an all_reduce of each gradient in each), then an eval's
barrier and all_reduce after the last step (none with "no-eval"; tests/test_report_steps_count.py,
tests/test_watch_unmodified.py)."""

import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
model = torch.nn.Linear(4, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(int(sys.argv[1])):
    model(torch.randn(2, 4)).sum().backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
    opt.step()
    opt.zero_grad()
if sys.argv[2:] != ["no-eval"]:
    dist.barrier()  # the eval after the last step
    dist.all_reduce(torch.ones(1))
dist.destroy_process_group()
