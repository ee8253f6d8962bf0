#!/usr/bin/env bash
# Issue 15 on the H200 host's own CPU (16-core Xeon), one device call: the TUI at 8 ranks with and
# without the live view's GC tuning (tui.view.gc_tuning), interleaved; then `commtop report` on one
# 10 M-record file with and without the collector paused (tui.recordings.pages), interleaved; then
# the stock benchmarks at 8, 64, 512 ranks and 10 M records. Wheels first (device-wheels.sh), .whl carried.
set -x
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1
cat > /tmp/tui_ab.py <<'PY'
import os, sys
sys.path.insert(0, "benchmarks")
if os.environ.get("DEFAULT_GC"):  # the before: Textual's and CPython's defaults
    import tui.view.app as a
    a.settle_garbage_collector = lambda: None
import render_scale
render_scale.main(sys.argv[1:])
PY
cat > /tmp/report_ab.py <<'PY'
import contextlib, io, os, sys, time
if os.environ.get("GC_ON"):  # the before: the collector runs during the read
    import tui.report.command as c
    c.collector_paused = contextlib.nullcontext
from tui import cli
t = time.perf_counter()
with contextlib.redirect_stdout(io.StringIO()):
    rc = cli.main(["report", sys.argv[1], "--format", "json"])
dt = time.perf_counter() - t
print(f"report gc_on={bool(os.environ.get('GC_ON'))} rc={rc} {dt:.3f} s {10_000_110 / dt / 1e6:.2f} M rec/s")
PY
for i in 1 2 3; do
  for v in default tuned; do
    if [ $v = default ]; then export DEFAULT_GC=1; else unset DEFAULT_GC; fi
    echo "== tui 8 ranks, gc $v, run $i"
    python3 /tmp/tui_ab.py --ranks 8 --seconds 10 --no-append 2>&1 | grep -E '^\| (8|reference)'
  done
done > $OUT/tui_ab.txt 2>&1
python3 -c "
import sys; sys.path.insert(0, 'benchmarks')
from pathlib import Path
import recordings
print('write s', recordings.write(Path('/tmp/bench10m.commtop'), 10_000_000, 8))
" > $OUT/report_ab.txt 2>&1
for i in 1 2 3; do GC_ON=1 python3 /tmp/report_ab.py /tmp/bench10m.commtop; python3 /tmp/report_ab.py /tmp/bench10m.commtop; done >> $OUT/report_ab.txt 2>&1
python3 benchmarks/render_scale.py --no-append --ranks 8,64,512 --seconds 8 > $OUT/render_scale.md 2>&1
python3 benchmarks/recordings.py --no-append --reuse /tmp/bench10m.commtop > $OUT/recordings.md 2>&1
ls -la $OUT
