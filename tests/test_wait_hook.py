"""workers.monitor.wait_hook: a record that ends when the job's own wait() returns (gloo's
isend/irecv), with test fakes for the Work (a real gloo isend needs a peer:
tests/test_job_streams_recorded.py runs the real one between two ranks), and the isend/irecv
specs of the patch.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from workers.monitor import patch, wait_hook
from workers.monitor.records import OP_INDEX


class FakeP2PWork:
    """Stands in for gloo's send/recv Work: incomplete until wait(), no future."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.waits = 0

    def wait(self, timeout: object = None) -> bool:
        self.waits += 1
        if self.fail:
            raise RuntimeError("peer closed the connection")
        return True


class OtherWork(FakeP2PWork):
    """A second Work class (the wrapper is per class)."""


class Slotted:
    """A Work without weak references: cannot be followed."""

    __slots__ = ()

    def wait(self) -> bool:
        return True


class Ends:
    """A test fake of a record's end (the monitor's Ender): appends ``name`` to ``log`` when
    the job's wait returned, ``("failed", name, error)`` when it raised."""

    def __init__(self, log: list[object], name: object = 1) -> None:
        self.log = log
        self.name = name

    def done(self) -> None:
        self.log.append(self.name)

    def fail(self, exc: BaseException) -> None:
        self.log.append(("failed", self.name, str(exc)))


@pytest.fixture(autouse=True)
def clean() -> Iterator[None]:
    yield
    wait_hook.unwrap()


def test_the_record_ends_when_the_jobs_wait_returns_once() -> None:
    ended: list[str] = []
    a, b = FakeP2PWork(), FakeP2PWork()
    assert wait_hook.expect(a, Ends(ended, "a"))
    assert wait_hook.expect(b, Ends(ended, "b"))
    assert ended == [] and wait_hook.outstanding() == 2
    assert b.wait() is True
    assert ended == ["b"]
    a.wait(timeout=5)
    a.wait()  # a second wait ends nothing more
    assert ended == ["b", "a"] and a.waits == 2 and wait_hook.outstanding() == 0


def test_a_failed_wait_counts_its_record_failed_once_and_the_job_sees_its_error() -> None:
    """A peer gone or a timeout inside the job's wait: the record never comes, so it counts as
    failed (before, it was counted nowhere: a rank's last irecv was one short of torch's count)."""
    ended: list[object] = []
    w = FakeP2PWork(fail=True)
    wait_hook.expect(w, Ends(ended))
    with pytest.raises(RuntimeError, match="peer closed"):
        w.wait()
    assert ended == [("failed", 1, "peer closed the connection")] and wait_hook.outstanding() == 0
    with pytest.raises(RuntimeError, match="peer closed"):
        w.wait()  # waited again: counted once
    assert len(ended) == 1 and wait_hook.unwaited() == []


def test_a_work_dropped_without_wait_is_forgotten_not_kept_alive() -> None:
    ended: list[object] = []
    w = FakeP2PWork()
    end = Ends(ended)
    wait_hook.expect(w, end)
    del w
    gc.collect()
    assert wait_hook.outstanding() == 0
    reused = FakeP2PWork()  # may take the dropped one's id: its wait must not end the old record
    reused.wait()
    assert ended == [] and wait_hook.unwaited() == [end]  # its record never comes: counted at the end


def test_unwaited_lists_the_live_un_waited_and_the_newest_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(wait_hook, "_dropped", wait_hook.deque(maxlen=2))
    log: list[object] = []
    kept, waited, out = FakeP2PWork(), FakeP2PWork(), torch.ones(8)
    ends = {name: Ends(log, name) for name in ("kept", "waited", "out", "d1", "d2", "d3")}
    wait_hook.expect(kept, ends["kept"])
    wait_hook.expect(waited, ends["waited"])
    wait_hook.expect_tensor(out, ends["out"])
    for name in ("d1", "d2", "d3"):
        wait_hook.expect(FakeP2PWork(), ends[name])  # dropped at once
    gc.collect()
    waited.wait()
    assert log == ["waited"]
    assert [e.name for e in wait_hook.unwaited()] == ["kept", "out", "d2", "d3"]  # type: ignore[attr-defined]


