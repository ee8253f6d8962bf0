"""Decode the Flight Recorder ring in a child process, so that the job's GIL never pays for it.

Reading the ring in the rank cost ~11 us of the job's GIL a collective (VM, ring of 8192): the
unpickle of the whole ring (~3.9 us a new entry: every read copies the ring), the cursor (~2.4),
the rows (~0.9) and their columns (~3.5). At ~2,000 collectives/s that is 2 % of the job's
Python time, which the step time shows. Here one small child per rank (torch-free: numpy, no
torch import) POSTs to the rank's worker server itself, unpickles and decodes, keeps the cursor,
and answers each request with one frame (:mod:`workers.capture.fr_batch`): the new collectives
as a 27-byte-a-row array, their groups, the cursor's state. The rank's capture thread only
writes a line, waits on the pipe (no GIL held) and maps the array into records.

Requests, one line each on the child's stdin: ``read``; ``finish JSON`` (torch's issued count
per group, or ``null``). Anything else, or a request that fails, is answered with an error (and
the cursor as it is); the rank then falls back to decoding itself. The child ends at EOF or
when its parent is gone.

    python -m workers.capture.fr_child SOCKET [HANDLER [pickle|json]]
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import IO, Any

from workers.capture.flight_recorder import FrCursor
from workers.capture.fr_batch import PREFIX, FrBatch, batch_of, decode, encode, frame_lengths
from workers.capture.fr_source import SERVER_TIMEOUT_S, DumpReader, LocalDecoder, ServerDump

#: How often a waiting child looks whether its parent is still there.
PARENT_CHECK_S = 1.0
#: How long the child may take to start and answer its first request.
START_TIMEOUT_S = 60.0


# --------------------------------------------------------------------------- the child


def answer(request: str, decoder: LocalDecoder) -> FrBatch:
    """One request's answer (``decoder.cursor`` is the cursor after it)."""
    cmd, _, arg = request.strip().partition(" ")
    try:
        if cmd == "read":
            return decoder.read_batch()
        if cmd == "finish":
            issued = json.loads(arg) if arg else None
            decoder.finish({str(k): int(v) for k, v in issued.items()} if isinstance(issued, dict) else None)
        elif cmd == "start_after":
            record_id, _, gone = arg.partition(" ")
            decoder.start_after(int(record_id), [g for g in gone.split(",") if g])
        else:
            return FrBatch(state=decoder.cursor.state(), error=f"unknown request {cmd[:40]!r}")
        return batch_of([], decoder.cursor, 0)
    except Exception as exc:  # noqa: BLE001 - said to the parent, which falls back
        return FrBatch(state=decoder.cursor.state(), error=f"{type(exc).__name__}: {exc}"[:300])


def _next_request(rfile: IO[bytes], parent: int) -> str | None:
    """The next request line, or None at EOF or once the parent is gone."""
    while True:
        ready, _, _ = select.select([rfile], [], [], PARENT_CHECK_S)
        if ready:
            line = rfile.readline()
            return line.decode(errors="replace") if line else None
        if os.getppid() != parent:
            return None


def serve(dump: DumpReader, rfile: IO[bytes], wfile: IO[bytes], parent: int) -> None:
    decoder = LocalDecoder(dump)
    while (request := _next_request(rfile, parent)) is not None:
        wfile.write(encode(answer(request, decoder)))
        wfile.flush()


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if not 1 <= len(args) <= 3 or (len(args) == 3 and args[2] not in ("pickle", "json")):
        raise SystemExit("usage: python -m workers.capture.fr_child SOCKET [HANDLER [pickle|json]]")
    handler = args[1] if len(args) > 1 else "dump_nccl_trace_pickle"
    dump = ServerDump(args[0], handler, decode=json.loads) if args[2:] == ["json"] else ServerDump(args[0], handler)
    parent = int(os.environ.get("COMMTOP_FR_PARENT", "0")) or os.getppid()
    # A stop is its rank's to handle: `commtop run` and Ctrl-C signal the job's whole group, and
    # a child ended by that signal failed the rank's last read (seen on an H100: "decoder child:
    # Broken pipe" at every stop). It still ends at EOF or once the rank is gone (and SIGKILL).
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        serve(dump, sys.stdin.buffer, sys.stdout.buffer, parent)
    except (BrokenPipeError, KeyboardInterrupt):
        pass


# --------------------------------------------------------------------------- the rank's side


class ChildDecoder:
    """The rank's handle on a child decoder: ``read_batch``/``finish`` as LocalDecoder has them;
    ``cursor`` mirrors the child's after every answer (the capture reads its counts, and a
    fallback decoder in the rank goes on from it)."""

    how = "torch's worker server, decoded in a child process (off the job's GIL)"

    def __init__(self, path: str, handler: str = "dump_nccl_trace_pickle", fmt: str = "pickle") -> None:
        import workers

        root = os.path.dirname(os.path.dirname(os.path.abspath(workers.__file__)))
        env = dict(os.environ, COMMTOP_FR_PARENT=str(os.getpid()))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
        self.cursor = FrCursor()
        self.proc: subprocess.Popen[bytes] | None = subprocess.Popen(
            [sys.executable, "-m", "workers.capture.fr_child", path, handler, fmt],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            bufsize=0,
            env=env,
            close_fds=True,
        )
        self._first = True

    def read_batch(self) -> FrBatch:
        return self._ask("read")

    def finish(self, issued: dict[str, int] | None) -> int:
        before = self.cursor.unread
        self._ask("finish " + json.dumps(issued))
        return self.cursor.unread - before

    def start_after(self, record_id: int, gone_pg_ids: Sequence[str] = ()) -> None:
        self._ask(f"start_after {int(record_id)} {','.join(str(int(g)) for g in gone_pg_ids)}".rstrip())

    def close(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        try:
            if proc.stdin is not None:
                proc.stdin.close()
            proc.wait(timeout=2.0)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()

    def _ask(self, request: str) -> FrBatch:
        proc = self.proc
        if proc is None or proc.stdin is None or proc.stdout is None:
            raise OSError("the decoder child is closed")
        timeout = START_TIMEOUT_S if self._first else SERVER_TIMEOUT_S
        try:
            proc.stdin.write(request.encode() + b"\n")
            deadline = time.monotonic() + timeout
            prefix = _read_exact(proc.stdout, PREFIX, deadline)
            hlen, alen = frame_lengths(prefix)
            batch = decode(prefix + _read_exact(proc.stdout, hlen + alen, deadline))
        except (OSError, ValueError) as exc:
            self.close()
            raise OSError(f"decoder child: {exc}") from exc
        self._first = False
        if batch.state:
            self.cursor = FrCursor.from_state(batch.state)
        if batch.error:
            raise OSError(f"decoder child: {batch.error}")
        return batch


def _read_exact(f: Any, n: int, deadline: float) -> bytes:
    """``n`` bytes from the pipe ``f`` (unbuffered), waiting with no GIL held until ``deadline``."""
    parts: list[bytes] = []
    left = n
    fd = f.fileno()
    while left:
        wait = deadline - time.monotonic()
        if wait <= 0 or not select.select([fd], [], [], wait)[0]:
            raise OSError(f"no answer within the time limit ({n - left} of {n} bytes)")
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise OSError("the decoder child ended")
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)


if __name__ == "__main__":
    main()
