#!/usr/bin/env bash
# GPU collectives from several threads of a rank (benchmarks/jobs/nccl_threads.py: DDP's comm hook
# on autograd's device thread, the loop, a saver thread), under the Flight Recorder capture and
# under the Python hooks (a CUDA event ring per thread, workers.monitor.timers); the job's own
# count against the recording's records + missing. ~1 min.
#   device run: bash benchmarks/device/h200_hook_threads.sh      (carry .whl)
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
R=$OUT/hook_threads.txt
{ nvidia-smi -L; python3 -c 'import torch; print("torch", torch.__version__)'; } | tee "$R"
for capture in default hooks; do
  rm -f /tmp/nt.*; echo "== capture $capture" | tee -a "$R"
  env $([ $capture = hooks ] && echo COMMTOP_CAPTURE=hooks) timeout 150 python3 -c 'import sys; from tui.cli import main; sys.exit(main())' \
    run --headless --record /tmp/nt_$capture.commtop -- python3 benchmarks/jobs/nccl_threads.py /tmp/nt > "$OUT/nt_$capture.log" 2>&1
  echo "rc=$?" | tee -a "$R"
  grep -E "commtop:|vm:|:0 |state" "$OUT/nt_$capture.log" | tail -6 | tee -a "$R"
  cat /tmp/nt.rank*.json 2>/dev/null | tee -a "$R"; echo | tee -a "$R"
  python3 -c 'import sys; from tui.cli import main; sys.exit(main())' report /tmp/nt_$capture.commtop > "$OUT/nt_${capture}_report.txt" 2>&1
  grep -E "^ +0 |^missing|^[0-9] " "$OUT/nt_${capture}_report.txt" | head -20 | tee -a "$R"
done
