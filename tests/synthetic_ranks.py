"""Test support for the reliability tests: real processes, real sockets, synthetic ranks.

Two parts:

* A harness for *real* runs: a torchrun job (``python -m torch.distributed.run ... -m workers``)
  and the real collector (``commtop watch --headless``), each in its own process group so a
  test can SIGKILL / SIGSTOP exactly the processes it started, with every output line
  time-stamped on arrival (so "data within 1 s" is measured, not guessed).
* :class:`SyntheticCluster`: test doubles for many ranks on many hosts (64, 512) that send
  real sealed frames over real ZeroMQ PUSH sockets, with collective semantics that a model can
  be checked against: all ranks of one collective *end* together, so the rank that arrives
  last waits least; per-host clock offsets shift every timestamp of that host.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from workers.wire import protocol as p
from workers.wire.busbw import bus_factor, collective_bytes

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable
#: The small workload every real-process test uses (fast on 2 cores).
SMALL_JOB = ("--shape", "64x64", "--copies", "1", "--collectives-per-step", "16", "--warmup", "2")


# --------------------------------------------------------------------------- environment


def short_runtime_dir() -> str:
    """A private runtime dir with a short path (ipc:// paths must stay under 107 chars)."""
    return tempfile.mkdtemp(prefix="cf-", dir="/tmp")


def child_env(runtime_dir: str, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("COMMTOP_CONNECTION_FILE", None)
    env.update(
        COMMTOP_RUNTIME_DIR=runtime_dir,
        OMP_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
        CUDA_VISIBLE_DEVICES="",
        PYTHONPATH=os.pathsep.join(x for x in (str(REPO), env.get("PYTHONPATH", "")) if x),
    )
    env.update(extra)
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --------------------------------------------------------------------------- processes


@dataclass(frozen=True)
class Line:
    t_ns: int  # time.time_ns() when the line was read
    stream: str
    text: str


class _Session:
    """Signals for a child started in its own session (process group): ``pid`` and ``proc``."""

    pid: int
    proc: subprocess.Popen[Any]

    def signal(self, sig: int) -> None:
        try:
            os.kill(self.pid, sig)
        except ProcessLookupError:
            pass

    def signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def kill_all(self) -> None:
        """SIGKILL the whole group (test cleanup; the group holds only what we started)."""
        self.signal_group(signal.SIGCONT)
        self.signal_group(signal.SIGKILL)
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            pass


class Proc(_Session):
    """A child in its own session (process group); its output lines are time-stamped."""

    def __init__(self, argv: Sequence[str], env: dict[str, str], cwd: Path = REPO) -> None:
        self.argv = list(argv)
        self.started_ns = time.time_ns()
        self.proc = subprocess.Popen(
            self.argv,
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        self.pid = self.proc.pid
        self.lines: list[Line] = []
        self._lock = threading.Lock()
        self._readers = [
            threading.Thread(target=self._read, args=(self.proc.stdout, "out"), daemon=True),
            threading.Thread(target=self._read, args=(self.proc.stderr, "err"), daemon=True),
        ]
        for t in self._readers:
            t.start()

    def _read(self, stream: Any, name: str) -> None:
        for raw in stream:
            line = Line(time.time_ns(), name, raw.decode(errors="replace").rstrip("\n"))
            with self._lock:
                self.lines.append(line)

    def text(self, stream: str | None = None) -> str:
        with self._lock:
            return "\n".join(ln.text for ln in self.lines if stream is None or ln.stream == stream)

    def first_line(self, contains: str, timeout_s: float) -> Line:
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                for ln in self.lines:
                    if contains in ln.text:
                        return ln
            if time.monotonic() > deadline:
                raise AssertionError(f"no line with {contains!r} within {timeout_s} s:\n{self.text()[-3000:]}")
            if self.proc.poll() is not None:
                for t in self._readers:
                    t.join(1.0)
                with self._lock:
                    for ln in self.lines:
                        if contains in ln.text:
                            return ln
                raise AssertionError(f"exited ({self.proc.returncode}) before {contains!r}:\n{self.text()[-3000:]}")
            time.sleep(0.01)

    def wait(self, timeout_s: float) -> int:
        code = self.proc.wait(timeout_s)
        for t in self._readers:
            t.join(2.0)
        return code


class PtyProc(_Session):
    """A child on a pseudo-terminal (the real Textual TUI), in its own session; every chunk
    it draws is time-stamped, so "the TUI shows data" is measured on its screen output."""

    def __init__(self, argv: Sequence[str], env: dict[str, str], rows: int = 40, cols: int = 160) -> None:
        import fcntl
        import pty
        import struct
        import termios

        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        self.started_ns = time.time_ns()
        self.proc = subprocess.Popen(
            list(argv),
            env={**env, "TERM": "xterm-256color", "COLUMNS": str(cols), "LINES": str(rows)},
            cwd=REPO,
            stdin=slave,
            stdout=slave,
            stderr=slave,
            start_new_session=True,
        )
        os.close(slave)
        self.pid = self.proc.pid
        self._master = master
        self._chunks: list[tuple[int, bytes]] = []
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self._master, 65536)
            except OSError:
                break
            if not data:
                break
            with self._lock:
                self._chunks.append((time.time_ns(), data))
        os.close(self._master)

    def first_seen(self, text: str, timeout_s: float) -> int:
        """time.time_ns() of the chunk that completed the first occurrence of ``text``."""
        needle = text.encode()
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                chunks = list(self._chunks)
            seen = b""
            for t_ns, data in chunks:
                seen += data
                if needle in seen:
                    return t_ns
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise AssertionError(f"{text!r} never appeared on the TUI's screen (exit {self.proc.poll()})")
            time.sleep(0.01)

    def wait(self, timeout_s: float) -> int:
        return self.proc.wait(timeout_s)


def start_tui(conn_path: str, env: dict[str, str], record: str) -> PtyProc:
    """The real TUI, ``commtop watch --connection-file F --record P``, on a pseudo-terminal."""
    return PtyProc([PY, "-m", "tui.cli", "watch", "--connection-file", conn_path, "--record", record], env)


def start_job(conn_path: str, env: dict[str, str], *args: str, nproc: int = 2, node: str = "") -> Proc:
    """torchrun as the issue starts it: ``--standalone`` (or ``node`` = extra torchrun flags)."""
    launch = ["--standalone"] if not node else node.split()
    argv = [PY, "-m", "torch.distributed.run", *launch, "--nproc-per-node", str(nproc), "--monitor-interval", "0.2"]
    return Proc([*argv, "-m", "workers", "--connection-file", conn_path, *args], env)


def start_watch(conn_path: str, env: dict[str, str], record: str | None = None) -> Proc:
    """The real collector: ``commtop watch --headless --connection-file F [--record P]``."""
    argv = [PY, "-m", "tui.cli", "watch", "--headless", "--connection-file", conn_path]
    if record is not None:
        argv += ["--record", record]
    return Proc(argv, env)


def wait_bound(watch: Proc, record: bool, timeout_s: float = 30.0) -> int:
    """When the collector's sockets are bound (it prints "recording to" after binding)."""
    return watch.first_line("recording to" if record else "start workers with", timeout_s).t_ns


def worker_pids(job: Proc, count: int, timeout_s: float = 30.0) -> dict[int, int]:
    """rank -> pid of the job's worker processes (read from their environment)."""
    import psutil

    deadline = time.monotonic() + timeout_s
    while True:
        found: dict[int, int] = {}
        try:
            children = psutil.Process(job.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            children = []
        for child in children:
            try:
                cmd = child.cmdline()
                env = child.environ()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            if "workers" in cmd and "-m" in cmd and "RANK" in env and "telemetry" not in " ".join(cmd):
                found[int(env["RANK"])] = child.pid
        if len(found) >= count:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"found worker pids {found}, wanted {count}:\n{job.text()[-2000:]}")
        time.sleep(0.1)


# --------------------------------------------------------------------------- summaries


def summary_table(text: str) -> dict[int, dict[str, str]]:
    """The per-rank rows of ``format_summary`` output, by column name (column positions are
    taken from the dashed rule, so values with spaces such as "exited (0)" stay whole)."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("----") and i > 0:
            header, rule = lines[i - 1], line
            break
    else:
        raise AssertionError(f"no summary table in:\n{text[-2000:]}")
    spans: list[tuple[int, int]] = []
    pos = 0
    for part in rule.split("  "):
        if part:
            spans.append((pos, pos + len(part)))
        pos += len(part) + 2
    names = [header[a:b].strip() for a, b in spans]
    rows: dict[int, dict[str, str]] = {}
    for line in lines[i + 1 :]:
        first = line[: spans[0][1]].strip()
        if not line.strip():
            break  # the per-rank table ends here (the overlap-class table follows)
        if not first.isdigit():
            continue  # a continuation row (another mode of the same rank), or a note
        cells = [line[a : (spans[k + 1][0] if k + 1 < len(spans) else None)].strip() for k, (a, _b) in enumerate(spans)]
        rows[int(first)] = dict(zip(names, cells, strict=True))
    return rows


def stream_table(text: str) -> list[dict[str, str]]:
    """The stream lines of ``format_summary`` output (the block after "streams (all ranks):"),
    by column name: group, op, dtype, bytes, count, p50 ms, p99 ms, busbw GB/s."""
    from tui.run.summary_views import STREAMS_TITLE

    lines = text.splitlines()
    if STREAMS_TITLE not in lines:
        raise AssertionError(f"no stream table in:\n{text[-2000:]}")
    i = lines.index(STREAMS_TITLE)
    header, rule = lines[i + 1], lines[i + 2]
    spans: list[tuple[int, int]] = []
    pos = 0
    for part in rule.split("  "):
        if part:
            spans.append((pos, pos + len(part)))
        pos += len(part) + 2
    names = [header[a:b].strip() for a, b in spans]
    rows = []
    for line in lines[i + 3 :]:
        if not line.strip():
            break
        cells = [line[a : (spans[k + 1][0] if k + 1 < len(spans) else None)].strip() for k, (a, _b) in enumerate(spans)]
        rows.append(dict(zip(names, cells, strict=True)))
    return rows


def worker_summaries(job: Proc) -> dict[int, dict[str, Any]]:
    import json

    out = {}
    for ln in job.text("out").splitlines():
        if ln.startswith("commtop-summary "):
            data = json.loads(ln[len("commtop-summary ") :])
            out[int(data["rank"])] = data
    return out


def rss_bytes(pid: int) -> int:
    import psutil

    return int(psutil.Process(pid).memory_info().rss)


# --------------------------------------------------------------------------- synthetic ranks


CONFIG = {
    "collective": "all_gather",
    "shape": [8192, 8192],
    "dtype": "bfloat16",
    "tensor_bytes": 8192 * 8192 * 2,
    "collectives_per_step": 32,
}
SETTINGS = {"mode": "overlap", "copies": 5, "copy_scale": 1.0, "pinned": True, "direction": "d2h", "knobs": {}}


@dataclass
class SyntheticRank:
    """One synthetic rank: identity, clock offset of its host, and its batch sequence."""

    rank: int
    world_size: int
    host: str
    local_rank: int
    local_world_size: int
    clock_offset_ns: int = 0
    seq: int = 0
    started_ns: int = field(default_factory=time.time_ns)

    def hello(self, iteration: int, t_ns: int | None = None) -> p.Hello:
        return p.Hello(
            rank=self.rank,
            world_size=self.world_size,
            local_rank=self.local_rank,
            local_world_size=self.local_world_size,
            host=self.host,
            pid=100_000 + self.rank,
            backend="nccl",
            device="NVIDIA H200 (synthetic)",
            device_index=self.local_rank,
            gpu_uuid=f"GPU-synthetic-{self.host}-{self.local_rank}",
            torch_version="synthetic",
            nccl_version="2.28.9",
            config=dict(CONFIG),
            settings=dict(SETTINGS),
            epoch=0,
            iteration=iteration,
            pinned_bytes=0,
            t_ns=(t_ns or time.time_ns()) + self.clock_offset_ns,
            started_ns=self.started_ns + self.clock_offset_ns,
            seq_coll=self.seq,
        )

    def batch(self, iterations: np.ndarray, start_ns: np.ndarray, dur_us: np.ndarray, mode: int = 1) -> p.Batch:
        """A collective batch; ``start_ns`` is true time, shifted here by the host's clock offset."""
        n = len(iterations)
        nbytes = collective_bytes("all_gather", int(CONFIG["tensor_bytes"]), self.world_size)  # type: ignore[arg-type]
        dur = np.asarray(dur_us, dtype=np.float32)
        algbw = nbytes / np.maximum(dur.astype(np.float64), 1e-3) / 1e3
        start = np.asarray(start_ns, dtype=np.int64) + self.clock_offset_ns
        cols = {
            "iteration": np.asarray(iterations, dtype=np.int64),
            "step": np.asarray(iterations, dtype=np.int64) // 32,
            "epoch": np.zeros(n, dtype=np.int32),
            "mode": np.full(n, mode, dtype=np.uint8),
            "op": np.zeros(n, dtype=np.uint8),
            "group": np.zeros(n, dtype="<u2"),
            "dtype": np.zeros(n, dtype="u1"),
            "nbytes": np.full(n, nbytes, dtype=np.int64),
            "host_ns": start,
            "start_ns": start,
            "dur_us": dur,
            "algbw": algbw.astype(np.float32),
            "busbw": (algbw * bus_factor("all_gather", self.world_size)).astype(np.float32),
        }
        batch = p.Batch(p.COLL, self.rank, self.seq, 0, cols, 0, -1, -1, int(start[-1]) if n else time.time_ns())
        self.seq += 1
        return batch


@dataclass(frozen=True)
class Lateness:
    """At ``iteration``, ``rank`` arrives ``late_us`` after the others (e.g. its offload ended late)."""

    iteration: int
    rank: int
    late_us: float


class SyntheticCluster:
    """``world`` synthetic ranks spread over ``hosts`` hosts, each rank with its own real
    PUSH socket (like a worker), producing collectives with real collective timing:

    every rank *arrives* at ``arrive`` (host time + jitter + any :class:`Lateness`), the
    collective *ends* for all ranks at ``max(arrive) + base_us``, and each rank records
    ``dur = end - arrive``. So the rank that arrived last waits least, and for an all_gather
    the others' latency minus its latency is the skew.
    """

    def __init__(
        self,
        world: int,
        hosts: int,
        *,
        base_us: float = 2700.0,
        jitter_us: float = 30.0,
        period_us: float = 5000.0,
        clock_offsets_ns: Sequence[int] | None = None,
        seed: int = 7,
    ) -> None:
        self.world = world
        per_host = max(1, world // hosts)
        offsets = list(clock_offsets_ns or [0] * hosts)
        self.ranks = [
            SyntheticRank(
                rank=r,
                world_size=world,
                host=f"node{r // per_host:02d}",
                local_rank=r % per_host,
                local_world_size=per_host,
                clock_offset_ns=int(offsets[min(r // per_host, hosts - 1)]),
            )
            for r in range(world)
        ]
        self.base_us = base_us
        self.jitter_us = jitter_us
        self.period_ns = int(period_us * 1e3)
        self.rng = np.random.default_rng(seed)
        self.t0_ns = time.time_ns()
        self.next_iteration = 0
        self._socks: list[zmq.Socket[Any]] = []
        self._key = b""
        self._session = ""

    def connect(self, endpoint: str, key: bytes, session: str, ctx: zmq.Context[Any] | None = None) -> None:
        ctx = ctx or zmq.Context.instance()
        self._key, self._session = key, session
        for _ in self.ranks:
            sock = ctx.socket(zmq.PUSH)
            sock.setsockopt(zmq.SNDHWM, 1000)
            sock.setsockopt(zmq.LINGER, 2000)
            sock.connect(endpoint)
            self._socks.append(sock)

    def timings(self, n: int, late: Iterable[Lateness] = ()) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(iterations, arrive_ns[world, n], dur_us[world, n]) in true time."""
        its = np.arange(self.next_iteration, self.next_iteration + n)
        base_t = self.t0_ns + its * self.period_ns
        arrive_us = self.rng.uniform(0.0, self.jitter_us, size=(self.world, n))
        for lt in late:
            if its[0] <= lt.iteration <= its[-1]:
                arrive_us[lt.rank, lt.iteration - its[0]] += lt.late_us
        end_us = arrive_us.max(axis=0) + self.base_us
        dur = end_us[None, :] - arrive_us
        arrive = base_t[None, :] + (arrive_us * 1e3).astype(np.int64)
        self.next_iteration += n
        return its, arrive, dur

    def messages(self, n: int, late: Iterable[Lateness] = ()) -> list[tuple[int, Any]]:
        """(rank, message) for ``n`` more iterations of every rank, hellos first."""
        its, arrive, dur = self.timings(n, late)
        out: list[tuple[int, Any]] = [(r.rank, r.hello(int(its[0]))) for r in self.ranks]
        out += [(r.rank, r.batch(its, arrive[r.rank], dur[r.rank])) for r in self.ranks]
        return out

    def send(self, n: int, late: Iterable[Lateness] = ()) -> None:
        for rank, message in self.messages(n, late):
            body = p.hello_body(self._session, message) if isinstance(message, p.Hello) else None
            if body is None:
                body = p.batch_body(message.kind, self._session, message)
            self._socks[rank].send_multipart(p.seal(self._key, body))

    def feed(self, apply: Callable[[Any], None], n: int, late: Iterable[Lateness] = ()) -> None:
        """The same messages straight into a model (no sockets), for pure model tests."""
        for _rank, message in self.messages(n, late):
            apply(message)

    def close(self) -> None:
        for sock in self._socks:
            sock.close(linger=1000)
        self._socks.clear()


def open_tcp_collector(label: str = "2nodes") -> tuple[Any, Any, int]:
    """A collector on three free TCP ports (PORT..PORT+2) and a rendezvous port apart from them.
    A port found free can be taken before it is bound (other tests run beside this one on a
    loaded CI machine): another block is tried then."""
    from tui.run.session import LiveSession, SessionError
    from workers.wire import connection as connections

    for _ in range(10):
        port, rdzv = free_port(), free_port()
        if port <= rdzv <= port + 2:
            continue
        data, control, request = connections.tcp_endpoints(f"tcp://127.0.0.1:{port}")
        conn = connections.create_run(data=data, control=control, request=request, label=label)
        try:
            return conn, LiveSession.open(conn, None), rdzv
        except SessionError as exc:
            if "in use" not in str(exc):
                raise
    raise AssertionError("no free block of three TCP ports in 10 tries")
