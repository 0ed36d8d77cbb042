#!/usr/bin/env bash
# The GPU check, run on a lent GPU machine in one call (docs/dev/gpu-check.md): care-train gpu-check (built here by
# `packaging/dev.sh device-build`, linked at run time to the machine's own torch/lib) and the PyTorch + PEFT
# reference on the same GPU. Everything it writes goes to $OUT (the device tool brings that folder back).
#   bash target/device-pack/gpu_check.sh [STEPS]
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/care-gpu-check}
STEPS=${1:-10}
mkdir -p "$OUT"
PY=${PY:-python3}
# The machine's torch (2.11, CUDA 13) and the nvidia-* wheels beside it give libtorch and the CUDA libraries.
SITE=$("$PY" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
NV=$(find "$SITE/nvidia" -maxdepth 4 -type d -name lib 2>/dev/null | tr '\n' ':')
export LD_LIBRARY_PATH="$SITE/torch/lib:${NV}${LD_LIBRARY_PATH:-}"
# The caching allocator maps memory as it is needed, so the device's used memory tracks what is allocated.
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True CARE_NO_PROGRESS=1
{
    date -u
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
    "$PY" -c 'import torch; print("torch", torch.__version__, torch.version.cuda)'
    ldd "$HERE/care-train" | grep -E 'not found|torch|c10|cudart' || true
} >"$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"
t0=$(date +%s)
timeout 330 "$HERE/care-train" gpu-check --json "$OUT/gpu-check.json" --steps "$STEPS" --case-timeout 200 2>&1 |
    tee "$OUT/care-train.log" | grep -v '^\[ *[0-9.]*s\] training'
echo "[gpu_check.sh] care-train gpu-check: $(( $(date +%s) - t0 )) s"
t1=$(date +%s)
PYTHONUNBUFFERED=1 timeout 200 "$PY" "$HERE/stage2_reference.py" --json "$OUT/reference.json" --steps "$STEPS" 2>&1 |
    tee "$OUT/reference.log"
echo "[gpu_check.sh] reference: $(( $(date +%s) - t1 )) s"
