#!/usr/bin/env bash
# The served path against the Python stack, in one window on one pinned core with one ONNX Runtime thread: the
# Python reference (tests/bench/reference.py, in process, fp32 and int8) against `care-bench --http` (HTTPS, the
# whole façade) with each query encoder named, interleaved and then in reverse:
#   python fp32, care ENC1, care ENC2, python int8, python int8, care ENC2, care ENC1, python fp32.
# Each care run also states the pair's nDCG@10 on the set's dev split (`care eval --collection bench`, weight fitted
# on train). Writes OUT.json (every run, the means, the ratios to Python fp32, machine) and OUT.svg.
#
# Usage: tests/bench/served_side_by_side.sh DATA_DIR OUT ENC1 ENC2
#   DATA_DIR  a `care-bench --reuse` directory of the set (collection "bench", documents embedded by e5-small@1)
#             holding the query packages to compare (`care --data-dir DATA_DIR model import PKG`)
#   ENCn      QUERY_MODEL:GRAPH, e.g. e5-small@1-int8:int8 or e5-small-l4@1:int8
# Env: CARE (default target/release/care), SET (default $CARE_SHARED/data/retrieval/kuake_qtr), QUERIES (500),
#      CORE (1), PY (.care-dev/bench-venv/bin/python), CACHE (.care-dev/bench-cache, as side_by_side.sh prepares it),
#      COMBINE=WORK (only combine the runs an earlier invocation kept in WORK).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
[ $# -eq 4 ] || { awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "$0"; exit 2; }
D=$1 OUT=$2 ENC1=$3 ENC2=$4
CARE=${CARE:-$ROOT/target/release/care}
CARE_BENCH=${CARE_BENCH:-$(dirname "$CARE")/care-bench}
SET=${SET:-${CARE_SHARED:-$ROOT/../shared}/data/retrieval/kuake_qtr}
QUERIES=${QUERIES:-500} CORE=${CORE:-1}
PY=${PY:-$ROOT/.care-dev/bench-venv/bin/python} CACHE=${CACHE:-$ROOT/.care-dev/bench-cache}
# COMBINE=WORK only combines the runs of an earlier invocation (kept in WORK).
WORK=${COMBINE:-$(mktemp -d /var/tmp/care-served.XXXXXX)}
unset CARE_E5S1 # care-bench would otherwise serve e5-small instead of the activated encoder
log() { printf '[served] %s\n' "$*" >&2; }

activate() { "$CARE" --data-dir "$D" model activate --query "${1%:*}" --document e5-small@1 --query-graph "${1##*:}" >/dev/null; }
care_run() { # n enc
    activate "$2"
    log "run $1: care ${2}"
    taskset -c "$CORE" "$CARE_BENCH" --set "$SET" --queries "$QUERIES" --threads 1 --http --reuse "$D" \
        --out "$WORK/$1-care-$2.json" >"$WORK/$1.log" 2>&1
}
py_run() { # n precision
    log "run $1: python $2"
    "$PY" "$ROOT/tests/bench/reference.py" --set "$SET" --model "$D/models/e5-small/1" --precision "$2" \
        --queries "$QUERIES" --cache "$CACHE" --core "$CORE" --out "$WORK/$1-python-$2.json" >"$WORK/$1.log" 2>&1
}
quality() { # enc -> nDCG@10 file
    activate "$1"
    "$CARE" --data-dir "$D" eval --set "$SET" --collection bench --tune-on train --out "$WORK/eval-$1.json" >/dev/null 2>&1
}
if [ -z "${COMBINE:-}" ]; then
    quality "$ENC1"
    quality "$ENC2"
    py_run 01 fp32
    care_run 02 "$ENC1"
    care_run 03 "$ENC2"
    py_run 04 int8
    py_run 05 int8
    care_run 06 "$ENC2"
    care_run 07 "$ENC1"
    py_run 08 fp32
fi

"$PY" - "$WORK" "$OUT" "$(nproc)" <<'PY'
import glob, json, os, statistics, sys
from html import escape
work, out, cores = sys.argv[1], sys.argv[2], int(sys.argv[3])
runs, groups = [], {}
for f in sorted(glob.glob(f"{work}/[0-9]*.json")):
    r = json.load(open(f))
    name = os.path.basename(f)[3:-5]
    stack, conf = name.split("-", 1)
    if stack == "python":
        key, lat, ndcg = f"Python {conf} (in process)", r["hybrid_in_process"], r["ndcg_at_10"]
    else:
        ev = json.load(open(f"{work}/eval-{conf}.json"))
        key, lat, ndcg = f"care {conf} (HTTPS)", r["hybrid_http"], ev["methods"]["weighted"]["ndcg_at_10"]
    runs.append({"file": os.path.basename(f), "config": key, "p50_ms": lat["p50_ms"], "p99_ms": lat["p99_ms"],
                 "ndcg_at_10": ndcg, "report": r})
    groups.setdefault(key, []).append((lat["p50_ms"], lat["p99_ms"], ndcg))
mean = {k: {"p50_ms": statistics.fmean(x[0] for x in v), "p99_ms": statistics.fmean(x[1] for x in v),
            "ndcg_at_10": v[0][2], "runs": len(v)} for k, v in groups.items()}
base = mean["Python fp32 (in process)"]
for v in mean.values():
    v["p50_ratio_to_python_fp32"] = round(v["p50_ms"] / base["p50_ms"], 3)
    v["p99_ratio_to_python_fp32"] = round(v["p99_ms"] / base["p99_ms"], 3)
first = next(r["report"] for r in runs if "vector_isa" in r["report"])
doc = {"cpu": first["cpu"], "cores": cores, "vector_isa": first["vector_isa"], "set": first["set"],
       "queries": first["queries"], "summary": mean, "runs": runs}
open(out + ".json", "w").write(json.dumps(doc, indent=2, ensure_ascii=False))
rows, top, bar = list(mean.items()), 60, 14
scale = 420 / max(v["p99_ms"] for _, v in rows)
h = top + len(rows) * (2 * bar + 14) + 30
svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="820" height="{h}" font-family="sans-serif" font-size="12">'
       '<rect width="100%" height="100%" fill="white"/>',
       '<text x="10" y="20" font-size="15">Hybrid search: care over HTTPS against the Python stack in process</text>',
       f'<text x="10" y="38" fill="#555">ms, mean of each configuration\'s runs, one window; {escape(first["cpu"])} '
       f'({first["vector_isa"]}), 1 pinned core of {cores}; nDCG@10 on {escape(first["set"])} dev</text>']
