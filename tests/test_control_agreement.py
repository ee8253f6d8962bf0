"""The live-control agreement on its own: real TCPStore on localhost, real threads, fake loops.

Fake loops stand in for the worker loop (named Fake...): each calls ``begin_step`` at every
step boundary like workers.synthetic.loop does and records the epoch each iteration ran with.
"""

from __future__ import annotations

import random
import threading
import time
from datetime import timedelta

import pytest
import torch.distributed as torch_dist  # noqa: E402
import zmq

from workers.rank.live_control import (  # noqa: E402
    DesiredListener,
    LiveControl,
)
from workers.wire import protocol  # noqa: E402
from workers.wire.control import ctl_state_body  # noqa: E402
from workers.wire.settings import Settings  # noqa: E402

STEP = 4
KEY = bytes(range(32))
SESSION = "s-test"


@pytest.fixture()
def store_server():
    server = torch_dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=20))
    yield server


def client(server):
    return torch_dist.TCPStore("127.0.0.1", server.port, is_master=False, timeout=timedelta(seconds=20))


class FakeDesired:
    """Rank 0's desired-state source, set directly by the test."""

    def __init__(self, settings: Settings) -> None:
        self.desired: tuple[int, Settings] | None = (0, settings)
        self.rejected: dict[str, int] = {}

    def poll(self, timeout_s: float) -> None:
        time.sleep(timeout_s)

    def close(self) -> None:
        pass


class FakeLoops:
    """N loops in lockstep (a barrier per step stands for the collective), each allowed to
    run ``ahead[r]`` steps past the slowest rank, as a GPU queue lets a host run ahead."""

    def __init__(self, controls: list[LiveControl], steps: int, ahead: list[int] | None = None, jitter_s: float = 0.0):
        self.controls = controls
        self.steps = steps
        self.ahead = ahead or [0] * len(controls)
        self.jitter_s = jitter_s
        self.started = [0] * len(controls)
        self.cond = threading.Condition()
        self.epochs: list[dict[int, int]] = [{} for _ in controls]
        self.settings: list[dict[int, Settings]] = [{} for _ in controls]
        self.errors: list[BaseException] = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(r,), daemon=True) for r in range(len(controls))]

    def start(self) -> FakeLoops:
        for t in self.threads:
            t.start()
        return self

    def join(self, timeout: float) -> None:
        self.stop.set()
        with self.cond:
            self.cond.notify_all()
        deadline = time.monotonic() + timeout
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))
        assert not any(t.is_alive() for t in self.threads), "a fake loop hung"
        assert not self.errors, self.errors

    def _run(self, rank: int) -> None:
        rng = random.Random(rank)
        try:
            for step in range(self.steps):
                if self.stop.is_set():
                    break
                with self.cond:
                    # this step's "collective" needs every rank within `ahead` steps
                    ok = self.cond.wait_for(
                        lambda s=step: min(self.started) >= s - self.ahead[rank] or self.stop.is_set(), timeout=30
                    )
                    assert ok, f"rank {rank} stuck at step {step}"
                settings, epoch = self.controls[rank].begin_step(step * STEP)
                self.epochs[rank][step * STEP] = epoch
                self.settings[rank][epoch] = settings
                with self.cond:
                    self.started[rank] = step + 1
                    self.cond.notify_all()
                if self.jitter_s:
                    time.sleep(rng.uniform(0, self.jitter_s))
        except BaseException as exc:
            self.errors.append(exc)


def make_controls(server, world: int, desired, **kw) -> list[LiveControl]:
    s0 = Settings()
    return [
        LiveControl(
            client(server),
            rank=r,
            world_size=world,
            settings=s0,
            prefix=f"commtop/{SESSION}/0",
            step=STEP,
            desired=desired if r == 0 else None,
            **kw,
        )
        for r in range(world)
    ]


