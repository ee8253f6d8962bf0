"""One line of a rank's row: p50 per overlap class (during copies / after copies / no copies)
over the whole run, so the forum's three numbers (alone, while copies run, after they finish)
are on screen for every rank. Shown as the fourth line of a rank row, when the grid gives each
rank four lines or more (a few ranks on a tall terminal); the report and `commtop ab` have
the same classes (workers.wire.overlap)."""

from __future__ import annotations

import math

from rich.segment import Segment

from tui.model.snapshot import RankView
from tui.view.widgets.palette import STALE, fmt_ms, style
from workers.wire.overlap import CLASSES

#: (class, label) in the order of the line: the forum's "while copies run", "after", "alone".
LABELS = ((CLASSES[1], "during"), (CLASSES[2], "after"), (CLASSES[0], "none"))


def class_text(r: RankView, room: int = 200) -> str:
    """ "p50 by class  during 0.068  after -  none 0.067  (100 % overlapped)", shortened to fit
    ``room`` cells; "" before any collective is labelled."""
    stats = r.run_by_class
    if not stats or not any(s.count for s in stats.values()):
        return ""
    values = []
    for name, label in LABELS:
        s = stats.get(name)
        values.append((label, fmt_ms(s.p50_ms if s is not None and s.count else math.nan, 0)))
    overlapped = f"  ({r.overlapped * 100:.0f} % overlapped)" if math.isfinite(r.overlapped) else ""
    long = "p50 by class  " + "  ".join(f"{k} {v}" for k, v in values)
    short = "p50 " + " ".join(f"{k} {v}" for k, v in values)
    for text in (long + overlapped, long, short):
        if len(text) <= room:
            return text
    return short[:room]


def class_numbers(r: RankView, room: int) -> list[Segment]:
    """The line's fixed columns (``room`` cells), the text from the left edge: its length varies
    with the numbers and with whether the overlapped share fits, so right-aligned it started at
    a different column on every rank's row."""
    text = class_text(r, room - 2)
    if not text:
        return [Segment(" " * room)]
    return [Segment(f"{text:<{room - 2}}  ", style(STALE))]