y = top
for k, v in rows:
    svg.append(f'<text x="10" y="{y + bar + 2}">{escape(k)}</text>'
               f'<text x="10" y="{y + 2 * bar + 2}" fill="#555">nDCG@10 {v["ndcg_at_10"]:.4f}, '
               f'{v["p50_ratio_to_python_fp32"]}× / {v["p99_ratio_to_python_fp32"]}×</text>')
    for i, (q, colour) in enumerate((("p50_ms", "#2980b9"), ("p99_ms", "#c0392b"))):
        w = v[q] * scale
        svg.append(f'<rect x="330" y="{y + i * bar}" width="{w:.1f}" height="{bar - 2}" fill="{colour}"/>'
                   f'<text x="{334 + w:.1f}" y="{y + i * bar + bar - 4}">{q[:3]} {v[q]:.2f}</text>')
    y += 2 * bar + 14
svg.append("</svg>")
open(out + ".svg", "w").write("\n".join(svg))
for k, v in mean.items():
    print(f"{k}: {v['p50_ms']:.2f} / {v['p99_ms']:.2f} ms ({v['p50_ratio_to_python_fp32']}× / "
          f"{v['p99_ratio_to_python_fp32']}×), nDCG@10 {v['ndcg_at_10']:.4f}")
PY
log "runs and logs in $WORK"
