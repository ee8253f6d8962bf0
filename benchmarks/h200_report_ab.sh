#!/usr/bin/env bash
# `commtop report` on the H200 host's CPU, before/after, one device call: one 10 M-record file
# (benchmarks/recordings.py's generator), then fresh CLI processes of the code before (an untracked
# copy of an older commit's tui/ and workers/ in ./_before, carried: `git archive OLD tui workers |
# tar -x -C _before`) and of this tree, interleaved, with wall time, system time and page faults;
# their JSON outputs' md5; then recordings.py on the same file. Wheels first (device-wheels.sh).
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
. benchmarks/_h200_wall.sh
for i in 1 2 3 4; do
  echo -n "before run $i: "; (cd _before && PYTHONPATH=$top/_before:/tmp/site wall python3 -m tui.cli report /tmp/bench10m.commtop --format json)
  echo -n "after run $i: "; wall python3 -m tui.cli report /tmp/bench10m.commtop --format json
done
(cd _before && PYTHONPATH=$top/_before:/tmp/site python3 -m tui.cli report /tmp/bench10m.commtop --format json) | md5sum
python3 -m tui.cli report /tmp/bench10m.commtop --format json | md5sum
python3 benchmarks/recordings.py --no-append --reuse /tmp/bench10m.commtop
