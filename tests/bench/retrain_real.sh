#!/usr/bin/env bash
# Issue 16's real run, as an admin would do it from the shell: two approved collections (the 22,629 answers of
# huatuo26m_test, the 32,171 titles of kuake_qtr), the train qrels uploaded as judgment sets (huatuo26m_test and
# toyhom_neike on the answers, kuake_qtr on the titles), the live hybrid scored on the held-out dev splits, one
# retraining job with a recipe (the CPU default unless RECIPE names a JSON file), and the dev splits scored again.
#
#   tests/bench/retrain_real.sh DATA_DIR [OUT_NAME]     (OUT_NAME defaults to retrain-real)
#
#   RECIPE, ABLATION_RECIPE, PRUNED_RECIPE: see below.
# Needs: CARE_BIN (default $CARGO_TARGET_DIR/debug/care), CARE_TRAIN_BIN, CARE_SHARED. Writes
# tests/results/OUT_NAME.json and .svg; DATA_DIR keeps the appliance (re-running skips finished steps).
set -euo pipefail
cd "$(dirname "$0")/../.."
data=${1:?usage: retrain_real.sh DATA_DIR [OUT_NAME]}
name=${2:-retrain-real}
care=${CARE_BIN:-${CARGO_TARGET_DIR:-target}/debug/care}
sets=${CARE_SHARED:-../shared}/data/retrieval
: "${CARE_TRAIN_BIN:?CARE_TRAIN_BIN must name the care-train binary}"
mkdir -p "$data"
work=$data/bench
mkdir -p "$work"
cfg=$work/care.toml
cat >"$cfg" <<EOF
[training]
trainer = "$CARE_TRAIN_BIN"
device = "cpu"
EOF
c() { "$care" --data-dir "$data" --config "$cfg" "$@"; }
# CARE_INGEST_BIN: a release build for the set-up and ingest steps (a debug build's tokeniser and indexer are slow);
# the later steps migrate the data directory forward if it is an older release.
ci() { "${CARE_INGEST_BIN:-$care}" --data-dir "$data" --config "$cfg" "$@"; }
# step NAME COMMAND…: runs once (a marker file records it and its wall time).
step() {
    local n=$1
    shift
    [ -f "$work/$n.done" ] && return 0
    echo "[$(date +%T)] $n: $*" >&2
    local s
    s=$(date +%s.%N)
    "$@"
    python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$s" "$(date +%s.%N)" >"$work/$n.done"
}
evals() {
    local when=$1
    step "eval-$when-huatuo" c eval --set "$sets/huatuo26m_test" --split dev --collection huatuo --out "$work/$when-huatuo26m_test.json"
    step "eval-$when-toyhom" c eval --set "$sets/toyhom_neike" --split dev --collection huatuo --out "$work/$when-toyhom_neike.json"
    step "eval-$when-kuake" c eval --set "$sets/kuake_qtr" --split dev --collection kuake --out "$work/$when-kuake_qtr.json"
}