def test_works_that_cannot_be_followed_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    assert not wait_hook.expect(Slotted(), Ends([]))
    monkeypatch.setattr(wait_hook, "MAX_EXPECTED", 2)
    held = [FakeP2PWork() for _ in range(3)]
    assert [wait_hook.expect(w, Ends([])) for w in held] == [True, True, False]


def test_unwrap_restores_every_class_and_forgets_what_was_expected() -> None:
    original, other = FakeP2PWork.wait, OtherWork.wait
    wait_hook.expect(FakeP2PWork(), Ends([]))
    keep = OtherWork()
    wait_hook.expect(keep, Ends([]))
    assert FakeP2PWork.wait is not original
    wait_hook.unwrap()
    assert FakeP2PWork.__dict__["wait"] is original and OtherWork.wait is other
    assert wait_hook.outstanding() == 0 and wait_hook.unwaited() == []


def test_process_group_send_and_recv_are_send_and_recv_finished_at_wait() -> None:
    """isend, irecv and batch_isend_irecv reach gloo through ``ProcessGroup.send/recv(self,
    tensors, peer, tag)``: the group is ``self``, the bytes those of every tensor."""
    import torch
    import torch.distributed as dist

    for name, op in (("send", "send"), ("recv", "recv"), ("recv_anysource", "recv")):
        spec = patch.method_spec(name)
        assert spec.code == OP_INDEX[op] and spec.at_wait and spec.async_pos < 0
        t, u = torch.ones(8), torch.ones(4, dtype=torch.float16)
        group = object()
        assert spec.parse((group, [t, u], 1, 0), {}) == (t, 40, group, True)
        assert spec.parse((group,), {"tensors": [u]}) == (u, 8, group, True)
    blocking = patch._spec("send", dist.send.__dict__.get("__commtop_original__", dist.send))
    assert not blocking.at_wait and blocking.parse((torch.ones(2), 1), {})[3] is False


def test_a_tensors_record_ends_when_wait_tensor_returns_for_its_storage() -> None:
    """A functional collective's output is waited as itself or as a view of it (a gather on
    another dimension): the same storage ends the record, once; another tensor ends nothing."""
    import torch

    calls: list[object] = []
    wait_tensor = wait_hook.wrap_wait_tensor(lambda t: calls.append(t) or t)
    ended: list[object] = []
    out, other = torch.ones(4, 6), torch.ones(3)
    assert wait_hook.expect_tensor(out, Ends(ended, "out"))
    assert wait_tensor(other) is other and ended == []
    view = out.view(2, 12)[:, :6]
    assert wait_tensor(view) is view and ended == ["out"]
    wait_tensor(out)
    assert ended == ["out"] and len(calls) == 3 and wait_hook.outstanding() == 0


def test_an_output_dropped_without_a_wait_is_forgotten() -> None:
    import torch

    ended: list[object] = []
    out = torch.ones(1024)
    wait_hook.expect_tensor(out, Ends(ended))
    del out
    gc.collect()
    assert wait_hook.outstanding() == 0
    wait_hook.wrap_wait_tensor(lambda t: t)(torch.ones(1024))  # may reuse the freed storage
    assert ended == []


def test_a_failed_wait_tensor_counts_its_record_failed_and_the_job_sees_its_error() -> None:
    import torch

    def failing(t: object) -> object:
        raise RuntimeError("Connection closed by peer")

    ended: list[object] = []
    out = torch.ones(16)
    wait_hook.expect_tensor(out, Ends(ended, "out"))
    with pytest.raises(RuntimeError, match="closed by peer"):
        wait_hook.wrap_wait_tensor(failing)(out[:8])
    assert ended == [("failed", "out", "Connection closed by peer")] and wait_hook.outstanding() == 0


def test_a_functional_collectives_group_resolves_to_its_process_group_or_to_no_record() -> None:
    import torch
    import torch.distributed._functional_collectives as funcol

    spec = patch.funcol_spec("all_gather", "all_gather_single", funcol.all_gather_single)
    assert spec.code == OP_INDEX["all_gather"] and spec.times_group and spec.at_wait == patch.TENSOR_WAIT
    t = torch.ones(8)
    # a group torch cannot resolve: no record (an int group, as for a rank outside a group)
    assert spec.parse((t, 0, object()), {}) == (t, 32, -1, True)
