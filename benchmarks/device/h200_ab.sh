#!/usr/bin/env bash
# The A/B verdicts on the single-H200 machine, in one device call (~4 minutes):
# `commtop ab --a mode=none --b mode=overlap` and `--b mode=sync` (the forum loop, world size 1),
# each recorded, and `commtop report` on each recording (which reproduces the verdict from the
# A/B marks). Run from the repo root with the carried wheels in .whl; results go to $OUT
# (7 files: the log, and per arm B the output, the recording and its report).
set -u
OUT=${OUT:-h200-out}; mkdir -p "$OUT"
PY=${PY:-python3}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export COMMTOP_RUNTIME_DIR=/tmp/ct; rm -rf /tmp/ct
exec > >(tee -a "$OUT/ab.log") 2>&1
echo "== $(date -u +%FT%TZ) $(hostname)"; nvidia-smi -L || true
$PY -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version())'
for b in overlap sync; do
  echo "== commtop ab --a mode=none --b mode=$b --duration ${AB_S:-60}"
  timeout 170 $PY -m tui.cli ab --a mode=none --b "mode=$b" --duration "${AB_S:-60}" --seed 13 \
      --record "$OUT/h200-ab-none-$b.commtop" > "$OUT/ab-$b.txt" 2>&1
  echo "exit $?"; cat "$OUT/ab-$b.txt"
  $PY -m tui.cli report "$OUT/h200-ab-none-$b.commtop" > "$OUT/report-$b.txt" 2>&1
  echo "-- report of the recording (its A/B section):"; grep -A14 "^A/B:" "$OUT/report-$b.txt"
done
echo "== done $(date -u +%FT%TZ)"
