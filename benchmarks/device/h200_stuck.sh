#!/usr/bin/env bash
# One GPU, NCCL: a collective stuck behind a spinning kernel (benchmarks/jobs/nccl_stuck.py) under
# the Flight Recorder capture: the Hellos sent meanwhile say which collective the rank is inside
# (op, bytes, since), the recording holds them; counts recorded + missing against the job's. ~40 s.
#   device run: bash benchmarks/device/h200_stuck.sh      (carry .whl)
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
R=$OUT/stuck.txt
nvidia-smi -L | tee "$R"
rm -f /tmp/st.*
timeout 120 python3 -c 'import sys; from tui.cli import main; sys.exit(main())' run --headless --record /tmp/st.commtop \
  -- python3 benchmarks/jobs/nccl_stuck.py /tmp/st ${SECONDS_STUCK:-8} > "$OUT/stuck.log" 2>&1
echo "rc=$?" | tee -a "$R"
grep -E "^0 |commtop" "$OUT/stuck.log" | cut -c1-300 | tail -8 | tee -a "$R"
echo "job: $(cat /tmp/st.rank0.json 2>/dev/null)" | tee -a "$R"
python3 - /tmp/st.commtop <<'PY' | tee -a "$R"
import sys
from tui.recordings.reader import open_recording
from workers.wire.protocol import OP_NAMES
with open_recording(sys.argv[1]) as rec:
    t = rec.tables()
inside = [(h.t_ns, h.inside) for _, h in t.hellos if h.inside]
print("recorded", len(t.coll["rank"]), "+ lost", max((h.lost for _, h in t.hellos), default=0), "| hellos", len(t.hellos), "with inside", len(inside))
for t_ns, (op, g, nbytes, since) in inside[:12]:
    print(f"  hello at +{(t_ns - since) / 1e9:.2f} s inside {OP_NAMES[op]} group {g} {nbytes} B since {since}")
PY
