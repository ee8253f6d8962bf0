"""The Flight Recorder decoder on the entries FSDP2, coalesced collectives and point-to-point write,
and its count of what a ring loses, on a FAKE ring (tests/fake_flight_recorder.py: entries as
torch 2.11's ProcessGroupNCCL writes them; CI has no NCCL).

How each counts (workers/capture/flight_recorder.py): one collective per (group,
collective_seq_id); a coalesced call is one collective with its tensors' bytes summed; a
startCoalescing block is one collective with its ops' bytes summed and the closing entry's time;
point-to-point is not a collective (counted as p2p, never lost).
"""

from __future__ import annotations

import copy
import itertools
import math
import pickle

import pytest
from fake_flight_recorder import FakeRing

from workers.capture.flight_recorder import FrCursor, issued_by_group, load_dump, op_name, read_all
from workers.capture.fr_source import (
    RING_DEFAULT,
    FillSchedule,
    FlightRecorderSource,
    choose_ring,
    idle_setting,
    ring_advice,
    ring_size,
)
from workers.wire.protocol import DTYPES

LAYERS = (1000, 2000, 3000)  # parameters per rank of each fully_shard unit


class FakeDump:
    """A DumpReader over the fake ring (pickled as torch's dump is)."""

    how = "a fake ring"

    def __init__(self, ring: FakeRing) -> None:
        self.ring = ring

    def fetch(self) -> bytes:
        return pickle.dumps(self.ring.dump(), protocol=2)

    def decode(self, raw: bytes) -> dict:
        return load_dump(raw)


def rows_of(rows: list) -> list[tuple[str, str, int, str]]:
    return [(r.pg, r.op, r.nbytes, DTYPES[r.dtype]) for r in rows]


def test_an_fsdp2_step_gives_one_row_per_all_gather_and_reduce_scatter() -> None:
    ring = FakeRing(world=2)
    expected = []
    for _step in range(2):
        # forward: all-gather each unit (bf16 params); backward: all-gather again (resharded after
        # forward), then reduce-scatter its fp32 gradients. 2.11 names them _all_gather_base / _reduce_scatter_base.
        for n in (*LAYERS, *reversed(LAYERS)):
            ring.collective("nccl:_all_gather_base", [[n]], [[2 * n]], "BFloat16")
            expected.append(("0", "all_gather", 2 * n * 2, "bfloat16"))
        for n in reversed(LAYERS):
            ring.collective("nccl:_reduce_scatter_base", [[2 * n]], [[n]], "Float")
            expected.append(("0", "reduce_scatter", 2 * n * 4, "float32"))
    ring.complete(duration_ms=0.25)
    rows, cursor = read_all([ring.dump()])
    assert rows_of(rows) == expected
    assert all(r.ranks == 2 and r.dur_us == 250.0 and r.parts == 1 for r in rows)
    assert [r.seq for r in rows] == list(range(1, len(expected) + 1))
    assert cursor.lost == 0 and cursor.pending == 0 and cursor.finish(issued_by_group(ring.status())) == 0
    assert op_name("nccl:_allgather_base") == op_name("nccl:_all_gather_base") == "all_gather"


def test_a_coalesced_call_is_one_collective_with_every_tensor_s_bytes() -> None:
    ring = FakeRing(world=2)
    ring.collective("nccl:all_gather_into_tensor_coalesced", [[100], [300]], [[200], [600]], "BFloat16")
    ring.collective("nccl:reduce_scatter_tensor_coalesced", [[200], [600]], [[100], [300]], "Float")
    ring.collective("nccl:allreduce_coalesced", [[10], [20], [30]], [[10], [20], [30]], "Float")
    ring.complete()
    rows, cursor = read_all([ring.dump()])
    assert rows_of(rows) == [
        ("0", "all_gather", (200 + 600) * 2, "bfloat16"),  # S = the gathered outputs
        ("0", "reduce_scatter", (200 + 600) * 4, "float32"),  # S = the inputs
        ("0", "all_reduce", 60 * 4, "float32"),
    ]
    assert [r.parts for r in rows] == [1, 1, 1] and cursor.lost == 0


