"""The bulk column reader (tui.recordings.bulk) gives exactly what decoding chunk by chunk gives:
the same arrays bit for bit, the same messages and the same notes, on the recordings in the
repository, on synthetic runs, on odd values, and on chunks that pass their checksum but do
not decode (those go to the per-chunk decoder in their place)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from per_chunk_tables import tables_by_chunk
from recording_synth import T0, synth_run, telem, write_recording

from tui.recordings import bulk, int_columns
from tui.recordings.codec import (
    CHUNK,
    CHUNK_PREFIX,
    Tables,
    _dec_int,
    _enc_int,
    _pack,
    _unpack,
    encode_chunk,
)
from tui.recordings.compression import decompress
from tui.recordings.reader import open_recording
from tui.recordings.writer import _frame
from tui.report.reading import REPORT_COLUMNS
from workers.wire import protocol as p

ROOT = Path(__file__).parent.parent
COLUMN_SETS = (None, REPORT_COLUMNS, ("epoch",), ("epoch", "recv_ns"), ("busbw", "host_ns"))


def assert_same_tables(a: Tables, b: Tables) -> None:
    for name in ("coll", "copy"):
        ta, tb = getattr(a, name), getattr(b, name)
        assert list(ta) == list(tb), name
        for col in ta:
            x, y = ta[col], tb[col]
            assert (x.dtype, x.shape) == (y.dtype, y.shape), (name, col)
            assert x.tobytes() == y.tobytes(), (name, col)
    for name in ("hellos", "byes", "ticks", "other"):
        assert repr(getattr(a, name)) == repr(getattr(b, name)), name


def assert_bulk_is_by_chunk(path: Path) -> None:
    for cols in COLUMN_SETS:
        with open_recording(path) as one, open_recording(path) as two:
            assert_same_tables(one.tables(cols), tables_by_chunk(two, cols))
            assert one.problems == two.problems


@pytest.mark.e2e
@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "recordings").glob("*.commtop")))
def test_the_recordings_in_the_repository_read_the_same_in_bulk(name: str) -> None:
    assert_bulk_is_by_chunk(ROOT / "recordings" / name)


def test_recordings_made_before_group_and_dtype_read_them_as_zeros() -> None:
    """The committed recordings were written before collective records named their group and
    dtype: both decoders give the world group and "not known" for every record."""
    with open_recording(ROOT / "recordings" / "cpu-gloo-4ranks-all_gather-modes.commtop") as rec:
        coll = rec.tables().coll
        per_chunk = tables_by_chunk(rec, None).coll
    assert len(coll["group"]) == len(coll["iteration"]) > 0
    for cols in (coll, per_chunk):
        assert not cols["group"].any() and not cols["dtype"].any()
        assert cols["group"].dtype == np.dtype(p.COLL_COLUMNS["group"])


def test_a_synthetic_run_with_copies_telemetry_and_many_chunks(tmp_path: Path) -> None:
    path = tmp_path / "run.commtop"
    write_recording(path, list(synth_run(duration_s=6.0, world=4)), chunk_s=0.05)
    with open_recording(path) as rec:
        assert len(rec.chunks) > 100
        tables = rec.tables()
        assert len(tables.copy["gbps"]) and len(tables.ticks) and len(tables.hellos)
    assert_bulk_is_by_chunk(path)


def _pool_gate(threads: int):  # type: ignore[no-untyped-def]
    """A call each pool thread makes before its first task: it waits until ``threads`` threads
    hold one (so each thread is seen however fast the others are: a loaded machine could let one
    thread take every task before the next one starts), once; then the gate stays open."""
    import threading

    gate, opened = threading.Barrier(threads, timeout=30), threading.Event()

    def wait() -> None:
        if not opened.is_set():
            try:
                gate.wait()
            except threading.BrokenBarrierError:
                pass
            opened.set()

    return wait


@pytest.mark.parametrize("cpus", [2, 16])
def test_columns_decoded_on_several_threads_are_the_columns_decoded_on_one(
    tmp_path: Path, monkeypatch, cpus: int
) -> None:
    """A large part's stored columns decode on 2 threads, up to MAX_COLUMN_THREADS where more
    CPUs are usable: with the threshold at 0 every part takes that path, and the tables are
    still the per-chunk decoder's, bit for bit."""
    import threading

    path = tmp_path / "run.commtop"
    write_recording(path, list(synth_run(duration_s=3.0, world=4)), chunk_s=0.05)
    threads: set[str] = set()
    decode_ints = bulk.decode_ints
    wait_for_the_pool = _pool_gate(min(cpus, bulk.MAX_COLUMN_THREADS))

    def recording_thread(*args, **kwargs):  # type: ignore[no-untyped-def]
        if threading.current_thread().name.startswith("commtop-columns"):
            threads.add(threading.current_thread().name)
            wait_for_the_pool()
        return decode_ints(*args, **kwargs)

    monkeypatch.setattr(bulk, "decode_ints", recording_thread)
    _threaded_decode(monkeypatch, cpus)
    assert_bulk_is_by_chunk(path)
    assert len(threads) == min(cpus, bulk.MAX_COLUMN_THREADS)