step init ci init
step model ci model import-e5s1 "${CARE_E5S1:?CARE_E5S1 must name e5-small-q4.bin}"
step create-huatuo ci collection create huatuo
step create-kuake ci collection create kuake
step ingest-huatuo ci ingest huatuo "$sets/huatuo26m_test/corpus.jsonl"
step ingest-kuake ci ingest kuake "$sets/kuake_qtr/corpus.jsonl"
step approve-huatuo c collection approve huatuo
step approve-kuake c collection approve kuake
step judgments-huatuo c judgments import huatuo huatuo26m-train --beir "$sets/huatuo26m_test" --split train
step judgments-toyhom c judgments import huatuo toyhom-train --beir "$sets/toyhom_neike" --split train
step judgments-kuake c judgments import kuake kuake-train --beir "$sets/kuake_qtr" --split train
c judgments list >"$work/judgments.txt"
evals before
recipe_args=()
[ -n "${RECIPE:-}" ] && recipe_args=(--recipe "$RECIPE")
# Exit 3: the candidate was gated out (kept with its report); the run itself finished.
train() { c train run "$@" || [ $? -eq 3 ]; }
# field FILE KEY: a key of a JSON file (of the first element when it is a list), as text.
field() { python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print((d[0] if isinstance(d, list) else d)[sys.argv[2]])' "$1" "$2"; }
# shown FILE: the run a step has just finished (the newest), kept in FILE.json; once, so that re-running the
# script after later runs does not take theirs.
shown() {
    [ -f "$work/$1.json" ] && return 0
    c train list --json >"$work/runs-list.json"
    c train show "$(field "$work/runs-list.json" job)" >"$work/$1.json"
}
# scored NAME RECIPE: a run with "promote": false from the live pair; its candidate is made live only to score the
# dev splits (evals NAME), then the pair live before it is live again. Leaves the run in run-NAME.json.
scored() {
    local name=$1 cand base
    step "train-$name" train --recipe "$2"
    shown "run-$name"
    cand=$(field "$work/run-$name.json" candidate)
    base=$(field "$work/run-$name.json" base)
    step "activate-$name" c model activate --query "${cand%%,*}" --document "${cand#*,}"
    evals "$name"
    step "activate-$name-back" c model activate --query "${base%%,*}" --document "${base#*,}"
}
# An ablation, when ABLATION_RECIPE names a recipe with "promote": false: a run from the same live pair before the
# main one (say, the main recipe with one thing changed), so the main run starts from the same "before".
[ -n "${ABLATION_RECIPE:-}" ] && scored ablation "$ABLATION_RECIPE"
step train train "${recipe_args[@]}"
shown run
c model history >"$work/history.txt"
evals after

# Target (b), when PRUNED_RECIPE names a recipe with "query_layers" (and "promote": false): a second run prunes
# the live query encoder and trains it, scored as above. Query latency of the three query encoders (the original,
# the retrained 12-layer one, the pruned one) is measured side by side, one pinned core, one libtorch thread.
spec_dir() { # NAME@VERSION → its package folder
    echo "$data/models/${1%@*}/${1#*@}"
}
if [ -n "${PRUNED_RECIPE:-}" ]; then
    retrained=$(field "$work/run.json" candidate)
    scored pruned "$PRUNED_RECIPE"
    cand=$(field "$work/run-pruned.json" candidate)
    base=$(field "$work/run-pruned.json" base)
    step bench-query taskset -c 1 "$CARE_TRAIN_BIN" --device cpu --threads 1 bench-query \
        --encoder "original=$(spec_dir "${base%%,*}")" --encoder "retrained=$(spec_dir "${retrained%%,*}")" \
        --encoder "pruned=$(spec_dir "${cand%%,*}")" --set "$sets/huatuo26m_test" --out "$work/bench-query.json"
fi

python3 - "$work" "tests/results/$name" "$(nproc)" "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs)" <<'EOF'
import glob, json, os, sys
work, out, cores, cpu = sys.argv[1:5]
steps = {os.path.basename(p)[:-5]: float(open(p).read()) for p in glob.glob(f"{work}/*.done")}
sets = ["huatuo26m_test", "toyhom_neike", "kuake_qtr"]
rows = {}
for s in sets:
    b = json.load(open(f"{work}/before-{s}.json"))
    a = json.load(open(f"{work}/after-{s}.json"))
    rows[s] = {
        "queries": b["queries"],
        "before": {m: b["methods"][m]["ndcg_at_10"] for m in b["methods"]},
        "after": {m: a["methods"][m]["ndcg_at_10"] for m in a["methods"]},
        "dense_model_before": b["dense_model"], "dense_model_after": a["dense_model"],
        "dense_weight": a["dense_weight"],
    }
run = json.load(open(f"{work}/run.json"))
pruned = None
if os.path.exists(f"{work}/run-pruned.json"):
    pruned = {
        "run": json.load(open(f"{work}/run-pruned.json")),
        "dev_ndcg_at_10": {s: {m: v["ndcg_at_10"] for m, v in json.load(open(f"{work}/pruned-{s}.json"))["methods"].items()}
                           for s in sets if os.path.exists(f"{work}/pruned-{s}.json")},
        "bench_query": json.load(open(f"{work}/bench-query.json")) if os.path.exists(f"{work}/bench-query.json") else None,
    }
ablation = None
if os.path.exists(f"{work}/run-ablation.json"):
    ablation = {
        "run": json.load(open(f"{work}/run-ablation.json")),
        "dev_ndcg_at_10": {s: {m: v["ndcg_at_10"] for m, v in json.load(open(f"{work}/ablation-{s}.json"))["methods"].items()}
                           for s in sets if os.path.exists(f"{work}/ablation-{s}.json")},
    }
result = {
    "what": "issue 16 real run: dev nDCG@10 of the live pair before and after one retraining job",
    "machine": {"cpu": cpu, "cores": int(cores), "gpu": None},
    "steps_seconds": steps,
    "dev_ndcg_at_10": rows,
    "run": run,
    "pruned": pruned,
    "ablation": ablation,
    "history": open(f"{work}/history.txt").read().splitlines(),
    "judgments": open(f"{work}/judgments.txt").read().splitlines(),
}
json.dump(result, open(out + ".json", "w"), ensure_ascii=False, indent=2)
# Chart: hybrid (weighted) and dense nDCG@10 before/after per set.
bars = [(f"{s} {m}", rows[s]["before"].get(m, 0), rows[s]["after"].get(m, 0)) for s in sets for m in ("weighted", "dense")]
W, H, top, left, bw = 760, 60 + 34 * len(bars), 40, 220, 480
svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
       f'<text x="10" y="20" font-size="14">dev nDCG@10 before (grey) and after (blue) retraining; {cores} cores, {cpu}</text>']
for i, (label, b, a) in enumerate(bars):
    y = top + 34 * i
    svg.append(f'<text x="10" y="{y + 14}">{label}</text>')
    svg.append(f'<rect x="{left}" y="{y}" width="{bw * b:.1f}" height="12" fill="#999"/>')
    svg.append(f'<rect x="{left}" y="{y + 13}" width="{bw * a:.1f}" height="12" fill="#2b6cb0"/>')
    svg.append(f'<text x="{left + bw * max(a, b) + 6:.1f}" y="{y + 20}">{b:.4f} → {a:.4f} ({(a - b) * 100:+.2f})</text>')
svg.append("</svg>")
open(out + ".svg", "w").write("\n".join(svg))
print(json.dumps({s: {m: round(rows[s]["after"][m] - rows[s]["before"][m], 4) for m in rows[s]["after"]} for s in sets}, indent=1))
EOF
