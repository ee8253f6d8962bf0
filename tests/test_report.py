"""`commtop report`: numbers checked against statistics computed independently (numpy on the
per-record CSV export and on the original messages), formats, errors, trace and plot."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import subprocess
import sys
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from recording_synth import DEFAULT_EPOCHS, TENSOR, Epoch, synth_run, write_recording

from tui import cli
from tui.report import build, kernels, reading
from workers.wire import protocol as p
from workers.wire.stats import order_positions, percentiles_and_max_sorted

ROOT = Path(__file__).parent.parent


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[Path, list]:
    items = list(synth_run(duration_s=6.0, world=4, seed=11))
    path = tmp_path_factory.mktemp("report") / "run.commtop"
    write_recording(path, items)
    return path, items


def call(capsys, *argv: str) -> tuple[int, str, str]:
    rc = cli.main(["report", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def records_from_csv(text: str) -> dict[str, np.ndarray]:
    rows = list(csv.DictReader(io.StringIO(text)))
    out = {}
    for name in rows[0]:
        values = [r[name] for r in rows]
        if name in ("mode", "op", "overlap", "group", "dtype"):
            out[name] = np.array(values)
        elif name == "overlapped":
            out[name] = np.array(values, dtype=np.float64)
        elif name in ("dur_us", "algbw", "busbw"):
            # 9 significant digits name a float32 exactly; widen the float32 for arithmetic
            out[name] = np.array(values, dtype=np.float64).astype(np.float32).astype(np.float64)
        else:
            out[name] = np.array(values, dtype=np.int64)
    return out


@pytest.mark.e2e
def test_records_csv_has_one_exact_row_per_collective(capsys, run) -> None:
    path, items = run
    rc, out, err = call(capsys, str(path), "--format", "csv", "--records")
    assert rc == 0 and err == ""
    got = records_from_csv(out)
    batches = [m for _, m in items if isinstance(m, p.Batch) and m.kind == p.COLL]
    assert len(got["rank"]) == sum(len(b) for b in batches)
    for name in ("iteration", "step", "epoch", "nbytes", "host_ns", "start_ns"):
        assert got[name].tolist() == np.concatenate([b.columns[name] for b in batches]).tolist()
    for name in ("dur_us", "algbw", "busbw"):  # 9 significant digits: exact for float32
        want = np.concatenate([b.columns[name] for b in batches])
        assert got[name].astype(np.float32).tobytes() == want.tobytes()
    assert set(got["mode"].tolist()) == {"none", "overlap", "sync"}
    assert got["rank"].tolist() == [b.rank for b in batches for _ in range(len(b))]
    assert (got["recv_ns"] > got["start_ns"]).all()


@pytest.mark.e2e
def test_report_numbers_match_numpy_on_the_csv_export(capsys, run) -> None:
    path, _ = run
    _, text, _ = call(capsys, str(path), "--format", "csv", "--records")
    rec = records_from_csv(text)
    rc, out, _ = call(capsys, str(path), "--format", "json")
    assert rc == 0
    doc = json.loads(out)
    rows = {(r["epoch"], r["rank"]): r for r in doc["rows"]}
    epochs = sorted(set(rec["epoch"].tolist()))
    ranks = sorted(set(rec["rank"].tolist()))
    assert set(rows) == {(e, r) for e in epochs for r in [*ranks, None]}
    for e in epochs:
        for r in [*ranks, None]:
            sel = (rec["epoch"] == e) & ((rec["rank"] == r) if r is not None else True)
            d = rec["dur_us"][sel]
            row = rows[(e, r)]
            assert row["count"] == sel.sum()
            assert row["p50_us"] == pytest.approx(np.percentile(d, 50), rel=1e-9)
            assert row["p90_us"] == pytest.approx(np.percentile(d, 90), rel=1e-9)
            assert row["p99_us"] == pytest.approx(np.percentile(d, 99), rel=1e-9)
            assert row["max_us"] == pytest.approx(d.max(), rel=1e-9)
            assert row["algbw_gbps"] == pytest.approx(rec["algbw"][sel].mean(), rel=1e-6)
            assert row["busbw_gbps"] == pytest.approx(rec["busbw"][sel].mean(), rel=1e-6)
            none = (rec["mode"] == "none") & ((rec["rank"] == r) if r is not None else True)
            assert row["slowdown"] == pytest.approx(np.percentile(d, 50) / np.median(rec["dur_us"][none]), rel=1e-9)
            assert row["mode"] == DEFAULT_EPOCHS[e].mode
    for m in doc["modes"]:
        sel = rec["mode"] == m["mode"]
        assert m["count"] == sel.sum()
        assert m["p50_us"] == pytest.approx(np.percentile(rec["dur_us"][sel], 50), rel=1e-9)
        ratio = np.median(rec["dur_us"][sel]) / np.median(rec["dur_us"][rec["mode"] == "none"])
        assert m["slowdown"] == pytest.approx(ratio, rel=1e-9)
    # the synthetic run is 3x slower under overlap and 1.6x under sync (lognormal noise around it)
    slow = {m["mode"]: m["slowdown"] for m in doc["modes"]}
    assert slow["none"] == 1.0 and 2.8 < slow["overlap"] < 3.2 and 1.5 < slow["sync"] < 1.7


@pytest.mark.e2e
def test_overlap_class_columns_match_the_records_csv(capsys, run) -> None:
    """json rows: n / p50 / p99 per overlap class equal numpy's on the records CSV's class column."""
    path, _ = run
    rec = records_from_csv(call(capsys, str(path), "--format", "csv", "--records")[1])
    assert set(rec["overlap"].tolist()) <= {"during", "after", "none"}
    assert ((rec["overlapped"] > 0) == (rec["overlap"] == "during")).all()
    doc = json.loads(call(capsys, str(path), "--format", "json")[1])
    for row in doc["rows"]:
        sel = (rec["epoch"] == row["epoch"]) & ((rec["rank"] == row["rank"]) if row["rank"] is not None else True)
        assert row["during_n"] + row["after_n"] + row["none_n"] == row["count"]
        for key in ("during", "after", "none"):
            d = rec["dur_us"][sel & (rec["overlap"] == key)]
            assert row[f"{key}_n"] == len(d)
            if len(d):
                assert row[f"{key}_p50_us"] == pytest.approx(np.percentile(d, 50), rel=1e-6)
                assert row[f"{key}_p99_us"] == pytest.approx(np.percentile(d, 99), rel=1e-6)
        if row["during_n"]:
            frac = rec["overlapped"][sel & (rec["overlap"] == "during")]
            assert row["during_overlap"] == pytest.approx(frac.mean(), rel=1e-3)
    header = call(capsys, str(path), "--format", "csv")[1].splitlines()[0].split(",")
    assert {"during_n", "during_p50_us", "during_p99_us", "during_overlap", "after_p50_us", "none_p99_us"} <= set(
        header
    )


@pytest.mark.e2e
def test_settings_copies_and_links_per_epoch(capsys, run) -> None:
    path, items = run
    doc = json.loads(call(capsys, str(path), "--format", "json")[1])
    copies = [m for _, m in items if isinstance(m, p.Batch) and m.kind == p.COPY]
    gbps = np.concatenate([c.columns["gbps"] for c in copies]).astype(np.float64)
    epoch_of = np.concatenate([c.columns["epoch"] for c in copies])
    rank_of = np.concatenate([np.full(len(c), c.rank) for c in copies])
    ticks = [(m["t"], np.frombuffer(m["m"]["pcie_tx_gbps"])) for _, m in items if isinstance(m, dict)]
    colls = [m for _, m in items if isinstance(m, p.Batch) and m.kind == p.COLL]
    start = np.concatenate([b.columns["start_ns"] for b in colls])
    end = start + (np.concatenate([b.columns["dur_us"] for b in colls]).astype(np.float64) * 1e3).astype(np.int64)
    ep = np.concatenate([b.columns["epoch"] for b in colls])
    for row in doc["rows"]:
        e, r = row["epoch"], row["rank"]
        want = DEFAULT_EPOCHS[e]
        if want.mode == "none":  # no copies ran: their settings are not shown as if they had
            assert (row["copies"], row["pinned"], row["direction"]) == (None, None, "")
        else:
            assert (row["copies"], row["pinned"], row["direction"]) == (want.copies, want.pinned, want.direction)
        sel = (epoch_of == e) & ((rank_of == r) if r is not None else True)
        assert row["copy_count"] == sel.sum()
        if sel.any():
            assert row["copy_bytes"] == TENSOR
            assert row["copy_gbps"] == pytest.approx(gbps[sel].mean(), rel=1e-6)
        else:
            assert row["copy_gbps"] is None
        t0, t1 = start[ep == e].min(), end[ep == e].max()
        window = [v.mean() for t, v in ticks if t0 <= t <= t1]
        assert row["pcie_tx_gbps"] == pytest.approx(np.mean(window), rel=1e-9)
        assert row["nvlink_tx_gbps"] is None  # n/a in the synthetic telemetry, not 0
        assert row["sm_clock_mhz"] == pytest.approx(1980.0 if e == 0 else 1970.0, abs=5)
        power = [
            np.frombuffer(m["m"]["power_w"]).mean() for _, m in items if isinstance(m, dict) and t0 <= m["t"] <= t1
        ]
        assert row["power_w"] == pytest.approx(np.mean(power), rel=1e-9)


@pytest.mark.e2e
def test_table_and_summary_csv(capsys, run) -> None:
    path, _ = run
    rc, out, err = call(capsys, str(path))
    assert rc == 0 and err == ""
    lines = out.splitlines()
    assert lines[0] == f"commtop report: {path}"
    assert "p50 ms" in out and "slowdown" in out and "per mode (all ranks)" in out
    overlap = [line for line in lines if " overlap " in line and " all " in line and "MiB" in line]
    assert len(overlap) == 1 and "128MiB" in overlap[0] and "d2h" in overlap[0]
    rc, out, _ = call(capsys, str(path), "--format", "csv")
    rows = list(csv.DictReader(io.StringIO(out)))
    assert len(rows) == 3 * 5 and {r["rank"] for r in rows} == {"0", "1", "2", "3", ""}  # "": all ranks
    assert all(r["nvlink_tx_gbps"] == "" for r in rows)


@pytest.mark.e2e
def test_output_file_and_usage_errors(capsys, run, tmp_path: Path) -> None:
    path, _ = run
    out = tmp_path / "r.json"
    assert call(capsys, str(path), "--format", "json", "-o", str(out))[0] == 0
    assert json.loads(out.read_text())["complete"] is True
    rc, _, err = call(capsys, str(path), "--format", "json", "--records")
    assert rc == 1 and err == "commtop report: error: --records needs --format csv\n"
    rc, _, err = call(capsys, str(path), "-o", str(tmp_path / "no" / "dir.txt"))
    assert rc == 1 and err.count("\n") == 1 and "No such file or directory" in err


@pytest.mark.e2e
@pytest.mark.parametrize("content", [b"", b"a,b,c\n1,2,3\n", bytes(range(256)) * 4])
def test_not_a_recording_is_one_line_and_exit_1(capsys, tmp_path: Path, content: bytes) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_bytes(content)
    rc, out, err = call(capsys, str(bad))
    assert rc == 1 and out == ""
    assert err == f"commtop report: error: {bad} is not a commtop recording\n"
    rc, _, err = call(capsys, str(tmp_path / "missing.commtop"))
    assert rc == 1 and err.startswith("commtop report: error: cannot read") and err.count("\n") == 1


@pytest.mark.e2e
def test_the_command_line_exit_code(tmp_path: Path) -> None:
    bad = tmp_path / "x.txt"
    bad.write_text("not a recording\n")
    proc = subprocess.run(
        [sys.executable, "-m", "tui.cli", "report", str(bad)], capture_output=True, text=True, cwd=ROOT
    )
    assert proc.returncode == 1 and proc.stderr == f"commtop report: error: {bad} is not a commtop recording\n"


@pytest.mark.e2e
def test_damaged_recording_reports_with_a_warning(capsys, run, tmp_path: Path) -> None:
    path, _ = run
    data = path.read_bytes()
    cut = tmp_path / "cut.commtop"
    cut.write_bytes(data[: len(data) * 2 // 3])
    rc, out, err = call(capsys, str(cut), "--format", "json")
    assert rc == 0
    assert err.startswith("commtop report: warning: recording incomplete: cut at byte")
    doc = json.loads(out)
    assert doc["complete"] is False and 0 < doc["records"]


@pytest.mark.e2e
def test_cpu_run_without_hellos_or_telemetry(capsys, tmp_path: Path) -> None:
    """What a bare recording still gives: settings counted from the records, links n/a."""
    epochs = (Epoch(0.0, "none", copies=0), Epoch(1.0, "overlap", copies=3, pinned=False, direction="h2d"))
    items = [
        (t, m)
        for t, m in synth_run(duration_s=2.0, world=2, epochs=epochs, telemetry=False)
        if not isinstance(m, p.Hello)
    ]
    path = tmp_path / "bare.commtop"
    write_recording(path, items)
    doc = json.loads(call(capsys, str(path), "--format", "json")[1])
    row = next(r for r in doc["rows"] if r["epoch"] == 1 and r["rank"] is None)
    assert (row["mode"], row["copies"], row["pinned"], row["direction"]) == ("overlap", 3.0, False, "h2d")
    assert row["pcie_tx_gbps"] is None and row["sm_clock_mhz"] is None
    assert doc["meta"]["ranks"] == []


@pytest.mark.e2e
def test_window_limits_every_output(capsys, run, tmp_path: Path) -> None:
    path, _ = run
    _, text, _ = call(capsys, str(path), "--format", "csv", "--records")
    everything = records_from_csv(text)
    rc, text, _ = call(capsys, str(path), "--format", "csv", "--records", "--window", "2.5:3.5")
    assert rc == 0
    part = records_from_csv(text)
    rel = (everything["start_ns"] - everything["start_ns"].min()) / 1e9
    assert part["start_ns"].tolist() == everything["start_ns"][(rel >= 2.5) & (rel <= 3.5)].tolist()
    doc = json.loads(call(capsys, str(path), "--format", "json", "--window", "2.5:3.5")[1])
    assert {r["epoch"] for r in doc["rows"]} == {1} and doc["records"] == len(part["rank"])
    out = tmp_path / "w.json"
    call(capsys, str(path), "--trace", str(out), "--window", "2.5:")
    events = json.loads(out.read_text())["traceEvents"]
    assert {e["args"]["epoch"] for e in events if e["ph"] == "X"} == {1, 2}
    with pytest.raises(SystemExit) as exc:
        cli.main(["report", str(path), "--window", "5:1"])
    assert exc.value.code == 2
    assert "expected FROM:TO in seconds" in capsys.readouterr().err


# --------------------------------------------------------------------------- trace and plot


@pytest.mark.e2e
def test_trace_is_perfetto_json_with_the_expected_tracks(capsys, run, tmp_path: Path) -> None:
    path, items = run
    out = tmp_path / "t.json"
    rc, stdout, err = call(capsys, str(path), "--trace", str(out))
    assert rc == 0 and stdout == "" and "trace events" in err
    doc = json.loads(out.read_text())
    events = doc["traceEvents"]
    assert doc["otherData"]["complete"] is True and doc["otherData"]["schema_version"] == p.SCHEMA_VERSION
    names = {(e["pid"], e["args"]["name"]) for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {(r, f"rank {r} · node0 · NVIDIA H200 {r}") for r in range(4)}
    threads = {(e["pid"], e["tid"], e["args"]["name"]) for e in events if e["name"] == "thread_name"}
    assert threads == {(r, t, n) for r in range(4) for t, n in ((1, "collectives"), (2, "copies"))}
    colls = [e for e in events if e["ph"] == "X" and e["cat"] == "collective"]
    copies = [e for e in events if e["ph"] == "X" and e["cat"] == "copy"]
    batches = [m for _, m in items if isinstance(m, p.Batch)]
    assert len(colls) == sum(len(b) for b in batches if b.kind == p.COLL)
    assert len(copies) == sum(len(b) for b in batches if b.kind == p.COPY)
    # named by the stream: op, size (S of nccl-tests: 4 x 128 MiB), group (the loop's dtype is not in its records)
    assert {e["name"] for e in colls} == {"all_gather 512MiB · group 0"} and {e["tid"] for e in colls} == {1}
    assert {e["name"] for e in copies} == {"d2h copy (pinned)"} and {e["tid"] for e in copies} == {2}
    assert min(e["ts"] for e in colls + copies) == 0.0
    first = batches[0]
    assert colls[0]["dur"] == pytest.approx(float(first.columns["dur_us"][0]), abs=1e-3)
    counters = [e for e in events if e["ph"] == "C"]
    assert {e["name"] for e in counters} == {"PCIe GB/s", "clocks MHz"}  # no NVLink values: no NVLink track
    assert {e["pid"] for e in counters} == {0, 1, 2, 3}
    assert all(set(e["args"]) <= {"tx", "rx", "sm", "mem"} for e in counters)
    marks = [e for e in events if e["ph"] == "i"]
    assert [m["name"].split(":")[0] for m in marks] == ["epoch 0", "epoch 1", "epoch 2"]
    assert "mode=overlap" in marks[1]["name"]


@pytest.mark.e2e
def test_plot_writes_a_png(capsys, run, tmp_path: Path) -> None:
    path, _ = run
    out = tmp_path / "p.png"
    rc, _, err = call(capsys, str(path), "--plot", str(out))
    assert rc == 0 and err == f"commtop report: wrote {out}\n"
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 20_000


@pytest.mark.e2e
def test_plot_without_matplotlib_is_one_line(run, tmp_path: Path) -> None:
    path, _ = run
    code = (
        "import sys; sys.modules['matplotlib'] = None\n"
        "from tui import cli\n"
        f"raise SystemExit(cli.main(['report', {str(path)!r}, '--plot', {str(tmp_path / 'p.png')!r}]))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 1
    assert (
        proc.stderr == "commtop report: error: --plot needs matplotlib: pip install 'commtop[plot]' "
        "(in a checkout: pip install -e '.[plot]'; or pip install matplotlib)\n"
    )
    assert not (tmp_path / "p.png").exists()


@pytest.mark.e2e
def test_an_empty_recording_reports_replays_and_plots(capsys, tmp_path: Path) -> None:
    from tui.recordings.replay import open_replay

    path = str(tmp_path / "empty.commtop")  # the Recorder removes such a file; one made elsewhere still reads
    write_recording(path, [])
    rc, out, err = call(capsys, path, "--format", "json", "--plot", str(tmp_path / "p.png"))
    assert rc == 0 and json.loads(out)["rows"] == [] and json.loads(out)["complete"] is True
    src = open_replay(path)
    assert src.poll(0) == [] and src.position().finished
    src.close()


@pytest.mark.e2e
def test_trace_puts_every_host_on_the_reference_clock(capsys, tmp_path: Path) -> None:
    """Ranks 2-3 on a second host: shifting that host's clock by 250 ms changes the stated
    offset by 250 ms and leaves the trace's timeline unchanged."""
    import dataclasses

    def trace(skew_ns: int) -> tuple[dict, dict[tuple[int, int], float]]:
        items = []
        for t, m in synth_run(duration_s=2.0, world=4, seed=3):
            if isinstance(m, p.Hello) and m.rank >= 2:
                m = dataclasses.replace(m, host="node1")
            elif isinstance(m, p.Batch) and m.rank >= 2:
                m = dataclasses.replace(m, columns=dict(m.columns, start_ns=m.columns["start_ns"] + skew_ns))
            items.append((t, m))
        path = tmp_path / f"skew{skew_ns}.commtop"
        write_recording(path, items)
        out = tmp_path / f"skew{skew_ns}.json"
        rc, _, _ = call(capsys, str(path), "--trace", str(out))
        assert rc == 0
        doc = json.loads(out.read_text())
        ends = {
            (e["pid"], e["args"]["iteration"]): e["ts"] + e["dur"]
            for e in doc["traceEvents"]
            if e["ph"] == "X" and e["cat"] == "collective"
        }
        return doc["otherData"]["host_clock_offsets_ms"], ends

    offsets0, ends0 = trace(0)
    offsets1, ends1 = trace(250_000_000)
    assert offsets1["node1"] - offsets0["node1"] == pytest.approx(250.0, abs=0.001)
    common = [i for (r, i) in ends0 if r == 0 and (2, i) in ends0]
    assert len(common) > 50
    for i in common:
        gap0 = ends0[(2, i)] - ends0[(0, i)]
        gap1 = ends1[(2, i)] - ends1[(0, i)]
        assert gap1 == pytest.approx(gap0, abs=0.01), f"iteration {i}: host clocks not aligned"


