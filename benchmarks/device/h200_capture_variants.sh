#!/usr/bin/env bash
# Where the DDP job's cost under `commtop run` comes from, one H200: rounds of bare, commtop
# (Flight Recorder capture), COMMTOP_CAPTURE=hooks (Python wrappers + CUDA events, DDP through
# its comm hook) and COMMTOP_CAPTURE=off (bootstrap and monitor, nothing captured), each step
# time from the job's own clock.   device run: bash benchmarks/device/h200_capture_variants.sh ROUNDS STEPS
set -u
ROUNDS=${1:-3}
STEPS=${2:-1200}
OUT=${OUT:-/tmp/out}; W=/tmp/variants; mkdir -p "$OUT" "$W"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD:${PYTHONPATH:-}
export PYTHONUNBUFFERED=1
JOB=(benchmarks/jobs/ddp_offload.py --steps "$STEPS" --warmup 50)
one() { # NAME ENV...
  local name=$1; shift
  local res="$W/${name}_$r.json"
  if [ "$name" = bare ]; then
    env "$@" timeout 200 python3 -m torch.distributed.run --standalone --nproc-per-node=1 "${JOB[@]}" --result "$res" >"$W/${name}_$r.log" 2>&1
  else
    env "$@" timeout 200 python3 -m tui.cli run --headless --nproc 1 -- python3 "${JOB[@]}" --result "$res" >"$W/${name}_$r.log" 2>&1
  fi
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(f'{sys.argv[2]:8s} round {sys.argv[3]}: step mean {d[\"step_ms_mean\"]:.4f} p50 {d[\"step_ms_p50\"]:.4f} p99 {d[\"step_ms_p99\"]:.4f}')" "$res" "$name" "$r" 2>/dev/null || { echo "$name round $r: FAILED"; tail -3 "$W/${name}_$r.log"; }
}
for r in $(seq 1 "$ROUNDS"); do
  one bare X=1
  one fr X=1
  one hooks COMMTOP_CAPTURE=hooks
  one off COMMTOP_CAPTURE=off
done | tee "$OUT/variants.txt"
grep -h "^commtop" "$W"/hooks_1.log "$W"/fr_1.log | head -6
