#!/usr/bin/env bash
# Side by side, in one window on this machine: `care-bench` and the plain Python reference stack
# (tests/bench/reference.py: jieba + bm25s, the appliance's ONNX graph on the onnxruntime wheel, numpy exact inner
# product, min-max fusion), fp32 and int8 query encoders, interleaved:
#   care fp32, python fp32, care int8, python int8, then once more in reverse (python int8, care int8, python fp32,
#   care fp32).
# Both run on one pinned core (taskset / sched_setaffinity) with one ONNX Runtime thread. Writes
# tests/results/reference.json (every run + machine info + the mean per configuration) and tests/results/reference.svg.
#
# Usage: tests/bench/side_by_side.sh [CARE_BINARY] [options]
#   --care BIN       release binary (or $CARE, or the first argument); build it with `cargo build --release -p care`
#   --set DIR        BEIR set (default $CARE_SHARED/data/retrieval/kuake_qtr, CARE_SHARED defaulting to ../shared)
#   --queries N      first N judged dev queries for both stacks (default 1000; kuake_qtr's dev split has 500)
#   --data DIR       a care data dir holding the model package models/e5-small/1 (model.onnx, tokenizer.json) for the
#                    Python side; prepared there when missing with
#                      care --data-dir DIR init && care --data-dir DIR model import-e5s1 $CARE_E5S1
#                    (default: WORK/data). `care-bench` itself needs no data dir: it ingests the set, imports the
#                    model from $CARE_E5S1 (fp32 documents; with --int8 also the int8 query graph) and embeds every
#                    chunk in a temporary directory on each run.
#   --model DIR      the model package directly (overrides --data)
#   --reuse DIR      `care-bench --reuse DIR`: the corpus is ingested and embedded once (outside the window, on every
#                    core) and each run only measures; the Python side then runs DIR's model package
#   --core N         the core both stacks are pinned to (default: the last one)
#   --no-pin-care    run `care-bench` unpinned (ONNX Runtime still uses 1 thread)
#   --python PY      default .care-dev/bench-venv/bin/python (packaging/dev.sh bench-venv creates it)
#   --cache DIR      the reference's corpus vectors and int8 graph (default .care-dev/bench-cache)
#   --work DIR       per-run JSON and logs (default: a new /var/tmp/care-side-by-side.XXXXXX, kept)
#   --out-dir DIR    where reference.json / reference.svg go (default tests/results)
# Needs CARE_E5S1 (the default model file) and ORT_DYLIB_PATH (or the packaged library) like `care-bench`.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
HERE="$ROOT/tests/bench"
CARE_BIN=${CARE:-}
SET="${CARE_SHARED:-$ROOT/../shared}/data/retrieval/kuake_qtr"
QUERIES=1000
DATA="" MODEL="" CORE="" WORK="" PIN_CARE=1 REUSE=""
PY="$ROOT/.care-dev/bench-venv/bin/python"
CACHE="$ROOT/.care-dev/bench-cache"
OUT_DIR="$ROOT/tests/results"
log() { printf '[side-by-side] %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

while [ $# -gt 0 ]; do
    case "$1" in
        --care) CARE_BIN=$2; shift 2 ;;
        --set) SET=$2; shift 2 ;;
        --queries) QUERIES=$2; shift 2 ;;
        --data) DATA=$2; shift 2 ;;
        --model) MODEL=$2; shift 2 ;;
        --reuse) REUSE=$2; shift 2 ;;
        --core) CORE=$2; shift 2 ;;
        --no-pin-care) PIN_CARE=0; shift ;;
        --python) PY=$2; shift 2 ;;
        --cache) CACHE=$2; shift 2 ;;
        --work) WORK=$2; shift 2 ;;
        --out-dir) OUT_DIR=$2; shift 2 ;;
        -h | --help) awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        -*) die "unknown option $1 (see --help)" ;;
        *) CARE_BIN=$1; shift ;;
    esac
done

[ -n "$CARE_BIN" ] || die "no care binary: pass it (first argument or --care) or set CARE"
[ -x "$CARE_BIN" ] || die "$CARE_BIN is not an executable"
CARE_BIN=$(cd "$(dirname "$CARE_BIN")" && pwd)/$(basename "$CARE_BIN")
# The benchmarks are their own binary, built beside `care`.
BENCH_BIN=${CARE_BENCH:-$(dirname "$CARE_BIN")/care-bench}
[ -x "$BENCH_BIN" ] || die "$BENCH_BIN is not built (cargo build --release builds it beside care)"
[ -n "${CARE_E5S1:-}" ] && [ -f "$CARE_E5S1" ] || die "CARE_E5S1 must name the default model file (packaging/dev.sh setup fetches it)"
[ -x "$PY" ] || die "$PY missing: run packaging/dev.sh bench-venv"
[ -f "$SET/corpus.jsonl" ] && [ -f "$SET/queries.jsonl" ] && [ -f "$SET/qrels/dev.tsv" ] || die "$SET is not a BEIR set with qrels/dev.tsv"
SET=$(cd "$SET" && pwd)
[ -n "$CORE" ] || CORE=$("$PY" -c 'import os; print(max(os.sched_getaffinity(0)))')
if [ "$PIN_CARE" = 1 ]; then
    command -v taskset >/dev/null || die "taskset not found (util-linux); or pass --no-pin-care"
    PIN=(taskset -c "$CORE")
else
    PIN=()
fi
[ -n "$WORK" ] || WORK=$(mktemp -d /var/tmp/care-side-by-side.XXXXXX)
mkdir -p "$WORK/runs" "$WORK/logs" "$CACHE"
log "work dir $WORK"

