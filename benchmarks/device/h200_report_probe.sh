#!/usr/bin/env bash
# Where `commtop report` spends its time on the H200 host's CPU (its report is ~10x its same-run
# reference there, ~3x on the 2-core VM): one 10 M-record file, then in-process phases (open,
# tables, build) with user/system time and page faults, for the page and heap settings of
# tui.recordings.pages switched on and off in turn, and with the read and sort threads at 2 or 1.
set -x
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1
nproc; uptime; cat /sys/kernel/mm/transparent_hugepage/enabled /sys/kernel/mm/transparent_hugepage/defrag
python3 -c "
import sys; sys.path.insert(0, 'benchmarks/standing')
from pathlib import Path
import recordings
print('write s', recordings.write(Path('/tmp/bench10m.commtop'), 10_000_000, 8))
"
cat > /tmp/phases.py <<'PY'
import contextlib, os, resource, sys, time
from tui.recordings import pages
from tui.recordings.reader import open_recording
from tui.report.build import build_report
from tui.report.reading import report_tables
variant = sys.argv[1]
small = pages.small_pages if "small" in variant else contextlib.nullcontext
heap = pages.heap_kept if "heap" in variant else contextlib.nullcontext
if "cpu1" in variant:
    os.sched_setaffinity(0, {0})
ru0 = resource.getrusage(resource.RUSAGE_SELF)
with small(), heap(), pages.collector_paused():
    t0 = time.perf_counter(); rec = open_recording(sys.argv[2]); t1 = time.perf_counter()
    tables = report_tables(rec); t2 = time.perf_counter()
    build_report(rec, tables); t3 = time.perf_counter()
ru = resource.getrusage(resource.RUSAGE_SELF)
print(f"{variant:22s} open {t1-t0:.3f} tables {t2-t1:.3f} build {t3-t2:.3f} total {t3-t0:.3f} s; "
      f"user {ru.ru_utime-ru0.ru_utime:.2f} sys {ru.ru_stime-ru0.ru_stime:.2f} faults {ru.ru_minflt-ru0.ru_minflt}")
PY
for i in 1 2; do
  for v in small+heap heap small none small+heap+cpu1; do python3 /tmp/phases.py $v /tmp/bench10m.commtop; done
done
python3 -c "
import time, zlib, numpy as np
data = zlib.compress(open('/tmp/bench10m.commtop','rb').read()[:64<<20], 1)
v = np.random.default_rng(0).lognormal(8, 0.2, 10_000_000).astype(np.float32)
t = time.perf_counter(); zlib.decompress(data); t1 = time.perf_counter(); np.sort(v); t2 = time.perf_counter()
a = np.empty(100_000_000, np.uint8); t3 = time.perf_counter(); a[:] = 1; t4 = time.perf_counter()
print(f'reference parts: inflate {t1-t:.3f} s, sort 10M float32 {t2-t1:.3f} s; first touch of 100 MB {t4-t3:.3f} s')
"
