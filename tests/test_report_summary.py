"""Per-chunk summaries (tui.recordings.summary): written at record time, read by `commtop report`
in place of the start, algbw and busbw columns; the report they give is the report of the columns,
bit for bit, and where they cannot be trusted the columns decide."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from per_chunk_tables import tables_by_chunk
from recording_synth import Epoch, synth_run, write_recording

from tui.recordings import summary
from tui.recordings.codec import decode_chunk
from tui.recordings.reader import open_recording
from tui.recordings.writer import RecordingWriter
from tui.report import build, reading
from tui.report.text import format_json
from workers.wire import protocol as p

ROOT = Path(__file__).parent.parent
EPOCHS = [Epoch(0.0, "none", copies=0), Epoch(1.0, "overlap"), Epoch(2.0, "none"), Epoch(3.0, "sync", copies=3)]


def _without_copies(items: list) -> list:
    return [(t, m) for t, m in items if not (isinstance(m, p.Batch) and m.kind == p.COPY)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("summary")
    items = list(synth_run(duration_s=4.0, world=3, epochs=EPOCHS, seed=21))
    out = {"copies": d / "copies.commtop", "nocopies": d / "nocopies.commtop"}
    write_recording(out["copies"], items)
    write_recording(out["nocopies"], _without_copies(items))
    return out


@pytest.mark.parametrize("name", ["copies", "nocopies"])
def test_the_summaries_give_the_report_of_the_columns_bit_for_bit(runs, name: str) -> None:
    with open_recording(runs[name]) as rec:
        assert rec.has_summaries
        lean = reading.report_tables(rec)
        assert lean.coll_summary is not None
        assert "algbw" not in lean.coll and "busbw" not in lean.coll
        assert "start_ns" in lean.coll and "step" in lean.coll  # the step view needs them
        from_summaries = build.build_report(rec, lean)
        from_columns = build.build_report(rec, rec.tables(coll_columns=reading.report_columns(rec)))
    assert repr(from_summaries) == repr(from_columns)  # every field (repr: NaN equals NaN there)
    assert format_json(from_summaries) == format_json(from_columns)


def test_summary_rows_are_the_sums_of_the_records_they_stand_for(runs) -> None:
    """Folded per (epoch, rank), the rows hold exactly the records' counts, first and last
    starts, last ends and float64 sums of the float32 values, as numpy computes them."""
    with open_recording(runs["copies"]) as rec:
        rows = rec.tables(coll_columns=["epoch"], summary=True).coll_summary
        cols = rec.tables().coll
    assert rows is not None
    per = summary.by_key(rows)
    keys = (cols["epoch"].astype(np.int64) << summary.RANK_BITS) | cols["rank"]
    assert per["key"].tolist() == np.unique(keys).tolist()
    for i, key in enumerate(per["key"].tolist()):
        sel = keys == key
        start = cols["start_ns"][sel]
        assert per["n"][i] == sel.sum()
        assert per["s0"][i] == start.min() and per["s1"][i] == start.max()
        assert per["t1"][i] == (start + (cols["dur_us"][sel].astype(np.float64) * 1e3).astype(np.int64)).max()
        for f, col in (("d", "dur_us"), ("a", "algbw"), ("b", "busbw")):
            assert per[f][i] == pytest.approx(cols[col][sel].astype(np.float64).sum(), rel=1e-12)


def test_summaries_that_do_not_add_up_leave_the_report_to_the_columns(tmp_path: Path, monkeypatch) -> None:
    """A writer bug (here: each chunk's last record left out of its summary) must not reach the
    report: the counts disagree with the records read, so the report reads the columns and is
    the true one (taken from the summaries, every sum and window would miss records)."""
    items = _without_copies(list(synth_run(duration_s=2.0, world=2, epochs=EPOCHS[:2], seed=4)))
    good, bad = tmp_path / "good.commtop", tmp_path / "bad.commtop"
    write_recording(good, items)
    real = summary.summarize

    def last_one_left_out(rank, cols):
        return real(rank[:-1], {name: col[:-1] for name, col in cols.items()})

    monkeypatch.setattr(summary, "summarize", last_one_left_out)
    write_recording(bad, items)
    with open_recording(bad) as rec:
        rows = reading.report_tables(rec).coll_summary
        assert rows is not None and rows["n"].sum() < rec.tables(coll_columns=["epoch"]).coll["epoch"].size
        wrong = build.build_report(rec)
    with open_recording(good) as rec:
        right = build.build_report(rec)
    assert repr(wrong).replace(str(bad), "") == repr(right).replace(str(good), "")


def test_a_recording_without_summaries_reads_the_columns(capsys) -> None:
    """Recordings made before the summaries (the committed ones) report as they always did."""
    path = ROOT / "recordings" / "h200-nccl-1gpu-ab-none-overlap.commtop"
    with open_recording(path) as rec:
        assert not rec.has_summaries
        tables = reading.report_tables(rec)
        assert tables.coll_summary is None and "busbw" in tables.coll


def test_a_rewritten_ab_recording_reports_the_same_from_its_summaries(tmp_path: Path) -> None:
    """An A/B experiment's per-arm link and HBM figures take each block's first and last
    collective start: from the summaries they equal those of the start column."""
    src = ROOT / "recordings" / "h200-nccl-1gpu-ab-none-overlap.commtop"
    dst = tmp_path / "rewritten.commtop"
    with open_recording(src) as rec:
        header = dict(rec.header)
        chunks = [list(_chunk_messages(rec, info)) for info in rec.chunks]
    with open(dst, "wb") as f:
        writer = RecordingWriter(f, header)
        for chunk in chunks:
            writer.write_chunk(chunk)
        writer.close({"complete": True})
    with open_recording(dst) as rec:
        assert rec.has_summaries
        lean = build.build_report(rec, reading.report_tables(rec))
        full = build.build_report(rec, rec.tables(coll_columns=reading.report_columns(rec)))
    assert lean.ab and lean.ab == full.ab
    assert repr(lean) == repr(full)


def _chunk_messages(rec, info):
    from tui.recordings.codec import chunk_messages

    chunk = rec.decode(info)
    assert chunk is not None
    return chunk_messages(chunk)


def test_the_per_chunk_decoder_reads_a_chunk_with_a_summary(runs) -> None:
    """Readers that do not know the summary skip it: the per-chunk decoder, the reference of the
    bulk reader, gives the same tables."""
    with open_recording(runs["copies"]) as rec:
        bulk, by_chunk = rec.tables(), tables_by_chunk(rec)
        body = rec._data[rec.chunks[1].body : rec.chunks[1].end]
        from tui.recordings.compression import decompress

        assert decode_chunk(decompress(body, rec.chunks[1].flags)).coll
    for name in bulk.coll:
        assert np.array_equal(bulk.coll[name], by_chunk.coll[name])


@pytest.mark.parametrize(
    "value",
    [
        None,
        [],
        {"e": b""},
        {f: b"" for f in summary.FIELDS[:-1]},
        {**{f: b"\0" * 8 for f in summary.FIELDS}, "d": b"\0" * 16},
        {**{f: b"\0" * 8 for f in summary.FIELDS}, "n": [1]},
        {**{f: b"\0" * 7 for f in summary.FIELDS}},
    ],
)
def test_a_malformed_summary_is_not_valid(value) -> None:
    assert not summary.valid(value)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 3), st.integers(0, 5), st.integers(1, 30)), min_size=1, max_size=12),
    st.integers(0, 2**31),
)
def test_summaries_of_many_chunks_fold_to_the_summary_of_all(batches, seed: int) -> None:
    """Any split of records into chunks: the rows of every chunk folded per key give the counts,
    sums and windows of the records taken all at once."""
    rng = np.random.default_rng(seed)
    parts, all_cols, all_rank = [], [], []
    for epoch, rank, n in batches:
        cols = {
            "epoch": np.full(n, epoch, dtype=np.int32),
            "start_ns": rng.integers(0, 10**12, n).astype(np.int64),
            "dur_us": rng.lognormal(7, 1, n).astype(np.float32),
            "algbw": rng.random(n).astype(np.float32),
            "busbw": rng.random(n).astype(np.float32),
        }
        ranks = np.full(n, rank, dtype=np.int64)
        parts.append(summary.summarize(ranks, cols))
        all_cols.append(cols)
        all_rank.append(ranks)
    assert all(summary.valid(s) for s in parts)
    folded = summary.by_key(summary.join(parts))
    whole = summary.by_key(
        summary.join(
            [
                summary.summarize(
                    np.concatenate(all_rank), {k: np.concatenate([c[k] for c in all_cols]) for k in all_cols[0]}
                )
            ]
        )
    )
    for f in ("key", "n", "s0", "s1", "t1"):
        assert folded[f].tolist() == whole[f].tolist()
    for f in summary.FLOAT_FIELDS:
        np.testing.assert_allclose(folded[f], whole[f], rtol=1e-12)
