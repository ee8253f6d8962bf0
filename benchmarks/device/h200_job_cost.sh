#!/usr/bin/env bash
# Where a user's job pays for commtop on one H200 (NCCL world size 1): the Flight Recorder
# dump probe, then the DDP offload job (benchmarks/jobs/ddp_offload.py) bare and under
# commtop, in alternating rounds, each variant's step time from the job's own clock.
#   device run: bash benchmarks/device/h200_job_cost.sh ROUNDS STEPS   (carry .whl)
set -u
ROUNDS=${1:-3}
STEPS=${2:-600}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:${PYTHONPATH:-} || exit 1
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1 || echo "editable install failed"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__, 'nccl', torch.cuda.nccl.version())"
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
for ring in 2000 20000; do
  timeout 120 python3 benchmarks/probes/fr_dump_cost.py --ring $ring --out "$OUT/fr_$ring.json" 2>&1 | grep -v Warning | cut -c1-600
done
JOB="benchmarks/jobs/ddp_offload.py --steps $STEPS"
run() {  # NAME ENV... -- CMD...
  local name=$1; shift
  local res="$OUT/job_${name}_$r.json"
  local t0=$(date +%s.%N)
  env "$@" --result "$res" > "$OUT/log_${name}_$r.txt" 2>&1
  local t1=$(date +%s.%N)
  python3 - "$res" "$name" "$r" "$t0" "$t1" <<'PY'
import json, sys
path, name, r, t0, t1 = sys.argv[1:]
try:
    d = json.load(open(path))
    print(f"{name:14s} round {r}: step mean {d['step_ms_mean']:.4f} ms p50 {d['step_ms_p50']:.4f} p99 {d['step_ms_p99']:.4f} issued {d['issued_total']} (wall {float(t1)-float(t0):.1f} s)")
except Exception as exc:
    print(f"{name:14s} round {r}: no result ({exc})")
PY
}
TR="python3 -m torch.distributed.run --standalone --nproc-per-node=1"
for r in $(seq 1 "$ROUNDS"); do
  run bare X=1 $TR $JOB
  run timing TORCH_NCCL_ENABLE_TIMING=1 $TR $JOB
  run commtop X=1 python3 -m tui.cli run --headless --nproc 1 -- python3 $JOB
  run capture_off COMMTOP_CAPTURE=off python3 -m tui.cli run --headless --nproc 1 -- python3 $JOB
  run bare_cdmc1 CUDA_DEVICE_MAX_CONNECTIONS=1 $TR $JOB
  run commtop_cdmc1 CUDA_DEVICE_MAX_CONNECTIONS=1 python3 -m tui.cli run --headless --nproc 1 -- python3 $JOB
done
tail -5 "$OUT/log_commtop_1.txt"
