"""The rank row's overlap-class line: p50 during copies / after copies / no copies (whole run),
shortened to the room there is, empty before any collective is labelled."""

from __future__ import annotations

from tui.model.snapshot import RankView
from tui.model.stats import RunStats
from tui.view.widgets.class_row import class_numbers, class_text


def _rank(overlapped: float = 0.78) -> RankView:
    return RankView(
        rank=0,
        run_by_class={
            "during copies": RunStats(count=900, p50_ms=2.713),
            "after copies": RunStats(count=0),
            "no copies": RunStats(count=100, p50_ms=0.0671),
        },
        overlapped=overlapped,
    )


def test_each_class_p50_and_the_overlapped_share() -> None:
    assert class_text(_rank()) == "p50 by class  during 2.71  after -  none 0.067  (78 % overlapped)"
    assert class_text(_rank(float("nan"))) == "p50 by class  during 2.71  after -  none 0.067"


def test_shortened_to_the_room_and_every_row_from_the_same_column() -> None:
    assert class_text(_rank(), 40) == "p50 during 2.71 after - none 0.067"
    segs = class_numbers(_rank(), 43)  # the narrow layout's fixed columns
    assert sum(len(s.text) for s in segs) == 43 and segs[0].text.startswith("p50 during 2.71")
    wide = [class_numbers(_rank(share), 66)[0].text for share in (0.78, float("nan"))]  # with and without the share
    assert [len(t) for t in wide] == [66, 66] and all(t.startswith("p50 by class  during 2.71") for t in wide)


def test_nothing_before_a_collective_is_labelled() -> None:
    assert class_text(RankView(rank=3)) == ""
    assert class_numbers(RankView(rank=3), 66)[0].text == " " * 66
