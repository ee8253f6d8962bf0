#!/usr/bin/env bash
# One device call: GPM HBM bandwidth utilisation (DRAM_BW_UTIL) on the H200 through commtop's
# sampler code (benchmarks/probes/hbm_probe.py: idle / D2H / D2D), then a short `commtop ab` of none vs
# overlap whose result carries HBM bandwidth per arm, and `commtop report` on its recording.
set -x
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1
export PYTHONUNBUFFERED=1
run() { python3 -c 'import sys; from tui.cli import main; sys.exit(main())' "$@"; }
nvidia-smi -L
timeout 60 python3 benchmarks/probes/hbm_probe.py --seconds 3 --out $OUT/hbm_probe.json > $OUT/hbm_probe.txt 2>&1; echo "probe rc=$?" >> $OUT/hbm_probe.txt
timeout 100 bash -c "$(declare -f run); run ab --a mode=none --b mode=overlap --duration 20 --record $OUT/ab.commtop" > $OUT/ab.txt 2>&1; echo "ab rc=$?" >> $OUT/ab.txt
timeout 60 bash -c "$(declare -f run); run report $OUT/ab.commtop" > $OUT/ab_report.txt 2>&1; echo "report rc=$?" >> $OUT/ab_report.txt
python3 - "$OUT/ab.commtop" > $OUT/ticks.txt 2>&1 <<'PY'
import sys
from tui.recordings.reader import open_recording
rec = open_recording(sys.argv[1])
ticks = rec.tables().ticks
vals = [float(t.metrics["dram_bw_util_pct"][0]) for _, t in ticks if len(t.uuids)]
print(len(ticks), "ticks; dram_bw_util_pct first 40:", [round(v, 1) for v in vals[:40]])
PY
rm -f $OUT/ab.commtop
ls -la $OUT
