#!/usr/bin/env bash
# The Flight Recorder decoded in a child process (workers.capture.fr_child) on one H200, in one
# device call (~7 min): (1) completeness at RATE (6,000) collectives/s for 20 s under `commtop
# run --record` with default settings (the child decodes), summed up by job_cost_summary.py;
# (2) h200_cost_parts.sh's rounds with the variants child (default), rank (COMMTOP_FR_DECODE=rank,
# decoded in the rank as before) and timing (bare torchrun with NCCL timing and the 8192 ring:
# torch's own share), and its mixed-backend probe.
#   device run: bash benchmarks/device/h200_child_decoder.sh [ROUNDS] [STEPS]
set -u
OUT=${OUT:-/tmp/out}; W=/tmp/childdec; mkdir -p "$OUT" "$W"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD:${PYTHONPATH:-}
export PYTHONUNBUFFERED=1
R="$OUT/variants.txt"
echo "== completeness at ${RATE:-6000} collectives/s for ${SECONDS_RATE:-20} s" | tee "$R"
timeout 150 python3 -m tui.cli run --headless --nproc 1 --record "$W/rec_rate_1.commtop" -- python3 benchmarks/jobs/ddp_offload.py \
  --layers 0 --explicit 10 --copies 0 --warmup 50 --rate "${RATE:-6000}" --seconds "${SECONDS_RATE:-20}" \
  --result "$W/job_rate_commtop_1.json" >"$W/rate.log" 2>&1
echo "rate run exit $?" | tee -a "$R"
grep -E "^commtop|Flight Recorder" "$W/rate.log" | cut -c1-300 | tee -a "$R"
python3 benchmarks/device/job_cost_summary.py "$W" 2>&1 | tail -3 | tee -a "$R"
VARIANTS="child=X=1 rank=COMMTOP_FR_DECODE=rank timing=TORCH_NCCL_ENABLE_TIMING=1,TORCH_FR_BUFFER_SIZE=8192" \
  PROBES=0 bash benchmarks/device/h200_cost_parts.sh "${1:-3}" "${2:-1200}"
cat "$OUT/cost_parts.txt" >> "$R"
timeout 90 python3 -m torch.distributed.run --standalone --nproc-per-node=1 benchmarks/probes/mixed_backend_fr.py 2>&1 \
  | grep -E "mixed_backend_fr|Error" | tee -a "$R"