def test_pools_take_two_threads_and_more_only_where_more_cpus_are_usable(monkeypatch) -> None:
    for cpus, most, want in ((1, 4, 2), (2, 4, 2), (3, 4, 3), (16, 4, 4), (16, 2, 2)):
        monkeypatch.setattr(bulk, "usable_cpus", lambda cpus=cpus: cpus)
        assert bulk.worker_threads(most) == want


@pytest.mark.parametrize("cpus", [2, 16])
def test_chunks_read_on_several_threads_are_the_chunks_read_on_one(tmp_path: Path, monkeypatch, cpus: int) -> None:
    """A recording's chunks are inflated, unpacked and checked on 2 threads, up to
    MAX_READ_THREADS where more CPUs are usable; in order, whatever thread read which, and the
    tables are the per-chunk decoder's, bit for bit."""
    import threading

    path = tmp_path / "run.commtop"
    write_recording(path, list(synth_run(duration_s=3.0, world=4)), chunk_s=0.02)
    monkeypatch.setattr(bulk, "READ_TASK", 2)
    monkeypatch.setattr(bulk, "usable_cpus", lambda: cpus)
    threads: set[str] = set()
    read = bulk._read
    wait_for_the_pool = _pool_gate(min(cpus, bulk.MAX_READ_THREADS))

    def named(*args):  # type: ignore[no-untyped-def]
        threads.add(threading.current_thread().name)
        wait_for_the_pool()
        return read(*args)

    monkeypatch.setattr(bulk, "_read", named)
    with open_recording(path) as rec:
        assert len(rec.chunks) >= 4 * bulk.READ_TASK
    assert_bulk_is_by_chunk(path)
    assert all(name.startswith("commtop-read") for name in threads), threads
    assert len(threads) == min(cpus, bulk.MAX_READ_THREADS)


@pytest.mark.parametrize("cpus", [2, 16])
def test_columns_decoded_in_pieces_on_several_threads_are_the_columns_decoded_on_one(
    tmp_path: Path, monkeypatch, cpus: int
) -> None:
    """With the piece threshold at 0 every stored column decodes as one run of chunks per thread,
    each into its slice of the column: the tables are still the per-chunk decoder's."""
    path = tmp_path / "run.commtop"
    write_recording(path, list(synth_run(duration_s=3.0, world=4)), chunk_s=0.05)
    _threaded_decode(monkeypatch, cpus)
    monkeypatch.setattr(bulk, "PIECE_RECORDS", 0)
    into: list[int] = []
    decode_ints = bulk.decode_ints

    def counting(encs, width=8, out=None):  # type: ignore[no-untyped-def]
        if out is not None:
            into.append(len(out))
        return decode_ints(encs, width, out)

    monkeypatch.setattr(bulk, "decode_ints", counting)
    assert_bulk_is_by_chunk(path)
    threads = min(cpus, bulk.MAX_COLUMN_THREADS)
    assert len(into) > threads and len(set(into)) > 1


def _threaded_decode(monkeypatch, cpus: int = 2) -> None:
    """Every part takes the threaded decode (and with it the early grouping), on any machine."""
    monkeypatch.setattr(bulk, "PARALLEL_RECORDS", 0)
    monkeypatch.setattr(bulk, "usable_cpus", lambda: cpus)


