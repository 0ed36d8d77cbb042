#!/usr/bin/env bash
# Shows that `packaging/dev.sh check` fires and names the missing piece and its fix, instead of the build failing
# deep inside lance-encoding's build script (issue "Fresh machine"). Run by `dev.sh test` after setup; needs only
# what setup installed. Each case hides one piece from an otherwise complete machine:
#   1. a PATH that lacks pkg-config;          2. PROTOC naming a protoc that does not exist;
#   3. a protoc that runs but sees no google/protobuf/*.proto (what a machine without libprotobuf-dev gives);
#   4. an ONNX Runtime library with an unresolvable dependency.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
t=$(mktemp -d)
trap 'rm -rf "$t"' EXIT
fail() { echo "[dev-check-test] FAIL: $*" >&2; exit 1; }

"$HERE/dev.sh" check || fail "the check fails on this (complete) machine"

expect() { # expect NAME PATTERN... : dev.sh check must exit 3 and print every pattern
    local name=$1 out rc=0
    shift
    out=$(env "${ENVS[@]}" "$HERE/dev.sh" check 2>&1) || rc=$?
    [ "$rc" = 3 ] || fail "$name: exit status $rc, expected 3; output: $out"
    for p in "$@"; do grep -qF -- "$p" <<<"$out" || fail "$name: output lacks '$p': $out"; done
    echo "[dev-check-test] $name: fired"
}

# 1. PATH lacking pkg-config: a folder with a link to every other command on PATH.
mkdir "$t/path"
IFS=: read -ra dirs <<<"$PATH"
for d in "${dirs[@]}"; do
    for f in "$d"/*; do
        n=$(basename "$f")
        [ -x "$f" ] && [ "$n" != pkg-config ] && [ ! -e "$t/path/$n" ] && ln -s "$f" "$t/path/$n"
    done
done
ENVS=(PATH="$t/path")
expect "PATH without pkg-config" "command 'pkg-config' not found" "sudo apt-get install pkg-config"

# 2. PROTOC pointing nowhere.
ENVS=(PROTOC="$t/nowhere/protoc")
expect "missing protoc" "protoc (the protobuf compiler) not found" "sudo apt-get install protobuf-compiler"

# 3. A working protoc without the well-known types: a copy looks for them beside itself, not in /usr/include.
mkdir -p "$t/proto/bin"
cp "$(command -v protoc)" "$t/proto/bin/protoc"
ENVS=(PROTOC="$t/proto/bin/protoc")
expect "protoc without libprotobuf-dev" "google/protobuf/empty.proto" "sudo apt-get install libprotobuf-dev"

# 4. An ONNX Runtime library that needs a library nobody has.
printf 'int f(void) { return 0; }\n' >"$t/dep.c"
cc -shared -fPIC -o "$t/libcaremissingdep.so" "$t/dep.c"
cc -shared -fPIC -o "$t/libonnxruntime.so" "$t/dep.c" -Wl,--no-as-needed -L"$t" -lcaremissingdep
rm "$t/libcaremissingdep.so"
ENVS=(ORT_DYLIB_PATH="$t/libonnxruntime.so")
expect "ONNX Runtime with an unresolved dependency" "libcaremissingdep.so not found" "packaging/dev.sh setup"
echo "[dev-check-test] ok"
