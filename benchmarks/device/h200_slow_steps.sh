#!/usr/bin/env bash
# Which steps of the DDP job are slow, and when, under: bare torchrun, torch's NCCL timing alone,
# commtop as it is (recorded: the node sampler's ticks), commtop with the sampler at 10 s, and
# commtop without CUPTI; each with the job's per-step log (benchmarks/jobs/ddp_offload.py
# --step-log) and, under commtop, the capture thread's timeline (capture_timeline.py). ~3 min.
#   device run: bash benchmarks/device/h200_slow_steps.sh [STEPS]
set -u
OUT=${OUT:-/tmp/out}; W=/tmp/slowsteps; mkdir -p "$OUT" "$W"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD:${PYTHONPATH:-}
export PYTHONUNBUFFERED=1
STEPS=${1:-1200}
JOB=(benchmarks/jobs/ddp_offload.py --steps "$STEPS" --warmup 50)
TR=(python3 -m torch.distributed.run --standalone --nproc-per-node=1)
timeout 120 "${TR[@]}" "${JOB[@]}" --step-log "$W/steps_bare.json" 2>&1 | grep "^ddp_offload" | cut -c1-200
TORCH_NCCL_ENABLE_TIMING=1 TORCH_FR_BUFFER_SIZE=8192 timeout 120 "${TR[@]}" "${JOB[@]}" --step-log "$W/steps_timing.json" 2>&1 | grep "^ddp_offload" | cut -c1-200
timeout 120 "${TR[@]}" --monitor-interval=0.2 "${JOB[@]}" --step-log "$W/steps_bare_mon02.json" 2>&1 | grep "^ddp_offload" | cut -c1-200
for v in default=X=1 slowtel=COMMTOP_TELEMETRY_INTERVAL=10 nocupti=COMMTOP_CUPTI=0; do
  name=${v%%=*}; IFS=, read -r -a envs <<<"${v#*=}"
  rec=(); [ "$name" = default ] && rec=(--record "$W/default.commtop")
  env "${envs[@]}" timeout 150 python3 -m tui.cli run --headless --nproc 1 "${rec[@]}" -- python3 benchmarks/probes/capture_timeline.py \
    "$W/tl_$name.json" "${JOB[@]}" >"$W/run_$name.log" 2>&1
  echo "== $name (exit $?)"
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); d.pop('raw'); print(json.dumps(d))" "$W/tl_$name.json"
done
(cd "$W" && tar czf "$OUT/slow_steps.tar.gz" .) && ls -la "$W"
