"""The group table: codes by torch's group name, shared by the wrappers (group objects) and the
Flight Recorder capture (names), published whole for the Hellos."""

from __future__ import annotations

from types import SimpleNamespace

from workers.rank.groups import OVERFLOW, GroupTable
from workers.wire.protocol import MAX_GROUPS


def test_codes_follow_first_sight_and_names_agree_across_both_paths() -> None:
    sink = SimpleNamespace(groups=())
    table = GroupTable(sink)
    assert table.code("1", "undefined", 2) == 1  # seen first through the Flight Recorder
    assert sink.groups == (("", "", 0), ("1", "undefined", 2))  # code 0 stays the world's
    table.world(("0", "default_pg", 2))
    assert sink.groups == (("0", "default_pg", 2), ("1", "undefined", 2))
    assert table.code("0", "default_pg", 2) == 0 and table.code("1", "x", 9) == 1
    assert table.code("hashed-name", "tp", 4) == 2 and sink.groups[2] == ("hashed-name", "tp", 4)


def test_past_the_hello_s_limit_groups_share_one_unnamed_code() -> None:
    table = GroupTable()
    table.world(("0", "default_pg", 8))
    codes = [table.code(str(i), "undefined", 8) for i in range(1, MAX_GROUPS + 5)]
    assert codes[: MAX_GROUPS - 1] == list(range(1, MAX_GROUPS)) and set(codes[MAX_GROUPS - 1 :]) == {OVERFLOW}
    assert len(table.table) == MAX_GROUPS


def test_a_group_torch_cannot_describe_never_raises_into_the_job() -> None:
    table = GroupTable()
    assert table.of_pg(object()) == (0, 0)  # no process group exists in this process
    assert table.by_pg == {}