@pytest.mark.e2e
def test_a_cut_recording_started_before_any_hello_names_its_ranks_from_the_data(capsys, run, tmp_path: Path) -> None:
    """`commtop run --record` opens the file before the first Hello (an empty header); a cut
    file has no trailer to fill it in: the report takes the ranks and hosts from the Hellos."""
    from tui.recordings.writer import RecordingWriter

    _, items = run
    path = tmp_path / "early.commtop"
    writer = RecordingWriter(open(path, "wb"), {"schema_version": p.SCHEMA_VERSION})
    writer.write_chunk(items[: len(items) // 2])
    writer.flush()  # no trailer: the writer was killed
    hellos = {m.rank: m for _, m in items[: len(items) // 2] if isinstance(m, p.Hello)}
    assert len(hellos) == 4
    rc, out, err = call(capsys, str(path))
    assert rc == 0 and "incomplete" in out and err == ""  # said once, in the table
    hosts = ", ".join(sorted({h.host for h in hellos.values()}))
    assert f"; ranks 4 on {hosts};" in out.splitlines()[1]
    rc, out, _ = call(capsys, str(path), "--format", "json")
    meta = json.loads(out)["meta"]
    assert meta["ranks"] == [0, 1, 2, 3] and meta["world_size"] == 4 and meta["backend"] == hellos[0].backend


@pytest.mark.parametrize(
    "ranks, epochs",
    [
        (np.arange(8), np.arange(-1, 5)),  # dense ids (radix-sorted uint16), a "no epoch" -1 among them
        (np.array([0, 3, 70_000]), np.arange(3)),  # a rank span too wide for 16-bit ids: np.unique
    ],
)
def test_grouping_is_the_stable_sort_by_epoch_then_rank(ranks, epochs) -> None:
    rng = np.random.default_rng(7)
    n = 50_000
    epoch = rng.choice(epochs, n).astype(np.int32)
    rank = rng.choice(ranks, n).astype(np.int32)
    g = kernels._group(epoch, rank)
    keys = (epoch.astype(np.int64) << 20) | rank
    want = np.argsort(keys, kind="stable")
    assert np.array_equal(g.order, want)
    sorted_keys = keys[want]
    starts = np.flatnonzero(np.r_[True, sorted_keys[1:] != sorted_keys[:-1]])
    ends = np.r_[starts[1:], n]
    assert g.runs == list(zip(sorted_keys[starts].tolist(), starts.tolist(), ends.tolist(), strict=True))
    for (_, a, b), gid in zip(g.runs, g.ids, strict=True):  # ids name the same records
        assert np.array_equal(np.flatnonzero(g.gid == gid), np.sort(want[a:b]))
    sums = kernels._group_sums(g.gid, np.ones(n, dtype=np.float32), g.span)
    assert [sums[i] for i in g.ids] == [b - a for _, a, b in g.runs]


def test_combo_codes_cover_rare_and_many_sizes() -> None:
    rng = np.random.default_rng(3)
    n = 200_000
    for distinct in (1, 3, 200):
        op = rng.integers(0, 3, n).astype(np.uint8) if distinct > 1 else np.zeros(n, dtype=np.uint8)
        nbytes = rng.choice(np.arange(1, distinct + 1) << 10, n).astype(np.int64)
        nbytes[12_345] = 7  # one record of a size the sample cannot see
        codes, combos = kernels._combo_codes(op, nbytes)
        assert np.array_equal(np.array(combos, dtype=np.int64)[codes], (op.astype(np.int64) << 48) | nbytes)
        assert combos == sorted(set(combos))  # codes ascend with the combo


@pytest.mark.e2e
def test_copy_bandwidth_as_a_share_of_the_pcie_peak_on_the_h200_recording(capsys) -> None:
    """The committed H200 recording (PCIe Gen5 x16, no NVLink): pinned copies at ~87 % of the
    theoretical 63 GB/s, pageable far below; no NVLink share (n/a, not 0)."""
    path = Path(__file__).resolve().parent.parent / "recordings" / "h200-nccl-1gpu-all_gather-modes.commtop"
    rc, out, _ = call(capsys, str(path), "--format", "json")
    assert rc == 0
    rows = {r["epoch"]: r for r in json.loads(out)["rows"] if r["rank"] is None}
    for epoch, row in rows.items():
        assert row["busbw_pct_nvlink"] is None
        if row["copy_gbps"] is None:
            assert row["copy_pct_pcie"] is None
        else:  # Gen5 x16: 16 lanes x 32 GT/s x 128/130 / 8 = 63.0 GB/s
            assert row["copy_pct_pcie"] == pytest.approx(row["copy_gbps"] / 63.015 * 100, rel=1e-3), epoch
    assert 80 < rows[1]["copy_pct_pcie"] < 95 and rows[5]["copy_pct_pcie"] < 30  # pinned / pageable
    text = call(capsys, str(path))[1]
    assert "link peaks (theoretical, from NVML): PCIe Gen5 x16 63.0 GB/s per direction; no NVLink" in text


@pytest.mark.parametrize(
    ("name", "printed"),
    [
        # what `commtop ab` printed on the H200 (benchmarks/device/h200_ab.sh, 2026-12-02), verdict without the peak
        ("overlap", "mode=overlap vs mode=none: p50 +1.8 % [+1.7, +1.8] · during copies +1.8 % · copies 55.1 GB/s"),
        (
            "sync",
            "mode=sync vs mode=none: p50 +1.1 % [-0.2, +2.5] no detectable difference · after +1.1 % · copies 55.2 GB/s",
        ),
    ],
)
@pytest.mark.e2e
def test_h200_ab_recordings_reproduce_the_verdict_printed_live(capsys, name: str, printed: str) -> None:
    path = Path(__file__).resolve().parent.parent / "recordings" / f"h200-nccl-1gpu-ab-none-{name}.commtop"
    rc, out, _ = call(capsys, str(path), "--format", "json")
    assert rc == 0
    (ab,) = json.loads(out)["ab"]
    assert ab["verdict"] == printed + " · 15 pairs"
    assert ab["pairs"] == 15 and ab["classes"]["all"]["p50"]["pairs"] == 15


def test_sorting_each_epoch_once_gives_the_report_that_sorting_every_subset_gives(tmp_path: Path, monkeypatch) -> None:
    """build_report sorts an epoch once and reads its ranks' and classes' percentiles, and the
    settings rows of repeated settings (none -> overlap -> none -> overlap), out of that order.
    Forcing the per-subset sorts (no order for any epoch) must give the same report, bit for bit."""
    from recording_synth import Epoch

    from tui.recordings.reader import open_recording
    from tui.report.text import format_table

    epochs = [Epoch(0.0, "none"), Epoch(1.0, "overlap"), Epoch(2.0, "none"), Epoch(3.0, "overlap", copies=3)]
    path = tmp_path / "repeat.commtop"
    write_recording(path, list(synth_run(duration_s=4.0, world=3, epochs=epochs, seed=5)))
    fast = build.build_report(open_recording(path))
    assert len(fast.settings) == 3 and any(len(r.epochs) == 2 for r in fast.settings)
    monkeypatch.setattr(kernels._EpochOrder, "of", classmethod(lambda cls, *a: None))
    slow = build.build_report(open_recording(path))
    assert repr(fast) == repr(slow)  # every field (repr: NaN equals NaN there)
    assert format_table(fast) == format_table(slow)


def test_the_report_of_columns_decoded_on_two_threads_and_grouped_early_is_the_same(
    tmp_path: Path, monkeypatch
) -> None:
    """A large recording's columns decode on two threads and its records are grouped while they
    do (tui.recordings.bulk): with that path forced on a small one, the report is the one built
    from tables read on one thread and grouped afterwards, bit for bit."""
    from recording_synth import Epoch

    from tui.recordings import bulk
    from tui.recordings.reader import open_recording
    from tui.report.text import format_table

    epochs = [Epoch(0.0, "none"), Epoch(1.0, "overlap", copies=3), Epoch(2.0, "sync")]
    path = tmp_path / "run.commtop"
    write_recording(path, list(synth_run(duration_s=3.0, world=3, epochs=epochs, seed=9)), chunk_s=0.1)
    one = build.build_report(open_recording(path))
    monkeypatch.setattr(bulk, "PARALLEL_RECORDS", 0)
    monkeypatch.setattr(bulk, "usable_cpus", lambda: 2)
    with open_recording(path) as rec:
        tables = reading.report_tables(rec)
        assert tables.coll_grouped is not None
        two = build.build_report(rec, tables)
    assert repr(one) == repr(two)  # every field (repr: NaN equals NaN there)
    assert format_table(one) == format_table(two)


def test_baselines_read_out_of_the_sorted_epochs_are_the_baselines_of_the_records(tmp_path: Path, monkeypatch) -> None:
    """Mode none's medians (per rank and over all ranks, the slowdown's baseline) come out of
    the epochs' sorted orders when every none record is in a none-only epoch; computing them from
    the records as before must give the same report, bit for bit, with one none epoch or two."""
    from recording_synth import Epoch

    from tui.recordings.reader import open_recording

    real = build._baselines_of_pure_epochs
    for epochs in (
        [Epoch(0.0, "none"), Epoch(1.0, "overlap"), Epoch(2.0, "none"), Epoch(3.0, "sync")],
        [Epoch(0.0, "none"), Epoch(2.0, "overlap")],
    ):
        path = tmp_path / f"repeat{len(epochs)}.commtop"
        write_recording(path, list(synth_run(duration_s=4.0, world=3, epochs=epochs, seed=7)))
        taken: list = []

        def spy(*a, taken=taken):
            taken.append(real(*a))
            return taken[-1]

        monkeypatch.setattr(build, "_baselines_of_pure_epochs", spy)
        fast = build.build_report(open_recording(path))
        assert taken and taken[0] is not None and len(taken[0][1]) == 3  # read out of the orders, 3 ranks
        assert any(math.isfinite(r.slowdown) and r.slowdown > 1.5 for r in fast.rows)
        monkeypatch.setattr(build, "_baselines_of_pure_epochs", lambda *a: None)
        slow = build.build_report(open_recording(path))
        assert repr(fast) == repr(slow)


def test_a_recording_without_copies_puts_every_collective_in_no_copies(tmp_path: Path) -> None:
    """Without copy records every collective is in the class "no copies", exactly what the
    classifier says of them; the step column is read all the same (the step view needs it)."""
    from recording_synth import Epoch

    from tui.recordings.reader import open_recording
    from workers.wire.overlap import classify_columns

    path = tmp_path / "nocopies.commtop"
    items = [
        (t, m)
        for t, m in synth_run(duration_s=2.0, world=2, seed=3)
        if not (isinstance(m, p.Batch) and m.kind == p.COPY)
    ]
    write_recording(path, items)
    with open_recording(path) as rec:
        assert "step" in reading.report_columns(rec)
        tables = rec.tables()
        assert len(tables.coll["rank"]) and not len(tables.copy["rank"])
        cls, frac = classify_columns(tables.coll, tables.copy)
        assert cls.dtype == np.uint8 and frac.dtype == np.float32 and not cls.any() and not frac.any()
        lean = build.build_report(rec)
        full = build.build_report(rec, tables)
        assert repr(lean) == repr(full)
        assert all(r.none_n == r.count for r in lean.rows)
    with_copies = tmp_path / "copies.commtop"
    write_recording(with_copies, list(synth_run(duration_s=2.0, world=2, epochs=[Epoch(0.0, "overlap")], seed=3)))
    with open_recording(with_copies) as rec:
        assert reading.report_columns(rec) == reading.REPORT_COLUMNS


@settings(max_examples=80, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 6), min_size=1, max_size=40),
    seed=st.integers(0, 2**32 - 1),
    wide=st.booleans(),
    mid_batch=st.booleans(),
)
def test_records_grouped_by_their_batches_are_grouped_as_one_by_one(
    sizes, seed: int, wide: bool, mid_batch: bool
) -> None:
    """Grouping by batches (each one rank's; the epoch changing only where a batch starts) gives
    the stable order, runs, ids and per-record ids that grouping the records one by one gives;
    an epoch that changes inside a batch is grouped record by record, with the same result."""
    rng = np.random.default_rng(seed)
    n = sum(sizes)
    brank = rng.integers(0, 3 if not wide else 1 << 19, len(sizes))
    bepoch = np.sort(rng.integers(-2, 3, len(sizes))) if not wide else rng.integers(-(1 << 40), 1 << 40, len(sizes))
    rank = np.repeat(brank, sizes).astype(np.int32)
    epoch = np.repeat(bepoch, sizes).astype(np.int64 if wide else np.int32)
    if mid_batch and n:
        epoch[rng.integers(0, n)] += 1  # may land inside a batch
    batches = np.array(sizes, dtype=np.int64)
    want, got = kernels._group(epoch, rank), kernels._group(epoch, rank, batches)
    assert got.runs == want.runs and got.ids == want.ids and got.span == want.span
    assert np.array_equal(got.order, want.order) and np.array_equal(got.gid, want.gid)
    assert got.gid.dtype == want.gid.dtype
    changes = set((np.flatnonzero(epoch[1:] != epoch[:-1]) + 1).tolist())
    firsts = set((np.cumsum(batches) - batches)[batches > 0].tolist())
    by_batches = kernels._group_batches(epoch, rank, batches) if n else None
    assert (by_batches is not None) == (n > 0 and changes <= firsts)


@contextlib.contextmanager
def _placing(on: bool):
    """The report's one-class orders placed at its percentile positions (``on``) or sorted,
    whatever this machine's timing chose (kernels._placing_is_faster), for arrays of any size."""
    with (
        mock.patch.object(kernels, "_CHOOSE_AT", 0),
        mock.patch.object(kernels, "_placing_is_faster", lambda: on),
    ):
        yield


def _assert_in_order(values: np.ndarray, want_sorted: np.ndarray, placed: bool) -> None:
    """``values`` are ``want_sorted``'s: the same array, or (``placed``) the same values with
    the sorted array's at every position the report reads, and the same percentiles."""
    if not placed:
        assert values.tobytes() == want_sorted.tobytes()
        return
    assert np.sort(values).tobytes() == want_sorted.tobytes()
    kth = order_positions(len(values), kernels.REPORT_QS)
    assert values[kth].tobytes() == want_sorted[kth].tobytes()
    if len(values):
        assert repr(percentiles_and_max_sorted(values, kernels.REPORT_QS)) == repr(
            percentiles_and_max_sorted(want_sorted, kernels.REPORT_QS)
        )


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 50), min_size=1, max_size=6),
    cls=st.integers(0, 2),
    seed=st.integers(0, 2**32 - 1),
    zeros=st.booleans(),
    placed=st.booleans(),
)
def test_an_epoch_of_one_class_is_ordered_as_the_packed_keys_order_it(
    sizes, cls: int, seed: int, zeros: bool, placed: bool
) -> None:
    """One overlap class in the epoch: each rank's float32 durations and the epoch's, sorted or
    placed at the report's percentile positions, give the epoch's, each rank's and each
    class's durations in order where the report reads them exactly as the uint64 keys do."""
    rng = np.random.default_rng(seed)
    dur = rng.choice(np.array([0.0, 1.5, 2700.25, 1e-30, 3e38], dtype=np.float32), sum(sizes))
    if not zeros:
        dur = rng.lognormal(8, 0.3, sum(sizes)).astype(np.float32)
    with _placing(placed):
        one = kernels._EpochOrder.of(dur, np.full(len(dur), cls, dtype=np.uint8), sizes)
    odd = np.full(len(dur) + 1, cls, dtype=np.uint8)
    odd[-1] = (cls + 1) % 3  # one record of another class: the packed keys
    keys = kernels._EpochOrder.of(np.append(dur, np.float32(dur[0])), odd, [*sizes[:-1], sizes[-1] + 1])
    assert one is not None and keys is not None
    _assert_in_order(one.values, np.sort(dur), placed)
    for index in range(-1, len(sizes)):
        values, by_class = one.group(index)
        a = 0 if index < 0 else sum(sizes[:index])
        b = len(dur) if index < 0 else a + sizes[index]
        _assert_in_order(values, np.sort(dur[a:b]), placed)
        assert by_class[cls].tobytes() == values.tobytes()
        assert all(len(v) == 0 for c, v in by_class.items() if c != cls)
        if 0 <= index < len(sizes) - 1:  # ranks the extra record is not in: the same as the keys give
            _assert_in_order(values, keys.group(index)[0], placed)


