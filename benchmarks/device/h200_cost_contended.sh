#!/usr/bin/env bash
# commtop's cost on a user's DDP job when the host's CPUs are busy with other work: HOGS busy-loop
# processes (default 12 of the H200 host's 16 cores) run beside h200_cost_parts.sh's rounds, the
# reference being capoff (the job under `commtop run` with NCCL timing and the 8192 ring, nothing
# of commtop in the rank), against commtop as it is and commtop with fewer wake-ups in the rank
# (COMMTOP_CUPTI=0, COMMTOP_FR_IDLE_S=10). ~5 min.
#   device run: bash benchmarks/device/h200_cost_contended.sh [ROUNDS] [STEPS]      (carry .whl)
set -u
HOGS=${HOGS:-12}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
pids=()
for _ in $(seq 1 "$HOGS"); do python3 -c 'while 1: pass' & pids+=($!); done
trap 'kill "${pids[@]}" 2>/dev/null' EXIT
echo "== $HOGS busy-loop processes beside the job ($(nproc) CPUs)" | tee "$OUT/contended.txt"
REF=capoff PROBES=0 VARIANTS="capoff=COMMTOP_CAPTURE=off,TORCH_NCCL_ENABLE_TIMING=1,TORCH_FR_BUFFER_SIZE=8192 commtop=X=1 quiet=COMMTOP_CUPTI=0,COMMTOP_FR_IDLE_S=10" \
  OUT="$OUT/parts" bash benchmarks/device/h200_cost_parts.sh "${1:-3}" "${2:-1200}" >"$OUT/parts_console.txt" 2>&1
grep -Ev "^\[rank0\]|^commtop(:| summary)" "$OUT/parts/cost_parts.txt" | tee -a "$OUT/contended.txt"
