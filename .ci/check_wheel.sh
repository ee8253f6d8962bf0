#!/usr/bin/env bash
# The wheel: `python -m build` in this checkout, installed into a fresh venv outside it, must run
# `commtop --version` and `commtop report` on a committed recording and carry its package data
# (the Textual .tcss and the Grafana dashboard). It installs with all its dependencies, as a user
# would; torch is pinned to the CPU build that CPU machines have on disk (an unpinned torch range
# takes a multi-GB CUDA build).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
work=$(mktemp -d /tmp/commtop-wheel-XXXX)
trap 'rm -rf "$work"' EXIT
.venv/bin/python -m build --wheel --outdir "$work/dist" . >"$work/build.log" 2>&1 || { tail -20 "$work/build.log"; exit 1; }
wheel=$(ls "$work"/dist/commtop-*.whl)
echo "built $(basename "$wheel")"
python3 -m venv "$work/venv"
"$work/venv/bin/pip" install -q torch==2.13.0 "$wheel"
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