def test_the_reader_groups_the_records_while_the_other_columns_decode(tmp_path: Path, monkeypatch) -> None:
    """``group_by`` gets the epoch and rank columns the tables end up with and the records per
    batch (each one rank's), and its result is what grouping those columns afterwards gives;
    the tables are the same as without it."""
    from tui.report.kernels import _group

    _threaded_decode(monkeypatch)
    path = tmp_path / "run.commtop"
    write_recording(path, list(synth_run(duration_s=3.0, world=4)), chunk_s=0.05)
    seen: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []

    def group_by(epoch: np.ndarray, rank: np.ndarray, batches: np.ndarray):  # type: ignore[no-untyped-def]
        seen.append((epoch, rank, batches))
        return _group(epoch, rank, batches)

    with open_recording(path) as one, open_recording(path) as two:
        grouped, plain = one.tables(REPORT_COLUMNS, group_by=group_by), two.tables(REPORT_COLUMNS)
    assert_same_tables(grouped, plain)
    assert plain.coll_grouped is None
    ((epoch, rank, batches),) = seen
    assert epoch is grouped.coll["epoch"] and rank is grouped.coll["rank"]
    assert int(batches.sum()) == len(rank) and len(batches) < len(rank)
    edges = np.cumsum(batches)[:-1]
    assert all(len(set(part.tolist())) == 1 for part in np.split(rank, edges) if len(part))
    want, got = _group(plain.coll["epoch"], plain.coll["rank"]), grouped.coll_grouped
    assert got.runs == want.runs and got.ids == want.ids and got.span == want.span
    assert np.array_equal(got.order, want.order) and np.array_equal(got.gid, want.gid)


def test_no_early_grouping_where_a_chunk_is_decoded_on_its_own(tmp_path: Path, monkeypatch) -> None:
    """A chunk the bulk path does not take is decoded in its place: the columns are then pieces
    joined afterwards, not the arrays ``group_by`` saw, so its result is dropped."""
    _threaded_decode(monkeypatch)
    path = tmp_path / "run.commtop"
    write_recording(path, list(synth_run(duration_s=3.0, world=2)), chunk_s=0.25)
    _rewrite_chunk(path, 3, _delta_not_delta)
    calls: list[int] = []
    with open_recording(path) as rec:
        tables = rec.tables(REPORT_COLUMNS, group_by=lambda epoch, rank, _: calls.append(len(epoch)) or "grouped")
    assert calls and tables.coll_grouped is None


def test_odd_values_and_empty_batches(tmp_path: Path) -> None:
    n = 7
    cols = {
        "iteration": np.array([0, 1, 2, 10**12, -5, 3, 4], dtype="<i8"),
        "step": np.array([0, -(2**63), 2**63 - 1, 0, 5, 5, 5], dtype="<i8"),
        "epoch": np.array([0, 0, 1, 1, -(2**31), 2, 2**31 - 1], dtype="<i4"),
        "mode": np.array([0, 1, 2, 3, 0, 255, 2], dtype="u1"),
        "op": np.arange(n, dtype="u1"),
        "group": np.zeros(n, dtype="<u2"),
        "dtype": np.zeros(n, dtype="u1"),
        "nbytes": np.array([1, 2**40, 3, 0, 5, 6, 7], dtype="<i8"),
        "host_ns": np.array([T0, 0, -1, 2**62, T0, T0, T0], dtype="<i8"),
        "start_ns": np.array([T0, T0 + 1, T0 - 10**15, 0, T0, T0, 2**62], dtype="<i8"),
        "dur_us": np.array([1.5, np.nan, np.inf, -0.0, 0.0, 1e-30, 3e38], dtype="<f4"),
        "algbw": np.array([7.0, np.nan, 1.0, 2.0, 3.0, -1.0, 0.0], dtype="<f4"),
        "busbw": np.array([0.0, 1.0, 2.0, np.nan, 4.0, 5.0, 6.0], dtype="<f4"),
    }
    one = p.Batch(p.COLL, 3, 9, 4, cols, epoch_in_force=2, pending_epoch=3, apply_at=640, t_ns=T0)
    single = p.Batch(p.COLL, 1, 2, 0, {k: v[:1] for k, v in cols.items()})
    empty = p.Batch(p.COPY, 1, 0, 0, {k: np.zeros(0, dtype=d) for k, d in p.COPY_COLUMNS.items()})
    items = [
        (T0, one),
        (T0 + 5, empty),
        (T0 + 5, telem(2, T0, 1, 54.0, 1980.0)),
        (T0 + 6, single),
        (T0 + 10**9, p.Bye(3, -9, "killed", T0)),
        (T0 + 2 * 10**9, single),
        (T0 + 3 * 10**9, one),
    ]
    path = tmp_path / "odd.commtop"
    write_recording(path, items, chunk_s=0.5)
    assert_bulk_is_by_chunk(path)


