"""Measured peaks from nccl-tests: `commtop report --peak FILE`, FILE written by an nccl-tests
binary with ``-J FILE.json`` (e.g. ``all_gather_perf -b 8M -e 1G -f 2 -g 8 -J ag.json``).

The file (nccl-tests src/util.cu, JSON_FILE_VERSION 3) is one object: ``args`` (argv: the
binary names the op), ``results`` (one object per size: ``size`` in bytes, ``type``, and
``out_of_place`` / ``in_place`` each with ``time`` µs, ``alg_bw``, ``bus_bw`` GB/s; either may be
null; a NaN is written as the string "nan"). ``size`` is nccl-tests' S: the whole gathered
(all_gather) or reduced (reduce_scatter) buffer, as commtop's ``nbytes`` (workers.wire.busbw).
The peak of a size is the better of out-of-place and in-place busbw.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field

#: nccl-tests binary (without _perf / _perf_mpi) -> commtop's op name.
BINARY_OPS = {
    "all_reduce": "all_reduce",
    "all_gather": "all_gather",
    "reduce_scatter": "reduce_scatter",
    "alltoall": "all_to_all",
    "broadcast": "broadcast",
    "reduce": "reduce",
}
MAX_BYTES = 64 << 20  # an nccl-tests json is a few hundred KB; refuse anything huge


class PeakFileError(ValueError):
    """The --peak file cannot be used; one line meant for the user."""


@dataclass(frozen=True)
class MeasuredPeaks:
    """Peak busbw (GB/s) per message size of one op, from one nccl-tests run."""

    op: str
    path: str
    program: str
    busbw: dict[int, float] = field(default_factory=dict)  # size (bytes) -> best busbw

    def lookup(self, nbytes: int) -> tuple[float, int]:
        """(peak busbw, the measured size it is for): the same size, else the nearest in log2."""
        if not self.busbw or nbytes <= 0:
            return math.nan, 0
        if nbytes in self.busbw:
            return self.busbw[nbytes], nbytes
        size = min(self.busbw, key=lambda s: abs(math.log2(s) - math.log2(nbytes)))
        return self.busbw[size], size

    def best(self) -> tuple[float, int]:
        size = max(self.busbw, key=lambda s: self.busbw[s])
        return self.busbw[size], size


def _program_op(args: object) -> tuple[str, str]:
    if not isinstance(args, list) or not args or not isinstance(args[0], str):
        raise PeakFileError("no 'args' (the nccl-tests command line) to tell which collective it measured")
    program = os.path.basename(args[0])
    base = program.split("_perf")[0]
    op = BINARY_OPS.get(base)
    if op is None:
        known = ", ".join(f"{b}_perf" for b in BINARY_OPS)
        raise PeakFileError(f"{program!r} is not an nccl-tests collective binary ({known})")
    return program, op


def _bus_bw(part: object) -> float:
    if not isinstance(part, dict):
        return math.nan  # null: not measured
    value = part.get("bus_bw")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return math.nan  # "nan" or missing
    return float(value) if math.isfinite(value) and value > 0 else math.nan


def load_peaks(path: str) -> MeasuredPeaks:
    """Read one nccl-tests ``-J`` file; PeakFileError (one line) when it is not one."""
    where = f"--peak {path}"
    try:
        if os.path.getsize(path) > MAX_BYTES:
            raise PeakFileError(f"{where}: larger than {MAX_BYTES >> 20} MiB; not an nccl-tests -J file")
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except OSError as exc:
        raise PeakFileError(f"{where}: {exc.strerror or exc}") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise PeakFileError(f"{where}: not JSON ({str(exc).splitlines()[0][:120]})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("results"), list):
        raise PeakFileError(f"{where}: no 'results' list; expected the output of an nccl-tests binary run with -J")
    try:
        program, op = _program_op(doc.get("args"))
    except PeakFileError as exc:
        raise PeakFileError(f"{where}: {exc}") from None
    busbw: dict[int, float] = {}
    for entry in doc["results"]:
        if not isinstance(entry, dict):
            continue
        size = entry.get("size")
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
            continue
        best = max(_bus_bw(entry.get("out_of_place")), _bus_bw(entry.get("in_place")), key=_finite_or_low)
        if math.isfinite(best):
            busbw[size] = max(best, busbw.get(size, 0.0))
    if not busbw:
        raise PeakFileError(f"{where}: no result with a bus bandwidth (bus_bw) in it")
    return MeasuredPeaks(op=op, path=path, program=program, busbw=busbw)


def _finite_or_low(x: float) -> float:
    return x if math.isfinite(x) else -math.inf


def size_text(nbytes: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"
