"""Where the TUI's ingest thread spends its CPU: render_scale's app and feed, with each
``RunModel.apply`` timed by message type and each ``poll`` and ``snapshot`` timed whole
(thread CPU time), printed at exit.

    python benchmarks/probes/ingest_split.py [RANKS] [SECONDS]      (default 512 ranks, 10 s)

Issue 28's question: at 512 ranks is it the snapshots, the batches, the receive or the hellos?
(VM, 2026-12-04: snapshots ~43 %, batches ~30 %, poll ~21 %, hellos ~6 %.) The snapshot is split
further into its parts (rank views computed, the epochs' verdict, the step view, ...; "other" is
the rest: skew, straggler, the rank views kept, the Snapshot itself), also in thread CPU: unlike
cProfile, this does not inflate code that makes many small numpy calls.
"""

from __future__ import annotations

import atexit
import collections
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "standing"))

import tui.ingest.sources as sources  # noqa: E402 - after the path for render_scale
import tui.model.history as history  # noqa: E402
import tui.model.run_model as run_model  # noqa: E402
import tui.model.snapshot_builder as builder  # noqa: E402

cpu_ns: collections.Counter[str] = collections.Counter()
calls: collections.Counter[str] = collections.Counter()


def _timed(name_of: Any, fn: Any, into: collections.Counter[str] | None = None) -> Any:
    ns_of = cpu_ns if into is None else into
    count = calls if into is None else part_calls

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t = time.thread_time_ns()
        try:
            return fn(*args, **kwargs)
        finally:
            name = name_of(args)
            ns_of[name] += time.thread_time_ns() - t
            count[name] += 1

    return wrapper


#: The snapshot's parts (thread CPU inside RunModel.snapshot; the rest of it is "other").
part_ns: collections.Counter[str] = collections.Counter()
part_calls: collections.Counter[str] = collections.Counter()
SNAPSHOT_PARTS = {
    "rank views (computed)": (builder.SnapshotBuilder, "_compute_rank_view"),
    "epochs verdict": (builder.SnapshotBuilder, "_epochs"),
    "step view": (builder.SnapshotBuilder, "_steps"),
    "stream table": (builder.SnapshotBuilder, "_streams"),
    "clock offsets": (builder.SnapshotBuilder, "_offsets"),
    "history window": (history.HistoryMatrix, "window"),
}


def main() -> None:
    ranks = sys.argv[1] if len(sys.argv) > 1 else "512"
    seconds = sys.argv[2] if len(sys.argv) > 2 else "10"
    run_model.RunModel.apply = _timed(lambda a: type(a[1]).__name__, run_model.RunModel.apply)  # type: ignore[method-assign]
    run_model.RunModel.snapshot = _timed(lambda a: "snapshot", run_model.RunModel.snapshot)  # type: ignore[method-assign]
    sources.LiveSource.poll = _timed(lambda a: "poll", sources.LiveSource.poll)  # type: ignore[method-assign]
    for name, (cls, attr) in SNAPSHOT_PARTS.items():
        setattr(cls, attr, _timed(lambda a, name=name: name, getattr(cls, attr), part_ns))

    @atexit.register
    def show() -> None:
        total = sum(cpu_ns.values()) or 1
        print(f"\ningest thread CPU by part ({ranks} ranks, {seconds} s):")
        for name, ns in cpu_ns.most_common():
            print(
                f"  {name:10s} {ns / 1e6:9.1f} ms  {ns / total * 100:5.1f} %  n={calls[name]:7d}  "
                f"per={ns / max(calls[name], 1) / 1e3:8.1f} us"
            )
        snap = cpu_ns["snapshot"] or 1
        print("  snapshot by part (of the snapshot's CPU):")
        for name, ns in [*part_ns.most_common(), ("other", snap - sum(part_ns.values()))]:
            n = part_calls[name] or calls["snapshot"]  # "other": per snapshot
            print(
                f"    {name:22s} {ns / 1e6:9.1f} ms  {ns / snap * 100:5.1f} %  n={n:7d}  per={ns / max(n, 1) / 1e3:8.1f} us"
            )

    import render_scale

    render_scale.main(["--ranks", ranks, "--seconds", seconds])


if __name__ == "__main__":
    main()