def _rewrite_chunk(path: Path, index: int, change) -> None:
    """Replace chunk ``index`` by one whose (inflated) body ``change`` edited, checksum valid."""
    data = path.read_bytes()
    with open_recording(path) as rec:
        info = rec.chunks[index]
    body = data[info.body : info.end]
    doc = change(_unpack(decompress(body, info.flags)))
    prefix = data[info.offset + 14 : info.body]
    if isinstance(doc, bytes):
        new_body = doc
    else:
        new_body = _pack(doc)
    frame = _frame(CHUNK, prefix + new_body, 0)
    path.write_bytes(data[: info.offset] + frame + data[info.end :])


def _batch_counts_off(doc: dict) -> dict:
    n = _dec_int(doc["c"]["m"]["n"])
    n[0] += 1
    doc["c"]["m"]["n"] = _enc_int(n, False)
    return doc


def _kinds_off(doc: dict) -> dict:
    k = _dec_int(doc["k"])
    k[k == 0] = 1  # batches said to be copies
    doc["k"] = _enc_int(k, False)
    return doc


def _bad_hello(doc: dict) -> dict:
    doc["o"][0] = {"k": "hello", "rank": "not a rank"}
    return doc


def _delta_not_delta(doc: dict) -> dict:
    doc["c"]["c"]["start_ns"] = _enc_int(_dec_int(doc["c"]["c"]["start_ns"]), False)  # legal, unusual
    return doc


@pytest.mark.parametrize(
    "change",
    [
        _batch_counts_off,
        _kinds_off,
        _bad_hello,
        _delta_not_delta,
        lambda doc: b"\xc1 not msgpack",
        lambda doc: [1, 2, 3],
        lambda doc: {**doc, "c": {"m": {}, "c": {}}},
        lambda doc: {**doc, "o": []},
    ],
    ids=["batch-counts", "kinds", "bad-hello", "plain-start", "not-msgpack", "not-a-map", "empty-part", "no-others"],
)
def test_a_chunk_that_does_not_decode_gets_the_same_note_and_the_rest_is_read(tmp_path: Path, change) -> None:
    path = tmp_path / "run.commtop"
    write_recording(path, list(synth_run(duration_s=3.0, world=2)), chunk_s=0.25)
    _rewrite_chunk(path, 0, change)  # the first chunk holds the Hellos
    _rewrite_chunk(path, 3, change)
    assert_bulk_is_by_chunk(path)


def test_a_chunk_with_counts_its_prefix_does_not_claim(tmp_path: Path) -> None:
    path = tmp_path / "run.commtop"
    items = list(synth_run(duration_s=3.0, world=2))
    write_recording(path, items, chunk_s=0.25)
    body, n_coll, n_copy = encode_chunk(items[:40])
    extra = _frame(CHUNK, CHUNK_PREFIX.pack(T0, T0, 40, n_coll + 3, n_copy) + body, 0)
    data = path.read_bytes()
    with open_recording(path) as rec:
        at = rec.chunks[2].offset
    path.write_bytes(data[:at] + extra + data[at:])
    assert_bulk_is_by_chunk(path)


#: A column's values in up to 6 chunks: any int64 (wrapping deltas), and small ones (narrow widths).
COLUMN_CHUNKS = st.lists(
    st.lists(st.integers(-(2**63), 2**63 - 1) | st.integers(-300, 300), min_size=0, max_size=40),
    min_size=1,
    max_size=6,
)


@settings(max_examples=200, deadline=None)
@given(chunks=COLUMN_CHUNKS, delta=st.booleans(), width=st.sampled_from([1, 2, 4, 8]))
def test_decode_ints_is_the_per_chunk_decoder_modulo_the_width(chunks, delta: bool, width: int) -> None:
    encs = [_enc_int(np.array(values, dtype=np.int64), delta) for values in chunks]
    want = np.concatenate([_dec_int(e) for e in encs]) if encs else np.zeros(0, dtype=np.int64)
    checked = [bulk._enc(e, int(delta)) for e in encs]
    assert all(c is not None for c in checked)
    got = int_columns.decode_ints(checked, width)  # type: ignore[arg-type]
    assert got.dtype.itemsize == width
    assert got.tobytes() == want.astype(got.dtype).tobytes()


