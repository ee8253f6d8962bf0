#!/usr/bin/env bash
# CUPTI timing on the H200 in one device call: the raw CUPTI client (decode, fixture, costs, agreement
# with CUDA events in every mode and at three sizes), overhead.py with CUPTI and with CUDA events,
# a headless synthetic run, and the unmodified DDP example under the capture bootstrap.
# Wheels first, here: bash ../shared/tools/device-wheels.sh cupti-python==13.0.1 cuda-bindings==13.0.3 cuda-pathfinder prometheus-client zstandard
# Logs: $OUT/h200_cupti.log (everything), plus the probe's JSON and fixture files.
exec > $OUT/h200_cupti.log 2>&1
set -x
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1
nvidia-smi -L
timeout 300 python3 benchmarks/probes/cupti_timer_probe.py capture --out-dir $OUT; echo "capture rc=$?"
timeout 60 python3 benchmarks/probes/cupti_timer_probe.py layouts --out-dir $OUT | tail -3; echo "layouts rc=$?"
run() { python3 -c 'import sys; from tui.cli import main; sys.exit(main())' "$@"; }
timeout 120 bash -c "$(declare -f run); run run --headless --iters 3200 --offload overlap --record $OUT/cupti_run.commtop"; echo "run rc=$?"
run report $OUT/cupti_run.commtop | head -40
timeout 150 bash -c "$(declare -f run); run run --headless --record $OUT/ddp_plain.commtop -- python3 examples/train_ddp_plain.py --steps 50"; echo "ddp rc=$?"
run report $OUT/ddp_plain.commtop | head -40
for t in ${TIMINGS:-cupti events}; do
  COMMTOP_TIMING=$t timeout 200 python3 benchmarks/standing/overhead.py --out $OUT/overhead_$t.txt > /dev/null 2>&1; echo "overhead $t rc=$?"
  cat $OUT/overhead_$t.txt
done
rm -f $OUT/cupti_buffers.bin $OUT/cupti_buffers.json