def test_a_start_coalescing_block_is_one_collective_timed_by_its_closing_entry() -> None:
    ring = FakeRing(world=2)
    ring.collective("nccl:all_reduce", [[4]], [[4]])
    closer = ring.coalescing_block(
        [("nccl:_all_gather_base", [[n]], [[2 * n]]) for n in LAYERS], dtype="BFloat16", pg="0"
    )
    ring.collective("nccl:_reduce_scatter_base", [[64]], [[32]])
    members = [e for e in ring.entries if e["collective_seq_id"] == 2]
    assert len(members) == 4 and members[-1] is closer and closer["input_sizes"] == []  # as torch writes it
    # A dump taken between the ops and endCoalescing: the ops wait (no closing entry yet).
    ring.complete(duration_ms=0.5, upto=0)
    mid = ring.dump()
    mid["entries"] = [e for e in mid["entries"] if e["record_id"] < closer["record_id"]]
    cursor = FrCursor()
    assert rows_of(cursor.read(mid)) == [("0", "all_reduce", 16, "float32")] and cursor.pending == 1
    ring.complete(duration_ms=0.5)
    rows = cursor.read(ring.dump())
    assert rows_of(rows) == [
        ("0", "all_gather", sum(LAYERS) * 2 * 2, "bfloat16"),
        ("0", "reduce_scatter", 64 * 4, "float32"),
    ]
    block = rows[0]
    assert block.parts == 3 and block.seq == 2 and block.record_id == closer["record_id"]
    assert block.dur_us == 500.0 and block.host_ns == closer["time_created_ns"]
    assert all(e["state"] == "scheduled" and not e["retired"] for e in members[:-1])  # never timed themselves
    assert cursor.read(ring.dump()) == [] and cursor.lost == 0 and cursor.pending == 0


def test_point_to_point_entries_are_no_collectives_and_never_lost() -> None:
    ring = FakeRing(world=2)
    ring.collective("nccl:all_reduce", [[256]], [[256]])
    ring.send(1, 256)
    ring.send(1, 256, recv=True)
    ring.p2p_batch(64, 4)
    ring.complete()
    rows, cursor = read_all([ring.dump()])
    assert rows_of(rows) == [("0", "all_reduce", 1024, "float32")]
    assert cursor.p2p == 2 + 4 + 1 and cursor.lost == 0
    # torch's count for the group is the last work's seq, here a p2p one (3 > 1 collective):
    # not trusted for a group that ran p2p, so nothing is counted as never read.
    assert issued_by_group(ring.status()) == {"0": 3}
    assert cursor.finish(issued_by_group(ring.status())) == 0 and cursor.lost == 0


def test_a_ring_smaller_than_the_issue_rate_loses_exactly_what_was_not_read() -> None:
    ring = FakeRing(size=64, world=2)
    ring.group("1", "tp")
    cursor = FrCursor()
    read = 0
    for i in range(1000):
        ring.collective("nccl:all_reduce", [[256]], [[256]], pg="1" if i % 3 == 0 else "0", done=True)
        if i % 100 == 99:
            read += len(cursor.read(ring.dump()))  # 100 new since the last read; the ring holds 64
    for _ in range(10):  # issued after the last read, never read
        ring.collective("nccl:all_reduce", [[256]], [[256]], done=True)
    assert read == 10 * 64 and cursor.overwritten == 10 * 36
    assert cursor.finish(issued_by_group(ring.status())) == 10
    assert read + cursor.lost == ring.issued == 1010


def test_untimed_and_unknown_collectives_count_as_lost() -> None:
    ring = FakeRing(world=2)
    ring.collective("nccl:all_reduce", [[4]], [[4]])
    ring.complete(timed=False)  # its group's timing is off: finished, retired, no duration
    ring.collective("nccl:all_reduce", [[4]], [[4]])
    ring.collective("nccl:_some_new_op", [[4]], [[4]])
    ring.complete()
    rows, cursor = read_all([ring.dump()])
    assert len(rows) == 1 and (cursor.untimed, cursor.unknown, cursor.lost) == (1, 1, 2)
    assert len(rows) + cursor.lost == ring.issued


