#!/usr/bin/env bash
# Where commtop's cost on a user's DDP job goes, one H200, one device call (~8 min):
# (1) benchmarks/probes/capture_timeline.py under commtop, as it is and with COMMTOP_FR_IDLE_S=10
# (reads by fill level only at this rate): which capture activities line up with the job's slow
# steps; (2) h200_cost_parts.sh's rounds: bare, timing (bare torchrun with NCCL timing and the
# 8192 ring: torch's own share), commtop as it is, and $VARIANTS2 (default: idle10).
#   device run: bash benchmarks/device/h200_cost_timeline.sh [ROUNDS] [STEPS]
set -u
OUT=${OUT:-/tmp/out}; W=/tmp/timeline; mkdir -p "$OUT" "$W"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD:${PYTHONPATH:-}
export PYTHONUNBUFFERED=1
R="$OUT/timeline.txt"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$R"
python3 -c "import torch; print('torch', torch.__version__, 'nccl', torch.cuda.nccl.version())" | tee -a "$R"
for v in ${TIMELINES:-"default=X=1 idle10=COMMTOP_FR_IDLE_S=10"}; do
  name=${v%%=*}; IFS=, read -r -a envs <<<"${v#*=}"
  env "${envs[@]}" timeout 150 python3 -m tui.cli run --headless --nproc 1 -- python3 benchmarks/probes/capture_timeline.py \
    "$OUT/timeline_$name.json" benchmarks/jobs/ddp_offload.py --steps "${2:-1200}" --warmup 50 >"$W/tl_$name.log" 2>&1
  echo "== timeline $name (exit $?)" | tee -a "$R"
  python3 - "$OUT/timeline_$name.json" <<'PY' | tee -a "$R"
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except (OSError, ValueError) as exc:
    print("no result:", exc); raise SystemExit
print({k: v for k, v in d.items() if k != "by_activity"})
for kind, a in d["by_activity"].items():
    print(f"  {kind:17s} {a}")
PY
done
VARIANTS="timing=TORCH_NCCL_ENABLE_TIMING=1,TORCH_FR_BUFFER_SIZE=8192 commtop=X=1 ${VARIANTS2:-idle10=COMMTOP_FR_IDLE_S=10}" \
  PROBES=0 OUT="$W/parts" bash benchmarks/device/h200_cost_parts.sh "${1:-5}" "${2:-1200}" 2>&1 | grep -v "^.rank0.\|^commtop"
cat "$W/parts/cost_parts.txt" >> "$R"
cp "$W/parts/cost_parts_runs.tar.gz" "$OUT/" 2>/dev/null
tail -3 "$W"/tl_default.log | cut -c1-300
