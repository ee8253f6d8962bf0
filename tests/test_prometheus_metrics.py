"""The node exporter's metrics from real sealed batches and real sampler ticks, read back through
prometheus_client's own exposition and parser; the `--prometheus` address rules; the dashboard
queries only metrics the exporter serves."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from workers.export.metrics import BUCKETS_S, STALL_AFTER_S, Collector, NodeMetrics, size_label
from workers.wire import exporter_address
from workers.wire import protocol as p
from workers.wire.telemetry import Tick

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "workers" / "export" / "grafana-dashboard.json"
KEY, SESSION = b"k" * 32, "s1"


def coll_batch(
    rank: int, seq: int, iters: list[int], dur_us: list[float], mode: int = 1, nbytes: int = 1 << 27
) -> p.Batch:
    n = len(iters)
    cols = {
        "iteration": np.array(iters),
        "step": np.array(iters) // 4,
        "epoch": np.full(n, 3),
        "mode": np.full(n, mode),
        "op": np.zeros(n),
        "group": np.zeros(n, dtype="<u2"),
        "dtype": np.zeros(n, dtype="u1"),
        "nbytes": np.full(n, nbytes),
        "host_ns": np.arange(n) + 10**18,
        "start_ns": np.arange(n) + 10**18,
        "dur_us": np.array(dur_us),
        "algbw": np.full(n, 2.0),
        "busbw": np.full(n, 1.5),
    }
    return sealed_roundtrip(p.COLL, p.Batch(p.COLL, rank, seq, 7, cols, epoch_in_force=3))


def sealed_roundtrip(kind: str, batch: p.Batch) -> p.Batch:
    """Through the real wire: seal, verify, decode (what the exporter's receiver does)."""
    frames = p.seal(KEY, p.batch_body(kind, SESSION, batch))
    return p.decode(p.open_frames(KEY, frames, SESSION))


def scrape(metrics: NodeMetrics) -> dict[str, list]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(Collector(metrics))  # type: ignore[arg-type]
    text = generate_latest(registry).decode()
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def sample(samples: list, name: str, **labels: str) -> float:
    hits = [s.value for s in samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(hits) == 1, (name, labels, samples[:5])
    return hits[0]


def tick(t_ns: int, pcie_tx_gbps: float, throttle: int = 0x4) -> Tick:
    metrics = {name: np.full(1, np.nan) for name in p.TELEM_GPU_METRICS}
    metrics["pcie_tx_gbps"][0] = pcie_tx_gbps
    metrics["pcie_rx_gbps"][0] = 1.0
    metrics["nvlink_tx_gbps"][0] = 100.0
    metrics["nvlink_rx_gbps"][0] = 100.0
    metrics["sm_clock_mhz"][0] = 1980.0
    metrics["power_w"][0] = 327.0
    metrics["power_limit_w"][0] = 700.0
    metrics["throttle_reasons"][0] = float(throttle)
    return Tick(
        host="n", pid=1, seq=0, t_ns=t_ns, cost_us=1.0, uuids=("GPU-abc",), metrics=metrics,
        gpu_cost_us=np.zeros(1), pcie_peak_gbps=np.full(1, 64.0), nvlink_peak_gbps=np.full(1, np.nan),
        cpu_pct=1.0, mem_used_bytes=1, mem_total_bytes=2, procs={}, nvml="", dropped=0,
    )  # fmt: skip


def test_histogram_bytes_and_busbw_per_rank_op_size_and_mode() -> None:
    m = NodeMetrics("n")
    m.add_message(coll_batch(0, 0, [0, 1, 2], [15.0, 150.0, 20e6]))  # 15 us, 150 us, 20 s (+Inf)
    m.add_message(coll_batch(0, 1, [3], [10.0], mode=2))
    fams = scrape(m)
    dur = fams["commtop_collective_duration_seconds"]
    labels = {"rank": "0", "op": "all_gather", "size": "128MiB", "mode": "overlap"}
    assert sample(dur, "commtop_collective_duration_seconds_count", **labels) == 3
    assert sample(dur, "commtop_collective_duration_seconds_bucket", le="1e-05", **labels) == 0
    assert sample(dur, "commtop_collective_duration_seconds_bucket", le="2e-05", **labels) == 1
    assert sample(dur, "commtop_collective_duration_seconds_bucket", le="0.0002", **labels) == 2
    assert sample(dur, "commtop_collective_duration_seconds_bucket", le="10", **labels) == 2
    assert sample(dur, "commtop_collective_duration_seconds_bucket", le="+Inf", **labels) == 3
    assert sample(dur, "commtop_collective_duration_seconds_sum", **labels) == pytest.approx(20.000165)
    # 10 us lands in the le="1e-05" bucket (le is inclusive), in its own mode series
    assert sample(dur, "commtop_collective_duration_seconds_bucket", le="1e-05", **{**labels, "mode": "sync"}) == 1
    assert sample(fams["commtop_collective_bytes"], "commtop_collective_bytes_total", **labels) == 3 * (1 << 27)
    assert sample(fams["commtop_collective_bus_bytes"], "commtop_collective_bus_bytes_total", **labels) == (
        pytest.approx(1.5e9 * 20.000165, rel=1e-5)
    )
    assert sample(
        fams["commtop_collective_busbw_bytes_per_second"], "commtop_collective_busbw_bytes_per_second", **labels
    ) == (pytest.approx(1.5e9))
    assert sample(fams["commtop_rank_settings_epoch"], "commtop_rank_settings_epoch", rank="0") == 3
    assert sample(fams["commtop_rank_dropped_records"], "commtop_rank_dropped_records_total", rank="0") == 7
    assert len(BUCKETS_S) == 19 and BUCKETS_S[0] == 1e-5 and BUCKETS_S[-1] == 10.0


def test_sizes_fall_in_bounded_power_of_two_buckets() -> None:
    m = NodeMetrics("n")
    for seq, nbytes in enumerate((1, 3000, 1 << 27, (1 << 28) - 1, 1 << 40)):
        m.add_message(coll_batch(0, seq, [seq], [5.0], nbytes=nbytes))
    sizes = {s.labels["size"] for s in scrape(m)["commtop_collective_bytes"]}
    assert sizes == {"1KiB", "2KiB", "128MiB", "16GiB"}  # 1 B -> 1KiB floor; 1 TiB -> 16GiB cap
    assert size_label(34) == "16GiB" and size_label(10) == "1KiB"


def test_copies_by_direction_and_pinned() -> None:
    m = NodeMetrics("n")
    cols = {
        "step": np.arange(4), "epoch": np.zeros(4), "nbytes": np.full(4, 1000), "direction": np.array([0, 0, 1, 0]),
        "pinned": np.array([1, 0, 1, 1]), "start_ns": np.arange(4), "dur_us": np.full(4, 30.0), "gbps": np.ones(4),
    }  # fmt: skip
    m.add_message(sealed_roundtrip(p.COPY, p.Batch(p.COPY, 2, 0, 0, cols)))
    fams = scrape(m)
    assert (
        sample(fams["commtop_copy_bytes"], "commtop_copy_bytes_total", rank="2", direction="d2h", pinned="true") == 2000
    )
    assert (
        sample(fams["commtop_copy_bytes"], "commtop_copy_bytes_total", rank="2", direction="h2d", pinned="true") == 1000
    )
    dur = fams["commtop_copy_duration_seconds"]
    assert sample(dur, "commtop_copy_duration_seconds_count", rank="2", direction="d2h", pinned="false") == 1


def _feed_pairs(m: NodeMetrics, r0: np.ndarray, r1: np.ndarray, per_batch: int = 50) -> None:
    """Two ranks' latencies of the same iterations, in batches as the publishers send them."""
    for seq, at in enumerate(range(0, len(r0), per_batch)):
        its = list(range(at, min(at + per_batch, len(r0))))
        m.add_message(coll_batch(0, seq, its, r0[its].tolist()))
        m.add_message(coll_batch(1, seq, its, r1[its].tolist()))


def test_even_ranks_take_turns_being_last_and_count_no_straggler_iterations() -> None:
    """Two even ranks: each is last about half the time (746 / 751 in issue 27), by chance."""
    rng = np.random.default_rng(7)
    r0, r1 = rng.normal(500.0, 20.0, 1500), rng.normal(500.0, 20.0, 1500)
    m = NodeMetrics("n")
    _feed_pairs(m, r0, r1)
    fams = scrape(m)["commtop_rank_straggler_iterations"]
    assert sample(fams, "commtop_rank_straggler_iterations_total", rank="0") == 0
    assert sample(fams, "commtop_rank_straggler_iterations_total", rank="1") == 0


def test_a_clear_straggler_counts_the_iterations_it_arrived_last() -> None:
    """Rank 1 arrives late (waits least) in 97 % of the iterations: it is the node's straggler,
    and every iteration it was last in counts once the test says so (from the first batches)."""
    rng = np.random.default_rng(8)
    r0 = rng.normal(500.0, 20.0, 1500)
    r1 = r0 - 300.0
    flip = rng.random(1500) < 0.03
    r1[flip] = r0[flip] + 50.0  # now and then rank 0 is last
    m = NodeMetrics("n")
    _feed_pairs(m, r0, r1)
    m.add_message(coll_batch(1, 99, [5], [100.0]))  # a repeated iteration is not counted twice
    fams = scrape(m)["commtop_rank_straggler_iterations"]
    last_of_1 = int((~flip).sum())
    got = sample(fams, "commtop_rank_straggler_iterations_total", rank="1")
    assert last_of_1 - 50 <= got <= last_of_1  # all but (at most) the first batch's
    assert sample(fams, "commtop_rank_straggler_iterations_total", rank="0") == 0


def test_ranks_whose_kth_collectives_differ_count_no_straggler_iterations() -> None:
    """Rank 1 is as clearly last as above, but from iteration 300 on its records are another
    collective than rank 0's of the same iteration (a thread's collectives interleave differently
    on each rank): comparing them compares different collectives, so counting stops there."""
    rng = np.random.default_rng(8)
    r0 = rng.normal(500.0, 20.0, 1500)
    r1 = r0 - 300.0
    m = NodeMetrics("n")
    for seq, at in enumerate(range(0, 1500, 50)):
        its = list(range(at, at + 50))
        m.add_message(coll_batch(0, seq, its, r0[its].tolist()))
        m.add_message(coll_batch(1, seq, its, r1[its].tolist(), nbytes=(1 << 27) if at < 300 else 4096))
    got = sample(scrape(m)["commtop_rank_straggler_iterations"], "commtop_rank_straggler_iterations_total", rank="1")
    assert m.interleaved and 0 < got <= 300


def test_gaps_in_sequence_numbers_count_lost_batches_and_silence_counts_one_stall() -> None:
    now = [100.0]
    m = NodeMetrics("n", clock=lambda: now[0])
    m.add_message(coll_batch(0, 0, [0], [5.0]))
    m.add_message(coll_batch(0, 3, [9], [5.0]))  # batches 1 and 2 never arrived
    m.add_message(coll_batch(1, 0, [0], [5.0]))
    m.add_message(p.Bye(1, 0, "finished", 0))  # a rank that said bye is not stalled
    now[0] += STALL_AFTER_S + 0.1
    m.check_stalls()
    m.check_stalls()  # one silence, one stall
    fams = scrape(m)
    assert sample(fams["commtop_rank_lost_batches"], "commtop_rank_lost_batches_total", rank="0") == 2
    assert sample(fams["commtop_rank_stalls"], "commtop_rank_stalls_total", rank="0") == 1
    assert sample(fams["commtop_rank_stalls"], "commtop_rank_stalls_total", rank="1") == 0
    m.add_message(coll_batch(0, 4, [10], [5.0]))
    now[0] += STALL_AFTER_S + 0.1
    m.check_stalls()
    assert sample(scrape(m)["commtop_rank_stalls"], "commtop_rank_stalls_total", rank="0") == 2


def test_a_rank_whose_first_batch_has_not_come_is_not_stalled() -> None:
    """A rank's Hello comes at once, its first batch after its first collectives: every rank
    counted a stall at start-up (QA7: stalls 1 on both ranks of a job that never paused)."""
    now = [100.0]
    m = NodeMetrics("n", clock=lambda: now[0])
    m.add_message(sealed_hello(_hello(0, t_ns=50 * 10**9)))
    now[0] += STALL_AFTER_S + 5.0
    m.check_stalls()
    assert sample(scrape(m)["commtop_rank_stalls"], "commtop_rank_stalls_total", rank="0") == 0
    m.add_message(coll_batch(0, 0, [0], [5.0]))
    now[0] += STALL_AFTER_S + 0.1
    m.check_stalls()  # its records stopped: a stall
    assert sample(scrape(m)["commtop_rank_stalls"], "commtop_rank_stalls_total", rank="0") == 1


def test_a_rank_inside_a_collective_grows_its_inside_gauge_until_it_comes_out() -> None:
    """A hang to alert on: the rank's Hellos (the heartbeat's copy to the exporter) say it is inside
    an all_reduce since 12 s; the gauge goes on growing between Hellos, and is 0 once it is out."""
    now = [100.0]
    m = NodeMetrics("n", clock=lambda: now[0])
    hello = _hello(0, t_ns=50 * 10**9, inside=(p.OP_NAMES.index("all_reduce"), 0, 256, 38 * 10**9))
    m.add_message(sealed_hello(hello))
    m.add_message(coll_batch(1, 0, [0], [5.0]))
    now[0] += 3.0
    fams = scrape(m)["commtop_rank_inside_collective_seconds"]
    assert sample(fams, "commtop_rank_inside_collective_seconds", rank="0") == pytest.approx(15.0)
    assert sample(fams, "commtop_rank_inside_collective_seconds", rank="1") == 0
    m.add_message(sealed_hello(dataclasses.replace(hello, t_ns=51 * 10**9, inside=())))
    assert (
        sample(scrape(m)["commtop_rank_inside_collective_seconds"], "commtop_rank_inside_collective_seconds", rank="0")
        == 0
    )


def _hello(rank: int, **kw: object) -> p.Hello:
    values: dict = dict(
        rank=rank, world_size=2, local_rank=rank, local_world_size=2, host="n", pid=1, backend="gloo/cpu",
        device="cpu", device_index=-1, gpu_uuid="", torch_version="", nccl_version="", config={}, settings={},
        epoch=0, iteration=0, pinned_bytes=0, t_ns=1, started_ns=0,
    )  # fmt: skip
    values.update(kw)
    return p.Hello(**values)


def sealed_hello(hello: p.Hello) -> p.Hello:
    """The Hello as the exporter's receiver gets it: sealed, opened, decoded."""
    key = b"k" * 32
    return p.decode(p.open_frames(key, p.seal(key, p.hello_body("s", hello))))


def test_gpu_link_rates_integrate_into_byte_counters_and_throttle_reasons_are_named() -> None:
    m = NodeMetrics("n")
    m.add_tick(tick(10**9, 50.0))
    m.add_tick(tick(10**9 + 100_000_000, 50.0))  # 0.1 s at 50 GB/s
    m.add_tick(tick(10**9 + 300_000_000, 10.0, throttle=0x4 | 0x40))  # 0.2 s at 10 GB/s
    fams = scrape(m)
    labels = {"gpu": "0", "uuid": "GPU-abc"}
    assert sample(fams["commtop_gpu_pcie_tx_bytes"], "commtop_gpu_pcie_tx_bytes_total", **labels) == pytest.approx(7e9)
    assert sample(fams["commtop_gpu_sm_clock_hertz"], "commtop_gpu_sm_clock_hertz", **labels) == 1.98e9
    assert sample(fams["commtop_gpu_power_watts"], "commtop_gpu_power_watts", **labels) == 327.0
    reasons = {s.labels["reason"]: s.value for s in fams["commtop_gpu_throttle_reason"]}
    assert reasons["sw_power_cap"] == 1 and reasons["hw_thermal_slowdown"] == 1 and reasons["gpu_idle"] == 0


def test_a_metric_nvml_cannot_measure_is_absent_not_zero() -> None:
    m = NodeMetrics("n")
    t = tick(10**9, 50.0)
    t.metrics["nvlink_tx_gbps"][0] = np.nan  # "n/a: no NVLink"
    m.add_tick(t)
    m.add_tick(tick(2 * 10**9, 50.0))
    assert scrape(m)["commtop_gpu_nvlink_tx_bytes"][0].value == pytest.approx(100e9)  # only the measured second


@pytest.mark.parametrize(
    ("text", "want"),
    [("9400", ("127.0.0.1", 9400)), ("0", ("127.0.0.1", 0)), ("0.0.0.0:9400", ("0.0.0.0", 9400)),
     ("[::1]:0", ("::1", 0)), ("node-7.cluster:80", ("node-7.cluster", 80))],
)  # fmt: skip
def test_prometheus_address_forms(text: str, want: tuple[str, int]) -> None:
    assert exporter_address.parse(text) == want


@pytest.mark.parametrize("text", ["", "x", "9400x", "127.0.0.1:70000", "-1", "a b:80", "host:"])
def test_a_bad_prometheus_address_is_one_line(text: str) -> None:
    with pytest.raises(exporter_address.AddressError) as err:
        exporter_address.parse(text)
    assert "\n" not in str(err.value) and "--prometheus" in str(err.value)


def test_binding_wider_than_loopback_is_flagged() -> None:
    assert not exporter_address.is_wide("127.0.0.1") and exporter_address.is_wide("0.0.0.0")
    assert "\n" not in exporter_address.warning("0.0.0.0:9400")


def dashboard_queries() -> set[str]:
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for panel in dash["panels"] for t in panel["targets"]]
    exprs += [v["query"]["query"] for v in dash["templating"]["list"] if isinstance(v.get("query"), dict)]
    return set(re.findall(r"commtop_[a-z0-9_]+", " ".join(exprs)))


def test_every_metric_the_dashboard_queries_has_samples_once_fed() -> None:
    """The GPU half needs NVML ticks (none on a CPU machine): fed here from Tick objects;
    tests/test_prometheus_run.py checks the same names against a real run's scrape."""
    m = NodeMetrics("n")
    m.add_message(coll_batch(0, 0, [0, 1], [5.0, 6.0]))
    m.add_message(coll_batch(1, 0, [0, 1], [6.0, 5.0]))
    cols = {k: np.zeros(1) for k in p.COPY_COLUMNS}
    m.add_message(sealed_roundtrip(p.COPY, p.Batch(p.COPY, 0, 0, 0, cols)))
    m.add_tick(tick(10**9, 1.0))
    m.add_tick(tick(2 * 10**9, 1.0))
    names = {s.name for samples in scrape(m).values() for s in samples}
    queried = dashboard_queries()
    assert len(queried) >= 15
    assert queried <= names, sorted(queried - names)
    panels = {panel["type"] for panel in json.loads(DASHBOARD.read_text())["panels"]}
    assert {"heatmap", "table", "timeseries"} <= panels


def test_an_8_gpu_node_of_the_forum_loop_serves_the_series_the_readme_states() -> None:
    """8 ranks x 4 modes of one op and size, one copy kind, 8 GPUs with NVLink: 1,168 series, + 1
    (records taken) here, + 6 process_* in a real scrape = docs/benchmarks.md's 1,175."""
    m = NodeMetrics("n")
    for rank in range(8):
        for mode in range(4):
            m.add_message(coll_batch(rank, mode, [mode * 10 + rank], [50.0], mode=mode))
        cols = {k: np.ones(2) for k in p.COPY_COLUMNS}
        m.add_message(sealed_roundtrip(p.COPY, p.Batch(p.COPY, rank, 0, 0, cols)))
    for t_ns in (10**9, 2 * 10**9):
        ticks = tick(t_ns, 1.0)
        ticks = Tick(**{**ticks.__dict__, "uuids": tuple(f"GPU-{i}" for i in range(8))})
        ticks.metrics.update({k: np.repeat(v, 8) for k, v in ticks.metrics.items()})
        m.add_tick(ticks)
    series = [s for samples in scrape(m).values() for s in samples]
    by_kind = {
        "collective": sum(s.name.startswith("commtop_collective_") for s in series),
        "copy": sum(s.name.startswith("commtop_copy_") for s in series),
        "rank": sum(s.name.startswith("commtop_rank_") for s in series),
        "gpu": sum(s.name.startswith("commtop_gpu_") for s in series),
    }
    assert by_kind == {"collective": 800, "copy": 184, "rank": 56, "gpu": 128}
    assert len(series) == 1168 + 1  # + commtop_exporter_records_total (rejections: none yet)
