#!/usr/bin/env bash
# Packs CARE's recipe for one call of a lent GPU machine (issue 57; docs/dev/gpu-check.md), from an appliance's data
# directory whose approved collections and judgment sets are the run's data (tests/bench/retrain_real.sh sets one up):
#   - recipe-a.json: the recipe a run takes on a GPU (`care train recipe --device cuda`: both sides, 16,000 groups);
#   - recipe-b.json: the query side's recipe with a 4-layer query encoder (`--device cpu --query-layers 4`);
#   - stage2.jsonl.gz, corpus.jsonl.gz: what the data phase of such a run writes (`care train data`);
#   - e5-pruned.bin: e5-small cut down to the pieces those texts use (`care-train prune-vocab`): the default file is
#     71.6 MB, more than one call carries;
#   - recipe.sh, the script that runs there.
# The care-train that runs there must already be in PACK (`packaging/dev.sh device-build` builds it against the
# machine's torch; the CPU test copies its own). Prints what the call carries and fails above 60 MiB.
#   trainer/bench/recipe_prepare.sh DATA_DIR [PACK]     (PACK: target/device-pack)
# Needs CARE_BIN (default $CARGO_TARGET_DIR/debug/care), CARE_TRAIN_BIN (care-train here), CARE_E5S1.
set -euo pipefail
cd "$(dirname "$0")/../.."
data=${1:?usage: recipe_prepare.sh DATA_DIR [PACK]}
pack=${2:-target/device-pack}
care=${CARE_BIN:-${CARGO_TARGET_DIR:-target}/debug/care}
: "${CARE_TRAIN_BIN:?CARE_TRAIN_BIN must name a care-train that runs here}" "${CARE_E5S1:?CARE_E5S1 must name e5-small-q4.bin}"
[ -x "$pack/care-train" ] || { echo "recipe_prepare.sh: $pack/care-train is missing (packaging/dev.sh device-build)" >&2; exit 1; }
# CARE_CONFIG: the appliance's config file (tests/bench/retrain_real.sh writes DATA_DIR/bench/care.toml).
cfg=${CARE_CONFIG:-$data/bench/care.toml}
c() { if [ -f "$cfg" ]; then "$care" --data-dir "$data" --config "$cfg" "$@"; else "$care" --data-dir "$data" "$@"; fi; }
c train recipe --device cuda >"$pack/recipe-a.json"
c train recipe --device cpu --query-layers 4 >"$pack/recipe-b.json"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
c train data --out "$work" --recipe "$pack/recipe-a.json"
"$CARE_TRAIN_BIN" prune-vocab --e5s1 "$CARE_E5S1" --texts "$work/stage2.jsonl" "$work/corpus.jsonl" --out "$pack/e5-pruned.bin"
for f in stage2 corpus; do gzip -9 -c "$work/$f.jsonl" >"$pack/$f.jsonl.gz"; done
cp trainer/bench/recipe.sh "$pack/"
du -b "$pack"/* | sort -n
bytes=$(du -cb "$pack"/* | tail -1 | cut -f1)
mib=$(python3 -c "print(f'{$bytes / 1048576:.1f}')")
echo "recipe_prepare.sh: $pack carries $mib MiB ($bytes bytes; at most 60 MiB, the device tool's limit is 64)"
python3 -c "import sys; sys.exit(0 if $bytes <= 60 * 1048576 else 1)" || { echo "recipe_prepare.sh: over 60 MiB" >&2; exit 1; }
