"""RecordPublisher / RecordBatcher over real ZeroMQ sockets (no torch)."""

from __future__ import annotations

import time

import numpy as np
import pytest
import zmq

from workers.rank.publisher import COLL_ROW, RecordBatcher, RecordPublisher
from workers.wire import protocol
from workers.wire.busbw import bus_factor
from workers.wire.protocol import COLL, COPY, COPY_COLUMNS, Batch

KEY = b"k" * 32
SESSION = "s1"
STATUS = (3, -1, -1)


def coll_rows(n: int, first: int = 0) -> list[tuple]:
    return [
        (first + i, (first + i) // 8, 3, 1, 1_700_000_000_000_000_000 + i, 1_700_000_000_000_000_123 + i, 10.0 + i)
        for i in range(n)
    ]


def columns(n: int, first: int = 0) -> dict[str, np.ndarray]:
    arr = np.array(coll_rows(n, first), dtype=COLL_ROW)
    cols = {name: arr[name] for name in COLL_ROW.names}
    cols |= {
        "op": np.zeros(n, "u1"),
        "group": np.zeros(n, dtype="<u2"),
        "dtype": np.zeros(n, dtype="u1"),
        "nbytes": np.full(n, 4096, "<i8"),
        "algbw": np.ones(n, "<f4"),
        "busbw": np.ones(n, "<f4"),
    }
    return cols


@pytest.fixture
def ctx():
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


@pytest.fixture
def endpoint(tmp_path) -> str:
    return f"ipc://{tmp_path}/data.sock"


def pull(ctx: zmq.Context, endpoint: str, hwm: int = 1000) -> zmq.Socket:
    sock = ctx.socket(zmq.PULL)
    sock.setsockopt(zmq.RCVHWM, hwm)
    sock.setsockopt(zmq.MAXMSGSIZE, protocol.MAX_BODY_BYTES)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(endpoint)
    return sock


def receive_all(sock: zmq.Socket, quiet_ms: int = 300) -> list:
    out = []
    while sock.poll(quiet_ms):
        frames = sock.recv_multipart()
        out.append(protocol.decode(protocol.open_frames(KEY, frames, SESSION)))
    return out


def test_no_receiver_never_blocks_and_counts_every_drop(ctx, endpoint):
    pub = RecordPublisher(endpoint, KEY, SESSION, rank=2, ctx=ctx)
    total = 0
    for i in range(500):
        n = 1 + i % 7
        t0 = time.monotonic()
        assert pub.publish(COLL, columns(n), n, STATUS) is False
        # a blocking send would hang here forever; any send taking a second is a bug
        assert time.monotonic() - t0 < 1.0
        total += n
    assert pub.dropped == total
    assert pub.sent == 0
    assert pub.seq[COLL] == 500
    pub.close()


def test_every_record_arrives_in_order_with_contiguous_seq(ctx, endpoint):
    sock = pull(ctx, endpoint)
    pub = RecordPublisher(endpoint, KEY, SESSION, rank=1, ctx=ctx)
    assert pub.wait_connected(2.0)
    got = []
    for b in range(40):  # a collector that keeps up (read as we go), as the ingest thread does
        assert pub.publish(COLL, columns(10, first=b * 10), 10, STATUS)
        assert pub.publish(COPY, {k: np.zeros(2, dt) for k, dt in COPY_COLUMNS.items()}, 2, STATUS)
        for _ in range(2):
            assert sock.poll(5000)
            got.append(protocol.decode(protocol.open_frames(KEY, sock.recv_multipart(), SESSION)))
    got += receive_all(sock)
    pub.close()
    colls = [m for m in got if isinstance(m, Batch) and m.kind == COLL]
    copies = [m for m in got if isinstance(m, Batch) and m.kind == COPY]
    assert [b.seq for b in colls] == list(range(40))
    assert [b.seq for b in copies] == list(range(40))
    iters = np.concatenate([b.columns["iteration"] for b in colls])
    assert iters.tolist() == list(range(400))
    assert all(b.rank == 1 and b.dropped == 0 and b.epoch_in_force == 3 for b in colls)
    assert pub.dropped == 0 and pub.sent == 480


def test_stalled_receiver_is_bounded_and_drops_are_counted(ctx, endpoint):
    sock = pull(ctx, endpoint, hwm=2)  # bound but never read while we send (like a SIGSTOPped TUI)
    pub = RecordPublisher(endpoint, KEY, SESSION, rank=0, ctx=ctx, hwm=4)
    assert pub.wait_connected(2.0)
    n = 4096  # ~240 KB per batch, so kernel buffers cannot swallow them all
    batches = 300
    for b in range(batches):
        pub.publish(COLL, columns(n, first=b * n), n, STATUS)
    assert pub.dropped > 0
    assert pub.sent + pub.dropped == batches * n
    got = receive_all(sock)
    received = sum(len(m) for m in got)
    assert received == pub.sent  # what was queued arrives; the rest was counted, not lost silently
    seqs = [m.seq for m in got]
    assert seqs == sorted(seqs) and len(seqs) < batches
    drops = [m.dropped for m in got]
    assert drops == sorted(drops)
    # once the receiver reads again, the next batch reports every drop so far
    assert pub.publish(COLL, columns(1), 1, STATUS)
    (last,) = receive_all(sock)
    pub.close()
    assert last.seq == batches and last.dropped == pub.dropped


def test_batcher_columns_and_flush_policy():
    sent: list[tuple[str, dict[str, np.ndarray], int]] = []

    class FakeSink:
        def publish(self, kind, cols, n, status):
            sent.append((kind, cols, n))
            return True

    batcher = RecordBatcher(
        FakeSink(),
        lambda: STATUS,
        op_index=1,
        coll_nbytes=8 << 20,
        bus_factor=bus_factor("all_reduce", 4),
        batch_ms=10_000,
        max_records=100,
    )
    batcher.coll_rows.extend(coll_rows(99))
    assert not batcher.due()
    batcher.coll_rows.extend(coll_rows(1, first=99))
    assert batcher.due()
    batcher.copy_rows.append((0, 3, 1 << 20, 1, 1, 123, 20.0))
    batcher.flush()
    assert not batcher.coll_rows and not batcher.copy_rows
    (k1, c, n1), (k2, cp, n2) = sent
    assert (k1, n1, k2, n2) == (COLL, 100, COPY, 1)
    assert set(c) == set(protocol.COLL_COLUMNS) and set(cp) == set(COPY_COLUMNS)
    assert c["host_ns"][0] == 1_700_000_000_000_000_000  # int64 kept exact
    expected = (8 << 20) / c["dur_us"].astype(np.float64) / 1e3
    np.testing.assert_allclose(c["algbw"], expected, rtol=1e-6)
    np.testing.assert_allclose(c["busbw"], expected * 1.5, rtol=1e-6)
    assert (c["op"] == 1).all() and (c["nbytes"] == 8 << 20).all()
    assert cp["gbps"][0] == pytest.approx((1 << 20) / 20.0 / 1e3)
    # the body encodes with the protocol's own schema
    body = protocol.batch_body(COLL, SESSION, Batch(COLL, 0, 0, 0, c))
    assert len(protocol.decode_batch(body)) == 100
