#!/usr/bin/env bash
# Issue 15 before/after on the H200 host's own CPU, one device call: the code (an untracked
# copy of 0650af5's tui/, workers/ and benchmarks/ in ./_before, carried: `git archive 0650af5 tui
# workers benchmarks | tar -x -C _before`), each with its own render_scale.py, against this tree,
# interleaved; then `commtop report` on one 10 M-record file written by this tree's writer (with
# chunk summaries; 0650af5 reads the same file and skips them), fresh processes interleaved; then
# recordings.py on that file. Wheels first (device-wheels.sh), .whl carried.
set -x
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1
top=$PWD
nproc; python3 -c "import os; print('affinity', len(os.sched_getaffinity(0)))"; uptime
for i in 1 2; do
  (cd _before && PYTHONPATH=$top/_before:/tmp/site python3 benchmarks/render_scale.py --no-append --ranks 8,64,512 --seconds 8) > $OUT/render_before_$i.md 2>&1
  python3 benchmarks/render_scale.py --no-append --ranks 8,64,512 --seconds 8 > $OUT/render_after_$i.md 2>&1
done
python3 -c "
import sys; sys.path.insert(0, 'benchmarks')
from pathlib import Path
import recordings
print('write s', recordings.write(Path('/tmp/bench10m.commtop'), 10_000_000, 8))
" > $OUT/report_ab.txt 2>&1
. benchmarks/_h200_wall.sh
for i in 1 2 3; do
  echo -n "before run $i: "; (cd _before && PYTHONPATH=$top/_before:/tmp/site wall python3 -c "import sys; from tui import report; sys.exit(report.main(['/tmp/bench10m.commtop', '--format', 'json']))")
  echo -n "after run $i: "; wall python3 -m tui.cli report /tmp/bench10m.commtop --format json
done >> $OUT/report_ab.txt 2>&1
for i in 1 2; do python3 benchmarks/recordings.py --no-append --reuse /tmp/bench10m.commtop; done > $OUT/recordings.md 2>&1
ls -la $OUT
