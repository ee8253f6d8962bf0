#!/usr/bin/env bash
# `commtop report` before and after a change on the H200 host's CPU, in alternating pairs
# (PAIRS, default 3): one 10 M-record file written by the working tree
# (benchmarks/standing/recordings.py, ~50-90 s), then `recordings.py --reuse` on it from
# BEFORE_DIR (a tree of the older commit, git archive) and from the working tree. ~2.5 min.
#   here:   git archive --prefix=.ab_before/ OLD | tar -x    (.ab_before is git-ignored via info/exclude)
#   device: BEFORE_DIR=.ab_before bash benchmarks/device/h200_report_ab.sh   (carry .whl and .ab_before)
# REUSE=1 reads the file an earlier script of the same call wrote. .whl must hold zstandard (the
# device image lacks it, and without it the recording is zlib, which no pip install gives).
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
BEFORE_DIR=${BEFORE_DIR:?a tree of the older commit}
PAIRS=${PAIRS:-3}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1
R="$OUT/report_ab.txt"
{ nproc; lscpu | grep -E "Model name|^CPU\(s\)"; python3 --version; } | tee "$R"
F=/tmp/bench10m.commtop
[ -s "$F" ] && [ -n "${REUSE:-}" ] && echo "reusing $F" | tee -a "$R" || (cd benchmarks/standing && PYTHONPATH=/tmp/site:$PWD/../.. timeout 300 python3 -c "
from pathlib import Path
import recordings
print('write s', recordings.write(Path('$F'), 10_000_000, 8))
") | tee -a "$R"
for i in $(seq 1 "$PAIRS"); do
  for v in before after; do
    dir=$PWD; [ "$v" = before ] && dir=$(cd "$BEFORE_DIR" && pwd)
    (cd "$dir" && PYTHONPATH=/tmp/site:$dir timeout 120 python3 benchmarks/standing/recordings.py --reuse "$F" \
      --out "$OUT/report_${v}_$i.md" >/dev/null 2>&1) || echo "$v $i: exit $?" | tee -a "$R"
    echo "$v $i: $(grep -E "commtop report --format json|read speed, M records/s|/ reference" "$OUT/report_${v}_$i.md" \
      | awk -F'|' '{printf "%s;", $3}')" | tee -a "$R"
  done
done
