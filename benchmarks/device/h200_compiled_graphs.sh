#!/usr/bin/env bash
# One GPU, NCCL: collectives commtop's two captures see differently (benchmarks/jobs/nccl_compiled_graphs.py):
# functional all_reduces inside torch.compile, and an all_gather captured in a CUDA graph and
# replayed; the job ends with sys.exit(3). Each under the Flight Recorder capture and the Python
# hooks: the job's own count, the recording's records + missing, the ranks' Byes. ~1.5 min.
# WHAT picks the job's parts (default "compile graph"; also trees, ddp); with BEFORE_DIR (an older
# tree from git archive) the hooks runs are repeated on it ("before").
#   device run: WHAT="compile graph trees ddp" BEFORE_DIR=.ab_prev bash benchmarks/device/h200_compiled_graphs.sh   (carry .whl, .ab_prev)
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
ROOT=$PWD
R=$OUT/compiled_graphs.txt
{ nvidia-smi -L; python3 -c 'import torch; print("torch", torch.__version__)'; } | tee "$R"
commtop() { python3 -c 'import sys; from tui.cli import main; sys.exit(main())' "$@"; }
for what in ${WHAT:-compile graph}; do
  for cap in default hooks ${BEFORE_DIR:+before}; do
    echo "== $what, capture $cap" | tee -a "$R"
    rm -f /tmp/cg.*
    tree=$PWD; [ $cap = before ] && tree=$PWD/$BEFORE_DIR  # run from it: ranks import workers from their cwd first
    (cd "$tree" && env PYTHONPATH=/tmp/site:$tree $([ $cap != default ] && echo COMMTOP_CAPTURE=hooks) timeout 150 bash -c "$(declare -f commtop); commtop run --headless --record /tmp/cg_${what}_$cap.commtop -- python3 $ROOT/benchmarks/jobs/nccl_compiled_graphs.py /tmp/cg 3 $what") > "$OUT/cg_${what}_$cap.log" 2>&1
    echo "rc=$? (the job exits 3: commtop run says 1)" | tee -a "$R"
    grep -E "^0 |graph was captured|not seen|counted as missing|error" "$OUT/cg_${what}_$cap.log" | cut -c1-300 | tail -6 | tee -a "$R"
    echo "job: $(cat /tmp/cg.rank0.json 2>/dev/null)" | tee -a "$R"
    PYTHONPATH=/tmp/site:$tree python3 - /tmp/cg_${what}_$cap.commtop <<'PY' | tee -a "$R"
import sys
from tui.recordings.reader import open_recording
with open_recording(sys.argv[1]) as rec:
    t = rec.tables()
last = {}
for _, h in t.hellos:
    last[h.rank] = h
print("recorded", len(t.coll["rank"]), "+ lost", {r: h.lost for r, h in last.items()}, "| byes", [(b.exit_code, b.reason) for _, b in t.byes])
PY
  done
done
