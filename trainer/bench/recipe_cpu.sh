#!/usr/bin/env bash
# The recipe's whole path on a CPU at a tiny budget (issue 57's check where no GPU is lent): an appliance with a
# slice of huatuo26m_test as its one approved collection and judgment set, recipe_prepare.sh packing the run (with
# this machine's care-train in the GPU build's place), recipe.sh run from the pack on the CPU with 2-step stages,
# recipe_back.sh rebuilding, importing, gating and scoring both pairs as served.
#   trainer/bench/recipe_cpu.sh [ROOT]      (ROOT: /tmp/care-recipe-cpu, emptied first)
# Needs CARE_BIN, CARE_TRAIN_BIN (with libtorch on LD_LIBRARY_PATH), CARE_E5S1, CARE_SHARED.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=${1:-/tmp/care-recipe-cpu}
care=${CARE_BIN:-${CARGO_TARGET_DIR:-target}/debug/care}
: "${CARE_TRAIN_BIN:?}" "${CARE_E5S1:?}" "${CARE_SHARED:?}"
rm -rf "$root"
mkdir -p "$root/set/qrels" "$root/pack" "$root/data"
# The slice: 80 train and 40 dev queries with their answers, and 400 other answers.
python3 - "$CARE_SHARED/data/retrieval/huatuo26m_test" "$root/set" <<'EOF'
import json, random, sys
src, dst = sys.argv[1:3]
rows = {s: [l.rstrip("\n").split("\t") for l in open(f"{src}/qrels/{s}.tsv")][1:] for s in ("train", "dev")}
keep = {"train": rows["train"][:80], "dev": rows["dev"][:40]}
docs = {r[1] for s in keep.values() for r in s}
qids = {r[0] for s in keep.values() for r in s}
corpus = [json.loads(l) for l in open(f"{src}/corpus.jsonl")]
random.Random(7).shuffle(corpus)
others = [c for c in corpus if c["id"] not in docs][:400]
with open(f"{dst}/corpus.jsonl", "w") as f:
    for c in [c for c in corpus if c["id"] in docs] + others:
        f.write(json.dumps(c, ensure_ascii=False) + "\n")
with open(f"{dst}/queries.jsonl", "w") as f:
    for l in open(f"{src}/queries.jsonl"):
        if json.loads(l)["id"] in qids:
            f.write(l)
for s, rs in keep.items():
    with open(f"{dst}/qrels/{s}.tsv", "w") as f:
        f.write("query-id\tcorpus-id\tscore\n" + "".join("\t".join(r) + "\n" for r in rs))
EOF
data=$root/data
cfg=$root/care.toml
printf '[training]\ntrainer = "%s"\ndevice = "cpu"\n' "$CARE_TRAIN_BIN" >"$cfg"
export CARE_CONFIG=$cfg
c() { "$care" --data-dir "$data" --config "$cfg" "$@"; }
c init >/dev/null
c model import-e5s1 "$CARE_E5S1" >/dev/null
c collection create mini >/dev/null
c ingest mini "$root/set/corpus.jsonl" >/dev/null
c collection approve mini >/dev/null
c judgments import mini mini-train --beir "$root/set" --split train >/dev/null
cp "$CARE_TRAIN_BIN" "$root/pack/care-train"
trainer/bench/recipe_prepare.sh "$data" "$root/pack"
OUT=$root/back WORK=$root/device DEVICE=cpu STEPS1=2 STEPS2=2 BATCH1=4 BATCH2=2 bash "$root/pack/recipe.sh"
SETS="set:mini" SETS_DIR=$root trainer/bench/recipe_back.sh "$root/back" "$root/pack" "$data" "$root/result"
