#!/usr/bin/env bash
# Everything commtop measures on the single-H200 machine, in one device call (~6 minutes):
# overhead A/B, one recording with the four offload modes toggled through `commtop ctl`,
# the report of that recording, the cost of live control, and the monitored DDP example.
# Run from the repo root with the carried wheels in .whl (shared/tools/device-wheels.sh);
# results go to $OUT (or ./h200-out).
set -u
OUT=${OUT:-h200-out}; mkdir -p "$OUT"
PY=${PY:-python3}
if [ -z "${SKIP_WHEELS:-}" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export COMMTOP_RUNTIME_DIR=/tmp/ct; rm -rf /tmp/ct
ct() { $PY -m tui.cli "$@"; }
log="$OUT/session.log"
exec > >(tee -a "$log") 2>&1
echo "== $(date -u +%FT%TZ) $(hostname)"; nvidia-smi -L || true
$PY -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'

# MODE_S: seconds per mode (5 on one H200; >= 20 on 8 GPUs for >= 200 steps of 32 all_gathers).
# COLLECTIVES: which collectives to record (a multi-GPU node: "all_gather all_reduce").
for coll in ${COLLECTIVES:-all_gather}; do
  echo "== 1. recording $coll: none -> overlap -> sync -> sync-barrier -> none, then pageable and 2x copies, via ctl"
  rec="$OUT/$(hostname)-${coll}-modes.commtop"
  $PY -m tui.cli run --headless --collective "$coll" --offload none --record "$rec" > "$OUT/rec_run_$coll.txt" 2>&1 &
  run_pid=$!
  for _ in $(seq 120); do ct ctl status 2>/dev/null | grep -q " [1-9][0-9]* rank(s) reporting" && break; sleep 0.5; done
  ct ctl status
  for m in overlap sync sync-barrier none; do sleep "${MODE_S:-5}"; ct ctl mode "$m"; done
  sleep "${MODE_S:-5}"; ct ctl set mode=overlap pinned=false; sleep "${MODE_S:-5}"
  ct ctl set mode=overlap pinned=true copy_scale=2; sleep "${MODE_S:-5}"
  ct ctl status
  kill -TERM "$run_pid"; wait "$run_pid"; echo "run exit $? (130: stopped by us, as intended)"
  cat "$OUT/rec_run_$coll.txt"
  ct report "$rec" > "$OUT/report_$coll.txt" 2>&1; cat "$OUT/report_$coll.txt"
  ls -la "$rec"
done

echo "== 2. live control cost: same loop with and without it (mode none, 64000 collectives)"
for lc in 1 0 1 0; do
  COMMTOP_LIVE_CONTROL=$lc ct run --headless --offload none --iters ${LC_ITERS:-64000} > /tmp/lc.txt 2>&1
  echo "live_control=$lc $(grep -h commtop-summary /tmp/ct/*/job.log | tail -1)"
done | tee "$OUT/control_cost.txt"

echo "== 3. overhead A/B (benchmarks/standing/overhead.py)"
timeout 200 $PY benchmarks/standing/overhead.py --out "$OUT/overhead.md"

echo "== 4. the monitored DDP example under commtop"
timeout 120 $PY -m tui.cli run --headless -- $PY examples/train_ddp.py --steps ${DDP_STEPS:-300} 2>&1 | tail -30 | tee "$OUT/monitor_example.txt"
echo "== done $(date -u +%FT%TZ)"
