#!/usr/bin/env bash
# Builds care-appliance_<version>_amd64.deb into dist/.
#
#   packaging/build-deb.sh                      release build (≈60 min from clean on 2 cores; what ships)
#   packaging/build-deb.sh --profile dev        a debug build of `care` alone (CI packages the tests' own binary instead)
#   packaging/build-deb.sh --binary PATH --version V   package an existing `care` binary as version V-1
#   --fast                                      quicker, larger compression (CI)
#                                               (the upgrade test packages the previous release this way)
#
# Needs cargo-deb (`cargo install cargo-deb --locked`) and what `packaging/dev.sh setup` fetches (the ONNX Runtime
# library and the default model). Everything generated goes to packaging/deb/gen (git-ignored).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
PROFILE=release
BINARY=""
VERSION=""
OUT="$ROOT/dist"
FAST=""
while [ $# -gt 0 ]; do
    case "$1" in
        --profile) PROFILE=$2; shift 2 ;;
        --binary) BINARY=$2; shift 2 ;;
        --version) VERSION=$2; shift 2 ;;
        --out) OUT=$2; shift 2 ;;
        --fast) FAST=--fast; shift ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
done
log() { printf '[build-deb] %s\n' "$*" >&2; }
command -v cargo-deb >/dev/null || { log "cargo-deb not found: packaging/dev.sh deb-tools installs it"; exit 1; }
packaging/dev.sh setup >/dev/null
[ -z "$VERSION" ] && VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
if [ -z "$BINARY" ]; then
    cargo build -p care --profile "$PROFILE"
    dir=$PROFILE; [ "$PROFILE" = dev ] && dir=debug
    BINARY="$TARGET/$dir/care"
fi
GEN="$ROOT/packaging/deb/gen"
rm -rf "$GEN"
mkdir -p "$GEN/bin" "$GEN/man" "$GEN/maintainer" "$OUT"
log "staging $BINARY (stripped) as version $VERSION"
strip --strip-unneeded -o "$GEN/bin/care" "$BINARY"
for f in packaging/deb/maintainer/*; do
    sed "s/#DEB_VERSION#/$VERSION-1/g" "$f" > "$GEN/maintainer/$(basename "$f")"
    chmod 755 "$GEN/maintainer/$(basename "$f")"
done
# Man pages come from the binary's own clap definitions, so they cannot drift from `--help`. A binary from before
# `care manpages` existed (0.1.0) gets a minimal page pointing at --help.
if ! "$GEN/bin/care" manpages "$GEN/man" 2>/dev/null; then
    printf '.TH CARE 1\n.SH NAME\ncare \\- CARE hospital search appliance\n.SH DESCRIPTION\nRun \\fBcare --help\\fR.\n' > "$GEN/man/care.1"
fi
gzip -9n "$GEN"/man/*.1
# Debian revision 1: the upstream version is the workspace version.
DEB="$OUT/care-appliance_${VERSION}-1_amd64.deb"
cargo deb -p care --no-build --no-strip $FAST --deb-version "${VERSION}-1" -o "$DEB"
log "wrote $DEB"
