"""Small text helpers every report table shares: numbers and sizes as cells ("n/a" where a
value is not finite), and columns aligned to their widest cell."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any


def fmt_num(x: float | None, fmt: str = "{:.1f}") -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "n/a"
    return fmt.format(x)


def fmt_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:g}{unit}"
    return f"{n}B"


def aligned_table(
    head: Sequence[str], body: Sequence[Sequence[str]], groups: Sequence[Any], left: set[int]
) -> list[str]:
    """Columns padded to their widest cell (``left`` ones left-aligned, the rest right), a
    blank line where ``groups`` (one value per body row) changes."""
    widths = [max(len(h), *(len(row[i]) for row in body)) if body else len(h) for i, h in enumerate(head)]

    def fmt(row: Sequence[str]) -> str:
        return "  ".join(
            c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))
        )

    lines = [fmt(head)]
    for i, row in enumerate(body):
        if i and groups[i] != groups[i - 1]:
            lines.append("")
        lines.append(fmt(row))
    if not body:
        lines.append("  (no collective records)")
    return lines