def assert_exact(loops: FakeLoops) -> None:
    """Every iteration index ran with the same epoch on every rank."""
    reference = loops.epochs[0]
    for rank, epochs in enumerate(loops.epochs[1:], start=1):
        common = reference.keys() & epochs.keys()
        assert common, "no common iterations"
        bad = [(i, reference[i], epochs[i]) for i in sorted(common) if reference[i] != epochs[i]]
        assert not bad, f"rank {rank} disagrees with rank 0 at (iteration, epoch0, epoch{rank}): {bad[:5]}"


@pytest.mark.e2e
def test_random_changes_switch_every_rank_at_the_same_iteration(store_server):
    desired = FakeDesired(Settings())
    controls = make_controls(store_server, 4, desired)
    loops = FakeLoops(controls, steps=10**6, jitter_s=0.002).start()
    rng = random.Random(7)
    wanted: dict[int, Settings] = {0: Settings()}
    current = Settings()
    for epoch in range(1, 9):
        time.sleep(rng.uniform(0.0, 0.15))
        current = current.updated({"mode": rng.choice(protocol.MODES), "copies": rng.randint(0, 16)})
        wanted[epoch] = current
        desired.desired = (epoch, current)
        # wait until in force (so every change takes effect, none is superseded)
        deadline = time.monotonic() + 10
        while min(c.in_force()[1] for c in controls) < epoch and time.monotonic() < deadline:
            time.sleep(0.01)
        assert [c.in_force()[1] for c in controls] == [epoch] * 4, controls[0].stats()
    # a burst: changes faster than they can apply (proposals queue up, some epochs are skipped)
    for epoch in range(9, 15):
        current = current.updated({"copies": epoch})
        wanted[epoch] = current
        desired.desired = (epoch, current)
        time.sleep(rng.uniform(0.0, 0.03))
    deadline = time.monotonic() + 10
    while min(c.in_force()[1] for c in controls) < 14 and time.monotonic() < deadline:
        time.sleep(0.01)
    loops.join(60)
    for c in controls:
        c.close()
    assert_exact(loops)
    for rank in range(4):
        seen = set(loops.epochs[rank].values())
        assert set(range(9)) | {14} <= seen <= set(range(15)), "every waited-for change took effect on every rank"
        for epoch, settings in loops.settings[rank].items():
            assert settings == wanted[epoch]
    assert 9 <= controls[0].stats().commits <= 14


def test_a_rank_past_apply_at_makes_rank0_reissue_later(store_server):
    """Driven by hand: rank 3's loop is already far ahead when the proposal arrives."""
    desired = FakeDesired(Settings())
    controls = make_controls(store_server, 4, desired, start=False)
    for r, c in enumerate(controls):
        c.begin_step(1000 if r == 3 else 0)
    desired.desired = (1, Settings(mode="sync"))
    controls[0].poll_once()  # proposes apply_at a few steps after iteration 0
    first = controls[0].status()
    assert first[1] == 1 and first[2] < 1000
    for c in controls:
        c.poll_once()  # acks: ranks 0-2 ok, rank 3 late
    controls[0].poll_once()  # aborts and re-issues past rank 3's iteration
    stats = controls[0].stats()
    assert stats.aborts == 1 and stats.reissues == 1 and stats.late_acks == 0
    assert controls[3].stats().late_acks == 1
    assert "rank 3 was at iteration 1000" in stats.note
    second = controls[0].status()
    assert second[1] == 1 and second[2] > 1000 and second[2] % STEP == 0
    # the aborted proposal changes nothing, even on a rank that reaches its apply_at
    for c in controls:
        c.poll_once()  # decisions of the abort + acks of the re-issue (all ok now)
    assert controls[1].begin_step(first[2]) == (Settings(), 0)
    controls[0].poll_once()  # commit
    for c in controls:
        c.poll_once()
    for c in controls:
        assert c.begin_step(second[2] - STEP)[1] == 0
        settings, epoch = c.begin_step(second[2])
        assert (settings.mode, epoch) == ("sync", 1)
    assert controls[0].stats().commits == 1


