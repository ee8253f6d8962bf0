"""``torchrun ... -m workers``: one rank of the synthetic collective + offload loop
(:mod:`workers.synthetic.main`)."""

import os
import sys

from workers.synthetic.main import main

if __name__ == "__main__":
    exit_code = main()
    # Everything is closed and flushed by now; the interpreter's own teardown (torch, gloo,
    # thread joins) took 1-3 s on a busy 2-core host, so a stopped worker leaves at once.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(exit_code)