def test_a_collective_dumped_between_its_retirement_and_its_duration_is_timed_at_the_next_read() -> None:
    # torch marks an entry retired, then computes its duration outside its lock (retire_id): a
    # dump in between shows it retired without one. It was counted lost (H200: 1 of 120,500).
    ring = FakeRing(world=2)
    ring.collective("nccl:all_reduce", [[4]], [[4]], done=True)  # the group times its collectives
    for _ in range(3):
        ring.collective("nccl:all_reduce", [[4]], [[4]])
    ring.complete(timed=False)
    cursor = FrCursor()
    assert [r.seq for r in cursor.read(ring.dump())] == [1] and cursor.pending == 3 and cursor.lost == 0
    state = cursor.state()  # a child decoder hands the cursor over between reads
    for e in list(ring.entries)[1:3]:
        e["duration_ms"] = 0.07  # torch has set two of the durations by the next dump
    cursor = FrCursor.from_state(state)
    rows = cursor.read(ring.dump())
    assert [r.seq for r in rows] == [2, 3] and cursor.untimed == 1 and cursor.pending == 0  # the third had none
    assert len(rows) + 1 + cursor.lost == ring.issued


def simulate(ring: FakeRing, source: FlightRecorderSource, rate: float, span_s: float) -> list[int]:
    """A job issuing ``rate`` collectives/s (finished at once) while the capture thread polls and
    reads as the source schedules; returns the ring entries new at each read."""
    now, t_issue, last_id, fills = 0.0, 0.0, 0, []
    while now < span_s:
        while t_issue < now:
            ring.collective("nccl:all_reduce", [[256]], [[256]], done=True)
            t_issue += 1 / rate
        if source.poll(now):
            fills.append(ring.next_id - last_id)
            last_id = ring.next_id
            source.read(now)
        now = max(source.next_poll_at, now + 1e-4)
    return fills


def test_fill_level_reads_come_before_the_ring_wraps_at_a_steady_rate() -> None:
    ring = FakeRing(size=512, world=2)
    source = FlightRecorderSource(FakeDump(ring), ring.status, ring=512)
    fills = simulate(ring, source, rate=5000, span_s=10.0)
    assert source.cursor.overwritten == 0
    # Each read once 60 % of the ring is new, before it wraps (polls at most every 20 ms = 100 entries).
    assert 0.6 * 512 <= min(fills[1:]) and max(fills) < 512
    assert 50_000 / 512 < len(fills) <= 50_000 / (0.6 * 512) + 1
    # Without torch's status the reads go by time only (at least every second): the ring wraps.
    ring2 = FakeRing(size=512, world=2)
    warned: list[str] = []
    blind = FlightRecorderSource(FakeDump(ring2), None, ring=512, warn=warned.append)
    simulate(ring2, blind, rate=5000, span_s=10.0)
    assert blind.cursor.overwritten > 0 and len(warned) == 1
    assert "wrapped before it was read" in warned[0] and "TORCH_FR_BUFFER_SIZE=" in warned[0]


def idle_read_gaps(schedule: FillSchedule, rate: float, span_s: float, ring: int, cost_s: float = 0.0) -> list[float]:
    """Seconds between the reads ``schedule`` asks for while a ring of ``ring`` fills at ``rate``/s
    (each read costing the capture thread ``cost_s``), checked every 10 ms."""
    times: list[float] = []
    issued_at_read = 0.0
    for tick in range(int(span_s * 100)):
        now = tick / 100
        if schedule.due(now, rate * now - issued_at_read):
            times.append(now)
            issued_at_read = rate * now
            schedule.read_done(now, cost_s)
    return [b - a for a, b in itertools.pairwise(times)]


