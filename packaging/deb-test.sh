#!/usr/bin/env bash
# The package test CI runs (as root, on a throwaway machine: it installs and purges care-appliance here).
#
#   packaging/deb-test.sh NEW.deb OLD.deb
#
# 1. inspects NEW: file list, modes, conffiles, maintainer scripts, lintian, the unit's systemd security score;
# 2. installs OLD (the previous release), loads the demo collection with the default model, searches;
# 3. upgrades to NEW: the data is migrated forward and the same search gives the same results; a backup of it
#    restores onto an empty directory with the same results;
# 4. starts `care serve` as the service user and smoke-tests it over HTTPS;
# 5. refuses a downgrade to OLD, keeping the data; remove keeps data, purge deletes it.
set -euo pipefail
NEW=$(realpath "$1")
OLD=$(realpath "$2")
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PORT=${CARE_DEB_TEST_PORT:-18443}
log() { printf '[deb-test] %s\n' "$*" >&2; }
die() { log "FAIL: $*"; exit 1; }
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || die "run as root (it installs the package on this machine)"
    exec sudo -E "$0" "$@"
fi
as_care() { runuser -u care -- "$@"; }
care() { as_care /usr/bin/care --config /etc/care/care.toml "$@"; }

if ! command -v lintian >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends lintian >/dev/null
fi

log "1. contents of $(basename "$NEW")"
listing=$(dpkg-deb -c "$NEW")
for path in ./usr/bin/care ./usr/lib/care/libonnxruntime.so.1.31.1 ./usr/share/care/models/e5-small-q4.bin \
    ./etc/care/care.toml ./usr/lib/systemd/system/care.service ./usr/lib/sysusers.d/care.conf \
    ./usr/lib/tmpfiles.d/care.conf ./usr/share/man/man1/care.1.gz ./usr/share/doc/care-appliance/copyright \
    ./usr/share/doc/care-appliance/README.md ./usr/share/doc/care-appliance/docs/admin/errors.md \
    ./usr/share/care/ocr/ch_PP-OCRv4_rec_infer.onnx ./usr/share/care/ocr/ch_PP-OCRv4_det_infer.onnx; do
    grep -q " $path\$" <<<"$listing" || die "$path missing from the package"
done
grep -q '^-rw-r----- .* ./etc/care/care.toml$' <<<"$listing" || die "/etc/care/care.toml must be mode 0640"
dpkg-deb -f "$NEW" Package | grep -qx care-appliance || die "package name"
ctrl=$(mktemp -d)
dpkg-deb -e "$NEW" "$ctrl"
grep -qx /etc/care/care.toml "$ctrl/conffiles" || die "care.toml is not a conffile"
for s in preinst postinst prerm postrm; do
    [ -x "$ctrl/$s" ] || die "maintainer script $s missing"
    sh -n "$ctrl/$s" || die "$s has a syntax error"
done
grep -q "refusing to downgrade" "$ctrl/preinst" || die "preinst lacks the downgrade guard"

log "   lintian (each remaining tag is justified in packaging/deb/lintian-overrides)"
lintian --fail-on error,warning "$NEW" || die "lintian reported errors or warnings without a justified override"

log "   systemd-analyze security"
score=$(systemd-analyze security --offline=true --no-pager "$ROOT/packaging/deb/care.service" 2>/dev/null \
    | sed -n 's/.*Overall exposure level for care.service: \([0-9.]*\).*/\1/p')
log "   exposure score: $score (0 = fully locked down, 10 = unprotected)"
awk -v s="$score" 'BEGIN { exit !(s != "" && s <= 2.0) }' || die "unit exposure score $score is above 2.0"

stop_server() { pkill -TERM -u care -f '/usr/bin/care --config /etc/care/care.toml serve' 2>/dev/null || true; sleep 1; }
getent passwd care >/dev/null && stop_server
dpkg -P care-appliance >/dev/null 2>&1 || true
# Purge keeps backups (they are the way back); this test starts without them.
rm -rf /var/lib/care /var/lib/care-backups /etc/care

log "2. install the previous release $(basename "$OLD")"
dpkg -i --force-confdef --force-confold "$OLD"
getent passwd care >/dev/null || die "the care user was not created"
[ "$(stat -c %U /var/lib/care)" = care ] || die "/var/lib/care is not owned by care"
care demo --no-serve --e5s1 /usr/share/care/models/e5-small-q4.bin
search_ids() { care search --json -n 5 "$1" | python3 -c 'import json,sys; print(" ".join(h["external_id"] + "#" + str(h["chunk_id"]) for h in json.load(sys.stdin)["hits"]))'; }
before=$(search_ids 二甲双胍的禁忌症)
[ -n "$before" ] || die "the old release found nothing"
log "   old release: $before"
old_schema=$(python3 -c 'import sqlite3; print(sqlite3.connect("file:/var/lib/care/care.sqlite?mode=ro", uri=True).execute("pragma user_version").fetchone()[0])')

