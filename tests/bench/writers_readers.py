#!/usr/bin/env python3
"""Long writes beside clinicians' searches (issue 52): do writers stall readers?

  writers_readers.py --care target/debug/care --out tests/results/writers-readers-DATE [--rounds 3]

Starts the demo's data in a temp dir with a second collection of 100,000 documents (rows only: filing touches
nothing else) and `care serve` on loopback, then over HTTPS with 8 searching clients (each a process of its own,
one keep-alive connection, an API token):
  1. quiet: the searches' p50/p99 with nothing else running;
  2. under writes: ROUNDS times, a 50,000-group synonym import (`POST /api/v1/admin/synonyms/import?replace=true`,
     the table's limit) and then a 100,000-row filing spreadsheet (`care collection file`, a second process on the
     same data directory, as an admin runs it), while the 8 clients search; every answer that is not 200 counts as
     a failed search.
Writes OUT.json and OUT.svg: failed searches, p99 under writes against 1.5x the quiet p99, each write's duration.
"""
import argparse
import json
import multiprocessing as mp
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from signin_burst import QUERIES, bar_chart, conn, cpu_name, demo_admin, pct, serve, write_results  # noqa: E402

CLIENTS = 8


def client(port, token, stop, out, n):
    """Searches until `stop`: (latency ms, status) per search; a broken connection counts as a failure."""
    c, i, res = conn(port), n, []
    while not stop.is_set():
        q = QUERIES[i % len(QUERIES)]
        i += 1
        t = time.perf_counter()
        try:
            c.request("GET", "/api/v1/search?q=" + urllib.parse.quote(q), headers={"Authorization": f"Bearer {token}"})
            r = c.getresponse()
            r.read()
            status, timing = r.status, r.getheader("server-timing")
        except Exception as e:  # noqa: BLE001 - every failure is a result here
            status, timing = type(e).__name__, None
            c = conn(port)
        res.append(((time.perf_counter() - t) * 1000, status, time.time(), timing))
    out.put(res)


def searching(port, token, during):
    """Runs `during()` while CLIENTS processes search; returns their (latency, status) pairs and during's result."""
    ctx = mp.get_context("fork")
    stop, out = ctx.Event(), ctx.Queue()
    ps = [ctx.Process(target=client, args=(port, token, stop, out, n)) for n in range(CLIENTS)]
    for p in ps:
        p.start()
    time.sleep(1.0)
    result = during()
    stop.set()
    res = [x for _ in ps for x in out.get()]
    for p in ps:
        p.join()
    return res, result


def summary(res):
    lat = [l for l, s, *_ in res if s == 200]
    return {"searches": len(res), "failed": sum(1 for _, s, *_ in res if s != 200),
            "failures": sorted({str(s) for _, s, *_ in res if s != 200}),
            "p50_ms": round(pct(lat, 50), 2), "p99_ms": round(pct(lat, 99), 2), "max_ms": round(max(lat), 1)}


def phase_of(phases, at):
    """The write running at `at` ("between" when none ran)."""
    return next((name for name, a, b in phases if a <= at <= b), "between")


def slowest(res, phases, n=10):
    """The n slowest searches, the write each started during and the server's stage times (Server-Timing)."""
    return [{"ms": round(l, 1), "during": phase_of(phases, at - l / 1000), "server_timing": timing}
            for l, _, at, timing in sorted(res, key=lambda x: -x[0])[:n]]


def p99_by_write(res, phases):
    """Searches and their p99 while each kind of write ran (synonym import, filing) and between writes."""
    by = {}
    for l, s, at, _ in res:
        if s == 200:
            by.setdefault(phase_of(phases, at - l / 1000).split()[0], []).append(l)
    return {k: {"searches": len(v), "p99_ms": round(pct(v, 99), 2)} for k, v in sorted(by.items())}


def synonym_csv(round_no):
    lines = ["首选词,同义词,备注"]
    for i in range(50_000):
        lines.append(f"测试术语{round_no}x{i:05d},测术{round_no}x{i:05d},基准")
    return "\n".join(lines).encode()