@settings(max_examples=200, deadline=None)
@given(chunks=COLUMN_CHUNKS, delta=st.booleans(), width=st.sampled_from([1, 2, 4, 8]), cut=st.integers(0, 6))
def test_runs_of_chunks_decoded_into_their_slices_are_the_column(chunks, delta: bool, width: int, cut: int) -> None:
    """A column decoded in pieces (two runs of chunks, each into its slice of one array that
    held other bytes) is the column decoded whole: a chunk's first value is stored whole."""
    encs = [bulk._enc(_enc_int(np.array(values, dtype=np.int64), delta), int(delta)) for values in chunks]
    whole = int_columns.decode_ints(encs, width)  # type: ignore[arg-type]
    cut = min(cut, len(encs))
    at = sum(e[5] for e in encs[:cut])  # type: ignore[index]
    out = np.full(len(whole), 0xA5, dtype=whole.dtype)
    one = int_columns.decode_ints(encs[:cut], width, out[:at])  # type: ignore[arg-type]
    two = int_columns.decode_ints(encs[cut:], width, out[at:])  # type: ignore[arg-type]
    assert np.shares_memory(one, out) or at == 0
    assert np.shares_memory(two, out) or at == len(out)
    assert out.tobytes() == whole.tobytes()


@pytest.mark.parametrize("delta", [False, True])
@pytest.mark.parametrize("values", [[[5, 5], [5], [5, 5, 5]], [[5, 5], [7], [-1, -1, -1]]])
def test_chunks_of_one_value_each_fill_their_slice(values: list[list[int]], delta: bool) -> None:
    """Chunks stored as no bytes (one value each: the same in all, or not) written into ``out``."""
    encs = [bulk._enc(_enc_int(np.array(v, dtype=np.int64), delta), int(delta)) for v in values]
    assert all(e is not None and e[3] == 0 for e in encs)
    out = np.full(6, 0xA5, dtype=np.uint64)
    int_columns.decode_ints(encs, 8, out)  # type: ignore[arg-type]
    assert out.view(np.int64).tolist() == [x for v in values for x in v]


def test_decode_ints_refuses_an_out_of_another_size() -> None:
    enc = bulk._enc(_enc_int(np.arange(10, dtype=np.int64), True), 1)
    with pytest.raises(ValueError, match="not 10 x 8"):
        int_columns.decode_ints([enc], 8, np.empty(9, dtype=np.uint64))  # type: ignore[list-item]
    with pytest.raises(ValueError, match="not 10 x 4"):
        int_columns.decode_ints([enc], 4, np.empty(10, dtype=np.uint64))  # type: ignore[list-item]


@settings(max_examples=200, deadline=None)
@given(records=st.lists(st.integers(0, 1000), min_size=0, max_size=50), count=st.integers(1, 8))
def test_pieces_cover_every_chunk_in_order_in_about_equal_runs(records: list[int], count: int) -> None:
    pieces = int_columns.runs_of_chunks(records, count)
    assert len(pieces) <= count
    ends = np.cumsum([0, *records]).tolist()
    at = 0
    for a, b, ra, rb in pieces:
        assert a == at and b > a and (ra, rb) == (ends[a], ends[b])
        at = b
    assert at == len(records)
    total = sum(records)
    if total:  # a run ends at the first chunk reaching its share, so no run holds more than a share and a chunk
        assert all(rb - ra <= -(-total // count) + max(records) for _, _, ra, rb in pieces)


@pytest.mark.parametrize("damaged", [False, True])
def test_a_sparse_column_reads_at_any_record_what_decoding_it_gives(tmp_path: Path, damaged: bool) -> None:
    """A column asked for as ``sparse`` is left encoded where every chunk reads in bulk, and its
    values at any records (first, last, across chunks, repeated) are the decoded column's; where
    a chunk goes to the per-chunk decoder, it is decoded with the others. The other columns are
    the same either way."""
    path = tmp_path / "run.commtop"
    write_recording(path, list(synth_run(duration_s=3.0, world=3)), chunk_s=0.1)
    if damaged:
        _rewrite_chunk(path, 3, _delta_not_delta)
    cols = ("epoch", "step", "start_ns", "dur_us")  # the damaged chunk's start_ns: plain, not delta
    with open_recording(path) as one, open_recording(path) as two:
        sparse = one.tables(cols, sparse=("iteration",))
        full = two.tables((*cols, "iteration"))
    n = len(full.coll["iteration"])
    assert n > 1000
    assert ("iteration" in sparse.coll) == damaged and ("iteration" in sparse.coll_at) != damaged
    rng = np.random.default_rng(0)
    at = np.concatenate([[0, n - 1, n - 1, 0], rng.integers(0, n, 300)])
    assert sparse.coll_values("iteration", at).tobytes() == full.coll["iteration"][at].tobytes()
    assert sparse.coll_values("iteration", at[:0]).dtype == np.int64
    for col in cols:
        assert sparse.coll[col].tobytes() == full.coll[col].tobytes(), col
    if not damaged:
        with pytest.raises(IndexError):
            sparse.coll_values("iteration", np.array([n]))