def test_a_slowly_filling_ring_is_read_every_second_or_as_the_user_says() -> None:
    # 500/s into a ring of 8192: the fill trigger (4915 new) would take ~10 s; read every second.
    assert idle_read_gaps(FillSchedule(8192), rate=500, span_s=30.0, ring=8192) == pytest.approx([1.0] * 29, abs=0.011)
    # A job that fills the ring sooner is read by fill level: 0.6 x 8192 new at 6,000/s = 0.82 s.
    assert idle_read_gaps(FillSchedule(8192), rate=6000, span_s=30.0, ring=8192)[-5:] == pytest.approx(
        [0.82] * 5, abs=0.011
    )
    # A read that costs the capture thread more is spaced out (at most FR_DUTY of its time).
    assert idle_read_gaps(FillSchedule(8192), rate=10, span_s=60.0, ring=8192, cost_s=0.04) == pytest.approx(
        [8.0] * 7, abs=0.011
    )
    # The user's period wins where set; a value out of range is refused and the default stays.
    fresh = FillSchedule(8192, idle_set_s=idle_setting({"COMMTOP_FR_IDLE_S": "0.5"}))
    assert idle_read_gaps(fresh, rate=500, span_s=30.0, ring=8192)[-5:] == pytest.approx([0.5] * 5, abs=0.011)
    assert idle_setting({}) is None and idle_setting({"COMMTOP_FR_IDLE_S": "0.01"}) is None
    assert idle_setting({"COMMTOP_FR_IDLE_S": "soon"}) is None and idle_setting({"COMMTOP_FR_IDLE_S": "10"}) == 10.0


def test_the_ring_size_follows_torch_s_variables_and_is_only_chosen_when_unset() -> None:
    assert ring_size({}) == 2000 and ring_size({"TORCH_NCCL_TRACE_BUFFER_SIZE": "300"}) == 300
    assert ring_size({"TORCH_FR_BUFFER_SIZE": "100", "TORCH_NCCL_TRACE_BUFFER_SIZE": "300"}) == 100  # first wins
    env: dict[str, str] = {}
    assert choose_ring(env, server=True) == f"ring {RING_DEFAULT}" and env == {
        "TORCH_FR_BUFFER_SIZE": str(RING_DEFAULT)
    }
    env = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "20000"}
    assert choose_ring(env, server=True) == "ring 20000 ($TORCH_NCCL_TRACE_BUFFER_SIZE)" and len(env) == 1
    env = {}
    assert choose_ring(env, server=False) == "ring 2000 (torch's default)" and env == {}


def test_the_advice_names_a_ring_that_keeps_up_or_says_none_can() -> None:
    # 5,000/s, 15 us an entry: after the trigger 80 us an entry are left, 65 beyond the read.
    size = int(ring_advice(2000, 5000, 15e-6).rsplit("=", 1)[1])
    assert size == 1 << math.ceil(math.log2(max(4000, 0.5 / 65e-6)))
    assert "too slow for this rate at any ring size" in ring_advice(8192, 20000, 30e-6)


def test_record_ids_that_restart_do_not_hide_new_collectives() -> None:
    ring = FakeRing(world=2)
    for _ in range(5):
        ring.collective("nccl:all_reduce", [[4]], [[4]], done=True)
    cursor = FrCursor()
    assert len(cursor.read(ring.dump())) == 5
    after = copy.deepcopy(ring)
    after.entries.clear()
    after.next_id = 0  # torch's soft reset (_reset_fr_recording_nccl): ids from 0, seqs go on
    for _ in range(3):
        after.collective("nccl:all_reduce", [[4]], [[4]], done=True)
    assert [r.seq for r in cursor.read(after.dump())] == [6, 7, 8] and cursor.lost == 0


def test_the_oldest_collective_still_running_is_what_a_stalled_rank_is_inside() -> None:
    """A hang on the GPU: collectives stay running; the oldest is the stuck one (the Hello's
    ``inside``: op, group, bytes as nccl-tests count them, when torch created it)."""
    ring = FakeRing(world=2)
    ring.collective("nccl:all_reduce", [[4]], [[4]], done=True)
    stuck = ring.collective("nccl:_allgather_base", [[8]], [[16]])  # a peer never joined
    ring.collective("nccl:all_reduce", [[4]], [[4]])  # queued behind it
    cursor = FrCursor()
    assert len(cursor.read(ring.dump())) == 1 and cursor.pending == 2
    assert cursor.inside == ["all_gather", "0", 16 * 4, stuck["time_created_ns"]]
    assert FrCursor.from_state(cursor.state()).inside == cursor.inside  # a child decoder hands it over
    ring.complete()
    assert len(cursor.read(ring.dump())) == 2 and cursor.inside == []