def import_synonyms(port, token, body):
    c = conn(port, timeout=600)
    t = time.perf_counter()
    c.request("POST", "/api/v1/admin/synonyms/import?replace=true", body=body,
              headers={"Authorization": f"Bearer {token}", "Content-Type": "text/csv"})
    r = c.getresponse()
    answer = r.read()
    if r.status != 200:
        raise SystemExit(f"synonym import answered {r.status}: {answer[:300]!r}")
    return round(time.perf_counter() - t, 2)


def file_documents(care, data, csv, env):
    t = time.perf_counter()
    p = subprocess.run([care, "--data-dir", data, "collection", "file", "filing", str(csv)], capture_output=True,
                       env=env)
    if p.returncode != 0:
        raise SystemExit(f"care collection file failed: {p.stderr.decode()[-500:]}")
    return round(time.perf_counter() - t, 2), p.stdout.decode().strip().splitlines()[0]


def svg(r):
    quiet, load = r["quiet"]["p99_ms"], r["under_writes"]["p99_ms"]
    rows = [("search p99, quiet (ms)", quiet, None), ("search p99 under writes (ms)", load, 1.5 * quiet),
            ("search p50, quiet (ms)", r["quiet"]["p50_ms"], None),
            ("search p50 under writes (ms)", r["under_writes"]["p50_ms"], None),
            ("failed searches under writes", r["under_writes"]["failed"], 0)]
    note = (f"{CLIENTS} clients searching; {r['rounds']} rounds of a 50,000-group synonym import and a 100,000-row "
            "filing; red ticks: the acceptance bound")
    return bar_chart(r["title"], note, rows, left=260, span=420)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--care", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--port", type=int, default=18610)
    p.add_argument("--log", help="copy the server's log here (to see why a search failed)")
    a = p.parse_args()
    care = os.path.abspath(a.care)
    env = dict(os.environ)
    with tempfile.TemporaryDirectory() as d:
        token = demo_admin(care, d, env)
        subprocess.run([care, "--data-dir", d, "collection", "create", "filing"], check=True, capture_output=True,
                       env=env)
        db = sqlite3.connect(Path(d) / "care.sqlite")
        cid = db.execute("SELECT id FROM collections WHERE name = 'filing'").fetchone()[0]
        db.executemany("INSERT INTO documents (collection_id, external_id, content_hash, state, created_at) "
                       "VALUES (?, ?, 'x', 'indexed', '2026-11-29T00:00:00Z')",
                       ((cid, f"doc{i:06d}") for i in range(100_000)))
        db.commit()
        db.close()
        csvs = []
        for k, dept in enumerate(["内科", "外科"]):
            f = Path(d) / f"filing-{k}.csv"
            f.write_text("编号,科室\n" + "".join(f"doc{i:06d},{dept}\n" for i in range(100_000)))
            csvs.append(f)
        srv = serve(care, d, a.port, env)
        try:
            searching(a.port, token, lambda: time.sleep(3))  # warms the caches
            quiet, _ = searching(a.port, token, lambda: time.sleep(20))
            bodies = [synonym_csv(k) for k in range(a.rounds)]
            phases = []

            def writes():
                done = []
                for k in range(a.rounds):
                    t0 = time.time()
                    done.append({"synonym_import_s": import_synonyms(a.port, token, bodies[k])})
                    phases.append((f"synonym import {k + 1}", t0, time.time()))
                    t0 = time.time()
                    secs, said = file_documents(care, d, csvs[k % 2], env)
                    phases.append((f"filing {k + 1}", t0, time.time()))
                    done[-1].update({"filing_s": secs, "filing_said": said})
                    print(json.dumps(done[-1], ensure_ascii=False), file=sys.stderr, flush=True)
                return done

            load, done = searching(a.port, token, writes)
        finally:
            srv.terminate()
            srv.wait(timeout=60)
            if a.log:
                Path(a.log).write_bytes((Path(d) / "serve.log").read_bytes())
    r = {"title": "Searches under long writes (care serve, loopback)",
         "cpu": cpu_name(),
         "cores": os.cpu_count(), "binary": care, "clients": CLIENTS, "rounds": a.rounds,
         "quiet": summary(quiet), "under_writes": summary(load), "writes": done,
         "p99_by_write": p99_by_write(load, phases), "slowest_under_writes": slowest(load, phases)}
    r["p99_ratio"] = round(r["under_writes"]["p99_ms"] / r["quiet"]["p99_ms"], 2)
    write_results(a.out, r, svg(r))


if __name__ == "__main__":
    main()
