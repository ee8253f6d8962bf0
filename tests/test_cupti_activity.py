"""The raw CUPTI decoder and the CUPTI-fed timers, on buffers captured on the H200.

The fixture (``fixtures/h200/cupti_raw_buffers_h200_cupti13.*``) holds three activity buffers
exactly as CUPTI filled them, the record offsets CUPTI's own iterator gave, and every record
decoded with cupti-python's numpy dtypes (benchmarks/probes/cupti_timer_probe.py). CUPTI itself is
not needed: a ``FakeCupti`` (named so) replays the decoded buffers to the timers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from workers.rank import cupti_activity as ca
from workers.rank import cupti_timer as ct

FIXTURE = Path(__file__).parent / "fixtures" / "h200" / "cupti_raw_buffers_h200_cupti13"
META = json.loads(FIXTURE.with_suffix(".json").read_text())
BLOB = FIXTURE.with_suffix(".bin").read_bytes()
SIZES = {int(k): v for k, v in META["sizes"].items()}
DTOD_BYTES = 8192 * 8192 * 2  # the probe's all_gather at world size 1: one DtoD memcpy


def buffers() -> list[tuple[bytes, list[int]]]:
    return [(BLOB[b["at"] : b["at"] + b["length"]], b["offsets"]) for b in META["buffers"]]


def decode_all(sizes: dict[int, int] | None = None) -> list[ca.Decoded]:
    return [ca.decode_buffer(data, dict(SIZES if sizes is None else sizes)) for data, _ in buffers()]


def test_walk_finds_the_records_cuptis_own_iterator_finds() -> None:
    for data, offsets in buffers():
        found, kinds = ca.walk(
            lambda o, d=data: int.from_bytes(d[o : o + 4], "little"), len(data), lambda k, o: SIZES[k]
        )
        assert found == offsets
        assert set(kinds) <= set(SIZES)


def test_decoded_fields_equal_cupti_pythons_decoding() -> None:
    got: dict[str, list[dict[str, int]]] = {"memcpy": [], "kernel": []}
    for d in decode_all():
        for kind, cols in (("memcpy", d.memcpy), ("kernel", d.kernel)):
            names = list(cols)
            for i in range(len(cols["start"])):
                got[kind].append({n: int(cols[n][i]) for n in names})
    assert got == META["expected"]
    assert len(got["memcpy"]) == 490 and len(got["kernel"]) == 9


def test_a_buffer_of_one_kind_takes_the_uniform_path_and_agrees_with_the_walk() -> None:
    data, offsets = buffers()[1]  # four memcpy records only
    u32 = np.frombuffer(data, dtype=np.uint32)
    off, kinds = ca._uniform(u32, len(data), lambda k, o: SIZES[k])
    assert off is not None and off.tolist() == offsets and set(kinds.tolist()) == {ca.KIND_MEMCPY}
    mixed, _ = buffers()[2]
    assert ca._uniform(np.frombuffer(mixed, dtype=np.uint32), len(mixed), lambda k, o: SIZES[k])[0] is None


def test_sizes_are_learnt_through_size_of_once_per_kind() -> None:
    data, offsets = buffers()[2]
    asked: list[int] = []

    def size_of(kind: int, off: int) -> int:
        asked.append(kind)
        return SIZES[kind]

    sizes: dict[int, int] = {}
    d = ca.decode_buffer(data, sizes, size_of)
    assert sorted(asked) == sorted(SIZES) and sizes == SIZES
    assert len(d.memcpy["start"]) + len(d.kernel["start"]) == len(offsets)


def test_an_unknown_kind_without_size_of_ends_the_walk_and_keeps_what_came_before() -> None:
    data, offsets = buffers()[0]  # two kernel records, then memcpy records
    kinds = [int.from_bytes(data[o : o + 4], "little") for o in offsets]
    first_memcpy = kinds.index(ca.KIND_MEMCPY)
    d = ca.decode_buffer(data, {ca.KIND_CONCURRENT_KERNEL: SIZES[ca.KIND_CONCURRENT_KERNEL]})
    assert len(d.kernel["start"]) == first_memcpy == 2
    assert len(d.memcpy["start"]) == 0
    assert len(ca.decode_buffer(data, {ca.KIND_MEMCPY: 96}).kernel["start"]) == 0  # an unknown first record


def test_a_buffer_cut_inside_a_record_loses_only_that_record() -> None:
    data, offsets = buffers()[2]
    cut = data[: offsets[100] + 40]  # mid-record
    d = ca.decode_buffer(cut, dict(SIZES))
    full = ca.decode_buffer(data, dict(SIZES))
    n = len(d.memcpy["start"]) + len(d.kernel["start"])
    assert n == 100
    assert d.memcpy["start"].tolist() == full.memcpy["start"][: len(d.memcpy["start"])].tolist()


def test_the_signature_of_the_world_of_one_all_gather_is_its_dtod_memcpy() -> None:
    decoded = decode_all()
    first = min(int(d.memcpy["start"].min()) for d in decoded if len(d.memcpy["start"]))
    assert ct.signature_from(decoded, first, 2, lambda p: "at::fill") is None  # 489 records are not 2 x n
    assert ct.signature_from(decoded, first + 1, 1, lambda p: "at::fill").per_op == 488  # type: ignore[union-attr]
    count = sum(int((d.memcpy["copy_kind"] == ca.MEMCPY_DTOD).sum()) for d in decoded)
    sig = ct.signature_from(decoded, first, count, lambda p: "at::fill")
    assert count == 489
    assert sig == ct.CollectiveSignature(7, 1, frozenset({(ca.KIND_MEMCPY, (ca.MEMCPY_DTOD, DTOD_BYTES))}))


def test_nccl_kernels_count_and_other_kernels_do_not() -> None:
    assert ct.is_collective_record(ca.KIND_CONCURRENT_KERNEL, "ncclDevKernel_AllGather_RING_LL")
    assert not ct.is_collective_record(ca.KIND_CONCURRENT_KERNEL, "at::native::vectorized_elementwise_kernel")
    assert not ct.is_collective_record(ca.KIND_MEMCPY, (ca.MEMCPY_DTOH, 4096))


class FakeCupti:
    """Stands in for the CUPTI client in tests: replays decoded buffers, a fixed clock."""

    def __init__(self, decoded: list[ca.Decoded]) -> None:
        self.queue = list(decoded)
        self.flushes = 0

    def take(self) -> list[ca.Decoded]:
        out, self.queue = self.queue, []
        return out

    def timestamp(self) -> int:
        return 0

    def flush(self, forced: bool = False) -> None:
        self.flushes += 1

    def kernel_name(self, ptr: int) -> str:
        return "at::fill"


def feed_for(decoded: list[ca.Decoded]) -> tuple[ct.CuptiFeed, ct.CollectiveSignature]:
    sig = ct.CollectiveSignature(7, 1, frozenset({(ca.KIND_MEMCPY, (ca.MEMCPY_DTOD, DTOD_BYTES))}))
    return ct.CuptiFeed(FakeCupti(decoded), sig, since=0), sig  # type: ignore[arg-type]


def expected_spans(copy_kind: int) -> list[tuple[int, int]]:
    return [(r["start"], r["end"]) for r in META["expected"]["memcpy"] if r["copy_kind"] == copy_kind]


def test_records_are_matched_to_metas_in_issue_order() -> None:
    feed, sig = feed_for(decode_all())
    coll = ct.CuptiTimer(feed, "collectives", 1024, sig.per_op)
    copies = ct.CuptiTimer(feed, "copies", 64)
    spans = expected_spans(ca.MEMCPY_DTOD)
    for i in range(len(spans)):
        coll.begin((i, "meta"))
    copies.begin(("copy",))
    rows: list[Any] = []
    coll.harvest(rows)
    assert [r[0] for r in rows] == list(range(len(spans)))
    assert [r[-1] for r in rows] == pytest.approx([(e - s) / 1000 for s, e in spans])
    assert [r[-2] - feed.offset_ns for r in rows] == [s for s, _ in spans]
    copy_rows: list[Any] = []
    copies.harvest(copy_rows)
    ((s, e),) = expected_spans(ca.MEMCPY_DTOH)
    assert copy_rows == [("copy", s + feed.offset_ns, (e - s) / 1000)]
    assert coll.untimed == coll.unmatched == copies.untimed == copies.unmatched == 0


def test_a_reused_ring_slot_makes_its_record_untimed_not_mislabelled() -> None:
    feed, _ = feed_for(decode_all())
    coll = ct.CuptiTimer(feed, "collectives", 100)
    n = len(expected_spans(ca.MEMCPY_DTOD))
    for i in range(n):
        coll.begin((i,))  # the loop ran n ahead of the harvester: the first n - 100 slots were reused
    rows: list[Any] = []
    coll.harvest(rows)
    assert coll.untimed == n - 100
    assert [r[0] for r in rows] == list(range(n - 100, n))


def test_records_with_no_begin_are_counted_unmatched() -> None:
    feed, _ = feed_for(decode_all())
    coll = ct.CuptiTimer(feed, "collectives", 1024)
    for i in range(10):
        coll.begin((i,))
    rows: list[Any] = []
    coll.harvest(rows)
    assert len(rows) == 10
    assert coll.unmatched == len(expected_spans(ca.MEMCPY_DTOD)) - 10


def test_several_records_per_collective_span_first_start_to_last_end() -> None:
    feed, _ = feed_for(decode_all())
    coll = ct.CuptiTimer(feed, "collectives", 1024, per_op=2)
    spans = expected_spans(ca.MEMCPY_DTOD)
    for i in range(len(spans) // 2):
        coll.begin((i,))
    rows: list[Any] = []
    coll.harvest(rows)
    assert len(rows) == len(spans) // 2
    assert rows[1][-1] == pytest.approx((spans[3][1] - spans[2][0]) / 1000)
    assert coll.pending_records() == len(spans) % 2  # the odd record waits for its partner


def test_records_from_before_the_feed_started_are_ignored() -> None:
    decoded = decode_all()
    spans = expected_spans(ca.MEMCPY_DTOD)
    sig = ct.CollectiveSignature(7, 1, frozenset({(ca.KIND_MEMCPY, (ca.MEMCPY_DTOD, DTOD_BYTES))}))
    feed = ct.CuptiFeed(FakeCupti(decoded), sig, since=spans[400][0])  # type: ignore[arg-type]
    coll = ct.CuptiTimer(feed, "collectives", 1024)
    for i in range(len(spans) - 400):
        coll.begin((i,))
    rows: list[Any] = []
    coll.harvest(rows)
    assert len(rows) == len(spans) - 400 and coll.unmatched == 0
    assert rows[0][-1] == pytest.approx((spans[400][1] - spans[400][0]) / 1000)


def test_the_harvester_asks_cupti_for_partly_filled_buffers_at_most_every_flush_period() -> None:
    feed, _ = feed_for([])
    cupti = feed.cupti
    coll = ct.CuptiTimer(feed, "collectives", 16)
    for _ in range(50):
        coll.harvest([])
    assert cupti.flushes == 1  # type: ignore[attr-defined]


def test_learning_runs_the_collectives_then_reads_their_signature() -> None:
    decoded = decode_all()
    n = len(expected_spans(ca.MEMCPY_DTOD))
    calls: list[str] = []
    cupti = FakeCupti([])

    def run_collective() -> None:
        calls.append("collective")
        if len(calls) == n:
            cupti.queue = decoded  # what CUPTI hands over once the GPU ran them

    sig = ct.learn_collective(cupti, run_collective, lambda: calls.append("sync"), ops=n)  # type: ignore[arg-type]
    assert calls.count("collective") == n and calls[0] == "sync" and calls[-1] == "sync"
    assert sig == ct.CollectiveSignature(7, 1, frozenset({(ca.KIND_MEMCPY, (ca.MEMCPY_DTOD, DTOD_BYTES))}))


def test_learning_gives_up_when_the_records_do_not_tell_collectives_apart() -> None:
    cupti = FakeCupti([])
    sig = ct.learn_collective(cupti, lambda: None, lambda: None, ops=3)  # type: ignore[arg-type]
    assert sig is None  # nothing arrived within the wait: the loop falls back to CUDA events


def test_the_bootstraps_copies_keep_only_dtoh_and_htod_records() -> None:
    from collections import deque

    from workers.capture.cuda_capture import CuptiCopies
    from workers.capture.cupti_copies import ClockMap

    copies = CuptiCopies.__new__(CuptiCopies)  # without starting CUPTI: a FakeCupti replays the fixture
    copies.cupti = FakeCupti(decode_all())  # type: ignore[assignment]
    copies.queue = deque(maxlen=16)
    copies.seen = 0
    copies.clock = ClockMap()
    copies.flush()
    (dtoh,) = [r for r in META["expected"]["memcpy"] if r["copy_kind"] == ca.MEMCPY_DTOH]
    assert list(copies.queue) == [
        (ca.MEMCPY_DTOH, dtoh["src_kind"], dtoh["dst_kind"], dtoh["bytes"], dtoh["start"], dtoh["end"])
    ]
    assert copies.seen == len(META["expected"]["memcpy"])
