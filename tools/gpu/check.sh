#!/usr/bin/env bash
# The GPU check of gearshift's capture/release path (docs/architecture.md, "Hazards on the device").
# Run from the repository root on a CUDA machine: bash tools/gpu/check.sh (about 6 minutes, under 10).
# Uses the machine's own python3 and torch (no package index); a package the machine lacks (posix_ipc,
# for the 2-worker adoption) is installed from wheels in .whl/ when that folder holds any
# (made elsewhere: pip download posix_ipc --only-binary=:all: --python-version X.Y -d .whl).
# Prints ONE JSON line: gearshift.tools.bench.graphs_gpu's probes, the GPU tests, bench graphs --device cuda.
set -u
cd "$(dirname "$0")/../.." || exit 1
O=$(mktemp -d)
trap 'rm -rf "$O"' EXIT
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --target "$O/site" .whl/*.whl || exit 1
fi
export PYTHONPATH="$O/site:$PWD/src:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
python3 -c "import torch, gearshift; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())" >&2 || exit 1
exec timeout 580 python3 -m gearshift.tools.bench.graphs_gpu
