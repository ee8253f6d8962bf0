"""Wire protocol: round trips, and every malformed frame is refused with a reason."""

from __future__ import annotations

import dataclasses
import hashlib
import hmac

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workers.wire import protocol as p
from workers.wire.endings import bye_reason

KEY = b"k" * 32
SESSION = "s1"


def make_batch(n: int = 5, rank: int = 3) -> p.Batch:
    cols = {name: np.arange(n).astype(dtype) for name, dtype in p.COLL_COLUMNS.items()}
    return p.Batch(
        p.COLL, rank=rank, seq=7, dropped=2, columns=cols, epoch_in_force=4, pending_epoch=5, apply_at=640, t_ns=123
    )


def test_batch_round_trip_keeps_every_column_and_header() -> None:
    batch = make_batch()
    got = p.decode(p.open_frames(KEY, p.seal(KEY, p.batch_body(p.COLL, SESSION, batch)), SESSION))
    assert isinstance(got, p.Batch)
    assert (got.rank, got.seq, got.dropped, got.epoch_in_force, got.pending_epoch, got.apply_at, got.t_ns) == (
        3,
        7,
        2,
        4,
        5,
        640,
        123,
    )
    for name, dtype in p.COLL_COLUMNS.items():
        assert got.columns[name].dtype == np.dtype(dtype)
        np.testing.assert_array_equal(got.columns[name], batch.columns[name])
    assert len(got) == 5


def test_copy_batch_round_trip() -> None:
    cols = {name: np.ones(3, dtype=dtype) for name, dtype in p.COPY_COLUMNS.items()}
    batch = p.Batch(p.COPY, 0, 0, 0, cols)
    got = p.decode(p.open_frames(KEY, p.seal(KEY, p.batch_body(p.COPY, SESSION, batch))))
    assert got.kind == p.COPY and len(got) == 3


def test_row_layouts_take_their_dtypes_from_the_schema() -> None:
    cols = p.pick_columns(p.COPY_COLUMNS, ("epoch", "start_ns", "gbps"))
    assert cols == {"epoch": "<i4", "start_ns": "<i8", "gbps": "<f4"} and list(cols) == ["epoch", "start_ns", "gbps"]
    row = p.row_dtype(p.COLL_COLUMNS, ("op", "ranks", "dur_us"), extra={"ranks": "<i4"})
    assert row == np.dtype([("op", "u1"), ("ranks", "<i4"), ("dur_us", "<f4")])
    with pytest.raises(KeyError):
        p.row_dtype(p.COLL_COLUMNS, ("ranks",))
    with pytest.raises(ValueError):
        p.row_dtype(p.COLL_COLUMNS, ("op",), extra={"op": "<i8"})  # a wire column is not redefined


def test_hello_and_bye_round_trip() -> None:
    hello = p.Hello(
        rank=1,
        world_size=2,
        local_rank=1,
        local_world_size=2,
        host="node",
        pid=42,
        backend="gloo/cpu",
        device="cpu",
        device_index=-1,
        gpu_uuid="",
        torch_version="2.13.0",
        nccl_version="",
        config={"collective": "all_gather"},
        settings={"mode": "none"},
        epoch=3,
        iteration=99,
        pinned_bytes=0,
        t_ns=1,
        started_ns=0,
        rejected={"signature": 2},
    )
    assert p.decode(p.open_frames(KEY, p.seal(KEY, p.hello_body(SESSION, hello)))) == hello
    grouped = dataclasses.replace(hello, groups=(("0", "default_pg", 2), ("1", "tp", 2)), lost=7, inside=(1, 1, 256, 9))
    assert p.decode(p.open_frames(KEY, p.seal(KEY, p.hello_body(SESSION, grouped)))) == grouped
    bye = p.Bye(rank=1, exit_code=1, reason="RuntimeError: boom", t_ns=5)
    assert p.decode(p.open_frames(KEY, p.seal(KEY, p.bye_body(SESSION, bye)))) == bye


def test_a_hello_without_groups_or_lost_reads_as_none_and_bad_groups_are_refused() -> None:
    body = p.hello_body(SESSION, _hello())
    del body["groups"], body["lost"]  # what a recording made before them holds
    old = p.decode_hello(body)
    assert old.groups == () and old.lost == 0 and old.inside == ()
    for bad_inside in ([1, 0, 256], [1, 0, -1, 5], [1, 0, "256", 5], "all_reduce"):
        with pytest.raises(p.ProtocolError):
            p.decode_hello({**body, "inside": bad_inside})
    for bad in ([["0", "world"]], [["0", "world", -1]], [[0, "world", 2]], "0", [["0", "w", 2]] * (p.MAX_GROUPS + 1)):
        body["groups"] = bad
        with pytest.raises(p.ProtocolError):
            p.decode_hello(body)


def test_dtype_codes_from_torch_and_flight_recorder_names() -> None:
    assert p.DTYPES[p.dtype_code("torch.bfloat16")] == "bfloat16"
    assert p.dtype_code("BFloat16") == p.dtype_code("bfloat16") == p.DTYPE_INDEX["bfloat16"]
    assert p.DTYPES[p.dtype_code("Float")] == "float32" and p.DTYPES[p.dtype_code("Long")] == "int64"
    assert p.dtype_code("torch.qint8") == 0 and p.dtype_code("") == 0


