#!/usr/bin/env bash
# What a lent GPU machine brought back from trainer/bench/recipe.sh, rebuilt, served and gated here (issue 57):
# each carried encoder rebuilt over the same pruned start (`care-train carry-in`, the adapters folded in), its rows
# put back into the full e5-small (`scatter-vocab`, so the served encoder knows every token), averaged with its start
# as the job does (`merge`), exported as model packages, imported into the appliance at DATA_DIR, gated against the
# live pair (`care model evaluate`: (a)'s document side embeds every collection first) and scored on the dev splits
# as served (`care eval`, as tests/bench/retrain_real.sh does). The live pair is made live again at the end.
#   trainer/bench/recipe_back.sh BACK PACK DATA_DIR [OUT]   (OUT: tests/results/recipe-gpu-DATE; writes OUT.json)
# BACK: what the device run wrote under $OUT; PACK: the folder recipe_prepare.sh packed (its recipes, the pruned
# file). Needs CARE_BIN, CARE_TRAIN_BIN, CARE_E5S1, CARE_SHARED. SETS: the dev splits scored, SET:COLLECTION
# (default the three of retrain_real.sh), from SETS_DIR (default CARE_SHARED's retrieval sets).
set -euo pipefail
cd "$(dirname "$0")/../.."
back=${1:?usage: recipe_back.sh BACK PACK DATA_DIR [OUT]}
pack=${2:?} data=${3:?} result=${4:-tests/results/recipe-gpu-$(date -u +%F)}
care=${CARE_BIN:-${CARGO_TARGET_DIR:-target}/debug/care}
sets=${SETS_DIR:-${CARE_SHARED:-../shared}/data/retrieval}
: "${CARE_TRAIN_BIN:?}" "${CARE_E5S1:?}"
work=$data/recipe-back
mkdir -p "$work"
# CARE_CONFIG: the appliance's config file (tests/bench/retrain_real.sh writes DATA_DIR/bench/care.toml).
cfg=${CARE_CONFIG:-$data/bench/care.toml}
c() { if [ -f "$cfg" ]; then "$care" --data-dir "$data" --config "$cfg" "$@"; else "$care" --data-dir "$data" "$@"; fi; }
ct() { "$CARE_TRAIN_BIN" --device cpu "$@" >>"$work/care-train.log" 2>&1 || { tail -20 "$work/care-train.log" >&2; exit 1; }; }
r() { python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$1" "$2"; }
A=$pack/recipe-a.json B=$pack/recipe-b.json
layers=$(r "$B" query_layers)

rm -rf "$work/m" "$work/pk"
mkdir -p "$work/m" "$work/pk"
m=$work/m
ct import-e5s1 --e5s1 "$pack/e5-pruned.bin" --out "$m/e5p"
ct import-e5s1 --e5s1 "$CARE_E5S1" --out "$m/e5"
# rebuilt CARRIED START FULL OUT: carried back over the pruned start, then its rows into the full model.
rebuilt() {
    ct carry-in --carried "$1" --base "$2" --out "$4-pruned"
    ct scatter-vocab --trained "$4-pruned" --full "$3" --out "$4"
}
rebuilt "$back/a-query" "$m/e5p" "$m/e5" "$m/a-query"
rebuilt "$back/a-document" "$m/e5p" "$m/e5" "$m/a-document"
ratio=$(r "$A" merge_ratio)
ct merge --tuned "$m/a-query" --base "$m/e5" --ratio "$ratio" --out "$m/a-query-merged"
ct merge --tuned "$m/a-document" --base "$m/e5" --ratio "$ratio" --out "$m/a-document-merged"
ct prune --from "$m/e5p" --layers "$layers" --pick spread --out "$m/b-base-pruned"
ct prune --from "$m/e5" --layers "$layers" --pick spread --out "$m/b-base"
# (b) was merged with its Stage I start on the device: what came back is the query encoder as the job leaves it.
rebuilt "$back/b-query" "$m/b-base-pruned" "$m/b-base" "$m/b-query"

stamp=$(date -u +%Y%m%d%H%M)
pairing="care-gpu-$stamp"
ct export --query "$m/a-query-merged" --out "$work/pk/a-query" --name gpu-a --version "$stamp" --pairing-id "$pairing"
ct export --role document --query "$m/a-document-merged" --out "$work/pk/a-document" --name gpu-a-doc \
    --version "$stamp" --pairing-id "$pairing"
ct export --query "$m/b-query" --out "$work/pk/b-query" --name gpu-b --version "$stamp" --pairing-id "$pairing"
for p in a-query a-document b-query; do c model import "$work/pk/$p" >>"$work/care.log" 2>&1; done

# The pair live before (the newest line of the history), made live again at the end.
read -r live_q live_d < <(c model history | head -1 | awk '{print $2, $4}')
eval_set() { # WHEN SET COLLECTION
    c eval --set "$sets/$2" --split dev --collection "$3" --out "$work/$1-$2.json" >>"$work/care.log" 2>&1
}
SETS=${SETS:-"huatuo26m_test:huatuo toyhom_neike:huatuo kuake_qtr:kuake"}
evals() { for s in $SETS; do eval_set "$1" "${s%%:*}" "${s#*:}"; done; }
[ -f "$work/before-done" ] || { evals before; touch "$work/before-done"; }
# (a): gated against the live pair (its document side is embedded into its own tables first), made live, scored.
c model evaluate --candidate "gpu-a@$stamp,gpu-a-doc@$stamp" --out "$work/gate-a.json" >"$work/gate-a.txt" 2>>"$work/care.log" || true
c model activate --query "gpu-a@$stamp" --document "gpu-a-doc@$stamp" >>"$work/care.log" 2>&1
evals a
# (b): the 4-layer query encoder with (a)'s document side, gated against (a), served as int8.
c model evaluate --candidate "gpu-b@$stamp,gpu-a-doc@$stamp" --out "$work/gate-b.json" >"$work/gate-b.txt" 2>>"$work/care.log" || true
c model activate --query "gpu-b@$stamp" --document "gpu-a-doc@$stamp" --query-graph int8 >>"$work/care.log" 2>&1
evals b
c model activate --query "$live_q" --document "$live_d" >>"$work/care.log" 2>&1

python3 - "$work" "$result" "$back" "$SETS" <<'EOF'
import json, os, sys
work, out, back, sets = sys.argv[1:5]
sets = [s.split(":")[0] for s in sets.split()]
nd = lambda f: {m: v["ndcg_at_10"] for m, v in json.load(open(f))["methods"].items()}
rows = {s: {w: nd(f"{work}/{w}-{s}.json") for w in ("before", "a", "b")} for s in sets}
gate = {k: {"report": open(f"{work}/gate-{k}.txt").read().splitlines(),
            "json": json.load(open(f"{work}/gate-{k}.json")) if os.path.exists(f"{work}/gate-{k}.json") else None}
        for k in ("a", "b") if os.path.exists(f"{work}/gate-{k}.txt")}
times = dict(l.split() for l in open(f"{back}/times.txt")) if os.path.exists(f"{back}/times.txt") else {}
machine = open(f"{back}/machine.txt").read() if os.path.exists(f"{back}/machine.txt") else None
result = {"what": "issue 57: CARE's recipe at full budget on a GPU, dev nDCG@10 as served here",
          "device_machine": machine, "device_seconds": times, "dev_ndcg_at_10": rows, "gate": gate}
json.dump(result, open(out + ".json", "w"), ensure_ascii=False, indent=2)
for s in sets:
    b = rows[s]["before"].get("weighted")
    print(s, "weighted nDCG@10 before", f"{b:.4f};", " ".join(f"{w} {rows[s][w].get('weighted', 0):.4f} ({(rows[s][w].get('weighted', 0) - b) * 100:+.2f})" for w in ("a", "b")))
EOF