log "3. upgrade to $(basename "$NEW")"
dpkg -i --force-confdef --force-confold "$NEW"
new_schema=$(python3 -c 'import sqlite3; print(sqlite3.connect("file:/var/lib/care/care.sqlite?mode=ro", uri=True).execute("pragma user_version").fetchone()[0])')
log "   metadata schema $old_schema -> $new_schema"
[ "$new_schema" -gt "$old_schema" ] || die "the upgrade did not migrate the schema"
after=$(search_ids 二甲双胍的禁忌症)
log "   new release: $after"
[ "$before" = "$after" ] || die "search results changed across the upgrade: '$before' vs '$after'"
care check >/dev/null || die "care check reports inconsistent indexes after the upgrade"
care doctor || log "   (doctor reported failures above; the port and TLS checks are expected to warn here)"
log "   a scanned page, read by the packaged OCR models (/usr/share/care/ocr)"
# As the service user (`env care` would run /usr/bin/care as root, whose index files the service then cannot read),
# from a copy the service user can read.
install -m 644 "$ROOT/appliance/engine/tests/fixtures/ocr-page.png" /tmp/care-ocr-page.png
as_care env -u CARE_OCR_MODELS /usr/bin/care --config /etc/care/care.toml ingest --create scans /tmp/care-ocr-page.png \
    >/dev/null || die "the packaged OCR did not read a scanned page"
care search --json -c scans 阿卡波糖 \
    | python3 -c 'import json,sys; h=json.load(sys.stdin)["hits"]; sys.exit(not (h and h[0]["scan"]["page"] == 1))' \
    || die "the scanned page is not searchable with its page"

log "   backup, verify and restore onto an empty directory with the packaged binary"
[ "$(stat -c %U /var/lib/care-backups)" = care ] || die "/var/lib/care-backups is missing or not owned by care"
care backup create >/tmp/care-backup.log 2>&1 || { cat /tmp/care-backup.log; die "care backup create failed"; }
archive=$(ls -t /var/lib/care-backups/care-*.care-backup | head -n 1)
[ -n "$archive" ] || die "no backup archive in /var/lib/care-backups"
care backup verify "$archive" >/dev/null || die "the backup does not verify"
# The whole list first: `care … | grep -q` would close the pipe at the first match, under pipefail a failure.
backups=$(care backup list) || die "care backup list failed"
grep -q "每天 02:30" <<<"$backups" || die "the packaged care.toml's daily backup at 02:30 is not in force"
rm -rf /tmp/care-restore && install -d -o care -g care /tmp/care-restore
restored() { as_care /usr/bin/care --config /etc/care/care.toml --data-dir /tmp/care-restore/data "$@"; }
restored restore "$archive" >/dev/null || die "care restore failed"
restored check >/dev/null || die "care check fails on the restored directory"
live=$(search_ids 二甲双胍的禁忌症)
[ "$(restored search --json -n 5 二甲双胍的禁忌症 | python3 -c 'import json,sys; print(" ".join(h["external_id"] + "#" + str(h["chunk_id"]) for h in json.load(sys.stdin)["hits"]))')" = "$live" ] \
    || die "the restored directory answers differently"
rm -rf /tmp/care-restore

log "4. serve as the service user over HTTPS on 127.0.0.1:$PORT"
as_care env CARE__SERVER__BIND=127.0.0.1:$PORT CARE__SERVER__HTTP_REDIRECT_BIND=127.0.0.1:$((PORT + 1)) /usr/bin/care --config /etc/care/care.toml serve >/tmp/care-serve.log 2>&1 &
server=$!
trap stop_server EXIT
for _ in $(seq 1 120); do
    curl -skf "https://127.0.0.1:$PORT/healthz" >/dev/null 2>&1 && break
    kill -0 $server 2>/dev/null || { cat /tmp/care-serve.log; die "care serve exited"; }
    sleep 1
done
curl -skf "https://127.0.0.1:$PORT/healthz" >/dev/null || { cat /tmp/care-serve.log; die "no /healthz after 120 s"; }
[ -f /var/lib/care/tls/cert.pem ] || die "no self-signed certificate was generated"
pwfile=/var/lib/care/bootstrap-admin-password
[ "$(stat -c '%a %U' "$pwfile")" = "600 care" ] || die "the bootstrap admin password file is missing or not 0600 care"
token=$(care user token admin --name deb-test | tail -n 1)
CARE_TOKEN=$token "$ROOT/packaging/smoke.sh" "https://127.0.0.1:$PORT" || { cat /tmp/care-serve.log; die "HTTPS smoke test failed"; }
stop_server
wait $server 2>/dev/null || true
trap - EXIT

log "5. downgrade is refused, data kept"
if dpkg -i --force-confdef --force-confold "$OLD" >/tmp/care-downgrade.log 2>&1; then
    die "a downgrade to $(basename "$OLD") was accepted"
fi
grep -q "refusing to downgrade" /tmp/care-downgrade.log || { cat /tmp/care-downgrade.log; die "the downgrade error is not explained"; }
[ "$(dpkg-query -W -f '${Version}' care-appliance)" = "$(dpkg-deb -f "$NEW" Version)" ] || die "the installed version changed"
[ "$(search_ids 二甲双胍的禁忌症)" = "$live" ] || die "data changed after the refused downgrade"

log "   remove keeps data and config; purge deletes them"
dpkg -r care-appliance >/dev/null
[ -f /var/lib/care/care.sqlite ] || die "remove deleted /var/lib/care"
[ -f /etc/care/care.toml ] || die "remove deleted the config"
dpkg -P care-appliance >/dev/null
[ ! -e /var/lib/care ] || die "purge kept /var/lib/care"
[ ! -e /etc/care/care.toml ] || die "purge kept /etc/care/care.toml"
! getent passwd care >/dev/null || die "purge kept the care user"
log "all package checks passed"
