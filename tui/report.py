"""`commtop report FILE`: what a recording says, per settings epoch and per rank.

For every epoch (mode, copies, copy size, pinned, direction) and rank: collective latency
p50/p90/p99/max, algbw/busbw, copy GB/s, PCIe/NVLink and clocks from the node telemetry in
the epoch's time window, and the slowdown against mode ``none`` (same rank, same collective
and size) in the same recording. Everything is columnar numpy over the whole file, so ten
million records take seconds. ``--format csv --records`` exports one row per collective
record (for pandas); ``--trace`` writes a Perfetto trace, ``--plot`` a PNG.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import sys
import warnings
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import IO, Any

import numpy as np

from tui.recording import Recording, RecordingError, Tables, open_recording
from workers import protocol as p

REPORT_COLUMNS = ("epoch", "mode", "op", "nbytes", "start_ns", "dur_us", "algbw", "busbw")
LINK_METRICS = ("pcie_tx_gbps", "pcie_rx_gbps", "nvlink_tx_gbps", "nvlink_rx_gbps", "sm_clock_mhz", "mem_clock_mhz")
RECORD_FIELDS = (
    "rank",
    "iteration",
    "step",
    "epoch",
    "mode",
    "op",
    "nbytes",
    "host_ns",
    "start_ns",
    "dur_us",
    "algbw",
    "busbw",
    "recv_ns",
)


@dataclass(frozen=True)
class Row:
    """One epoch on one rank (``rank`` None = all ranks together)."""

    epoch: int
    rank: int | None
    mode: str
    copies: float | None  # per step (from the settings, else counted)
    copy_bytes: int | None
    pinned: bool | None
    direction: str
    op: str
    nbytes: int
    start_s: float  # from the start of the recording
    end_s: float
    count: int
    p50_us: float
    p90_us: float
    p99_us: float
    max_us: float
    mean_us: float
    algbw_gbps: float  # mean over records
    busbw_gbps: float
    copy_count: int
    copy_gbps: float  # mean over copies
    pcie_tx_gbps: float  # mean per GPU over the telemetry ticks of the epoch
    pcie_rx_gbps: float
    nvlink_tx_gbps: float
    nvlink_rx_gbps: float
    sm_clock_mhz: float
    mem_clock_mhz: float
    slowdown: float  # p50 / p50 of mode none (same rank, op, size); NaN without a baseline


@dataclass(frozen=True)
class ModeRow:
    mode: str
    count: int
    p50_us: float
    p99_us: float
    slowdown: float


@dataclass(frozen=True)
class Report:
    path: str
    complete: bool
    problems: str
    meta: dict[str, Any]
    duration_s: float
    records: int
    rows: tuple[Row, ...]
    modes: tuple[ModeRow, ...]


# --------------------------------------------------------------------------- computing


def _nanmean(values: np.ndarray) -> float:
    if values.size == 0:
        return math.nan
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return float(np.nanmean(values))


def _mode_of(values: np.ndarray) -> int:
    uniq, counts = np.unique(values, return_counts=True)
    return int(uniq[np.argmax(counts)])


class _Telemetry:
    """Node ticks as per-host arrays: times and metric[tick, gpu] matrices, GPUs by uuid."""

    def __init__(self, other: Sequence[tuple[int, dict[str, Any]]]) -> None:
        by_host: dict[str, list[tuple[int, tuple[str, ...], dict[str, Any]]]] = {}
        for _, body in other:
            if body.get("k") != p.TELEM or not isinstance(body.get("m"), dict):
                continue
            uuids = tuple(body.get("uuids") or ())
            if isinstance(body.get("t"), int) and uuids:
                by_host.setdefault(str(body.get("host", "")), []).append((body["t"], uuids, body["m"]))
        self.hosts: dict[str, tuple[np.ndarray, tuple[str, ...], dict[str, np.ndarray]]] = {}
        for host, ticks in by_host.items():
            uuids = Counter(u for _, u, _ in ticks).most_common(1)[0][0]
            ticks = sorted((t for t in ticks if t[1] == uuids), key=lambda t: t[0])
            n = len(uuids)
            mats = {}
            for name in LINK_METRICS:
                mat = np.full((len(ticks), n), np.nan)
                for i, (_, _, m) in enumerate(ticks):
                    raw = m.get(name)
                    if isinstance(raw, bytes) and len(raw) == 8 * n:
                        mat[i] = np.frombuffer(raw, dtype="<f8")
                mats[name] = mat
            self.hosts[host] = (np.array([t for t, _, _ in ticks], dtype=np.int64), uuids, mats)

    def mean(self, name: str, t0: int, t1: int, gpu: tuple[str, str] | None) -> float:
        """Mean of ``name`` over ticks in [t0, t1], for one (host, uuid) or every GPU."""
        parts = []
        for host, (times, uuids, mats) in self.hosts.items():
            a, b = np.searchsorted(times, [t0, t1 + 1])
            block = mats[name][a:b]
            if gpu is not None:
                if gpu[0] != host or gpu[1] not in uuids:
                    continue
                block = block[:, uuids.index(gpu[1])]
            parts.append(block.ravel())
        return _nanmean(np.concatenate(parts)) if parts else math.nan


def _settings_by_epoch(hellos: Sequence[tuple[int, p.Hello]]) -> dict[int, dict[str, Any]]:
    out: dict[int, dict[str, Any]] = {}
    for _, h in hellos:
        out.setdefault(h.epoch, dict(h.settings))
    return out


def build_report(rec: Recording, tables: Tables | None = None) -> Report:
    """Every number of the report, from a recording (``tables`` when already loaded)."""
    tables = tables or rec.tables(coll_columns=REPORT_COLUMNS)
    coll, copy = tables.coll, tables.copy
    t_base = int(coll["start_ns"].min()) if len(coll["start_ns"]) else rec.first_ns
    settings = _settings_by_epoch(tables.hellos)
    gpu_of = {h.rank: (h.host, h.gpu_uuid) for _, h in tables.hellos}
    telemetry = _Telemetry(tables.other)
    dur = coll["dur_us"].astype(np.float64)
    end_ns = coll["start_ns"] + (dur * 1e3).astype(np.int64)

    # baseline: p50 of mode none per (rank, op, nbytes) and per (op, nbytes) over all ranks
    none = coll["mode"] == p.MODES.index("none")
    base_rank: dict[tuple[int, int, int], float] = {}
    base_all: dict[tuple[int, int], float] = {}
    if none.any():
        keys = np.stack([coll["rank"][none], coll["op"][none], coll["nbytes"][none]], axis=1)
        for key in np.unique(keys, axis=0):
            sel = none & (coll["rank"] == key[0]) & (coll["op"] == key[1]) & (coll["nbytes"] == key[2])
            base_rank[(int(key[0]), int(key[1]), int(key[2]))] = float(np.median(dur[sel]))
        for key in np.unique(keys[:, 1:], axis=0):
            sel = none & (coll["op"] == key[0]) & (coll["nbytes"] == key[1])
            base_all[(int(key[0]), int(key[1]))] = float(np.median(dur[sel]))

    # copies, grouped the same way
    cgroups: dict[tuple[int, int | None], np.ndarray] = {}
    if len(copy["epoch"]):
        for e in np.unique(copy["epoch"]).tolist():
            in_e = copy["epoch"] == e
            cgroups[(e, None)] = np.flatnonzero(in_e)
            for r in np.unique(copy["rank"][in_e]).tolist():
                cgroups[(e, r)] = np.flatnonzero(in_e & (copy["rank"] == r))

    rows: list[Row] = []
    order = np.argsort(coll["epoch"].astype(np.int64) * (1 << 24) + coll["rank"], kind="stable")
    epochs_sorted = coll["epoch"][order]
    for e in np.unique(coll["epoch"]).tolist():
        a, b = np.searchsorted(epochs_sorted, [e, e + 1])
        idx_e = order[a:b]
        ranks_e = coll["rank"][idx_e]
        t0, t1 = int(coll["start_ns"][idx_e].min()), int(end_ns[idx_e].max())
        op = _mode_of(coll["op"][idx_e])
        nbytes = _mode_of(coll["nbytes"][idx_e])
        mode = p.MODES[_mode_of(coll["mode"][idx_e])] if _mode_of(coll["mode"][idx_e]) < len(p.MODES) else "?"
        s = settings.get(e, {})
        cidx = cgroups.get((e, None), np.zeros(0, dtype=np.int64))
        if "copies" in s:
            copies: float | None = float(s["copies"])
        else:
            steps = len(np.unique(np.stack([copy["rank"][cidx], copy["step"][cidx]], axis=1), axis=0))
            copies = len(cidx) / steps if len(cidx) else 0.0
        pinned = bool(s["pinned"]) if "pinned" in s else (bool(_mode_of(copy["pinned"][cidx])) if len(cidx) else None)
        direction = str(s.get("direction", p.DIRECTIONS[_mode_of(copy["direction"][cidx])] if len(cidx) else ""))
        copy_bytes = _mode_of(copy["nbytes"][cidx]) if len(cidx) else None
        groups: list[tuple[int | None, np.ndarray]] = [(None, idx_e)]
        bounds = np.flatnonzero(np.diff(ranks_e)) + 1
        for part in np.split(np.arange(len(idx_e)), bounds):
            groups.append((int(ranks_e[part[0]]), idx_e[part]))
        for rank, idx in groups:
            d = dur[idx]
            p50, p90, p99 = np.percentile(d, [50, 90, 99]).tolist()
            ci = cgroups.get((e, rank), np.zeros(0, dtype=np.int64))
            gpu = None if rank is None else gpu_of.get(rank, ("", ""))
            base = base_all.get((op, nbytes)) if rank is None else base_rank.get((rank, op, nbytes))
            links = {name: telemetry.mean(name, t0, t1, gpu) for name in LINK_METRICS}
            rows.append(
                Row(
                    epoch=e,
                    rank=rank,
                    mode=mode,
                    copies=copies,
                    copy_bytes=copy_bytes,
                    pinned=pinned,
                    direction=direction,
                    op=p.COLLECTIVES[op] if op < len(p.COLLECTIVES) else f"op{op}",
                    nbytes=nbytes,
                    start_s=(t0 - t_base) / 1e9,
                    end_s=(t1 - t_base) / 1e9,
                    count=len(idx),
                    p50_us=p50,
                    p90_us=p90,
                    p99_us=p99,
                    max_us=float(d.max()),
                    mean_us=float(d.mean()),
                    algbw_gbps=float(coll["algbw"][idx].astype(np.float64).mean()),
                    busbw_gbps=float(coll["busbw"][idx].astype(np.float64).mean()),
                    copy_count=len(ci),
                    copy_gbps=float(copy["gbps"][ci].astype(np.float64).mean()) if len(ci) else math.nan,
                    slowdown=p50 / base if base else math.nan,
                    **links,
                )
            )

    modes = []
    for m in np.unique(coll["mode"]).tolist():
        sel = coll["mode"] == m
        d = dur[sel]
        p50, p99 = np.percentile(d, [50, 99]).tolist()
        # slowdown per (op, size) with a baseline, weighted by records
        ratios, weights = [], []
        for (op, nb), base in base_all.items():
            s2 = sel & (coll["op"] == op) & (coll["nbytes"] == nb)
            if s2.any():
                ratios.append(float(np.median(dur[s2])) / base)
                weights.append(int(s2.sum()))
        slow = float(np.average(ratios, weights=weights)) if ratios else math.nan
        name = p.MODES[m] if m < len(p.MODES) else f"mode{m}"
        modes.append(ModeRow(name, int(sel.sum()), p50, p99, slow))
    return Report(
        path=rec.path,
        complete=rec.complete,
        problems=rec.summary(),
        meta=rec.meta,
        duration_s=(rec.last_ns - rec.first_ns) / 1e9,
        records=len(dur),
        rows=tuple(rows),
        modes=tuple(modes),
    )


# --------------------------------------------------------------------------- output


def _num(x: float | None, fmt: str = "{:.1f}") -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "n/a"
    return fmt.format(x)


def _pair(a: float, b: float) -> str:
    if not (math.isfinite(a) or math.isfinite(b)):
        return "n/a"
    return f"{_num(a)}/{_num(b)}"


def _bytes(n: int | None) -> str:
    if n is None:
        return "-"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:g}{unit}"
    return f"{n}B"


def format_table(report: Report) -> str:
    meta = report.meta
    lines = [
        f"commtop report: {report.path}",
        f"  {report.records:,} collective records over {report.duration_s:.1f} s; "
        f"ranks {len(meta.get('ranks') or [])} on {', '.join(meta.get('hosts') or ['?'])}; "
        f"commtop {meta.get('tool_version', '?')}, schema {meta.get('schema_version', '?')}",
    ]
    if report.problems:
        lines.append(f"  warning: {report.problems}")
    head = (
        "epoch",
        "mode",
        "copies",
        "size",
        "pin",
        "dir",
        "rank",
        "n",
        "p50 ms",
        "p90 ms",
        "p99 ms",
        "max ms",
        "algbw",
        "busbw",
        "copy GB/s",
        "PCIe tx/rx",
        "NVLink tx/rx",
        "SM MHz",
        "slowdown",
    )
    body = []
    for r in report.rows:
        body.append(
            (
                str(r.epoch),
                r.mode,
                _num(r.copies, "{:g}"),
                _bytes(r.copy_bytes),
                "-" if r.pinned is None else ("yes" if r.pinned else "no"),
                r.direction or "-",
                "all" if r.rank is None else str(r.rank),
                str(r.count),
                _num(r.p50_us / 1e3, "{:.3f}"),
                _num(r.p90_us / 1e3, "{:.3f}"),
                _num(r.p99_us / 1e3, "{:.3f}"),
                _num(r.max_us / 1e3, "{:.3f}"),
                _num(r.algbw_gbps),
                _num(r.busbw_gbps),
                _num(r.copy_gbps),
                _pair(r.pcie_tx_gbps, r.pcie_rx_gbps),
                _pair(r.nvlink_tx_gbps, r.nvlink_rx_gbps),
                _num(r.sm_clock_mhz, "{:.0f}"),
                _num(r.slowdown, "{:.2f}x"),
            )
        )
    widths = [max(len(h), *(len(row[i]) for row in body)) if body else len(h) for i, h in enumerate(head)]
    left = {1, 5}

    def fmt(row: Sequence[str]) -> str:
        return "  ".join(
            c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))
        )

    lines += ["", fmt(head)]
    last_epoch = None
    for r, row in zip(report.rows, body, strict=True):
        if last_epoch is not None and r.epoch != last_epoch:
            lines.append("")
        last_epoch = r.epoch
        lines.append(fmt(row))
    if not body:
        lines.append("  (no collective records)")
    if report.modes:
        lines += ["", "per mode (all ranks)   n        p50 ms    p99 ms   slowdown vs none"]
        for m in report.modes:
            lines.append(
                f"  {m.mode:18} {m.count:>9}  {_num(m.p50_us / 1e3, '{:.3f}'):>8}  {_num(m.p99_us / 1e3, '{:.3f}'):>8}"
                f"   {_num(m.slowdown, '{:.2f}x')}"
            )
    lines.append("")
    lines.append("latency = collective duration per rank (CUDA events on GPU); algbw/busbw GB/s as nccl-tests;")
    lines.append("PCIe/NVLink GB/s and SM clock = mean per GPU of the node telemetry during the epoch")
    return "\n".join(lines) + "\n"


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if isinstance(value, bytes):
        return None
    if isinstance(value, np.generic):
        return _clean(value.item())
    return value


def format_json(report: Report) -> str:
    meta_keys = ("tool_version", "schema_version", "clock", "ranks", "world_size", "hosts", "gpus", "config", "backend")
    doc = {
        "path": report.path,
        "complete": report.complete,
        "problems": report.problems,
        "duration_s": report.duration_s,
        "records": report.records,
        "meta": {k: report.meta.get(k) for k in meta_keys},
        "rows": [asdict(r) for r in report.rows],
        "modes": [asdict(m) for m in report.modes],
    }
    return json.dumps(_clean(doc), indent=1) + "\n"


def format_csv(report: Report) -> str:
    out = io.StringIO()
    names = list(Row.__dataclass_fields__)
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(names)
    for r in report.rows:
        values = asdict(r)
        writer.writerow(["all" if n == "rank" and values[n] is None else _csv_value(values[n]) for n in names])
    return out.getvalue()


def _csv_value(v: Any) -> Any:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return ""
    if isinstance(v, float):
        return repr(v)
    return v


def write_records_csv(tables: Tables, out: IO[str], block: int = 100_000) -> int:
    """One row per collective record; floats with 9 significant digits (exact for float32)."""
    coll = tables.coll
    out.write(",".join(RECORD_FIELDS) + "\n")
    names = np.array(list(p.MODES) + ["?"] * (256 - len(p.MODES)), dtype=object)
    ops = np.array(list(p.COLLECTIVES) + [f"op{i}" for i in range(len(p.COLLECTIVES), 256)], dtype=object)
    fmt = "%d,%d,%d,%d,%s,%s,%d,%d,%d,%.9g,%.9g,%.9g,%d\n"
    n = len(coll["dur_us"])
    for a in range(0, n, block):
        s = slice(a, a + block)
        cols = (
            coll["rank"][s].tolist(),
            coll["iteration"][s].tolist(),
            coll["step"][s].tolist(),
            coll["epoch"][s].tolist(),
            names[coll["mode"][s]].tolist(),
            ops[coll["op"][s]].tolist(),
            coll["nbytes"][s].tolist(),
            coll["host_ns"][s].tolist(),
            coll["start_ns"][s].tolist(),
            coll["dur_us"][s].tolist(),
            coll["algbw"][s].tolist(),
            coll["busbw"][s].tolist(),
            coll["recv_ns"][s].tolist(),
        )
        out.write("".join(fmt % row for row in zip(*cols, strict=True)))
    return n


# --------------------------------------------------------------------------- command line


def build_parser(prog: str = "commtop report") -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog=prog,
        description="Summarise a commtop recording per settings epoch and rank; export CSV, a Perfetto trace or a plot.",
    )
    ap.add_argument("file", help="a .commtop recording")
    ap.add_argument("--format", choices=("table", "json", "csv"), default=None, help="report format (default table)")
    ap.add_argument("--records", action="store_true", help="with --format csv: one row per collective record")
    ap.add_argument("--trace", metavar="OUT.json", help="write a Chrome/Perfetto trace (open in ui.perfetto.dev)")
    ap.add_argument("--plot", metavar="OUT.png", help="plot latency per rank by mode, and link throughput (matplotlib)")
    ap.add_argument("-o", "--output", metavar="PATH", help="write the report here instead of stdout")
    return ap


def main(argv: list[str] | None = None) -> int:
    """`commtop report ...`: 0 on success, 1 on a file that is not a recording or a failed write."""
    ns = build_parser().parse_args(argv)
    return run(ns)


report_main = main


def _err(message: str) -> int:
    print(f"commtop: error: {message}", file=sys.stderr)
    return 1


def run(ns: argparse.Namespace) -> int:
    if ns.records and ns.format not in (None, "csv"):
        return _err("--records needs --format csv")
    fmt = ns.format or ("csv" if ns.records else None)
    if fmt is None and not (ns.trace or ns.plot):
        fmt = "table"
    if ns.plot:  # fail before reading a big file
        from tui.plot import matplotlib_missing

        missing = matplotlib_missing()
        if missing:
            return _err(missing)
    try:
        rec = open_recording(ns.file)
    except RecordingError as exc:
        return _err(str(exc))
    with rec:
        if rec.summary():
            print(f"commtop: warning: {rec.summary()}", file=sys.stderr)
        wanted = None if ns.records or ns.trace else REPORT_COLUMNS
        tables = rec.tables(coll_columns=wanted)
        try:
            if ns.trace:
                from tui.trace import write_trace

                events = write_trace(rec, tables, ns.trace)
                print(
                    f"commtop: wrote {events:,} trace events to {ns.trace} (open in https://ui.perfetto.dev)",
                    file=sys.stderr,
                )
            if ns.plot:
                from tui.plot import plot_recording

                plot_recording(rec, tables, ns.plot)
                print(f"commtop: wrote {ns.plot}", file=sys.stderr)
            if fmt is None:
                return 0
            out = open(ns.output, "w", newline="") if ns.output else sys.stdout  # noqa: SIM115
            try:
                if ns.records:
                    write_records_csv(tables, out)
                else:
                    report = build_report(rec, tables)
                    out.write({"table": format_table, "json": format_json, "csv": format_csv}[fmt](report))
            finally:
                if out is not sys.stdout:
                    out.close()
        except BrokenPipeError:
            return 0
        except OSError as exc:
            return _err(f"{exc.filename or ''}: {exc.strerror or exc}".lstrip(": "))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