@pytest.mark.parametrize("placed", [False, True])
@pytest.mark.parametrize("classes", [(0, 0), (1, 1), (0, 2), (1, 2)])
def test_epochs_of_one_class_each_merged_split_by_class_as_their_values_say(
    classes: tuple[int, int], placed: bool
) -> None:
    """Two epochs, each of one overlap class, merged (a settings or mode row over both): each
    class's durations are those of the epochs of that class, in order where the report reads
    them, whether the classes are the same (no counting) or differ (counted on the merged
    classes, which a sort puts in order whether the epochs were sorted or placed)."""
    rng = np.random.default_rng(7)
    durs = [rng.lognormal(8, 0.3, n).astype(np.float32) for n in (40, 25)]
    with _placing(placed):
        parts = [
            kernels._EpochOrder.of(d, np.full(len(d), c, dtype=np.uint8), [len(d) // 2, len(d) - len(d) // 2])
            for d, c in zip(durs, classes, strict=True)
        ]
        merged = kernels._EpochOrder.union(parts)
    assert merged is not None
    values, by_class = merged.group(-1)
    _assert_in_order(values, np.sort(np.concatenate(durs)), placed and classes[0] == classes[1])
    for c in (0, 1, 2):
        mine = [d for d, k in zip(durs, classes, strict=True) if k == c]
        want = np.sort(np.concatenate(mine)) if mine else np.zeros(0, dtype=np.float32)
        _assert_in_order(by_class[c], want, placed and classes[0] == classes[1])


@pytest.mark.parametrize("placed", [False, True])
def test_a_report_of_placed_epochs_is_the_report_of_sorted_ones(tmp_path: Path, placed: bool) -> None:
    """Every number of a report whose one-class epochs are placed at the percentile positions
    is the number it has when they are sorted, and when no epoch has an order at all (per-subset
    sorts): the percentiles, medians, baselines and slowdowns read only those positions."""
    from tui.recordings.reader import open_recording

    # no copies: every epoch of one class (an epoch with copies sorts its packed keys)
    epochs = [Epoch(0.0, "none", copies=0), Epoch(1.0, "sync", copies=0), Epoch(2.0, "none", copies=0)]
    epochs.append(Epoch(3.0, "sync", copies=0))
    path = tmp_path / "run.commtop"
    write_recording(path, list(synth_run(duration_s=4.0, world=3, epochs=epochs, seed=11)))
    with _placing(placed):
        ordered = build.build_report(open_recording(path))
    with mock.patch.object(kernels._EpochOrder, "of", classmethod(lambda cls, *a: None)):
        per_subset = build.build_report(open_recording(path))
    assert any(r.rank is not None for r in ordered.rows) and ordered.modes and ordered.settings
    assert repr(ordered) == repr(per_subset)


@pytest.mark.parametrize("in_order", [True, False])
def test_a_runs_busy_time_a_block_at_a_time_is_the_whole_runs(in_order: bool) -> None:
    """The step view's time in collectives per (epoch, rank) run, taken BUSY_BLOCK records at a
    time, is busy_ns over the whole run: intervals that reach across a block's end count once,
    and a run whose starts are out of order is taken whole."""
    from tui.model.steps import busy_ns
    from tui.report import steps_report
    from workers.wire.overlap import end_ns

    rng = np.random.default_rng(11)
    n = 3 * steps_report.BUSY_BLOCK + 17
    start = np.cumsum(rng.integers(0, 3000, n)).astype(np.int64)
    if not in_order:
        start[[5, n - 5]] = start[[n - 5, 5]]
    dur = rng.lognormal(0.5, 1.5, n).astype(np.float32)  # some reach past several later starts
    want = busy_ns(start, end_ns(start, dur), -(2**62))[0]
    assert steps_report._busy_of_run(start, dur) == want
    # a block-local busy time (no carry across blocks) would count the overlaps twice
    blocks = sum(
        busy_ns(
            start[a : a + steps_report.BUSY_BLOCK],
            end_ns(start[a : a + steps_report.BUSY_BLOCK], dur[a : a + steps_report.BUSY_BLOCK]),
            -(2**62),
        )[0]
        for a in range(0, n, steps_report.BUSY_BLOCK)
    )
    if in_order:
        assert blocks != want


def test_the_steps_pass_on_several_threads_gives_the_report_of_one_thread(tmp_path: Path, monkeypatch) -> None:
    """The steps' pass walks the (epoch, rank) runs on side threads (one where two CPUs are
    usable, more where more are) and on the main thread once its sorts are done
    (tui.report.steps_report.RunWalk): the report must be the one-thread report bit for bit,
    for the forum loop's epochs and for a job of several process groups (each run split by
    group), and every thread must really have joined the walk."""
    import threading

    from job_synth import job_run
    from recording_synth import Epoch

    from tui.recordings import bulk
    from tui.recordings.reader import open_recording
    from tui.report import steps_report
    from tui.report.text import format_table

    epochs = [Epoch(0.0, "none"), Epoch(1.0, "overlap", copies=3), Epoch(2.0, "sync")]
    loop, job = tmp_path / "loop.commtop", tmp_path / "job.commtop"
    write_recording(loop, list(synth_run(duration_s=3.0, world=4, epochs=epochs, seed=4)))
    write_recording(job, list(job_run(world=4, steps=40)))
    real_work = steps_report.RunWalk.work

    def joined(walk, seen: list[str]):  # type: ignore[no-untyped-def]
        seen.append(threading.current_thread().name)
        real_work(walk)

    for path in (loop, job):
        alone = _walked(path, threads=0)  # this thread alone
        reports, walkers = [], []
        for cpus in (2, 16):
            for module in (build, bulk):
                monkeypatch.setattr(module, "usable_cpus", lambda cpus=cpus: cpus)
            seen: list[str] = []
            monkeypatch.setattr(steps_report.RunWalk, "work", lambda walk, seen=seen: joined(walk, seen))
            reports.append(build.build_report(open_recording(path)))
            walkers.append(seen)
        monkeypatch.setattr(steps_report.RunWalk, "work", real_work)
        one, many = reports
        for seen, side in zip(walkers, (1, build.MAX_STEP_THREADS), strict=True):  # a pool thread may join twice
            assert sorted(seen) == ["MainThread"] + sorted(seen)[1:] and len(seen) == side + 1, seen
            assert all(name.startswith("commtop-step-runs") for name in seen if name != "MainThread"), seen
        assert one.steps and one.groups, path.name
        assert repr(one) == repr(many), path.name  # every field (repr: NaN equals NaN there)
        assert format_table(one) == format_table(many)
        assert repr(_walked(path, threads=3)) == repr(alone)


def _walked(path: Path, threads: int):  # type: ignore[no-untyped-def]
    """The steps' pass of a recording walked by ``threads`` pool threads and this one."""
    from concurrent.futures import ThreadPoolExecutor

    from tui.report import steps_report

    walk = steps_report.RunWalk(*_walk_args(path))
    with ThreadPoolExecutor(max_workers=max(threads, 1)) as pool:
        walking = [pool.submit(walk.work) for _ in range(threads)]
        walk.work()
        for done in walking:
            done.result()
    return walk.result()


def _walk_args(path: Path) -> tuple:
    """What build_report hands the steps' pass of a recording: (groups, columns, sorted
    durations, each record's group, one group)."""
    from tui.recordings.reader import open_recording

    rec = open_recording(path)
    tables, g, sums = build._grouped(rec, reading.report_tables(rec))
    world = len(rec.meta.get("ranks") or []) or int(rec.meta.get("world_size") or 0)
    names = build.group_names(
        tables.coll["rank"], tables.coll["group"], tables.hellos, world, sorted({k & 0xFFFFF for k, _, _ in g.runs})
    )
    recs, _ = build._sorted_records(tables, g, sums, names)
    return g, tables.coll, recs.dur32, names.index, names.single
