#!/usr/bin/env bash
# One GPU, NCCL: a job that destroys its process group and makes it again (benchmarks/jobs/nccl_reinit.py:
# 9 collectives, destroy, init, 4 all_reduces + 4 all_reduce_coalesced) under the Flight Recorder
# capture and the Python hooks; recorded + missing against the job's own count; then the DDP job
# of nccl_compiled_graphs.py as a check of the usual path. ~70 s.
#   device run: bash benchmarks/device/h200_reinit.sh      (carry .whl)
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
for cap in fr hooks; do
  ( [ $cap = hooks ] && export COMMTOP_CAPTURE=hooks TORCH_NCCL_ENABLE_TIMING=0
    rm -f /tmp/ri.*
    timeout 150 python3 -c 'import sys; from tui.cli import main; sys.exit(main())' run --headless --record /tmp/ri_$cap.commtop -- python3 benchmarks/jobs/nccl_reinit.py /tmp/ri > "$OUT/reinit_$cap.log" 2>&1
    echo "== capture $cap rc=$? job: $(cat /tmp/ri.rank0.json 2>/dev/null)"
    grep -E "^0 |commtop monitor|rank  |commtop: coll|Traceback|Error" "$OUT/reinit_$cap.log" | cut -c1-250 )
done
rm -f /tmp/cg.*
timeout 150 python3 -c 'import sys; from tui.cli import main; sys.exit(main())' run --headless -- python3 benchmarks/jobs/nccl_compiled_graphs.py /tmp/cg 0 ddp > "$OUT/ddp.log" 2>&1
echo "== ddp rc=$? job: $(cat /tmp/cg.rank0.json 2>/dev/null | head -c 300)"
grep -E "^0 |commtop monitor|rank  " "$OUT/ddp.log" | cut -c1-250
