"""A user's job whose ranks catch SIGTERM and carry on (some frameworks' handlers only note it):
stopping commtop must still end them (tests/test_stop_a_job_that_ignores_sigterm.py)."""

import signal
import sys
import time

import torch
import torch.distributed as dist

signal.signal(signal.SIGTERM, lambda *_: print("SIGTERM noted, carrying on", flush=True))
dist.init_process_group("gloo")
t = torch.ones(4)
for i in range(1_000_000):
    dist.all_reduce(t)
    if i == 20:
        print("running", flush=True)
        sys.stderr.flush()
    time.sleep(0.01)
