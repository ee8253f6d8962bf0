#!/usr/bin/env bash
# One GPU, NCCL: ZeroRedundancyOptimizer steps (benchmarks/jobs/nccl_zero_raise.py, 20 steps) under
# the Flight Recorder capture and the hooks: the report's steps against the job's; then the same
# job raising after its steps: its traceback as the script alone prints it, the exit code; then
# the destroy/re-init job as a regression check. ~60 s.
#   device run: bash benchmarks/device/h200_zero_raise.sh      (carry .whl)
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
CT='import sys; from tui.cli import main; sys.exit(main())'
nvidia-smi -L; python3 -c 'import torch; print("torch", torch.__version__)'
for cap in fr hooks; do
  ( [ $cap = hooks ] && export COMMTOP_CAPTURE=hooks TORCH_NCCL_ENABLE_TIMING=0
    timeout 150 python3 -c "$CT" run --headless --record /tmp/z_$cap.commtop -- python3 benchmarks/jobs/nccl_zero_raise.py /tmp/z 20 > "$OUT/zero_$cap.log" 2>&1
    echo "== zero capture $cap rc=$? job: $(cat /tmp/z.rank0.json 2>/dev/null)"
    grep -E "^0 |steps/s|commtop monitor" "$OUT/zero_$cap.log" | cut -c1-250
    python3 -c "$CT" report /tmp/z_$cap.commtop 2>&1 | grep -A2 "^epoch  rank  steps" | cut -c1-200 )
done
timeout 150 python3 -c "$CT" run --headless -- python3 benchmarks/jobs/nccl_zero_raise.py /tmp/zr 5 raise > "$OUT/zero_raise.log" 2>&1
echo "== zero raise rc=$?"
grep -E "^\[rank0\]: (Traceback|  File|ValueError)|failed first" "$OUT/zero_raise.log" | cut -c1-200
bash benchmarks/device/h200_reinit.sh 2>&1 | grep -E "^== capture fr|^0 " | cut -c1-200
