#!/usr/bin/env bash
# A stopped NCCL job keeps every collective it issued (the Flight Recorder path of on_sigterm,
# tested on gloo by tests/test_stopped_job_keeps_records.py): `commtop run --headless --record`
# of benchmarks/jobs/counted_until_stopped.py on the GPUs, stopped after DELAY s by SIGTERM or
# SIGINT to commtop. Per rank: the job's own [done, begun] against the recording's records plus
# what it counted lost (issued, never seen to finish: the stuck case's collectives behind its
# 60 s kernel), the exit code, the summary's end column, how long the stop took (signal to
# commtop's exit) and what is left running. ~3 min.
#   device run: bash benchmarks/device/h200_stop_check.sh      (carry .whl)
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 COMMTOP_RUNTIME_DIR=/tmp/ct-stop
NPROC=${NPROC:-$(nvidia-smi -L | wc -l)}
R="$OUT/stop_check.txt"
check() {  # SIG PACE DELAY TAG [ENV=VAL]
  local sig=$1 pace=$2 delay=$3 tag=$4; shift 4
  [[ -n ${ONLY:-} && ! $tag =~ $ONLY ]] && return  # ONLY=REGEX: the cases whose tag matches
  local dir=/tmp/stop-$tag; rm -rf "$dir"; mkdir -p "$dir"
  env "$@" python3 -m tui.cli run --headless --nproc "$NPROC" --record "$dir/rec.commtop" \
    -- python3 benchmarks/jobs/counted_until_stopped.py "$dir" "$pace" > "$dir/out.txt" 2>&1 &
  local pid=$!
  for _ in $(seq 300); do [ -s "$dir/rank0.json" ] && break; sleep 0.2; done
  sleep "$delay"; local t0; t0=$(date +%s.%N); kill -"$sig" $pid; wait $pid; local rc=$?
  local took; took=$(python3 -c "import time; print(f'{time.time() - $t0:.2f}')")
  sleep 1
  local left; left=$(pgrep -fc "python3 benchmarks/jobs/counted_until_stopped.py|torch.distributed.run|workers.capture.(bootstrap|fr_child)" || true)
  python3 - "$dir" "$tag" "$rc" "$left" "$took" <<'PY' | tee -a "$R"
import collections, json, subprocess, sys
from pathlib import Path
from tui.recordings.reader import open_recording
d, tag, rc, left, took = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
with open_recording(d / "rec.commtop") as rec:
    got = collections.Counter(rec.tables().coll["rank"].tolist())
report = json.loads(subprocess.run([sys.executable, "-m", "tui.cli", "report", str(d / "rec.commtop"), "--format", "json"],
                                   capture_output=True, text=True).stdout or "{}")
lost = {r["rank"]: r["lost"] for r in report.get("ranks", [])}
ends = [" ".join(l.split()[-3:]) for l in (d / "out.txt").read_text().splitlines() if l[:1].isdigit() and " killed " in l]
for f in sorted(d.glob("rank*.json")):
    r = int(f.stem[4:]); t = json.loads(f.read_text()); n = got[r] + lost.get(r, 0)
    ok = t["done"] <= n <= t["begun"]  # recorded, or counted lost (issued, never seen to finish)
    print(f"{tag:22s} rank {r}: issued done {t['done']} begun {t['begun']}, recorded {got[r]} + lost {lost.get(r)} -> {'OK' if ok else 'MISMATCH'}; rc {rc}; stop {took} s; left running {left}; ends {ends}")
PY
  tail -25 "$dir/out.txt" > "$OUT/stop_$tag.txt"
}
{ date -u +%FT%TZ; nvidia-smi -L; } | tee "$R"
check TERM fast 8 term-fast
check TERM fast 5 term-fast-2
check INT fast 8 int-fast
check TERM slow 6 term-slow
check TERM stuck 8 term-stuck
check TERM fast 8 term-fast-rankdecode COMMTOP_FR_DECODE=rank
check TERM fast 8 term-fast-hooks COMMTOP_CAPTURE=hooks
check TERM stuck 8 term-stuck-hooks COMMTOP_CAPTURE=hooks
