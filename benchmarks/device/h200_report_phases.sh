#!/usr/bin/env bash
# `commtop report` part by part on the device host's CPU (benchmarks/probes/report_phases.py), with
# the libraries it reads with: the image's own (zstandard may be absent there, then the recording
# is zlib) and .whl's (what `pip install commtop` resolves: zstandard, msgpack). ~3 min.
#   device: bash benchmarks/device/h200_report_phases.sh   (carry .whl: device-wheels.sh zstandard==0.25.0 msgpack==1.2.4)
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
R="$OUT/report_phases.txt"
export PYTHONUNBUFFERED=1
{ nproc; lscpu | grep -E "Model name|^CPU\(s\)|MHz"; python3 --version; } | tee "$R"
echo "== the image's libraries" | tee -a "$R"
python3 -c "
import msgpack, numpy
try:
    import zstandard; z = zstandard.__version__
except ImportError:
    z = 'absent'
print('numpy', numpy.__version__, 'msgpack', msgpack.version, msgpack.Unpacker.__module__, 'zstandard', z)
" 2>&1 | tee -a "$R"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
F=/tmp/bench10m.commtop
(cd benchmarks/standing && timeout 300 python3 -c "
from pathlib import Path
import recordings
print('write s', recordings.write(Path('$F'), 10_000_000, 8))
") 2>&1 | tee -a "$R"
timeout 200 python3 benchmarks/probes/report_phases.py "$F" --runs ${RUNS:-4} 2>&1 | tee -a "$R"
(cd benchmarks/standing && timeout 120 python3 recordings.py --reuse "$F" --out "$OUT/recordings_reuse.md" >/dev/null 2>&1)
grep -E "commtop report --format json|read speed, M records/s|/ reference|same-run reference" "$OUT/recordings_reuse.md" | tee -a "$R"
