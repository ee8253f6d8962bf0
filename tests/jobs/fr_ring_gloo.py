"""A real torch Flight Recorder ring, read the way the capture reads NCCL's: through torch's worker
server (its C++ thread, over a unix socket) on the fill level torch's status dump gives.

gloo records every collective in the generic ring (no events, so every entry is untimed for
commtop), and torch 2.13's worker server serves that ring as ``fr_trace_json``; everything else is
the capture's own code (workers.capture.fr_source). Run by tests/test_fr_gloo_ring.py in a fresh
process with ``TORCH_FR_BUFFER_SIZE`` set (torch reads it once per process): prints one JSON line.

    TORCH_FR_BUFFER_SIZE=64 python tests/jobs/fr_ring_gloo.py FOLDER [rank|child|child-killed]

With ``child`` the ring is decoded in the decoder child (workers.capture.fr_child), as the
capture does by default, to the end (its final count included); with ``child-killed`` the child
is killed after the first phase: the reads go on in this process from the cursor the child left
(nothing read twice, nothing lost uncounted).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as c10d

from workers.capture.flight_recorder import WAIT, finished
from workers.capture.fr_child import ChildDecoder
from workers.capture.fr_source import FlightRecorderSource, ServerDump, WorkerServer, ring_size

KEEP_UP, BLIND, AFTER = 500, 200, 7


def settle(timeout_s: float = 30.0) -> None:
    """Until torch has finished every entry in its ring. gloo marks an entry finished on its
    own thread, a moment after the collective returned: on a loaded machine a read right after
    the loop found the last entry unfinished and left it for later (unread 8, not 7)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        dump = json.loads(c10d._dump_fr_trace_json(includeCollectives=True, onlyActive=False))
        if all(finished(e) != WAIT for e in dump.get("entries", [])):
            return
        time.sleep(0.01)
    raise SystemExit("fr_ring_gloo: torch left an entry unfinished for 30 s")


def main(folder: str, how: str) -> None:
    child = how.startswith("child")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    server = WorkerServer(folder, "fr.sock")
    ring = ring_size(os.environ)
    warnings: list[str] = []
    local = ServerDump(server.path, handler="fr_trace_json", decode=json.loads)
    source = FlightRecorderSource(
        ChildDecoder(server.path, "fr_trace_json", "json") if child else local,
        lambda: json.loads(c10d._dump_fr_trace_json(includeCollectives=False, onlyActive=False)),
        ring,
        warn=warnings.append,
        fallbacks=[local] if child else (),
    )
    t = torch.ones(4)
    now = 0.0
    for _ in range(KEEP_UP):  # a poller that keeps up: it looks after every collective (1 ms apart)
        dist.all_reduce(t)
        now += 0.001
        if source.poll(now):
            # Keeping up includes torch having finished what it reads: on a busy VM gloo's thread
            # once marked an entry finished only after this loop had issued 64 more (a few ms
            # here; 64 real collectives' time in a job), so the ring had wrapped past it
            # (overwritten 1, not 0).
            settle()
            source.read(now)
    accounted = sum(g.expect - 1 for g in source.cursor.groups.values())  # read or lost so far
    keep_up = {"reads": source.reads, "overwritten": source.cursor.overwritten, "accounted": accounted}
    how_before = source.how
    if how == "child-killed":  # the next read falls back to this process, from the child's cursor
        proc = source.decoder.proc  # type: ignore[attr-defined]
        proc.kill()
        proc.wait()
    for _ in range(BLIND):  # nobody reads: the ring wraps
        dist.all_reduce(t)
    settle()  # the read below then takes every one of them
    source.read(now + 1)
    blind = {"overwritten": source.cursor.overwritten - keep_up["overwritten"]}
    for _ in range(AFTER):  # issued after the last read
        dist.all_reduce(t)
    unread = source.finish()
    c = source.cursor
    print(
        "fr_ring_gloo: "
        + json.dumps(
            {
                "ring": ring,
                "issued": KEEP_UP + BLIND + AFTER,
                "keep_up": keep_up,
                "blind": blind,
                "untimed": c.untimed,
                "overwritten": c.overwritten,
                "unread": unread,
                "lost": c.lost,
                "warnings": warnings,
                "how": how_before,
                "how_after": source.how,
            }
        ),
        flush=True,
    )
    source.close()
    server.shutdown()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "rank")