REUSE_ARGS=()
if [ -n "$REUSE" ]; then
    REUSE_ARGS=(--reuse "$REUSE")
    if [ ! -f "$REUSE/care-bench-prepared.json" ]; then
        log "preparing $REUSE (care-bench --reuse: ingest and embed the corpus on every core)"
        "$BENCH_BIN" --set "$SET" --queries 10 --threads 1 --reuse "$REUSE" >"$WORK/logs/reuse.log" 2>&1 ||
            die "care-bench preparation failed: $WORK/logs/reuse.log"
    fi
    [ -n "$MODEL" ] || MODEL="$REUSE/models/e5-small/1"
fi

# The model package the Python side runs: the very files `care model import-e5s1` writes.
if [ -z "$MODEL" ]; then
    [ -n "$DATA" ] || DATA="$WORK/data"
    MODEL="$DATA/models/e5-small/1"
    if [ ! -f "$MODEL/model.onnx" ]; then
        log "preparing the model package in $DATA (care init, care model import-e5s1)"
        [ -f "$DATA/care.sqlite" ] || "$CARE_BIN" --data-dir "$DATA" init >"$WORK/logs/init.log" 2>&1
        "$CARE_BIN" --data-dir "$DATA" model import-e5s1 "$CARE_E5S1" >"$WORK/logs/import.log" 2>&1
    fi
fi
[ -f "$MODEL/model.onnx" ] && [ -f "$MODEL/tokenizer.json" ] || die "$MODEL has no model.onnx + tokenizer.json"

# Outside the window: the reference embeds the corpus (fp32) and quantises the graph once; every run reuses them.
log "preparing the reference's cache (corpus vectors, int8 graph) in $CACHE"
"$PY" "$HERE/reference.py" --set "$SET" --model "$MODEL" --precision int8 --cache "$CACHE" --queries 1 --warmup 0 \
    --core "$CORE" --out "$WORK/logs/prepare.json" >/dev/null 2>"$WORK/logs/prepare.log" ||
    die "reference preparation failed: $WORK/logs/prepare.log"

machine() { # machine.json: CPU, cores, versions, load at the start and the end of the window
    "$PY" - "$@" <<'PY'
import json, os, platform, subprocess, sys, time
sys.path.insert(0, os.environ["HERE"])
import reference as ref
out, care, core, start = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
m = json.loads(open(out).read()) if os.path.exists(out) else {}
m.setdefault("date", time.strftime("%Y-%m-%d %H:%M:%S %z"))
m.update(cpu=ref.cpu_info(), cores=os.cpu_count(), core=int(core), kernel=platform.release(),
         versions=ref.versions(), care=subprocess.run([care, "--version"], capture_output=True, text=True).stdout.strip(),
         git=subprocess.run(["git", "-C", os.environ["ROOT"], "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip())
m["loadavg_start" if start == "1" else "loadavg_end"] = os.getloadavg()
open(out, "w").write(json.dumps(m, indent=2))
PY
}
export HERE ROOT
machine "$WORK/machine.json" "$CARE_BIN" "$CORE" 1

run() { # run NN STACK PRECISION
    local n=$1 stack=$2 p=$3 out="$WORK/runs/$1-$2-$3.json" lg="$WORK/logs/$1-$2-$3.log"
    log "run $n: $stack $p"
    if [ "$stack" = care ]; then
        local int8=()
        [ "$p" = int8 ] && int8=(--int8)
        "${PIN[@]}" "$BENCH_BIN" --set "$SET" --queries "$QUERIES" --threads 1 "${int8[@]}" "${REUSE_ARGS[@]}" --out "$out" \
            >"$lg" 2>&1 || die "care-bench failed: $lg"
    else
        "$PY" "$HERE/reference.py" --set "$SET" --model "$MODEL" --precision "$p" --queries "$QUERIES" \
            --cache "$CACHE" --core "$CORE" --out "$out" >"$lg" 2>&1 || die "reference failed: $lg"
    fi
}
i=0
for cfg in "care fp32" "python fp32" "care int8" "python int8" "python int8" "care int8" "python fp32" "care fp32"; do
    i=$((i + 1))
    # shellcheck disable=SC2086
    run "$(printf %02d $i)" $cfg
done
machine "$WORK/machine.json" "$CARE_BIN" "$CORE" 0

mkdir -p "$OUT_DIR"
"$PY" "$HERE/combine.py" --runs "$WORK/runs" --machine "$WORK/machine.json" \
    --out-json "$OUT_DIR/reference.json" --out-svg "$OUT_DIR/reference.svg"
log "wrote $OUT_DIR/reference.json and $OUT_DIR/reference.svg"
"$PY" - "$OUT_DIR/reference.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print(f"{'':22} {'encode':>15} {'bm25':>13} {'dense':>13} {'fuse':>13} {'hybrid':>15}  nDCG@10")
for k, s in d["summary"].items():
    cells = [f"{s[st]['p50_ms']:.2f}/{s[st]['p99_ms']:.2f}" if s.get(st) else "-"
             for st in ("encode_query", "bm25", "dense", "fuse", "hybrid_in_process")]
    nd = f"{s['ndcg_at_10']:.4f}" if "ndcg_at_10" in s else "-"
    print(f"{k:22} {cells[0]:>15} {cells[1]:>13} {cells[2]:>13} {cells[3]:>13} {cells[4]:>15}  {nd}")
print("(p50/p99 ms, mean of each configuration's runs; care-bench reports no nDCG: see `care eval`)")
PY