def test_groups_made_again_after_destroy_are_read_by_a_new_cursor_from_where_the_last_stopped() -> None:
    """``destroy_process_group()`` then ``init_process_group()``: torch's ring keeps the gone
    groups' entries, and the new default group is named "0" again with seqs from 1. A cursor
    started after the last record the first read reads phase 2 once, none of phase 1 (on an
    H100 the capture stopped at the destroy and phase 2 was neither recorded nor counted)."""
    ring = FakeRing(world=2)
    for _ in range(9):
        ring.collective("nccl:all_reduce", [[4]], [[4]], done=True)
    first = FrCursor()
    assert len(first.read(ring.dump())) == 9
    ring.groups.clear()
    ring.group("0", "default_pg", 2)  # made again: seqs start at 1
    for _ in range(4):
        ring.collective("nccl:all_reduce", [[8]], [[8]], done=True)
        ring.collective("nccl:all_reduce", [[100], [200]], [[100], [200]], done=True)  # a coalesced call
    second = FrCursor()
    second.start_after(first.last_record, list(first.pg_names))
    rows = second.read(ring.dump())
    assert [(r.seq, r.nbytes) for r in rows] == [(s, 32 if s % 2 else 1200) for s in range(1, 9)]
    assert second.lost == 0 and second.read(ring.dump()) == []
    # torch's status keeps the gone group (pg_id 0, 9) beside the new "0" (pg_id 1, 8): on an H100
    # the end count read the gone group's 9 as never read
    assert issued_by_group(ring.status()) == {"0": 9, "1": 8}
    assert second.finish(issued_by_group(ring.status())) == 0 and second.lost == 0
    fresh = FrCursor()  # without it, phase 1's entries are read again as the new group's
    assert len(fresh.read(ring.dump())) > 8


def test_a_child_decoder_request_starts_its_cursor_after_a_record() -> None:
    from workers.capture.fr_child import answer
    from workers.capture.fr_source import LocalDecoder

    ring = FakeRing(world=2)
    for _ in range(3):
        ring.collective("nccl:all_reduce", [[4]], [[4]], done=True)
    decoder = LocalDecoder(FakeDump(ring))
    batch = answer("start_after 1", decoder)
    assert not batch.error and FrCursor.from_state(batch.state).floor == 1
    assert [r.seq for r in decoder.cursor.read(ring.dump())] == [3]


def test_torchs_status_is_read_by_each_groups_pg_id_not_its_name() -> None:
    """torch keys ``pg_status`` by ``pg_id``, the count of NCCL groups the process made, and the
    entries by the group's name: they part where a gloo group (or a group this rank is not in)
    took a name. Read by name, the end count took group "2"'s status for group "1" and counted
    the rest as a group never read."""
    ring = FakeRing(world=2)  # group "1" is a gloo side group: a name, no NCCL group, no pg_id
    ring.group("2", "tp", 2)  # the second NCCL group: pg_id 1, name "2"
    for _ in range(3):
        ring.collective("nccl:all_reduce", [[4]], [[4]], done=True)
        ring.collective("nccl:all_gather", [[4]], [[8]], pg="2", done=True)
    ring.collective("nccl:all_gather", [[4]], [[8]], pg="2")  # still running at the end
    cursor = FrCursor()
    assert len(cursor.read(ring.dump())) == 6
    assert issued_by_group(ring.status()) == {"0": 3, "1": 4}
    assert cursor.by_name(issued_by_group(ring.status())) == {"0": 3, "2": 4}
    assert cursor.finish(issued_by_group(ring.status())) == 1 and cursor.lost == 1  # the running one
    assert FrCursor.from_state(cursor.state()).pg_names == {"0": "0", "1": "2"}
