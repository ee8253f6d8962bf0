#!/usr/bin/env bash
# What commtop costs a user's DDP job on one H200, and whether it misses anything at a high
# collective rate (issue 26, items 2 and 3). One device call, within 9 minutes:
#   device run: bash benchmarks/device/h200_job_cost.sh [PAIRS] [STEPS]      (carry .whl)
# 1. a job issuing RATE collectives/s (default 6000) for 20 s (ddp_offload.py --layers 0
#    --explicit 10 --rate RATE) under `commtop run --headless --record`, default settings: recorded +
#    lost must equal what the job issued, lost 0;
# 2. PAIRS alternating pairs (bare first in odd pairs, commtop first in even ones) of the DDP
#    offload job (benchmarks/jobs/ddp_offload.py, STEPS timed steps) bare under torchrun and under
#    `commtop run --headless --record`, without and with CUDA_DEVICE_MAX_CONNECTIONS=1, the
#    conditions interleaved pair by pair; a pair that would not end within BUDGET_S is skipped;
# 3. if time is left, the high-rate run again at RATE2 (default 12000): where the capture stops
#    keeping up, it says so in one line and counts what it lost; RATE=0 / RATE2=0 skip 1 / 3;
# then benchmarks/device/job_cost_summary.py: per pair the step-time ratio (the job's own clock),
# per condition the mean ratio with a 95 % Student-t interval, and per commtop run the recorded /
# lost / dropped / issued counts from the recording.
# Files under $OUT: console.txt, summary.txt, summary.json, runs.tar.gz (every job result and log),
# ddp_offload_h200.commtop (the first DDP recording, replayable). Every step's failure is said and
# the script goes on.
set -u
PAIRS=${1:-5}
STEPS=${2:-2000}
RATE=${RATE:-6000}
RATE2=${RATE2:-12000}
BUDGET_S=${BUDGET_S:-480}
T0=$(date +%s)
OUT=${OUT:-/tmp/out}
WORK=${WORK:-/tmp/commtop-jobcost}
mkdir -p "$OUT" "$WORK"
rm -f "$WORK"/job_* "$WORK"/log_* "$WORK"/rec_*

say() { echo "$*" | tee -a "$OUT/console.txt"; }
elapsed() { echo $(($(date +%s) - T0)); }

if ls .whl/*.whl >/dev/null 2>&1; then
  if python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; then
    export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
  else
    say "wheel install failed (rc $?): going on with what is installed"
  fi
fi
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1 || say "editable install failed: the checkout is on PYTHONPATH instead"
export PYTHONPATH=$PWD:${PYTHONPATH:-}
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader 2>&1 | tee -a "$OUT/console.txt" || say "nvidia-smi failed"
python3 -c "import torch; print('torch', torch.__version__, 'nccl', torch.cuda.nccl.version())" 2>&1 | tee -a "$OUT/console.txt"

TR=(python3 -m torch.distributed.run --standalone --nproc-per-node=1)
CT=(python3 -m tui.cli run --headless --nproc 1)
JOB=(benchmarks/jobs/ddp_offload.py --steps "$STEPS" --warmup 50)

run() { # COND ARM PAIR [VAR=VALUE ...]: one job, bare or under commtop; its result and log in $WORK
  local cond=$1 arm=$2 i=$3
  shift 3
  local res="$WORK/job_${cond}_${arm}_${i}.json" log="$WORK/log_${cond}_${arm}_${i}.txt" rc t0 t1
  t0=$(date +%s)
  if [ "$arm" = bare ]; then
    env "$@" timeout 300 "${TR[@]}" "${JOB[@]}" --result "$res" >"$log" 2>&1
  else
    env "$@" timeout 300 "${CT[@]}" --record "$WORK/rec_${cond}_${i}.commtop" -- python3 "${JOB[@]}" --result "$res" >"$log" 2>&1
  fi
  rc=$?
  t1=$(date +%s)
  if [ $rc -ne 0 ] || [ ! -s "$res" ]; then
    say "  $cond $arm pair $i: FAILED (exit $rc, $((t1 - t0)) s); the end of its log:"
    tail -5 "$log" | tee -a "$OUT/console.txt"
  else
    say "  $cond $arm pair $i: $(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(f\"step mean {d['step_ms_mean']:.4f} ms p50 {d['step_ms_p50']:.4f} ms, issued {d['issued_total']}\")" "$res") ($((t1 - t0)) s)"
  fi
}

rate_run() { # NAME RATE: the collectives-only job paced at RATE collectives/s for 20 s, under commtop
  local name=$1 rate=$2 rc t0
  local res="$WORK/job_${name}_commtop_1.json" log="$WORK/log_${name}_commtop_1.txt"
  t0=$(date +%s)
  timeout 150 "${CT[@]}" --record "$WORK/rec_${name}_1.commtop" -- python3 benchmarks/jobs/ddp_offload.py \
    --layers 0 --explicit 10 --copies 0 --warmup 50 --rate "$rate" --seconds 20 --result "$res" >"$log" 2>&1
  rc=$?
  say "== $name: ${rate} collectives/s asked for 20 s: exit $rc ($(($(date +%s) - t0)) s); what the capture said:"
  grep -E "^commtop|Flight Recorder|ddp_offload:" "$log" | cut -c1-400 | tee -a "$OUT/console.txt"
}

if [ "$RATE" != 0 ]; then
  say "== high rate first (the proof needs it): default settings"
  rate_run rate "$RATE"
fi

say "== $PAIRS alternating pairs, $STEPS steps, without and with CUDA_DEVICE_MAX_CONNECTIONS=1 (budget ${BUDGET_S} s)"
longest=60
for i in $(seq 1 "$PAIRS"); do
  for cond in default cdmc1; do
    envs=()
    [ "$cond" = cdmc1 ] && envs=(CUDA_DEVICE_MAX_CONNECTIONS=1)
    if [ $(($(elapsed) + longest)) -gt "$BUDGET_S" ]; then
      say "  $cond pair $i: skipped (at $(elapsed) s a pair of up to ${longest} s would pass the ${BUDGET_S} s budget)"
      continue
    fi
    t0=$(date +%s)
    if [ $((i % 2)) -eq 1 ]; then
      run "$cond" bare "$i" ${envs[@]+"${envs[@]}"}
      run "$cond" commtop "$i" ${envs[@]+"${envs[@]}"}
    else
      run "$cond" commtop "$i" ${envs[@]+"${envs[@]}"}
      run "$cond" bare "$i" ${envs[@]+"${envs[@]}"}
    fi
    took=$(($(date +%s) - t0))
    [ "$took" -gt "$longest" ] && longest=$took
  done
done

if [ "$RATE2" = 0 ]; then
  say "== high rate at RATE2: not asked for"
elif [ $(($(elapsed) + 45)) -le "$BUDGET_S" ]; then
  say "== high rate again, at ${RATE2} collectives/s: where the capture stops keeping up"
  rate_run rate2 "$RATE2"
else
  say "== high rate at ${RATE2}/s: skipped (no time left)"
fi

say "== summary ($(elapsed) s so far)"
python3 benchmarks/device/job_cost_summary.py "$WORK" --json "$OUT/summary.json" >"$OUT/summary.txt" 2>&1 || say "summary failed (exit $?)"
cat "$OUT/summary.txt"
[ -s "$WORK/rec_default_1.commtop" ] && cp "$WORK/rec_default_1.commtop" "$OUT/ddp_offload_h200.commtop"
(cd "$WORK" && tar czf "$OUT/runs.tar.gz" job_* log_*) || say "tar of the runs failed"
say "done in $(elapsed) s"
