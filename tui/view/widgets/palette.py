"""Colours by meaning (offload mode, rank state, latency) and formatting shared by widgets.

Rich-only (no Textual), so the row renderer can be tested without an app.
"""

from __future__ import annotations

import math
from functools import lru_cache

from rich.color import Color
from rich.style import Style

from workers.wire.protocol import MODES

#: The offload mode in force when a collective ran: the colour of its sparkline cell.
MODE_COLORS: dict[str, str] = {
    "none": "#5fafff",  # blue: collectives alone
    "overlap": "#ffaf00",  # amber: copies overlap the collectives
    "sync": "#ff5f87",  # pink: copies, then synchronise, then collectives
    "sync-barrier": "#87d75f",  # green: the forum's fix (barrier after the offload)
}
UNKNOWN_MODE_COLOR = "#b2b2b2"
LIVE = "#5fd75f"
STALE = "#767676"
EXITED = "#ff5f5f"
STRAGGLER = "#d75fff"
TEXT = "#d0d0d0"
MUTED = "#8a8a8a"
ACCENT = "#5fd7ff"
WARN = "#ffaf00"

#: Latency heat map, cool to hot (a perceptually ordered ramp, readable on dark terminals).
HEAT_RAMP: tuple[str, ...] = (
    "#1d2b4f",
    "#21457a",
    "#23639a",
    "#2b84a8",
    "#3aa6a4",
    "#69c38d",
    "#b5d86a",
    "#f2d34f",
    "#f79a3a",
    "#e8562f",
    "#b8132b",
)
CLIPPED = "#ffffff"

SPARK_CHARS = "▁▂▃▄▅▆▇█"


def mode_color(mode_index: int) -> str:
    if 0 <= mode_index < len(MODES):
        return MODE_COLORS.get(MODES[mode_index], UNKNOWN_MODE_COLOR)
    return UNKNOWN_MODE_COLOR


@lru_cache(maxsize=512)
def style(fg: str | None = None, bg: str | None = None, *, bold: bool = False, dim: bool = False) -> Style:
    """Interned styles: building Style objects per cell would dominate rendering."""
    return Style(color=Color.parse(fg) if fg else None, bgcolor=Color.parse(bg) if bg else None, bold=bold, dim=dim)


def blend(fg: str, toward: str = "#303030", amount: float = 0.6) -> str:
    """``fg`` mixed toward ``toward`` (dims a colour without the terminal's dim attribute)."""
    a, b = Color.parse(fg).get_truecolor(), Color.parse(toward).get_truecolor()
    mix = [round(x + (y - x) * amount) for x, y in zip(a, b, strict=True)]
    return "#{:02x}{:02x}{:02x}".format(*mix)


def fmt_ms(value: float, width: int = 7) -> str:
    if not math.isfinite(value):
        return "-".rjust(width)
    if value >= 1000:
        text = f"{value:.0f}"
    elif value >= 100:
        text = f"{value:.1f}"
    elif value >= 1:
        text = f"{value:.2f}"
    else:
        text = f"{value:.3f}"
    return text.rjust(width)


def fmt_gbps(value: float, width: int = 7) -> str:
    if not math.isfinite(value):
        return "-".rjust(width)
    text = f"{value:.1f}" if value >= 10 else f"{value:.2f}"
    return text.rjust(width)


def fmt_bytes(n: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def fmt_duration(seconds: float) -> str:
    if not math.isfinite(seconds) or seconds < 0:
        return "-"
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"
