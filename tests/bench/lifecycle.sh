#!/usr/bin/env bash
# The model-lifecycle figures (docs/experiments/2026-11-23-model-lifecycle.md), on a copy of a data directory
# prepared by `care-bench --set kuake_qtr --reuse DIR` (kuake_qtr's 32,171 passages embedded by e5-small fp32, plus
# its int8 query graph registered as e5-small@1-int8):
#   1. kuake_qtr's train qrels imported as a judgment set, and the default pair (e5-small@1 both sides) evaluated
#      against its int8-query variant: the report holds both pairs' nDCG@10 / MRR@10 / Recall@100 with
#      paired-bootstrap intervals and their query-encode latency;
#   2. a blue/green re-embedding of all 32k passages over HTTPS (promotion, forced with a reason, of a document model
#      of another pairing), timed, with search latency sampled before, during and after it.
# Usage: tests/bench/lifecycle.sh CARE_BINARY PREPARED_DIR OUT_DIR   (needs curl and python3; CARE_SHARED names
# the shared data folder, default ../shared beside the repository; LIFECYCLE_PARTS=eval or bluegreen runs one part)
set -euo pipefail
care=$(realpath "$1")
prepared=$(realpath "$2")
out=$(realpath -m "$3")
repo=$(cd "$(dirname "$0")/../.." && pwd)
shared=${CARE_SHARED:-$repo/../shared}
kuake="$shared/data/retrieval/kuake_qtr"
work=$(mktemp -d /var/tmp/care-lifecycle.XXXXXX)
server=
cleanup() { [ -n "$server" ] && kill "$server" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
mkdir -p "$out"
log() { printf '[lifecycle] %s\n' "$*" >&2; }

cp -a "$prepared" "$work/data"
echo "# compiled defaults" >"$work/care.toml"
c() { CARE_LOG=warn "$care" --data-dir "$work/data" --config "$work/care.toml" "$@"; }
c model activate --query e5-small@1 --document e5-small@1 >/dev/null

parts=${LIFECYCLE_PARTS:-eval,bluegreen}
if [[ $parts == *eval* ]]; then
log "1. judgments and evaluation"
c judgments import bench kuake-train --beir "$kuake" --split train | tee "$out/lifecycle-judgments.txt"
start=$(date +%s.%N)
c model evaluate --candidate e5-small@1-int8,e5-small@1 --out "$out/lifecycle-eval.json" | tee "$out/lifecycle-eval.txt" || true
echo "evaluation took $(python3 -c "print(round($(date +%s.%N) - $start, 1))") s" | tee -a "$out/lifecycle-eval.txt"

fi
[[ $parts == *bluegreen* ]] || exit 0
log "2. blue/green re-embedding under search load"
pkg="$work/pkg"
cp -al "$work/data/models/e5-small/1" "$pkg"
rm "$pkg/manifest.toml"
sed -e 's/^name = .*/name = "e5-small-bg"/' -e 's/^pairing_id = .*/pairing_id = "bluegreen"/' \
    "$work/data/models/e5-small/1/manifest.toml" >"$pkg/manifest.toml"
c model import "$pkg" >/dev/null
echo "lifecycle-bench-$$-passphrase" >"$work/pw"
c user add lifecycle --role admin --password-file "$work/pw" >/dev/null
token=$(c user token lifecycle --name lifecycle-bench | tail -1)
c serve --bind 127.0.0.1:0 --http-bind 127.0.0.1:0 >"$work/serve.out" 2>"$work/serve.err" &
server=$!
for _ in $(seq 120); do grep -q '^listening on ' "$work/serve.out" && break; sleep 0.5; done
base=$(sed -n 's/^listening on //p' "$work/serve.out" | head -1)
[ -n "$base" ] || { cat "$work/serve.err" >&2; exit 1; }

# One curl process per batch reuses its connection; one line per request: seconds.
python3 - "$kuake/queries.jsonl" "$base" >"$work/urls.cfg" <<'EOF'
import json, sys, urllib.parse
qs = [json.loads(l)["text"] for l in open(sys.argv[1], encoding="utf-8") if l.strip()][:200]
for q in qs:
    print(f'url = "{sys.argv[2]}/api/v1/search?q={urllib.parse.quote(q)}&collection=bench"')
    print('output = "/dev/null"')
EOF
batch() { curl -sk -H "Authorization: Bearer $token" -K "$work/urls.cfg" -w '%{http_code} %{time_total}\n' >>"$1"; }
batch "$work/warm.txt"
batch "$work/before.txt"
start=$(date +%s.%N)
curl -sk -H "Authorization: Bearer $token" -H 'content-type: application/json' -o "$work/promote.json" \
    -w '%{http_code}\n' -d '{"candidate":"e5-small-bg@1","override_reason":"blue/green timing"}' \
    "$base/api/v1/admin/models/promote" >"$work/promote.code" &
promote=$!
while kill -0 "$promote" 2>/dev/null; do batch "$work/during.txt"; done
wait "$promote"
took=$(python3 -c "print(round($(date +%s.%N) - $start, 1))")
batch "$work/after.txt"
python3 - "$work" "$took" "$(cat "$work/promote.code")" >"$out/lifecycle-bluegreen.json" <<'EOF'
import json, os, sys
work, took, code = sys.argv[1], float(sys.argv[2]), sys.argv[3]
def phase(name):
    rows = [l.split() for l in open(os.path.join(work, name + ".txt"))]
    ms = sorted(float(t) * 1000 for _, t in rows)
    q = lambda p: ms[round((len(ms) - 1) * p)]
    return {"requests": len(ms), "errors": sum(c != "200" for c, _ in rows), "p50_ms": round(q(0.5), 2),
            "p99_ms": round(q(0.99), 2)}
cores = os.cpu_count()
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "unknown")
print(json.dumps({"cpu": cpu, "cores": cores, "passages": 32171, "promote_http_status": code,
                  "reembed_and_switch_seconds": took, "search_before": phase("before"),
                  "search_during": phase("during"), "search_after": phase("after")}, indent=2))
EOF
cat "$out/lifecycle-bluegreen.json"
