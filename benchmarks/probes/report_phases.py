"""Where `commtop report --format json` spends its time on one recording: wall and CPU seconds
per phase (the reader's column decode, the report's tables and passes), the codec of its
chunks, and the libraries it ran with, so two machines' reports can be compared part by part.

    python benchmarks/probes/report_phases.py FILE [--runs 3] [--profile 25]

``--profile N`` adds cProfile's N largest own-time functions of one more run (main thread
only: the reader's side thread is seen as the main thread's wait on it).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import cProfile
import functools
import io
import os
import platform
import pstats
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "standing"))

from tui import cli  # noqa: E402
from tui.recordings import bulk, compression  # noqa: E402
from tui.recordings.reader import open_recording  # noqa: E402
from tui.report import build, command, steps_report  # noqa: E402

wall: collections.Counter[str] = collections.Counter()
cpu: collections.Counter[str] = collections.Counter()

PHASES: dict[Any, tuple[str, ...]] = {
    command: ("report_tables", "build_report", "format_json"),
    build: ("_sort_epochs", "_sorted_records", "group_rows", "epoch_rows", "step_rows"),
    steps_report.RunWalk: ("work",),  # summed over the threads that join the walk
    bulk: ("decode_ints", "_columns", "_read_all", "_bad_counts"),
}


def _timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t, c = time.perf_counter(), time.process_time()
        try:
            return fn(*args, **kwargs)
        finally:
            wall[name] += time.perf_counter() - t
            cpu[name] += time.process_time() - c

    return wrapper


def _install() -> None:
    for module, names in PHASES.items():
        for name in names:
            if hasattr(module, name):
                setattr(module, name, _timed(name, getattr(module, name)))


def _one_report(path: Path) -> float:
    t = time.perf_counter()
    with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):
        rc = cli.main(["report", str(path), "--format", "json"])
    if rc:
        raise SystemExit(f"commtop report exited {rc}")
    return time.perf_counter() - t


def _codecs(path: Path) -> str:
    rec = open_recording(path)
    flags = collections.Counter(getattr(c, "flags", None) for c in rec.chunks)
    names = {compression.FLAG_ZSTD: "zstd", compression.FLAG_ZLIB: "zlib", 0: "stored", None: "?"}
    return ", ".join(f"{names.get(k, k)} {n}" for k, n in flags.items())


def _libraries() -> str:
    import msgpack
    import numpy

    zstd = compression._zstd()
    c_msgpack = "pure Python" if "fallback" in msgpack.Unpacker.__module__ else "C"
    return (
        f"python {platform.python_version()} ({platform.python_implementation()}), numpy {numpy.__version__}, "
        f"msgpack {'.'.join(map(str, msgpack.version))} ({c_msgpack}), "
        f"zstandard {zstd.__version__ if zstd is not None else 'absent'}"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file", type=Path)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--profile", type=int, default=0, help="cProfile's N largest own-time functions of one run")
    ns = ap.parse_args()
    print(_libraries())
    try:
        print("chunks:", _codecs(ns.file))
    except Exception as exc:  # the codec census is a side note; the report itself must run
        print("chunks: ?", type(exc).__name__, exc)
    _install()
    for i in range(ns.runs):
        wall.clear()
        cpu.clear()
        total = _one_report(ns.file)
        parts = "  ".join(f"{k} {wall[k]:.3f}/{cpu[k]:.3f}" for k, _ in wall.most_common() if wall[k] > 0.005)
        print(f"run {i + 1}: total {total:.3f} s; wall/cpu s: {parts}")
    if ns.profile:
        prof = cProfile.Profile()
        prof.enable()
        _one_report(ns.file)
        prof.disable()
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(ns.profile)
        print(out.getvalue())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
