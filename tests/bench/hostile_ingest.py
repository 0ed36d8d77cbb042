#!/usr/bin/env python3
"""Search latency and server memory while hostile files are ingested (issue 32's acceptance).

Starts `care serve` on a fresh data directory holding kuake_qtr's corpus (BM25 only, so the search itself is cheap
and any interference shows), measures search latency with 8 clients while nothing else runs (quiet), then while an
upload of hostile files is parsed: PDFs whose pages repeat one content stream and a 60 MB text over the parser's
memory limit (`CARE__INGEST__ISOLATION__MEMORY_MB=400`). Reports p50/p99 of both phases, their ratio, the server's
peak-RSS growth and the job's per-file outcome, as JSON plus an SVG chart.

    python3 tests/bench/hostile_ingest.py --care target/debug/care --shared ../shared --out tests/results/hostile-ingest.json
"""
import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import tempfile
import threading
import time
import zlib

import requests
import urllib3

urllib3.disable_warnings()


def pdf_one_stream(pages, lines):
    """A PDF whose `pages` pages all show one compressed content stream of `lines` text lines."""
    ops = b"".join(b"BT /F1 10 Tf 40 %d Td (Metformin is contraindicated in severe renal impairment.) Tj ET\n" % (800 - (i % 70) * 11) for i in range(lines))
    stream = zlib.compress(ops, 9)
    objs = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        None,  # pages, filled below
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
        b"<< /Length %d /Filter /FlateDecode >>\nstream\n" % len(stream) + stream + b"\nendstream",
    ]
    first_page = len(objs) + 1
    kids = " ".join(f"{first_page + i} 0 R" for i in range(pages)).encode()
    objs[1] = b"<< /Type /Pages /Kids [" + kids + b"] /Count %d >>" % pages
    for _ in range(pages):
        objs.append(b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 595 842] /Contents 4 0 R /Resources << /Font << /F1 3 0 R >> >> >>")
    out = bytearray(b"%PDF-1.5\n")
    offsets = []
    for n, o in enumerate(objs, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % n + o + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objs) + 1)
    for off in offsets:
        out += b"%010d 00000 n \n" % off
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objs) + 1, xref)
    return bytes(out)


