#!/usr/bin/env bash
# Where the capture's cost beyond torch's NCCL timing goes, one H200, one device call (~7 min):
# (1) benchmarks/probes/fr_dump_stall.py: do worker-server dumps stall the job's enqueue (rings of
# 8192 and 2000; PROBES=0 skips them and (3)); (2) ROUNDS rounds of the DDP offload job: bare,
# then each of $VARIANTS (NAME=VAR=VALUE,VAR=VALUE ...; default: commtop as it is, without CUPTI
# copies, with a ring of 2000; a variant named "timing" runs bare under torchrun with its
# variables), each step time from the job's own clock, ratios to the same round's bare run;
# (3) benchmarks/probes/mixed_backend_fr.py. REF=NAME takes that variant as each round's
# reference instead of bare (bare is then not run). Each run also prints its slow steps (over
# 1.25x the run's median, from the job's --step-log) and their excess over the median.
#   device run: bash benchmarks/device/h200_cost_parts.sh [ROUNDS] [STEPS]
set -u
ROUNDS=${1:-3}
STEPS=${2:-1200}
OUT=${OUT:-/tmp/out}; W=/tmp/costparts; mkdir -p "$OUT" "$W"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD:${PYTHONPATH:-}
export PYTHONUNBUFFERED=1
CT=(python3 -m tui.cli run --headless --nproc 1)
TR=(python3 -m torch.distributed.run --standalone --nproc-per-node=1)
R="$OUT/cost_parts.txt"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$R"
[ "${PROBES:-1}" = 1 ] && for ring in 8192 2000; do
  TORCH_FR_BUFFER_SIZE=$ring timeout 120 "${TR[@]}" benchmarks/probes/fr_dump_stall.py 2>&1 | grep -E "fr_dump_stall|Error" | sed 's/^\[rank0\]: //' | tee -a "$R"
done
JOB=(benchmarks/jobs/ddp_offload.py --steps "$STEPS" --warmup 50)
one() { # NAME ENV...
  local name=$1; shift
  local res="$W/${name}_$r.json" steps="$W/${name}_$r.steps.json"
  case $name in
    bare|timing*) env "$@" timeout 200 "${TR[@]}" "${JOB[@]}" --result "$res" --step-log "$steps" >"$W/${name}_$r.log" 2>&1 ;;
    *) env "$@" timeout 200 "${CT[@]}" -- python3 "${JOB[@]}" --result "$res" --step-log "$steps" >"$W/${name}_$r.log" 2>&1 ;;
  esac
  python3 - "$res" "$steps" "$name" "$r" <<'PY' 2>/dev/null || { echo "$name round $r: FAILED"; tail -3 "$W/${name}_$r.log"; }
import json, statistics, sys
d = json.load(open(sys.argv[1]))
dur = json.load(open(sys.argv[2]))["dur_s"]
med = statistics.median(dur)
slow = [x for x in dur if x > 1.25 * med]
excess = sum(x - med for x in dur if x > med)
print(f"{sys.argv[3]:8s} round {sys.argv[4]}: step mean {d['step_ms_mean']:.4f} p50 {d['step_ms_p50']:.4f} "
      f"p99 {d['step_ms_p99']:.4f}; slow {len(slow)} ({sum(slow) * 1e3:.0f} ms), excess {excess * 1e3:.0f} ms "
      f"({excess / sum(dur) * 100:.2f} %)")
PY
}
# NAME=ENV,ENV... per variant; "timing" runs bare under torchrun with the given variables
VARIANTS=${VARIANTS:-"commtop=X=1 nocupti=COMMTOP_CUPTI=0 ring2000=TORCH_FR_BUFFER_SIZE=2000"}
REF=${REF:-bare}
echo "== $ROUNDS rounds, $STEPS steps: $([ "$REF" = bare ] && echo "bare, then ")$VARIANTS; ratios to $REF" | tee -a "$R"
for r in $(seq 1 "$ROUNDS"); do
  [ "$REF" = bare ] && one bare X=1
  for v in $VARIANTS; do
    IFS=, read -r -a envs <<<"${v#*=}"
    one "${v%%=*}" "${envs[@]}"
  done
done | tee -a "$R"
python3 - "$W" "$ROUNDS" "$REF" $(for v in $VARIANTS; do echo "${v%%=*}"; done) <<'PY' | tee -a "$R"
import json, sys
sys.path.insert(0, "benchmarks/device")
from job_cost_summary import mean_ci
w, rounds, ref = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def mean(name, r):
    try:
        return json.load(open(f"{w}/{name}_{r}.json"))["step_ms_mean"]
    except (OSError, ValueError, KeyError):
        return None
for name in sys.argv[4:]:
    if name == ref:
        continue
    ratios = [mean(name, r) / mean(ref, r) for r in range(1, rounds + 1) if mean(name, r) and mean(ref, r)]
    m, h = mean_ci(ratios)
    print(f"{name:8s} / {ref}, same round: " + " ".join(f"{x:.4f}" for x in ratios) + f"; mean {m:.4f} ± {h:.4f} (95 % t)")
PY
grep -h "^\[rank0\]: commtop\|^commtop" "$W"/*_1.log | cut -c1-300 | tee -a "$R"
(cd "$W" && tar czf "$OUT/cost_parts_runs.tar.gz" *.json *.log) || true
[ "${PROBES:-1}" = 1 ] && timeout 90 "${TR[@]}" benchmarks/probes/mixed_backend_fr.py 2>&1 | grep -E "mixed_backend_fr|Error" | tee -a "$R"
