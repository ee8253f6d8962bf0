"""What every standing benchmark shares: the machine/date/versions header and the result tables.

A benchmark builds a :class:`Report` (its title, tables of measured numbers with their targets
and same-run reference, notes), then calls :func:`finish`, which prints it, writes it to
``--out FILE`` (a raw result file, e.g. under benchmarks/results/) and appends it to
``--results FILE`` when given. benchmarks/RESULTS.md is edited by hand: it keeps the latest
figure per benchmark, not every run. Numbers are formatted here so every table looks alike;
nothing here measures anything.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.metadata
import math
import os
import platform
import socket
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

if str(ROOT) not in sys.path:  # `python3 benchmarks/standing/x.py` from a checkout, installed or not
    sys.path.insert(0, str(ROOT))


def add_common_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tiny", action="store_true", help="smallest run that exercises every part (CI smoke)")
    parser.add_argument("--out", default="", help="also write the report to this file (replaced)")
    parser.add_argument("--results", default="", help="also append the report to this markdown file")
    parser.add_argument("--label", default="", help="a note in the report's heading (e.g. which code it measured)")


# --------------------------------------------------------------------------- machine


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpu_names() -> str:
    """GPU names from torch when it is already imported (never imported just for this),
    else from nvidia-smi, else "none"."""
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_available():
                return ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
        except Exception:
            pass
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        names = [n.strip() for n in out.stdout.splitlines() if n.strip()]
        if out.returncode == 0 and names:
            return f"{len(names)} x {names[0]}" if len(set(names)) == 1 else ", ".join(names)
    except (OSError, subprocess.TimeoutExpired):
        pass
    return "none"


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "-"


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    torch = sys.modules.get("torch")
    if torch is not None:
        out["torch"] = str(torch.__version__)
        try:
            if torch.cuda.is_available():
                out["cuda"] = str(torch.version.cuda)
                out["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:
            pass
    out["textual"] = _version("textual")
    try:
        import zmq

        out["pyzmq"] = f"{zmq.__version__} (libzmq {zmq.zmq_version()})"
    except ImportError:
        out["pyzmq"] = "-"
    out["numpy"] = _version("numpy")
    out["msgpack"] = _version("msgpack")
    try:
        rev = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5
        )
        if rev.returncode == 0:
            out["commtop"] = rev.stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        pass
    return out


def machine_lines() -> list[str]:
    cores = os.cpu_count() or 0
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = cores
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    vers = " · ".join(f"{k} {v}" for k, v in versions().items())
    return [
        f"- machine: `{socket.gethostname()}` · {cpu_model()} · {cores} cores ({usable} usable) · GPU: {gpu_names()}",
        f"- date: {now}",
        f"- versions: {vers}",
    ]


# --------------------------------------------------------------------------- tables


def fmt(value: object, digits: int = 3) -> str:
    """Numbers with a sensible number of significant digits; NaN as "-"."""
    if isinstance(value, bool) or value is None:
        return "-" if value is None else ("yes" if value else "no")
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if not math.isfinite(value):
            return "-"
        a = abs(value)
        if a >= 1e5:
            return f"{value:,.0f}"
        if a >= 100:
            return f"{value:.1f}"
        return f"{value:.4g}"
    return str(value)


@dataclass
class Table:
    title: str
    columns: Sequence[str]
    rows: list[Sequence[object]] = field(default_factory=list)

    def add(self, *row: object) -> None:
        self.rows.append(row)

    def markdown(self) -> str:
        head = "| " + " | ".join(self.columns) + " |"
        sep = "| " + " | ".join("---" for _ in self.columns) + " |"
        body = ["| " + " | ".join(fmt(v) for v in row) + " |" for row in self.rows]
        return "\n".join([f"**{self.title}**", "", head, sep, *body])


@dataclass
class Report:
    """One benchmark run: title, the command that ran it, tables and notes."""

    title: str
    tables: list[Table] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    command: str = ""

    def table(self, title: str, columns: Sequence[str]) -> Table:
        t = Table(title, columns)
        self.tables.append(t)
        return t

    def markdown(self, label: str = "") -> str:
        cmd = self.command or " ".join([Path(sys.executable).name, *sys.argv])
        parts = [f"### {self.title}{f' — {label}' if label else ''}", "", *machine_lines(), f"- command: `{cmd}`", ""]
        for t in self.tables:
            parts += [t.markdown(), ""]
        parts += [f"- {n}" for n in self.notes]
        return "\n".join(parts).rstrip() + "\n"


def finish(report: Report, ns: argparse.Namespace) -> None:
    """Print the report; write it to --out; append it to --results."""
    label = ", ".join(x for x in ("tiny (smoke) run" if getattr(ns, "tiny", False) else "", ns.label) if x)
    text = report.markdown(label)
    print(text, flush=True)
    if ns.out:
        Path(ns.out).parent.mkdir(parents=True, exist_ok=True)
        Path(ns.out).write_text(text)
    if ns.results:
        path = Path(ns.results)
        with path.open("a") as f:
            f.write("\n" + text)


def percentile(values: Sequence[float], q: float) -> float:
    """commtop's one percentile definition (workers.wire.stats); NaN when empty."""
    import numpy as np

    from workers.wire.stats import percentile as wire_percentile

    return wire_percentile(np.asarray(values, dtype=np.float64), q)


def mean_ci(values: Sequence[float]) -> tuple[float, float]:
    """Mean and the half-width of its ~95 % confidence interval (normal approximation)."""
    n = len(values)
    if n == 0:
        return math.nan, math.nan
    m = sum(values) / n
    if n < 2:
        return m, math.nan
    var = sum((v - m) ** 2 for v in values) / (n - 1)
    t = {2: 12.71, 3: 4.30, 4: 3.18, 5: 2.78, 6: 2.57, 7: 2.45, 8: 2.36, 9: 2.31, 10: 2.26}.get(n, 2.0)
    return m, t * math.sqrt(var / n)
