#!/usr/bin/env bash
# The wheel: `python -m build` in this checkout, installed into a fresh venv outside it, must run
# `commtop --version` and `commtop report` on a committed recording and carry its package data
# (the Textual .tcss and the Grafana dashboard). Neither command needs torch (only the workers
# do), and installing it took minutes on the 2-core CI machine: the venv gets the wheel's own
# dependency list minus torch (read from the wheel's METADATA), then the wheel with --no-deps.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
work=$(mktemp -d /tmp/commtop-wheel-XXXX)
trap 'rm -rf "$work"' EXIT
.venv/bin/python -m build --wheel --outdir "$work/dist" . >"$work/build.log" 2>&1 || { tail -20 "$work/build.log"; exit 1; }
wheel=$(ls "$work"/dist/commtop-*.whl)
echo "built $(basename "$wheel")"
python3 -m venv "$work/venv"
python3 - "$wheel" >"$work/requirements.txt" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as whl:
    meta = next(n for n in whl.namelist() if n.endswith(".dist-info/METADATA"))
    for line in whl.read(meta).decode().splitlines():
        if line.startswith("Requires-Dist:") and "extra ==" not in line and not line.split()[1].startswith("torch"):
            print(line.split(":", 1)[1].strip())
PY
grep -q '^prometheus-client' "$work/requirements.txt" || { echo "wheel metadata lacks prometheus-client"; exit 1; }
"$work/venv/bin/pip" install -q -r "$work/requirements.txt"
"$work/venv/bin/pip" install -q --no-deps "$wheel"
cd "$work"  # not the checkout: only the installed wheel can be imported
"$work/venv/bin/commtop" --version
"$work/venv/bin/commtop" report "$repo/recordings/cpu-gloo-4ranks-all_gather-modes.commtop" | head -5
"$work/venv/bin/python" - <<'PY'
import importlib.resources as r, json
import tui, workers
assert "site-packages" in tui.__file__, tui.__file__
assert (r.files("tui.view") / "app.tcss").is_file(), "app.tcss missing from the wheel"
dash = json.loads((r.files("workers.export") / "grafana-dashboard.json").read_text())
print(f"package data: app.tcss, grafana-dashboard.json ({len(dash['panels'])} panels)")
PY