def peak_rss(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def percentile(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def load(base, token, queries, stop, sink):
    s = requests.Session()
    s.verify = False
    s.trust_env = False  # REQUESTS_CA_BUNDLE would override verify=False (the server's certificate is self-signed)
    s.headers["Authorization"] = f"Bearer {token}"
    while not stop.is_set():
        q = random.choice(queries)
        t = time.perf_counter()
        r = s.get(f"{base}/api/v1/search", params={"q": q, "limit": 10, "method": "bm25"})
        dt = (time.perf_counter() - t) * 1e3
        if r.status_code != 200:
            sink.append(("error", r.status_code))
        else:
            sink.append(("ok", dt))


def run_phase(base, token, queries, clients, until):
    stop, sink = threading.Event(), []
    threads = [threading.Thread(target=load, args=(base, token, queries, stop, sink)) for _ in range(clients)]
    for t in threads:
        t.start()
    until()
    stop.set()
    for t in threads:
        t.join()
    ms = [v for k, v in sink if k == "ok"]
    errors = [v for k, v in sink if k == "error"]
    return {"searches": len(ms), "errors": len(errors), "p50_ms": statistics.median(ms), "p99_ms": percentile(ms, 99)}


def chart(report, path):
    q, h = report["quiet"], report["hostile"]
    bars = [("quiet p50", q["p50_ms"]), ("hostile p50", h["p50_ms"]), ("quiet p99", q["p99_ms"]), ("hostile p99", h["p99_ms"])]
    top = max(v for _, v in bars) * 1.15
    w, hgt = 520, 300
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{hgt}" font-family="sans-serif" font-size="12">',
           f'<text x="10" y="18" font-size="14">搜索延迟：平静时 vs 解析恶意文件时（{report["clients"]} 个并发客户端，ms）</text>']
    for i, (label, v) in enumerate(bars):
        x, bh = 40 + i * 115, (v / top) * 220
        color = "#4c78a8" if label.startswith("quiet") else "#e45756"
        out.append(f'<rect x="{x}" y="{260 - bh:.1f}" width="70" height="{bh:.1f}" fill="{color}"/>')
        out.append(f'<text x="{x + 35}" y="{255 - bh:.1f}" text-anchor="middle">{v:.1f}</text>')
        out.append(f'<text x="{x + 35}" y="278" text-anchor="middle">{label}</text>')
    out.append(f'<text x="10" y="295">p99 比值 {report["p99_ratio"]:.2f}×；care serve 峰值内存增长 {report["rss_growth_mib"]:.1f} MiB</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--care", required=True)
    ap.add_argument("--shared", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--quiet-seconds", type=float, default=20)
    a = ap.parse_args()
    care = os.path.abspath(a.care)
    tmp = tempfile.mkdtemp(prefix="care-hostile-")
    data = os.path.join(tmp, "data")
    env = dict(os.environ, CARE__INGEST__ISOLATION__MEMORY_MB="400")

    config = os.path.join(tmp, "care.toml")
    with open(config, "w") as f:
        f.write("# compiled defaults\n")

    def cli(*args):
        return subprocess.run([care, "--config", config, "--data-dir", data, *args], env=env, check=True, capture_output=True, text=True).stdout

    cli("init")
    cli("collection", "create", "c")
    set_dir = os.path.join(a.shared, "data/retrieval/kuake_qtr")
    cli("ingest", "c", os.path.join(set_dir, "corpus.jsonl"))
    pw = os.path.join(tmp, "pw")
    with open(pw, "w") as f:
        f.write("hostile-bench-password-1")
    cli("user", "add", "admin", "--role", "admin", "--password-file", pw, "--permanent")
    token = cli("user", "token", "admin", "--name", "bench").strip()
    queries = [json.loads(l)["text"] for l in open(os.path.join(set_dir, "queries.jsonl"))][:500]
    server = subprocess.Popen([care, "--config", config, "--data-dir", data, "serve", "--bind", "127.0.0.1:0", "--http-bind", "127.0.0.1:0"],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    base = None
    for line in server.stdout:
        if line.startswith("listening on "):
            base = line.removeprefix("listening on ").strip()
            break
    threading.Thread(target=lambda: [None for _ in server.stdout], daemon=True).start()
    s = requests.Session()
    s.verify = False
    s.trust_env = False  # REQUESTS_CA_BUNDLE would override verify=False (the server's certificate is self-signed)
    for _ in range(100):
        try:
            if s.get(f"{base}/healthz").status_code == 200:
                break
        except requests.RequestException:
            time.sleep(0.2)
    try:
        run_phase(base, token, queries, a.clients, lambda: time.sleep(3))  # warm-up
        quiet = run_phase(base, token, queries, a.clients, lambda: time.sleep(a.quiet_seconds))
        files = [(f"repeat{i}.pdf", pdf_one_stream(300, 3000)) for i in range(4)]
        files.append(("big.txt", ("二甲双胍禁用于严重肾功能不全的患者，用药前应评估肾功能。\n" * 700000).encode()))
        files.append(("ok.md", "# 胰岛素\n\n胰岛素注射部位应轮换。\n".encode()))
        rss0 = peak_rss(server.pid)
        r = s.post(f"{base}/api/v1/admin/collections/c/files", headers={"Authorization": f"Bearer {token}"},
                   files=[("file", (n, b)) for n, b in files])
        r.raise_for_status()
        job = r.json()["job_id"]
        outcome = {}

        def until_done():
            while True:
                j = s.get(f"{base}/api/v1/admin/jobs/{job}", headers={"Authorization": f"Bearer {token}"}).json()
                if j["state"] in ("done", "failed", "cancelled"):
                    outcome.update(j)
                    return
                time.sleep(0.2)

        t0 = time.time()
        hostile = run_phase(base, token, queries, a.clients, until_done)
        hostile["seconds"] = time.time() - t0
        rss1 = peak_rss(server.pid)
        alive = server.poll() is None
    finally:
        server.terminate()
        server.wait(timeout=30)
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    report = {
        "date": time.strftime("%Y-%m-%d"), "cpu": cpu, "cores": os.cpu_count(), "build": "debug" if "/debug/" in care else "release",
        "machine": platform.node(), "clients": a.clients, "corpus": "kuake_qtr (BM25)", "quiet": quiet, "hostile": hostile,
        "p99_ratio": hostile["p99_ms"] / quiet["p99_ms"], "p50_ratio": hostile["p50_ms"] / quiet["p50_ms"],
        "rss_growth_mib": (rss1 - rss0) / (1 << 20), "server_alive": alive,
        "files": [{"file": e.get("file"), "code": e.get("code"), "message": e.get("message")} for e in outcome.get("errors", [])],
        "job_state": outcome.get("state"),
    }
    with open(a.out, "w") as f:
        json.dump(report, f, ensure_ascii=False, indent=2)
    chart(report, os.path.splitext(a.out)[0] + ".svg")
    print(json.dumps(report, ensure_ascii=False, indent=2))


if __name__ == "__main__":
    main()
