"""What reading torch's Flight Recorder costs the job, per way of reading it (one GPU, NCCL).

    python3 benchmarks/probes/fr_dump_cost.py --ring 2000 --out $OUT/fr.json

For a full ring of ``--ring`` timed entries it times, per method, the wall time of a dump and
the share of that time the GIL was unavailable to another Python thread (a counter loop on
the main thread while the dump runs on a second thread: 1.0 = the dump held the GIL all
along), then the decode of the bytes (pickle / json) in whole and of the newest 5 % only:
* ``pickle``: ``_dump_nccl_trace`` (what commtop's capture calls today);
* ``json``: ``_dump_nccl_trace_json``;
* ``handler_pickle`` / ``handler_json``: the control-plane handlers of the same dumps, which
  torch binds with the GIL released;
* ``status``: ``_dump_nccl_trace_json(includeCollectives=False)`` (pg_status only).
It prints one entry of each format and the collective_seq_id range per group.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import threading
import time
from typing import Any


def init(ring: int) -> Any:
    os.environ.setdefault("TORCH_NCCL_ENABLE_TIMING", "1")
    os.environ["TORCH_FR_BUFFER_SIZE"] = str(ring)
    os.environ["TORCH_NCCL_TRACE_BUFFER_SIZE"] = str(ring)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1)
    return torch, dist


class Req:
    pass


def handler_call(name: str) -> Any:
    from torch._C._distributed_c10d import _get_handler, _Request, _Response

    class Request(_Request):
        def __init__(self, params: dict[str, str]) -> None:
            super().__init__()
            self._params = params

        def body(self) -> bytes:
            return b""

        def get_param(self, name: str) -> str:
            return self._params.get(name, "")

        def params(self) -> dict[str, str]:
            return self._params

    class Response(_Response):
        def __init__(self) -> None:
            super().__init__()
            self.content = b""
            self.status = 200

        def set_content(self, content: Any, content_type: str) -> None:
            self.content = content if isinstance(content, bytes) else str(content).encode()

        def set_status(self, status: int) -> None:
            self.status = status

    handler = _get_handler(name)
    params = {"includecollectives": "true", "includestacktraces": "false", "onlyactive": "false"}

    def call() -> bytes:
        resp = Response()
        handler(Request(params), resp)
        if resp.status != 200:
            raise RuntimeError(f"{name}: status {resp.status}: {resp.content[:200]!r}")
        return resp.content

    return call


def gil_share(fn: Any, repeats: int) -> tuple[float, float]:
    """(mean wall s per call, share of that time the main thread could not run Python)."""
    # the main thread's loop rate alone
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < 0.2:
        n += 1
    idle_rate = n / (time.perf_counter() - t0)
    walls: list[float] = []
    done = threading.Event()

    def worker() -> None:
        for _ in range(repeats):
            a = time.perf_counter()
            fn()
            walls.append(time.perf_counter() - a)
        done.set()

    th = threading.Thread(target=worker)
    n, t0 = 0, time.perf_counter()
    th.start()
    while not done.is_set():
        n += 1
    span = time.perf_counter() - t0
    th.join()
    busy_rate = n / span
    return statistics.mean(walls), max(0.0, 1.0 - busy_rate / idle_rate)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ring", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--out", default="")
    ns = ap.parse_args()
    torch, dist = init(ns.ring)
    from torch._C import _distributed_c10d as c10d

    t = torch.ones(256, device="cuda")
    g2 = dist.new_group([0])
    for i in range(ns.ring + 200):
        dist.all_reduce(t, group=g2 if i % 3 == 0 else None)
        if i % 7 == 0:
            out = torch.empty(256, device="cuda")
            dist.all_gather_into_tensor(out, t)
    torch.cuda.synchronize()
    time.sleep(1.0)  # the watchdog retires them
    methods = {
        "pickle": lambda: c10d._dump_nccl_trace(includeCollectives=True, includeStackTraces=False, onlyActive=False),
        "json": lambda: c10d._dump_nccl_trace_json(includeCollectives=True, onlyActive=False),
        "status": lambda: c10d._dump_nccl_trace_json(includeCollectives=False, onlyActive=False),
    }
    for name in ("dump_nccl_trace_pickle", "dump_nccl_trace_json"):
        try:
            methods["handler_" + name.rsplit("_", 1)[1]] = handler_call(name)
        except Exception as exc:  # noqa: BLE001
            print(f"{name}: not available: {exc!r}")
    result: dict[str, Any] = {
        "ring": ns.ring,
        "torch": torch.__version__,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())),
    }
    for name, fn in methods.items():
        try:
            raw = fn()
        except Exception as exc:  # noqa: BLE001
            print(f"{name}: failed: {exc!r}")
            continue
        wall, share = gil_share(fn, ns.repeats)
        row: dict[str, Any] = {"bytes": len(raw), "wall_ms": round(wall * 1e3, 3), "gil_share": round(share, 3)}
        a = time.perf_counter()
        data = pickle.loads(raw) if "pickle" in name else json.loads(raw)
        row["decode_ms"] = round((time.perf_counter() - a) * 1e3, 3)
        entries = data.get("entries") or []
        row["entries"] = len(entries)
        if entries:
            row["per_entry_us"] = round((wall * (1 - 0) + (time.perf_counter() - a)) / len(entries) * 1e6, 3)
            row["sample"] = {k: v for k, v in entries[-1].items() if k != "frames"}
            seqs: dict[str, list[int]] = {}
            for e in entries:
                pg = str((e.get("process_group") or [e.get("pg_id")])[0])
                seqs.setdefault(pg, []).append(int(e.get("collective_seq_id", -1)))
            row["seq_ranges"] = {pg: [min(s), max(s), len(s)] for pg, s in seqs.items()}
            ids = [int(e["record_id"]) for e in entries]
            row["record_ids"] = [min(ids), max(ids)]
            names = sorted({str(e.get("profiling_name")) for e in entries})
            row["names"] = names
        else:
            row["keys"] = sorted(data)
            row["pg_status"] = data.get("pg_status")
        if name == "handler_json" and entries:
            tail_id = int(entries[int(len(entries) * 0.95)]["record_id"])
            a = time.perf_counter()
            key = f'"record_id":{tail_id},'.encode()
            pos = raw.find(key)
            start = raw.rfind(b'{"', 0, pos)
            row["tail_find_us"] = round((time.perf_counter() - a) * 1e6, 2)
            row["tail_found"] = pos >= 0 and start >= 0
        print(name, json.dumps(row, default=str)[:1500], flush=True)
        result[name] = row
    if ns.out:
        with open(ns.out, "w") as f:
            json.dump(result, f, indent=1, default=str)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
