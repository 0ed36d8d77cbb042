#!/usr/bin/env bash
# Tests packaging/trainer/care-train against fake libtorch folders (no libtorch needed): a missing libtorch and a
# wrong version are refused with exit 2 and a message naming the fix; the right version execs the binary with
# libtorch's lib/ on LD_LIBRARY_PATH.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
t=$(mktemp -d)
trap 'rm -rf "$t"' EXIT
printf '#!/bin/sh\necho "ran $* LD=$LD_LIBRARY_PATH"\n' > "$t/bin"; chmod +x "$t/bin"
run() { CARE_TRAIN_BIN="$t/bin" CARE_TRAINER_CONFIG="$t/trainer.toml" "$HERE/care-train" "$@"; }
fail() { echo "[trainer-wrapper] FAIL: $*" >&2; exit 1; }

out=$(CARE_LIBTORCH="$t/none" run x 2>&1) && fail "missing libtorch accepted"
grep -q "libtorch not found" <<<"$out" || fail "unclear message: $out"

mkdir -p "$t/old/lib" "$t/good/lib"
echo "__version__ = '2.5.1+cpu'" > "$t/old/version.py"
echo "__version__ = '2.13.0+cu130'" > "$t/good/version.py"
out=$(CARE_LIBTORCH="$t/old" run x 2>&1) && fail "wrong version accepted"
grep -q "version '2.5.1', but this trainer needs 2.13.0" <<<"$out" || fail "unclear message: $out"

echo "libtorch = \"$t/good\"" > "$t/trainer.toml"
out=$(run stage1 --help)
[ "$out" = "ran stage1 --help LD=$t/good/lib" ] || fail "unexpected: $out"
echo "[trainer-wrapper] ok"
