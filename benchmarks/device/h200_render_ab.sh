#!/usr/bin/env bash
# render_scale (8, 64 and 512 ranks, each with its same-run reference) on the H200 host's CPU,
# before and after a change, in alternating pairs (PAIRS, default 3): "before" is a tree of the
# older commit (git archive) in BEFORE_DIR, "after" the working tree. ~40 s a run (RANKS=8: one
# rank count only, ~20 s).
#   here:   git archive --prefix=.ab_before/ OLD | tar -x    (.ab_before is git-ignored via info/exclude)
#   device: BEFORE_DIR=.ab_before bash benchmarks/device/h200_render_ab.sh   (carry .whl and .ab_before)
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
BEFORE_DIR=${BEFORE_DIR:?a tree of the older commit}
PAIRS=${PAIRS:-3}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1
R="$OUT/render_ab.txt"
{ nproc; lscpu | grep -E "Model name|^CPU\(s\)"; python3 --version; } | tee "$R"
for i in $(seq 1 "$PAIRS"); do
  for v in before after; do
    dir=$PWD; [ "$v" = before ] && dir=$(cd "$BEFORE_DIR" && pwd)
    (cd "$dir" && PYTHONPATH=/tmp/site:$dir timeout 150 python3 benchmarks/standing/render_scale.py ${RANKS:+--ranks "$RANKS"} \
      --out "$OUT/render_${v}_$i.md" >/dev/null 2>&1) || echo "$v $i: exit $?" | tee -a "$R"
    echo "== $v $i (ranks | TUI CPU % | ingest % | UI % | x reference)" | tee -a "$R"
    grep -E "^\| (8|64|512) \|" "$OUT/render_${v}_$i.md" | awk -F'|' '{print $2,$12,$13,$14,$15}' | tee -a "$R"
    grep -E "^\| reference" "$OUT/render_${v}_$i.md" | tee -a "$R"
  done
done
