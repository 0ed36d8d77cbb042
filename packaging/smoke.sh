#!/usr/bin/env bash
# HTTPS smoke test of a running appliance: CARE_TOKEN=<api token> packaging/smoke.sh https://host:port
set -euo pipefail
BASE=$1
fail() { echo "[smoke] FAIL: $*" >&2; exit 1; }
code=$(curl -sk -o /dev/null -w '%{http_code}' "$BASE/healthz")
[ "$code" = 200 ] || fail "/healthz answered $code"
login=$(curl -sk "$BASE/login")
grep -q '<form' <<<"$login" && grep -q 'name="password"' <<<"$login" || fail "/login has no sign-in form"
grep -qi 'strict-transport-security' <(curl -skI "$BASE/login") || fail "no HSTS header"
code=$(curl -sk -o /dev/null -w '%{http_code}' "$BASE/api/v1/search?q=x")
[ "$code" = 401 ] || fail "anonymous search answered $code, expected 401"
json=$(curl -sk -G -H "Authorization: Bearer ${CARE_TOKEN:?set CARE_TOKEN}" --data-urlencode "q=二甲双胍的禁忌症" "$BASE/api/v1/search")
python3 - "$json" <<'PY' || fail "search API: $json"
import json, sys
r = json.loads(sys.argv[1])
assert r["hits"], "no hits"
print(f"[smoke] search API: {len(r['hits'])} hits, method {r['method']}, first: {r['hits'][0]['title']}")
PY
echo "[smoke] ok: /healthz, /login form, HSTS, 401 without credentials, search with an API token"
