#!/usr/bin/env bash
# The Flight Recorder decoded in a child process (workers.capture.fr_child) on one H200, in one
# device call (~7 min): (1) completeness at 6,000 collectives/s for 20 s under `commtop run`
# with default settings (the child decodes); (2) where the DDP job's cost goes: ROUNDS rounds
# of bare, commtop (child decoder, the default), commtop with COMMTOP_FR_DECODE=rank (decoded
# in the rank, as before) and bare with NCCL timing and the 8192 ring only (torch's own share),
# each step time from the job's own clock; (3) a mixed-backend job (init_process_group() with no
# backend): what torch's rings hold.   device run: bash benchmarks/device/h200_child_decoder.sh [ROUNDS] [STEPS]
set -u
ROUNDS=${1:-3}
STEPS=${2:-1200}
OUT=${OUT:-/tmp/out}; W=/tmp/childdec; mkdir -p "$OUT" "$W"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD:${PYTHONPATH:-}
export PYTHONUNBUFFERED=1
CT=(python3 -m tui.cli run --headless --nproc 1)
TR=(python3 -m torch.distributed.run --standalone --nproc-per-node=1)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/variants.txt"
echo "== completeness at 6000 collectives/s for 20 s" | tee -a "$OUT/variants.txt"
timeout 150 "${CT[@]}" --record "$W/rec_rate_1.commtop" -- python3 benchmarks/jobs/ddp_offload.py --layers 0 --explicit 10 \
  --copies 0 --warmup 50 --rate "${RATE:-6000}" --seconds "${SECONDS_RATE:-20}" --result "$W/job_rate_commtop_1.json" >"$W/rate.log" 2>&1
echo "rate run exit $?" | tee -a "$OUT/variants.txt"
grep -E "^commtop|Flight Recorder" "$W/rate.log" | cut -c1-300 | tee -a "$OUT/variants.txt"
python3 benchmarks/device/job_cost_summary.py "$W" 2>&1 | tail -3 | tee -a "$OUT/variants.txt"
JOB=(benchmarks/jobs/ddp_offload.py --steps "$STEPS" --warmup 50)
one() { # NAME ENV...
  local name=$1; shift
  local res="$W/${name}_$r.json"
  case $name in
    bare|timing) env "$@" timeout 200 "${TR[@]}" "${JOB[@]}" --result "$res" >"$W/${name}_$r.log" 2>&1 ;;
    *) env "$@" timeout 200 "${CT[@]}" -- python3 "${JOB[@]}" --result "$res" >"$W/${name}_$r.log" 2>&1 ;;
  esac
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(f'{sys.argv[2]:8s} round {sys.argv[3]}: step mean {d[\"step_ms_mean\"]:.4f} p50 {d[\"step_ms_p50\"]:.4f} p99 {d[\"step_ms_p99\"]:.4f}')" "$res" "$name" "$r" 2>/dev/null || { echo "$name round $r: FAILED"; tail -3 "$W/${name}_$r.log"; }
}
echo "== $ROUNDS rounds, $STEPS steps: bare, child (default), rank (COMMTOP_FR_DECODE=rank), timing (bare + NCCL timing + ring 8192)" | tee -a "$OUT/variants.txt"
for r in $(seq 1 "$ROUNDS"); do
  one bare X=1
  one child X=1
  one rank COMMTOP_FR_DECODE=rank
  one timing TORCH_NCCL_ENABLE_TIMING=1 TORCH_FR_BUFFER_SIZE=8192
done | tee -a "$OUT/variants.txt"
python3 - "$W" "$ROUNDS" <<'PY' | tee -a "$OUT/variants.txt"
import json, sys
sys.path.insert(0, "benchmarks/device")
from job_cost_summary import mean_ci
w, rounds = sys.argv[1], int(sys.argv[2])
def mean(name, r):
    try:
        return json.load(open(f"{w}/{name}_{r}.json"))["step_ms_mean"]
    except (OSError, ValueError, KeyError):
        return None
for name in ("child", "rank", "timing"):
    ratios = [mean(name, r) / mean("bare", r) for r in range(1, rounds + 1) if mean(name, r) and mean("bare", r)]
    m, h = mean_ci(ratios)
    print(f"{name:8s} / bare, same round: " + " ".join(f"{x:.4f}" for x in ratios) + f"; mean {m:.4f} ± {h:.4f} (95 % t)")
PY
grep -h "^commtop" "$W"/child_1.log "$W"/rank_1.log | cut -c1-300 | tee -a "$OUT/variants.txt"
echo "== mixed backend" | tee -a "$OUT/variants.txt"
timeout 90 "${TR[@]}" benchmarks/probes/mixed_backend_fr.py 2>&1 | grep -E "mixed_backend_fr|Error" | tee -a "$OUT/variants.txt"
(cd "$W" && tar czf "$OUT/childdec_runs.tar.gz" *.json *.log) || true
