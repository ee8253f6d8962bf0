#!/usr/bin/env bash
# Ranks a script starts itself, on the GPUs (workers.capture.spawned): NCCL ranks started with
# multiprocessing.Process (spawn, fork), names bound by import, under `commtop run --nproc 1`;
# the job's own count against the recording's records + missing; then the gloo shapes of
# tests/jobs/spawned_ranks.py; and torchrun's parser on the line commtop runs (`--`). ~3 min.
#   device run: bash benchmarks/device/h200_self_launched.sh      (carry .whl)
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
R=$OUT/self_launched.txt
{ nvidia-smi -L; python3 --version; python3 -c 'import torch; print("torch", torch.__version__)'; } | tee "$R"
python3 - <<'PY' 2>&1 | tee -a "$R"
from torch.distributed.run import get_args_parser
from tui.run.job_plan import script_argv
for cmd in (["python", "t.py", "--start", "fork", "--log", "x", "-m", "y"], ["torchrun", "--nproc-per-node", "2", "t.py", "--start", "1"]):
    a = get_args_parser().parse_args(script_argv(cmd, 2)[3:])
    print("torchrun's parser:", a.module, a.training_script, a.training_script_args)
PY
commtop() { python3 -c 'import sys; from tui.cli import main; sys.exit(main())' "$@"; }
counts() {  # PREFIX REC
  python3 - "$1" "$2" <<'PY' | tee -a "$R"
import glob, json, subprocess, sys
job = [json.load(open(f)).get("issued") for f in sorted(glob.glob(sys.argv[1] + ".rank*.json"))]
rep = subprocess.run([sys.executable, "-c", "import sys; from tui.cli import main; sys.exit(main())", "report", sys.argv[2], "--format", "json"], capture_output=True, text=True)
try:
    ranks = json.loads(rep.stdout)["ranks"]
    got = [f"{r['records']} + {r['missing']}" for r in ranks]
except Exception as exc:
    got = [f"no report ({exc!r}: {rep.stderr[-200:]})"]
print("job", job, "| recorded + missing", got)
PY
}
for how in ${NCCL_HOW:-spawn fork}; do
  rm -f /tmp/np.*; echo "== NCCL, multiprocessing.Process $how" | tee -a "$R"
  timeout 150 bash -c "$(declare -f commtop); commtop run --headless --nproc 1 --record /tmp/np_$how.commtop -- python3 benchmarks/jobs/nccl_process_ranks.py /tmp/np $how" > "$OUT/np_$how.log" 2>&1
  echo "rc=$?" | tee -a "$R"
  grep -E "commtop:|exit codes" "$OUT/np_$how.log" | tail -5 | tee -a "$R"
  counts /tmp/np /tmp/np_$how.commtop
done
for a in "--start spawn" "--start fork --launcher-is-rank0" "--start spawn --subclass"; do
  rm -f /tmp/sr.*; echo "== gloo, tests/jobs/spawned_ranks.py $a" | tee -a "$R"
  timeout 120 bash -c "$(declare -f commtop); commtop run --headless --nproc 1 --record /tmp/sr.commtop -- python3 tests/jobs/spawned_ranks.py --ranks 3 $a --counts /tmp/sr" > "$OUT/sr.log" 2>&1
  echo "rc=$?" | tee -a "$R"
  python3 -c "import json; print('job', [sum(r[-1] for r in json.load(open(f'/tmp/sr.rank{i}.json'))) for i in range(3)])" 2>&1 | tee -a "$R"
  counts /tmp/nothing /tmp/sr.commtop
done
