#!/usr/bin/env bash
# Does `commtop report` scale with the H200 host's CPUs? One 10 M-record file
# (benchmarks/standing/recordings.py, ~50-90 s to write), then the benchmark on it pinned to 2, 8
# and 16 CPUs with taskset, each twice in alternating order; then render_scale (8, 64 and 512
# ranks) once, for the host's TUI row. ~5 min. Written for bb5dd9b (read and sort threads sized
# by the usable CPUs, 2-8): it did not scale (results/report_threads_h200host_2026-12-04.md),
# and the change was reverted; the script still measures the report pinned to 2, 8 and 16 CPUs.
#   device run: bash benchmarks/device/h200_report_threads.sh      (carry .whl)
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
R="$OUT/report_threads.txt"
{ nproc; lscpu | grep -E "Model name|^CPU\(s\)"; python3 --version; } | tee "$R"
F=/tmp/bench10m.commtop
(cd benchmarks/standing && timeout 300 python3 -c "
from pathlib import Path
import recordings
print('write s', recordings.write(Path('$F'), 10_000_000, 8))
") | tee -a "$R"
for order in "0-1 0-7 0-15" "0-15 0-7 0-1"; do
  for cpus in $order; do
    taskset -c "$cpus" timeout 120 python3 benchmarks/standing/recordings.py --reuse "$F" --out "$OUT/rec_$cpus.md" >/dev/null 2>&1
    echo "cpus $cpus: $(grep -E "read speed, M records/s|/ reference|commtop report --format json" "$OUT/rec_$cpus.md" | tr -s ' |' ' ' | tr '\n' ';')" | tee -a "$R"
  done
done
timeout 150 python3 benchmarks/standing/render_scale.py --out "$OUT/render_scale_h200host.md" >/dev/null 2>&1 || echo "render_scale: exit $?" | tee -a "$R"
grep -E "^\| (8|64|512|reference)" "$OUT/render_scale_h200host.md" | tee -a "$R"
