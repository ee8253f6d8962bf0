#!/usr/bin/env bash
# `commtop report` on the H200 host's CPU (16 cores) before/after this session's report changes, one
# device call: one 10 M-record file (benchmarks/recordings.py's generator), then fresh CLI processes
# of the code before (an untracked copy of 5ea564b's tui/ and workers/ in ./_before, carried) and
# after, interleaved, then recordings.py on the same file. Wheels first (device-wheels.sh), .whl carried.
set -x
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1
nproc; python3 -c "import os; print('affinity', len(os.sched_getaffinity(0)))"
python3 -c "
import sys; sys.path.insert(0, 'benchmarks')
from pathlib import Path
import recordings
print('write s', recordings.write(Path('/tmp/bench10m.commtop'), 10_000_000, 8))
"
top=$PWD
wall() { local t0 t1; t0=$(date +%s.%N); "$@" > /dev/null; t1=$(date +%s.%N); python3 -c "d=$t1-$t0; print(f'{d:.3f} s  {10_000_110/d/1e6:.2f} M rec/s')"; }
for i in 1 2 3; do
  echo -n "before (5ea564b) run $i: "; (cd _before && PYTHONPATH=$top/_before:/tmp/site wall python3 -m tui.cli report /tmp/bench10m.commtop --format json)
  echo -n "after run $i: "; wall python3 -m tui.cli report /tmp/bench10m.commtop --format json
done
(cd _before && PYTHONPATH=$top/_before:/tmp/site python3 -m tui.cli report /tmp/bench10m.commtop --format json) | md5sum
python3 -m tui.cli report /tmp/bench10m.commtop --format json | md5sum
python3 benchmarks/recordings.py --no-append --reuse /tmp/bench10m.commtop
