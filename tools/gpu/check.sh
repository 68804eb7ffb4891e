#!/usr/bin/env bash
# The GPU check of gearshift's device path (docs/architecture.md, "Hazards on the device").
# Run from the repository root on a CUDA machine: bash tools/gpu/check.sh [STEP ...]
# (about 4 minutes on an H100; never more than 340 s: rerun it within a 15-minute lease).
# Uses the machine's own python3 and torch (no package index); a package the machine lacks (posix_ipc,
# for the 2-worker adoption) is installed from wheels in .whl/ when that folder holds any
# (made elsewhere: pip download posix_ipc --only-binary=:all: --python-version X.Y -d .whl).
# Prints one JSON line per step as it ends (gearshift.tools.bench.graphs_gpu says which), so a
# step that hangs or faults loses only itself; the raw-torch probes run last, each alone.
set -u
cd "$(dirname "$0")/../.." || exit 1
O=$(mktemp -d)
trap 'rm -rf "$O"' EXIT
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --target "$O/site" .whl/*.whl || exit 1
fi
export PYTHONPATH="$O/site:$PWD/src:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
# the outer limit is graphs_gpu.BUDGET + SPARE: every step's own timeout ends first
timeout -k 5 340 python3 -m gearshift.tools.bench.graphs_gpu "$@"