def _hello() -> p.Hello:
    return p.Hello(
        rank=0, world_size=1, local_rank=0, local_world_size=1, host="h", pid=1, backend="gloo/cpu", device="cpu",
        device_index=-1, gpu_uuid="", torch_version="", nccl_version="", config={}, settings={}, epoch=0,
        iteration=0, pinned_bytes=0, t_ns=1, started_ns=0,
    )  # fmt: skip


def _reason(frames: list[bytes], session: str | None = SESSION) -> str:
    with pytest.raises(p.ProtocolError) as info:
        body = p.open_frames(KEY, frames, session)
        p.decode(body)
    return info.value.reason


def _signed(body: object) -> list[bytes]:
    payload = msgpack.packb(body, use_bin_type=True)
    return [hmac.new(KEY, payload, hashlib.sha256).digest(), payload]


def test_rejections_have_reasons() -> None:
    good = p.seal(KEY, p.batch_body(p.COLL, SESSION, make_batch()))
    assert _reason([good[1]]) == "frames"
    assert _reason([b"\0" * 32, good[1]]) == "signature"
    assert _reason([good[0], good[1][:-1] + bytes([good[1][-1] ^ 1])]) == "signature"
    assert _reason(p.seal(b"x" * 32, p.batch_body(p.COLL, SESSION, make_batch()))) == "signature"
    assert _reason(good, session="other") == "session"
    assert _reason(_signed(b"\xc1garbage")) == "malformed"
    assert _reason([hmac.new(KEY, b"\xc1", hashlib.sha256).digest(), b"\xc1"]) == "malformed"
    assert _reason(_signed([1, 2, 3])) == "malformed"
    assert _reason(_signed({"v": 99, "k": "coll", "s": SESSION})) == "version"
    assert _reason(_signed({"v": p.SCHEMA_VERSION, "k": "nope", "s": SESSION})) == "kind"
    body = p.batch_body(p.COLL, SESSION, make_batch())
    body["cols"]["dur_us"] = body["cols"]["dur_us"][:-1]
    assert _reason(_signed(body)) == "field"
    body = p.batch_body(p.COLL, SESSION, make_batch())
    body["n"] = p.MAX_BATCH_RECORDS + 1
    assert _reason(_signed(body)) == "field"
    body = p.batch_body(p.COLL, SESSION, make_batch())
    body["rank"] = "zero"
    assert _reason(_signed(body)) == "field"


def test_oversized_and_deeply_nested_bodies_are_refused() -> None:
    big = b"\0" * (p.MAX_BODY_BYTES + 1)
    assert _reason([hmac.new(KEY, big, hashlib.sha256).digest(), big]) == "oversized"
    nested: object = 0
    for _ in range(5000):
        nested = [nested]
    payload = b"\x91" * 5000 + b"\x00"  # 5000 nested one-element arrays
    assert _reason([hmac.new(KEY, payload, hashlib.sha256).digest(), payload]) == "malformed"


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2048))
def test_signed_garbage_never_raises_anything_but_protocol_error(payload: bytes) -> None:
    frames = [hmac.new(KEY, payload, hashlib.sha256).digest(), payload]
    try:
        p.decode(p.open_frames(KEY, frames, SESSION))
    except p.ProtocolError:
        pass


@settings(max_examples=200, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.text(max_size=20) | st.binary(max_size=20),
        lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
        max_leaves=30,
    ),
    st.sampled_from(sorted(p.KINDS)),
)
def test_signed_wellformed_but_wrong_bodies_never_crash_decode(junk: object, kind: str) -> None:
    body = {"v": 1, "k": kind, "s": SESSION, "n": 1, "cols": junk, "rank": junk, "seq": junk}
    try:
        p.decode(p.open_frames(KEY, _signed(body), SESSION))
    except p.ProtocolError:
        pass


def test_bye_reason_drops_cpp_source_locations_and_keeps_the_message():
    gloo = RuntimeError(
        "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:534] "
        "Connection closed by peer [127.0.0.1]:28412\nException raised from ..."
    )
    assert bye_reason(gloo) == "RuntimeError: Connection closed by peer [127.0.0.1]:28412"
    nested = RuntimeError("[c10/util/Exception.cpp:42] [/src/nccl.cc:7]  NCCL error: unhandled system error")
    assert bye_reason(nested) == "RuntimeError: NCCL error: unhandled system error"
    # bracketed text that is not a source location stays; empty messages give the type alone
    assert bye_reason(ValueError("[rank 3] bad shape")) == "ValueError: [rank 3] bad shape"
    assert bye_reason(KeyError()) == "KeyError"
    assert bye_reason(OSError("\n\n  disk full  \n")) == "OSError: disk full"
    long = bye_reason(RuntimeError("Check the logs of the remote worker before reporting an error."), 60)
    assert long == "RuntimeError: Check the logs of the remote worker before…"  # cut between words
    assert len(bye_reason(RuntimeError("x" * 2000))) == 512


@pytest.mark.parametrize(
    ("code", "status", "reason"),
    [
        (None, 0, "finished"),
        (0, 0, "finished"),
        (3, 3, "sys.exit(3)"),
        ("rank 1: bad data\nmore", 1, "SystemExit: rank 1: bad data"),
        (True, 1, "sys.exit(True)"),  # bool is an int: Python exits with 1
    ],
)
def test_a_system_exit_ends_the_process_with_pythons_status(code: object, status: int, reason: str) -> None:
    from workers.monitor.exits import system_exit_status

    assert system_exit_status(SystemExit(code)) == (status, reason)
