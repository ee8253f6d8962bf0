"""workers.monitor on two real gloo ranks under torchrun, with a real collector socket.

One job checks both: every record of every patched collective (sync and async_op=True)
arrives from both ranks, and a knob flipped over the signed control channel switches both
ranks at the same step (live_control's agreement through torchrun's store).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zmq

from tui.ingest.sources import LiveSource  # noqa: E402
from workers.monitor.records import OPS  # noqa: E402
from workers.wire import connection as connections  # noqa: E402
from workers.wire import protocol  # noqa: E402
from workers.wire.control import ctl_state_body  # noqa: E402
from workers.wire.settings import Settings  # noqa: E402

pytestmark = pytest.mark.e2e  # starts processes

REPO = Path(__file__).resolve().parent.parent
N = 512
#: Per step, in order: (function call, op recorded, bytes recorded) on 2 ranks.
PER_STEP = [
    ("all_reduce", 4 * N),
    ("all_gather", 2 * 4 * N),
    ("reduce_scatter", 2 * 4 * N),
    ("all_reduce", 4 * N),  # async_op=True + wait
    ("all_gather", 2 * 4 * N),  # async_op=True + wait
    ("reduce_scatter", 2 * 4 * N),  # async_op=True + wait (gloo: no future; timed by a waiter)
]

RANK_SCRIPT = textwrap.dedent(
    f"""
    import sys, time
    import torch, torch.distributed as dist
    from workers import monitor

    dist.init_process_group("gloo")
    ws = dist.get_world_size()
    mon = monitor.start(wait_s=5.0, sampler=False)
    monitor.patch_distributed()
    mon.knob("offload", ["none", "overlap"])
    t = torch.ones({N}); big = torch.ones({N} * ws); out = torch.empty({N} * ws); part = torch.empty({N})
    stop_at = -1
    for step in range(4000):
        with mon.step(step):
            dist.all_reduce(t)
            dist.all_gather_into_tensor(out, t)
            dist.reduce_scatter_tensor(part, big)
            dist.all_reduce(t, async_op=True).wait()
            dist.all_gather_into_tensor(out, t, async_op=True).wait()
            dist.reduce_scatter_tensor(part, big, async_op=True).wait()
            knob = mon.setting("offload")
        print(f"step {{step}} {{knob}}", flush=True)
        if knob == "overlap" and stop_at < 0:
            stop_at = step + 5  # the switch step is agreed, so both ranks stop together
        if step == stop_at:
            break
        time.sleep(0.003)
    monitor.stop()
    dist.destroy_process_group()
    """
)


def test_two_ranks_every_record_arrives_and_a_knob_switches_both_at_the_same_step() -> None:
    root = tempfile.mkdtemp(prefix="cm-", dir="/tmp")
    env = dict(os.environ, COMMTOP_RUNTIME_DIR=root, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    env["PYTHONPATH"] = os.pathsep.join(x for x in (str(REPO), env.get("PYTHONPATH", "")) if x)
    os.environ["COMMTOP_RUNTIME_DIR"] = root
    try:
        conn = connections.create_run(label="ranks")
    finally:
        del os.environ["COMMTOP_RUNTIME_DIR"]
    env["COMMTOP_CONNECTION_FILE"] = conn.path
    script = Path(root) / "rank_job.py"
    script.write_text(RANK_SCRIPT)
    source = LiveSource(conn)
    pub = zmq.Context.instance().socket(zmq.PUB)  # the control channel a ControlServer binds
    pub.bind(conn.control)
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(script)]
    job = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=root)
    messages: list[Any] = []
    try:
        deadline = time.monotonic() + 60
        flip = Settings(mode="none", copies=0, knobs={"offload": "overlap"})
        next_send = 0.0
        while job.poll() is None and time.monotonic() < deadline:
            messages += source.poll(0.05)
            steps = {m.rank: int(m.columns["step"].max()) for m in messages if isinstance(m, protocol.Batch) and len(m)}
            if len(steps) == 2 and min(steps.values()) >= 10 and time.monotonic() >= next_send:
                pub.send_multipart(protocol.seal(conn.key, ctl_state_body(conn.session, 1, flip)))
                next_send = time.monotonic() + 0.2
        output = job.communicate(timeout=max(1.0, deadline - time.monotonic()))[0].decode(errors="replace")
        end = time.monotonic() + 1.0
        while time.monotonic() < end:
            messages += source.poll(0.05)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
        pub.close(0)
        source.close()
        shutil.rmtree(root, ignore_errors=True)
    assert job.returncode == 0, output[-3000:]

    switch_step = {}
    for rank in (0, 1):
        batches = [m for m in messages if isinstance(m, protocol.Batch) and m.rank == rank and m.kind == "coll"]
        cols = {k: np.concatenate([b.columns[k] for b in batches]) for k in protocol.COLL_COLUMNS}
        order = np.argsort(cols["iteration"])
        steps = int(cols["step"].max()) + 1
        assert cols["iteration"][order].tolist() == list(range(steps * len(PER_STEP))), f"rank {rank} lost records"
        assert [OPS[o] for o in cols["op"][order]] == [op for op, _ in PER_STEP] * steps
        assert cols["nbytes"][order].tolist() == [nb for _, nb in PER_STEP] * steps
        assert (cols["dur_us"] > 0).all()
        assert np.allclose(
            cols["busbw"][cols["op"] == OPS.index("all_gather")] * 2,
            cols["algbw"][cols["op"] == OPS.index("all_gather")],
        )
        epoch = cols["epoch"][order]
        first = int(np.argmax(epoch == 1))
        assert epoch[first:].min() == 1 and epoch[:first].max() == 0
        assert first % len(PER_STEP) == 0  # switched at a step boundary
        switch_step[rank] = int(cols["step"][order][first])
        modes = cols["mode"][order]
        assert set(modes[:first].tolist()) == {0} and set(modes[first:].tolist()) == {1}  # none -> overlap
        hello = [m for m in messages if isinstance(m, protocol.Hello) and m.rank == rank][-1]
        assert hello.settings["knobs"] == {"offload": "overlap"} and hello.epoch == 1
        assert [(b.exit_code, b.reason) for b in messages if isinstance(b, protocol.Bye) and b.rank == rank] == [
            (0, "finished")
        ]
    assert switch_step[0] == switch_step[1]
    assert not source.rejected
