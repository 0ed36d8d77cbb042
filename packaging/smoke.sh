#!/usr/bin/env bash
# HTTPS smoke test of a running appliance: packaging/smoke.sh https://host:port
set -euo pipefail
BASE=$1
fail() { echo "[smoke] FAIL: $*" >&2; exit 1; }
code=$(curl -sk -o /dev/null -w '%{http_code}' "$BASE/healthz")
[ "$code" = 200 ] || fail "/healthz answered $code"
page=$(curl -skL "$BASE/")
grep -q "<html" <<<"$page" || fail "/ is not an HTML page"
json=$(curl -sk -G --data-urlencode "q=二甲双胍的禁忌症" "$BASE/api/v1/search")
python3 - "$json" <<'PY' || fail "search API: $json"
import json, sys
r = json.loads(sys.argv[1])
assert r["hits"], "no hits"
print(f"[smoke] search API: {len(r['hits'])} hits, method {r['method']}, first: {r['hits'][0]['title']}")
PY
echo "[smoke] ok"
