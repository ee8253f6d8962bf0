"""`commtop report FILE --plot out.png`: latency over time per rank coloured by mode (the
synthetic loop) or by stream (a user's job, or a run of several streams: process group, op,
dtype, size), and the links underneath. matplotlib is an optional extra (``pip install
'commtop[plot]'``); without it the command says so in one line."""

from __future__ import annotations

import numpy as np

from tui.model.job import JobInfo
from tui.recordings.codec import Tables
from tui.recordings.reader import Recording
from tui.report.trace import stream_labels
from tui.report.views_text import size_cell
from workers.wire import protocol as p

MODE_COLOURS = {"none": "#4c72b0", "overlap": "#dd8452", "sync": "#c44e52", "sync-barrier": "#8172b3"}
#: Streams drawn in a colour of their own (the most frequent); the rest are "other", grey.
STREAM_COLOURS = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#8c8c8c", "#ccb974")
MAX_POINTS = 300_000  # per plot; more only costs time and ink


def matplotlib_missing() -> str:
    """ "" when matplotlib can be imported, else the one-line error to show."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return (
            "--plot needs matplotlib: pip install 'commtop[plot]' (in a checkout: pip install -e '.[plot]'; "
            "or pip install matplotlib)"
        )
    return ""


def plot_recording(rec: Recording, tables: Tables, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    coll = tables.coll
    starts = [a.min() for a in (coll["start_ns"], tables.copy["start_ns"]) if len(a)]
    base = int(min(starts)) if starts else rec.first_ns
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(13, 7.5), sharex=True, height_ratios=(3, 2))
    n = len(coll["dur_us"])
    step = max(1, n // MAX_POINTS)
    t = (coll["start_ns"][::step] - base) / 1e9
    lat = coll["dur_us"][::step].astype(np.float64) / 1e3
    ranks = coll["rank"][::step]
    for sel, colour, name in _colour_groups(rec, tables, step):
        if sel.any():
            top.scatter(t[sel], lat[sel], s=2, c=colour, label=name, alpha=0.6, linewidths=0)
    # a thin line per rank (median per time bin) so a straggler stands out from the cloud (of one
    # stream: a median over several streams says nothing)
    if n and not _by_stream(rec, tables):
        width = max(0.05, float(t.max()) / 150)
        bins = np.floor(t / width).astype(np.int64)
        for r in np.unique(ranks).tolist()[:64]:
            sel = ranks == r
            b, inv = np.unique(bins[sel], return_inverse=True)
            med = np.array([np.median(lat[sel][inv == i]) for i in range(len(b))])
            top.plot((b + 0.5) * width, med, lw=0.6, color="black", alpha=0.3)
    top.set_ylabel("collective latency (ms)")
    top.set_yscale("log")
    top.yaxis.set_major_locator(matplotlib.ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
    top.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    top.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    if n:
        top.legend(title="stream" if _by_stream(rec, tables) else "mode", markerscale=4, loc="upper left", fontsize=8)
    else:
        top.text(0.5, 0.5, "no collective records", ha="center", va="center", transform=top.transAxes)
    title = f"{rec.path}: {n:,} collectives, ranks {len(np.unique(coll['rank'])) if n else 0}"
    top.set_title(title + ("" if rec.complete else " (incomplete recording)"), fontsize=10)
    _links(bottom, tables, base)
    changes = _changes(coll, base)
    for ax in (top, bottom):
        for x, _ in changes:
            ax.axvline(x, color="grey", ls="--", lw=0.8)
        ax.grid(alpha=0.3)
    for x, label in changes:  # what the settings became, at the top of each line
        top.annotate(
            label,
            (x, 1.0),
            xycoords=("data", "axes fraction"),
            xytext=(2, -2),
            textcoords="offset points",
            rotation=90,
            va="top",
            fontsize=7,
            color="dimgrey",
        )
    bottom.set_xlabel("time (s)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _by_stream(rec: Recording, tables: Tables) -> bool:
    """Colour by stream: a user's job without modes, or several streams."""
    config = rec.meta.get("config") or next((h.config for _, h in tables.hellos), {})
    if not JobInfo.of(config).has_modes:
        return True
    coll = tables.coll
    return len(coll["op"]) > 0 and any(
        bool((coll[c] != coll[c][0]).any()) for c in ("op", "nbytes", "group", "dtype") if c in coll
    )


def _colour_groups(rec: Recording, tables: Tables, step: int) -> list[tuple[np.ndarray, str, str]]:
    """(mask of the plotted points, colour, legend label) per mode, or per stream (the most
    frequent STREAM_COLOURS less one by name, the rest as "other")."""
    coll = tables.coll
    if not _by_stream(rec, tables):
        modes = coll["mode"][::step]
        return [(modes == m, MODE_COLOURS.get(name, "grey"), name) for m, name in enumerate(p.MODES)]
    world = max((h.world_size for _, h in tables.hellos), default=0)
    codes, names = stream_labels(coll, tables.hellos, world)
    shown = codes[::step]
    counts = np.bincount(shown, minlength=len(names))
    order = [int(c) for c in np.argsort(-counts, kind="stable") if counts[c]]
    named = order[: len(STREAM_COLOURS) - 1] if len(order) > len(STREAM_COLOURS) else order
    out = []
    for colour, c in zip(STREAM_COLOURS, named, strict=False):
        s = names[c]
        out.append((shown == c, colour, f"{s.group_text} {s.op} {s.dtype} {size_cell(s.nbytes)}"))
    rest = np.isin(shown, named, invert=True)
    if rest.any():
        out.append((rest, "#bbbbbb", f"other ({len(order) - len(named)} streams)"))
    return out


def _changes(coll: dict[str, np.ndarray], base: int) -> list[tuple[float, str]]:
    """(seconds, "epoch N: MODE") where a new settings epoch starts."""
    if not len(coll["epoch"]):
        return []
    order = np.argsort(coll["start_ns"], kind="stable")
    top = np.maximum.accumulate(coll["epoch"][order])
    rises = np.flatnonzero(top[1:] > top[:-1]) + 1
    times = ((coll["start_ns"][order][rises] - base) / 1e9).tolist()
    modes = coll["mode"][order][rises].tolist()
    epochs = top[rises].tolist()
    return [
        (t, f"epoch {e}: {p.MODES[m] if m < len(p.MODES) else f'mode {m}'}")
        for t, e, m in zip(times, epochs, modes, strict=True)
    ]


def _links(ax, tables: Tables, base: int) -> None:
    """Mean per GPU of each link metric over time, from the TELEM ticks."""
    series: dict[str, tuple[list[float], list[float]]] = {}
    for _, tick in tables.ticks:
        t = (tick.t_ns - base) / 1e9
        for name in ("pcie_tx_gbps", "pcie_rx_gbps", "nvlink_tx_gbps", "nvlink_rx_gbps"):
            v = tick.metrics[name]
            if np.isfinite(v).any():
                xs, ys = series.setdefault(name, ([], []))
                xs.append(t)
                ys.append(float(np.nanmean(v)))
    for name, (xs, ys) in sorted(series.items()):
        order = np.argsort(xs)
        ax.plot(np.asarray(xs)[order], np.asarray(ys)[order], lw=1, label=name.replace("_gbps", "").replace("_", " "))
    if series:
        ax.legend(loc="upper left", fontsize=8)
    else:
        ax.text(0.5, 0.5, "no link telemetry in this recording", ha="center", va="center", transform=ax.transAxes)
    ax.set_ylabel("GB/s per GPU")
