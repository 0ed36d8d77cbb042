#!/usr/bin/env bash
# CARE's recipe at full budget on a lent GPU machine, in one call (issue 57; docs/dev/gpu-check.md). What it runs is
# what the appliance's training job runs in its trainer phases, from the files `packaging/dev.sh device-recipe`
# packs beside it (the data phase's stage2.jsonl and corpus.jsonl, written here by `care train data`, the recipes
# `care train recipe --device cuda` picks, e5-small cut down to the data's vocabulary):
#   (a) both sides from e5-small: Stage II (query encoder fully, document encoder through LoRA), WiSE-FT merge;
#   (b) from (a)'s pair, a 4-layer query encoder spread from (a)'s: Stage I against (a)'s document side, Stage II
#       with that side frozen, merge.
# It brings back, under $OUT, what `trainer/bench/recipe_back.sh` needs to rebuild, serve and gate both pairs here:
# (a)'s query encoder and (b)'s as their trained tensors in bf16 (the frozen word embeddings stay behind), (a)'s
# document side as its LoRA adapters, the metrics and logs.
#   bash target/device-pack/recipe.sh            on the GPU machine (DEVICE=cuda)
#   DEVICE=cpu STEPS2=2 STEPS1=2 ... recipe.sh   the same at a tiny budget on a CPU (the end-to-end test)
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/care-recipe}
WORK=${WORK:-/tmp/care-recipe-work}
DEVICE=${DEVICE:-cuda}
PY=${PY:-python3}
mkdir -p "$OUT" "$WORK"
if [ "$DEVICE" = cuda ]; then
    # The machine's torch (2.11, CUDA 13) and the nvidia-* wheels beside it give libtorch and the CUDA libraries.
    SITE=$("$PY" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
    NV=$(find "$SITE/nvidia" -maxdepth 4 -type d -name lib 2>/dev/null | tr '\n' ':')
    export LD_LIBRARY_PATH="$SITE/torch/lib:${NV}${LD_LIBRARY_PATH:-}"
    export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >"$OUT/machine.txt" 2>&1 || true
fi
export CARE_NO_PROGRESS=1
CT="$HERE/care-train"
ct() { "$CT" --device "$DEVICE" "$@"; }
# r FILE KEY: one field of a recipe (care_engine::training::Recipe as JSON).
r() { "$PY" -c 'import json, sys; v = json.load(open(sys.argv[1]))[sys.argv[2]]; print(str(v).lower() if isinstance(v, bool) else v)' "$1" "$2"; }
# The step budget of one pass, as the job sets it: the recipe's steps, at most 4 epochs over the groups written.
capped() { "$PY" -c 'import sys; s, b, g = map(int, sys.argv[1:]); print(min(s, -(-g // b) * 4))' "$1" "$2" "$3"; }
times=$OUT/times.txt
: >"$times"
phase() { # NAME COMMAND…: runs COMMAND, its log in $OUT/NAME.log, its wall time in times.txt
    local name=$1 t0
    shift
    t0=$(date +%s.%N)
    echo "[recipe.sh $(date -u +%T)] $name" >&2
    "$@" >"$OUT/$name.log" 2>&1 || { tail -20 "$OUT/$name.log" >&2; exit 1; }
    "$PY" -c 'import sys; print(sys.argv[1], round(float(sys.argv[3]) - float(sys.argv[2]), 1))' "$name" "$t0" "$(date +%s.%N)" >>"$times"
}

A=$HERE/recipe-a.json B=$HERE/recipe-b.json
for f in stage2 corpus; do gzip -dc "$HERE/$f.jsonl.gz" >"$WORK/$f.jsonl"; done
groups=$(wc -l <"$WORK/stage2.jsonl")
# The e5 templates the job renders from the live packages' manifests.
TPL=(--query-template "query: {text}" --document-template "passage: {text}")
freeze=(); [ "$(r "$A" freeze_embeddings)" = true ] && freeze=(--freeze-embeddings)
by_source=(); [ "$(r "$A" stage2_batch_by_source)" = true ] && by_source=(--batch-by-source)
# The job trains in Hyper's default precision (fp32; e5-small is small enough on a GPU); PRECISION=bf16 to compare.
PRECISION=${PRECISION:-fp32}

phase import ct import-e5s1 --e5s1 "$HERE/e5-pruned.bin" --out "$WORK/e5"

# (a) Stage I is skipped (the symmetric pair is aligned by construction), as the job does.
steps_a=${STEPS2:-$(capped "$(r "$A" stage2_steps)" "$(r "$A" stage2_batch_size)" "$groups")}
phase a-stage2 ct stage2 --query "$WORK/e5" --document "$WORK/e5" --train "$WORK/stage2.jsonl" \
    --max-examples "$(r "$A" stage2_max_groups)" --group-size $(( $(r "$A" negatives) + 1 )) \
    --lora-rank "$(r "$A" lora_rank)" --lora-alpha "$(r "$A" lora_alpha)" --document-adapters \
    --steps "$steps_a" --batch-size "${BATCH2:-$(r "$A" stage2_batch_size)}" --lr "$(r "$A" lr)" \
    --sub-batch "$(r "$A" stage2_sub_batch)" --seed "$(r "$A" seed)" --checkpoint-every "$(r "$A" checkpoint_every)" \
    --precision "$PRECISION" "${freeze[@]}" "${by_source[@]}" "${TPL[@]}" --out "$WORK/a/stage2"
phase a-carry-query ct carry-out --trained "$WORK/a/stage2/query" --base "$WORK/e5" --out "$OUT/a-query"
phase a-carry-document ct carry-out --trained "$WORK/a/stage2/document" --base "$WORK/e5" --out "$OUT/a-document"
# (a)'s pair as the job leaves it: both sides averaged with their starts (WiSE-FT), the document side's adapters
# folded in first; (b) starts from it.
ct carry-in --carried "$OUT/a-document" --base "$WORK/e5" --out "$WORK/a/document" >/dev/null
ratio=$(r "$A" merge_ratio)
phase a-merge-query ct merge --tuned "$WORK/a/stage2/query" --base "$WORK/e5" --ratio "$ratio" --out "$WORK/a/query-merged"
phase a-merge-document ct merge --tuned "$WORK/a/document" --base "$WORK/e5" --ratio "$ratio" --out "$WORK/a/document-merged"

# (b) A smaller query encoder: layers spread from (a)'s, Stage I against (a)'s document side, Stage II.
layers=$(r "$B" query_layers)
phase b-prune ct prune --from "$WORK/a/query-merged" --layers "$layers" --pick spread --out "$WORK/b/init"
phase b-stage1 ct stage1 --query "$WORK/b/init" --document "$WORK/a/document-merged" --corpus "$WORK/corpus.jsonl" \
    --max-texts "$(r "$B" stage1_max_texts)" --max-chars "$(r "$B" stage1_max_chars)" --mse-weight "$(r "$B" mse_weight)" \
    --teacher-query-template "query: {text}" --steps "${STEPS1:-$(r "$B" stage1_steps)}" \
    --batch-size "${BATCH1:-$(r "$B" batch_size)}" --lr "$(r "$B" stage1_lr)" --seed "$(r "$B" seed)" \
    --checkpoint-every "$(r "$B" checkpoint_every)" --precision "$PRECISION" "${freeze[@]}" "${TPL[@]}" \
    --out "$WORK/b/stage1"
steps_b=${STEPS2:-$(capped "$(r "$B" stage2_steps)" "$(r "$B" stage2_batch_size)" "$groups")}
phase b-stage2 ct stage2 --query "$WORK/b/stage1/query" --document "$WORK/a/document-merged" --freeze-document \
    --train "$WORK/stage2.jsonl" --max-examples "$(r "$B" stage2_max_groups)" --group-size $(( $(r "$B" negatives) + 1 )) \
    --steps "$steps_b" --batch-size "${BATCH2:-$(r "$B" stage2_batch_size)}" --lr "$(r "$B" lr)" \
    --seed "$(r "$B" seed)" --checkpoint-every "$(r "$B" checkpoint_every)" --precision "$PRECISION" \
    "${freeze[@]}" "${by_source[@]}" "${TPL[@]}" --out "$WORK/b/stage2"
phase b-merge ct merge --tuned "$WORK/b/stage2/query" --base "$WORK/b/stage1/query" --ratio "$(r "$B" merge_ratio)" \
    --out "$WORK/b/query-merged"
# Carried against the same prune of e5-small's start (the word embeddings, frozen throughout, are the only tensor
# left behind), which recipe_back.sh rebuilds here.
ct prune --from "$WORK/e5" --layers "$layers" --pick spread --out "$WORK/b/base" >/dev/null
phase b-carry-query ct carry-out --trained "$WORK/b/query-merged" --base "$WORK/b/base" --out "$OUT/b-query"

for s in a/stage2 b/stage1 b/stage2; do
    [ -f "$WORK/$s/metrics.jsonl" ] && cp "$WORK/$s/metrics.jsonl" "$OUT/${s//\//-}-metrics.jsonl"
done
echo "$groups" >"$OUT/groups.txt"
cat "$times"
echo "[recipe.sh] brought back: $(du -sk "$OUT" | cut -f1) KiB in $OUT"