def test_run_ahead_ranks_stay_exact_through_reissues(store_server):
    """Rank 3 runs up to 40 steps ahead and the first lead is tiny: proposals are late,
    re-issued with a longer lead, and still every rank switches at the same iteration."""
    desired = FakeDesired(Settings())
    controls = make_controls(store_server, 4, desired, lead_s=0.001)
    loops = FakeLoops(controls, steps=10**6, ahead=[0, 0, 0, 40], jitter_s=0.0005).start()
    for epoch, mode in enumerate(("sync", "sync-barrier", "none"), start=1):
        desired.desired = (epoch, Settings(mode=mode))
        deadline = time.monotonic() + 15
        while min(c.in_force()[1] for c in controls) < epoch and time.monotonic() < deadline:
            time.sleep(0.01)
    loops.join(60)
    for c in controls:
        c.close()
    assert_exact(loops)
    assert set(loops.epochs[0].values()) == {0, 1, 2, 3}
    assert controls[0].stats().reissues >= 1, "the run-ahead rank should have been late at least once"


def test_loop_waiting_at_a_switch_fails_loudly_if_control_thread_dies(store_server):
    desired = FakeDesired(Settings())
    controls = make_controls(store_server, 2, desired, start=False)
    controls[0].begin_step(0)
    controls[1].begin_step(0)
    desired.desired = (1, Settings(mode="none"))
    controls[0].poll_once()
    controls[1].poll_once()  # rank 1 acked ok; no decision will ever be polled (no thread)
    apply_at = controls[1].status()[2]
    with pytest.raises(RuntimeError, match="live control stopped"):
        controls[1].begin_step(apply_at)


# --------------------------------------------------------------------------- rank 0's listener


def signed_state(epoch: int, settings: Settings, key: bytes = KEY, session: str = SESSION) -> list[bytes]:
    return protocol.seal(key, ctl_state_body(session, epoch, settings))


def test_listener_accepts_newer_epochs_and_counts_every_rejection_by_reason(tmp_path):
    ctx = zmq.Context()
    endpoint = f"ipc://{tmp_path / 'control.sock'}"
    pub = ctx.socket(zmq.PUB)
    pub.bind(endpoint)
    listener = DesiredListener(endpoint, KEY, SESSION, context=ctx)
    listener.note_in_force(0, Settings())
    try:
        old = signed_state(1, Settings(mode="sync"))
        flipped = signed_state(2, Settings(mode="none"))
        flipped[1] = flipped[1][:-1] + bytes([flipped[1][-1] ^ 1])
        messages = [
            [b"", protocol.seal(KEY, ctl_state_body(SESSION, 5, Settings()))[1]],  # unsigned
            signed_state(5, Settings(mode="none"), key=bytes(32)),  # wrong key
            flipped,  # bit flipped
            signed_state(5, Settings(mode="none"), session="other"),  # foreign session
            signed_state(2, Settings(mode="sync-barrier")),
            old,  # replay of an older valid message
            signed_state(2, Settings(mode="none")),  # same epoch, other settings
            protocol.seal(KEY, {**ctl_state_body(SESSION, 3, Settings()), "settings": {"copies": 99}}),
        ]
        # PUB drops messages until the subscription has reached it: probe with `old` until heard
        deadline = time.monotonic() + 5
        while listener.desired != (1, Settings(mode="sync")) and time.monotonic() < deadline:
            pub.send_multipart(old)
            listener.poll(0.05)
        assert listener.desired == (1, Settings(mode="sync"))
        for frames in messages:
            pub.send_multipart(frames)
        deadline = time.monotonic() + 5
        while sum(listener.rejected.values()) < 7 and time.monotonic() < deadline:
            listener.poll(0.05)
        assert listener.desired == (2, Settings(mode="sync-barrier"))
        assert dict(listener.rejected) == {
            "signature": 3,
            "session": 1,
            "replay": 1,
            "conflict": 1,
            "invalid": 1,
        }
    finally:
        listener.close()
        pub.close(0)
        ctx.term()
