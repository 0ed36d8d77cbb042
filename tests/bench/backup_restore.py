#!/usr/bin/env python3
"""Backups while clinicians search, and what a backup and a restore cost (issue 55).

  backup_restore.py --care target/debug/care --out tests/results/backup-restore-DATE [--passages 100000]

1. The demo (48 articles, e5-small, dense and BM25) served by `care serve` on loopback, 8 searching clients (each a
   process of its own, an API token): 20 s quiet, then a backup (`care backup create`, which the server makes)
   while an ingest runs beside it. Every answer that is not 200 is a failed search; the bound is
   p99 <= 1.5x quiet. The ingest is one JSONL file of 300 kuake_qtr passages; 40 small files (each parsed in a
   sandboxed child of its own) are measured too. The backup and each ingest also alone.
2. That backup restored onto an empty directory: `care check` and `care audit verify` there. A second backup made
   quiet, after the ingest, restored too: the same 200 held-out kuake_qtr queries over HTTPS against the live and
   the restored appliance must return identical rankings (ids and scores).
3. The same backup and restore for PASSAGES passages of ../shared/data/training/corpus.jsonl in a BM25-only
   appliance (its dense vectors are left out: embedding 100,000 passages with e5-small on 2 CPU cores takes hours;
   their size is stated from the table layout instead).
Writes OUT.json and OUT.svg.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from signin_burst import bar_chart, conn, cpu_name, demo_admin, serve, write_results  # noqa: E402
from writers_readers import CLIENTS, searching, summary  # noqa: E402

SHARED = Path(os.environ.get("CARE_SHARED", Path(__file__).resolve().parents[3] / "shared"))


def run(care, d, *args, env, check=True):
    p = subprocess.run([care, "--data-dir", str(d), *args], capture_output=True, env=env)
    if check and p.returncode != 0:
        raise SystemExit(f"care {' '.join(args)} failed: {p.stderr.decode()[-800:]}")
    return p


def backup(care, d, to, env):
    t = time.perf_counter()
    r = json.loads(run(care, d, "backup", "create", "--to", str(to), "--json", env=env).stdout)
    r["wall_s"] = round(time.perf_counter() - t, 2)
    return r


def restore(care, archive, target, env):
    t = time.perf_counter()
    r = json.loads(run(care, target, "restore", str(archive), "--json", env=env).stdout)
    check = run(care, target, "check", env=env, check=False)
    audit = run(care, target, "audit", "verify", env=env, check=False)
    return {"seconds": round(time.perf_counter() - t, 2), "restore_s": round(r["seconds"], 2),
            "consistent": r["check"]["consistent"], "care_check_exit": check.returncode,
            "audit_verify_exit": audit.returncode, "documents": r["info"]["documents"], "chunks": r["info"]["chunks"]}


def rankings(port, token, queries):
    c, out = conn(port, timeout=120), []
    for q in queries:
        c.request("GET", "/api/v1/search?limit=10&q=" + urllib.parse.quote(q),
                  headers={"Authorization": f"Bearer {token}"})
        r = c.getresponse()
        body = json.loads(r.read())
        out.append([(h["external_id"], round(h["score"], 5)) for h in body.get("hits", [])])
    return out


def held_out_queries(n):
    lines = (SHARED / "data/retrieval/kuake_qtr/queries.jsonl").read_text().splitlines()
    return [json.loads(l)["text"] for l in lines[:n]]


def kuake_export(d, k, n=300):
    """The k-th slice of n kuake_qtr passages as one JSONL file."""
    f = Path(d) / f"export-{k}.jsonl"
    lines = (SHARED / "data/retrieval/kuake_qtr/corpus.jsonl").read_text().splitlines()[k * n:(k + 1) * n]
    f.write_text("\n".join(lines) + "\n")
    return str(f)


def notes(d, n):
    files = []
    for i in range(n):
        f = Path(d) / f"note-{i}.md"
        f.write_text(f"# 会诊记录 {i}\n\n患者血压升高，建议复查肾功能与血钾，第 {i} 次随访，调整降压药剂量。\n")
        files.append(str(f))
    return files


def demo_part(care, env, port, queries):
    with tempfile.TemporaryDirectory() as d:
        data, backups = Path(d) / "data", Path(d) / "backups"
        token = demo_admin(care, str(data), env)
        srv = serve(care, str(data), port, env)
        try:
            searching(port, token, lambda: time.sleep(3))
            quiet, _ = searching(port, token, lambda: time.sleep(20))

            def ingest(files):
                return subprocess.Popen([care, "--data-dir", str(data), "ingest", "demo", *files],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)

            def during(files, to):
                def run():
                    running = ingest(files)
                    b = backup(care, data, to, env)
                    if running.wait() != 0:
                        raise SystemExit(f"ingest failed: {running.stderr.read().decode()[-500:]}")
                    return b
                return run

            # Two ingests: one file of 300 passages (a collection's export), and 40 small files (each parsed in a
            # sandboxed child of its own). Each alone first, to say which costs the searches what.
            exports = [kuake_export(d, k) for k in range(2)]
            many = notes(d, 80)
            alone_backup, _ = searching(port, token, lambda: backup(care, data, Path(d) / "alone", env))
            alone_ingest, _ = searching(port, token, lambda: ingest([exports[0]]).wait())
            load, loaded = searching(port, token, during([exports[1]], backups))
            alone_files, _ = searching(port, token, lambda: ingest(many[:40]).wait())
            load_files, _ = searching(port, token, during(many[40:], Path(d) / "files"))
            # The quiet backup (nothing written since the ingest ended) is the one the rankings are compared on.
            quiet_backup = backup(care, data, Path(d) / "quiet", env)
            live = rankings(port, token, queries)
        finally:
            srv.terminate()
            srv.wait(timeout=60)
        under_load = restore(care, loaded["path"], Path(d) / "restored-load", env)
        restored = restore(care, quiet_backup["path"], Path(d) / "restored", env)
        srv = serve(care, str(Path(d) / "restored"), port + 1, env)
        try:
            again = rankings(port + 1, token, queries)
        finally:
            srv.terminate()
            srv.wait(timeout=60)
        same = sum(1 for a, b in zip(live, again) if a == b)
        same_ids = sum(1 for a, b in zip(live, again) if [h[0] for h in a] == [h[0] for h in b])
        # What differs, for the reader to tell ids from scores.
        differing = [{"query": q, "live": a[:3], "restored": b[:3]}
                     for q, a, b in zip(queries, live, again) if a != b][:10]
        return {"quiet": summary(quiet), "backup_alone": summary(alone_backup), "ingest_alone": summary(alone_ingest),
                "during_backup": summary(load), "ingest_40_files_alone": summary(alone_files),
                "during_backup_40_files": summary(load_files),
                "backup": {k: loaded[k] for k in ("bytes", "seconds", "wall_s", "writes_paused_ms")}
                | {"data_bytes": loaded["info"]["data_bytes"], "files": loaded["info"]["files"]},
                "restore_of_backup_under_load": under_load,
                "quiet_backup": {k: quiet_backup[k] for k in ("bytes", "seconds")}, "restore": restored,
                "queries_compared": len(queries), "identical_rankings": same, "identical_ids_in_order": same_ids,
                "differing": differing,
                "queries_with_hits": sum(1 for r in live if r)}


def big_part(care, env, passages):
    env = dict(env, CARE__MODEL__DEFAULT_MODEL="/nonexistent/e5-small-q4.bin")
    with tempfile.TemporaryDirectory() as d:
        data, corpus = Path(d) / "data", Path(d) / "passages.jsonl"
        with open(SHARED / "data/training/corpus.jsonl") as src, open(corpus, "w") as out:
            for i, line in enumerate(src):
                if i >= passages:
                    break
                r = json.loads(line)
                out.write(json.dumps({"id": r["id"], "title": r.get("title", ""), "text": r["text"]},
                                     ensure_ascii=False) + "\n")
        run(care, data, "init", env=env)
        t = time.perf_counter()
        run(care, data, "ingest", "big", "--create", str(corpus), env=env)
        ingest_s = round(time.perf_counter() - t, 1)
        b = backup(care, data, Path(d) / "backups", env)
        r = restore(care, b["path"], Path(d) / "restored", env)
        du = sum(f.stat().st_size for f in data.rglob("*") if f.is_file())
        return {"passages": passages, "ingest_s": ingest_s, "data_dir_bytes": du,
                "backup": {k: b[k] for k in ("bytes", "seconds", "wall_s", "writes_paused_ms")}
                | {"data_bytes": b["info"]["data_bytes"], "chunks": b["info"]["chunks"]},
                "restore": r,
                # e5-small's 384 dimensions: an f32 vector and its int8 copy per passage, before compression.
                "dense_bytes_left_out": passages * 384 * 5}


def svg(r):
    demo, big = r["demo"], r["big"]
    mb = lambda b: round(b / 2**20, 1)  # noqa: E731
    bound = 1.5 * demo["quiet"]["p99_ms"]
    rows = [("demo: search p99 quiet (ms)", demo["quiet"]["p99_ms"], None),
            ("demo: search p99, backup alone (ms)", demo["backup_alone"]["p99_ms"], bound),
            ("demo: search p99, ingest (1 file) alone (ms)", demo["ingest_alone"]["p99_ms"], bound),
            ("demo: search p99, backup + ingest (ms)", demo["during_backup"]["p99_ms"], bound),
            ("demo: search p99, 40 files alone (ms)", demo["ingest_40_files_alone"]["p99_ms"], bound),
            ("demo: search p99, backup + 40 files (ms)", demo["during_backup_40_files"]["p99_ms"], bound),
            ("demo: failed searches during backup", demo["during_backup"]["failed"], 0),
            ("demo: backup (s)", demo["backup"]["seconds"], None),
            ("demo: restore incl. check and audit (s)", demo["restore"]["restore_s"], None),
            ("demo: archive (MB)", mb(demo["backup"]["bytes"]), None),
            ("demo: data backed up (MB)", mb(demo["backup"]["data_bytes"]), None),
            (f"{big['passages']:,} passages: backup (s)", big["backup"]["seconds"], None),
            (f"{big['passages']:,} passages: restore (s)", big["restore"]["restore_s"], None),
            (f"{big['passages']:,} passages: archive (MB)", mb(big["backup"]["bytes"]), None),
            (f"{big['passages']:,} passages: data backed up (MB)", mb(big["backup"]["data_bytes"]), None)]
    note = (f"{CLIENTS} clients searching during the demo's backup (an ingest beside it); "
            f"{demo['identical_rankings']}/{demo['queries_compared']} rankings identical after restore; red: bound")
    return bar_chart(r["title"], note, rows, left=330, span=380)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--care", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--passages", type=int, default=100_000)
    p.add_argument("--queries", type=int, default=200)
    p.add_argument("--port", type=int, default=18640)
    p.add_argument("--demo-only", action="store_true", help="skip the 100,000 passages (a quick look)")
    a = p.parse_args()
    care, env = os.path.abspath(a.care), dict(os.environ)
    queries = held_out_queries(a.queries)
    r = {"title": "Backup and restore (care serve, loopback)",
         "cpu": cpu_name(),
         "cores": os.cpu_count(), "binary": care}
    r["demo"] = demo_part(care, env, a.port, queries)
    print(json.dumps(r["demo"], ensure_ascii=False), file=sys.stderr, flush=True)
    if a.demo_only:
        return
    r["big"] = big_part(care, env, a.passages)
    r["p99_ratio"] = round(r["demo"]["during_backup"]["p99_ms"] / r["demo"]["quiet"]["p99_ms"], 2)
    write_results(a.out, r, svg(r))


if __name__ == "__main__":
    main()
