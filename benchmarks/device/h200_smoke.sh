#!/usr/bin/env bash
# Smoke of commtop on the H200 in one device call: the synthetic loop with prometheus, report, a short
# A/B, and the monitor-API example under the capture bootstrap. Wheels first, here:
#   bash ../shared/tools/device-wheels.sh cupti-python==13.0.1 cuda-bindings==13.0.3 cuda-pathfinder prometheus-client zstandard
# then run `bash benchmarks/device/h200_smoke.sh` there with .whl carried.
set -x
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1
export PYTHONUNBUFFERED=1
run() { python3 -c 'import sys; from tui.cli import main; sys.exit(main())' "$@"; }
nvidia-smi -L
timeout 150 bash -c "$(declare -f run); run run --headless --iters 640 --offload overlap --record $OUT/smoke.commtop --prometheus 127.0.0.1:0" > $OUT/run.txt 2>&1; echo "run rc=$?" >> $OUT/run.txt
run report $OUT/smoke.commtop > $OUT/report.txt 2>&1; echo "report rc=$?" >> $OUT/report.txt
timeout 120 bash -c "$(declare -f run); run ab --a mode=none --b mode=overlap --duration 25" > $OUT/ab.txt 2>&1; echo "ab rc=$?" >> $OUT/ab.txt
timeout 150 bash -c "$(declare -f run); run run --headless --record $OUT/ddp.commtop -- python3 examples/train_ddp.py --steps 30" > $OUT/ddp.txt 2>&1; echo "ddp rc=$?" >> $OUT/ddp.txt
run report $OUT/ddp.commtop > $OUT/ddp_report.txt 2>&1
rm -f $OUT/smoke.commtop
ls -la $OUT
