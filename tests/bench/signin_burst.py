#!/usr/bin/env python3
"""Sign-in and connection bursts against a real `care serve` (issue 51): what a shift change or a flood costs.

  signin_burst.py --care target/debug/care --out tests/results/signin-burst-DATE [--corpus FILE.jsonl]

Starts the demo's data in a temp dir and `care serve` on loopback, then measures, over HTTPS:
  1. quiet: p50/p99 of a clinician's search (one keep-alive connection, an API token);
  2. waves of 60, 120 and 200 concurrent anonymous sign-ins (fresh names, each from its own loopback address with
     its own login CSRF cookie): the server's RSS growth from the start, at its peak (sampled every 20 ms) and
     after; the search's p99 alongside (measured in a process of its own);
  3. 500 concurrent wrong sign-ins from one address: password hashes computed (`care_password_hashes_total` in
     /metrics before and after) and the answers;
  4. 300 concurrent new HTTPS connections (each a fresh TLS handshake and GET /login) while an upload of CORPUS is
     being ingested: handshake failures, requests unanswered, p50/p99 of the handshake.
Writes OUT.json and OUT.svg; `signin_burst.py --compare BEFORE.json AFTER.json OUT.svg` charts two runs against
the acceptance bounds. Loopback addresses 127.0.x.y are all this machine's: each worker binds its own.
"""
import argparse
import http.client
import json
import os
import re
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import uuid
from html import escape
from pathlib import Path

CTX = ssl.create_default_context()
CTX.check_hostname = False
CTX.verify_mode = ssl.CERT_NONE
QUERIES = ["二甲双胍的禁忌症", "高血压 饮食", "儿童发热的处理", "胰岛素注射部位", "咳嗽", "糖尿病足"]


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))] if xs else None


def rss_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1)) / 1024


def conn(port, source=None, timeout=60):
    return http.client.HTTPSConnection("127.0.0.1", port, context=CTX, timeout=timeout,
                                       source_address=(source, 0) if source else None)


def searcher(port, token, stop, out):
    """Searches one after another on one connection until `stop`; appends latencies in ms."""
    c, i = conn(port), 0
    while not stop.is_set():
        q = QUERIES[i % len(QUERIES)]
        i += 1
        t = time.perf_counter()
        c.request("GET", "/api/v1/search?q=" + urllib.parse.quote(q), headers={"Authorization": f"Bearer {token}"})
        r = c.getresponse()
        r.read()
        if r.status != 200:
            raise SystemExit(f"search answered {r.status}")
        out.append((time.perf_counter() - t) * 1000)


def sign_in(port, source, name, password, barrier, answers, with_cookie=True):
    """One sign-in on its own connection; without its CSRF cookie it is refused before any password is hashed
    (the same traffic without the hash, as a control)."""
    try:
        c = conn(port, source)
        c.request("GET", "/login")
        r = c.getresponse()
        r.read()
        cookie = next(v for k, v in r.getheaders() if k.lower() == "set-cookie" and "login_csrf" in v).split(";")[0]
        token = cookie.split("=", 1)[1]
        body = urllib.parse.urlencode({"username": name, "password": password, "csrf": token})
        barrier.wait()
        c.request("POST", "/login", body=body, headers={
            "Content-Type": "application/x-www-form-urlencoded", **({"Cookie": cookie} if with_cookie else {})})
        r = c.getresponse()
        r.read()
        answers.append(r.status)
    except Exception as e:  # noqa: BLE001 - every failure is a result here
        answers.append(type(e).__name__)


def metric(port, token, name):
    c = conn(port)
    c.request("GET", "/metrics", headers={"Authorization": f"Bearer {token}"})
    text = c.getresponse().read().decode()
    m = re.search(rf"^{name} (\S+)$", text, re.M)
    return float(m.group(1)) if m else None  # a build from before the metric


def burst(n, target):
    barrier = threading.Barrier(n)
    threads = [threading.Thread(target=target, args=(i, barrier)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def counts(xs):
    out = {}
    for x in xs:
        out[str(x)] = out.get(str(x), 0) + 1
    return out


def search_process(port, token, stop, out):
    """The benign search in a process of its own, so the burst's client threads do not slow its clock (GIL)."""
    lat = []
    t = threading.Thread(target=searcher, args=(port, token, stop, lat))
    t.start()
    t.join()
    out.put(lat)


def timed_searches(port, token, seconds=None, during=None):
    """Latencies (ms) of searches run in another process for `seconds`, or while `during()` runs."""
    import multiprocessing as mp
    ctx = mp.get_context("fork")
    stop, out = ctx.Event(), ctx.Queue()
    p = ctx.Process(target=search_process, args=(port, token, stop, out))
    p.start()
    time.sleep(0.5)
    t0 = time.perf_counter()
    if during:
        during()
    else:
        time.sleep(seconds)
    took = time.perf_counter() - t0
    stop.set()
    lat = out.get()
    p.join()
    return lat, took


def summary(lat):
    return {"n": len(lat), "p50_ms": round(pct(lat, 50), 2), "p99_ms": round(pct(lat, 99), 2)}


def concurrent_sign_ins(port, pid, token, waves):
    """Waves of concurrent sign-ins (the issue's 60, 120, 200), each with its RSS growth from the start."""
    start, out = rss_mb(pid), []
    for n in waves:
        stop, peak, answers = threading.Event(), [rss_mb(pid)], []

        def sample():
            while not stop.is_set():
                peak.append(rss_mb(pid))
                time.sleep(0.02)

        m = threading.Thread(target=sample)
        m.start()
        lat, took = timed_searches(port, token, during=lambda: burst(n, lambda i, b: sign_in(
            port, f"127.0.1.{i % 250 + 1}", f"nurse{uuid.uuid4().hex[:8]}", "wrong-password-1", b, answers)))
        stop.set()
        m.join()
        time.sleep(1)
        out.append({"sign_ins": n, "answers": counts(answers), "seconds": round(took, 2),
                    "rss_peak_mb": round(max(peak), 1), "rss_after_mb": round(rss_mb(pid), 1),
                    "rss_growth_from_start_mb": round(max(peak + [rss_mb(pid)]) - start, 1),
                    "search_during": summary(lat)})
    return {"rss_start_mb": round(start, 1), "waves": out}


def without_hashing(port, token, n):
    """The control: the same n concurrent sign-ins without their CSRF cookie, refused before the hash."""
    answers = []
    lat, took = timed_searches(port, token, during=lambda: burst(n, lambda i, b: sign_in(
        port, f"127.0.4.{i % 250 + 1}", f"nurse{uuid.uuid4().hex[:8]}", "wrong-password-1", b, answers, False)))
    return {"sign_ins": n, "answers": counts(answers), "seconds": round(took, 2), "search_during": summary(lat)}


def one_address_flood(port, token, n):
    before, answers = metric(port, token, "care_password_hashes_total"), []
    burst(n, lambda i, b: sign_in(port, "127.0.2.1", f"guess{i}", "wrong-password-2", b, answers))
    after = metric(port, token, "care_password_hashes_total")
    return {"sign_ins": n, "answers": counts(answers),
            "password_hashes": None if before is None else int(after - before)}


def upload(port, token, corpus):
    """Starts an ingest of `corpus` (an upload, as an admin does) and returns the job id."""
    c = conn(port, timeout=600)
    c.request("POST", "/api/v1/admin/collections", body=json.dumps({"name": "burst", "description": ""}),
              headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    c.getresponse().read()
    boundary = uuid.uuid4().hex
    data = Path(corpus).read_bytes()
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{Path(corpus).name}\"\r\n"
            f"Content-Type: application/octet-stream\r\n\r\n").encode() + data + f"\r\n--{boundary}--\r\n".encode()
    c.request("POST", "/api/v1/admin/collections/burst/files", body=body, headers={
        "Authorization": f"Bearer {token}", "Content-Type": f"multipart/form-data; boundary={boundary}"})
    r = c.getresponse()
    answer = r.read()
    if r.status != 202:
        raise SystemExit(f"upload answered {r.status}: {answer[:300]!r}")
    return json.loads(answer)["job_id"]


def job_state(port, token, job):
    c = conn(port)
    c.request("GET", f"/api/v1/admin/jobs/{job}", headers={"Authorization": f"Bearer {token}"})
    return json.loads(c.getresponse().read()).get("state")


def connection_burst(port, token, n, corpus, pid):
    job = upload(port, token, corpus) if corpus else None
    if job:
        time.sleep(3)  # the parse and embedding are under way
    cpu0 = sum(int(x) for x in open("/proc/stat").readline().split()[1:8])
    idle0 = int(open("/proc/stat").readline().split()[4])
    hs, answers = [], []

    def one(i, barrier):
        barrier.wait()
        try:
            t = time.perf_counter()
            raw = socket.create_connection(("127.0.0.1", port), timeout=60, source_address=(f"127.0.3.{i % 250 + 1}", 0))
            s = CTX.wrap_socket(raw, server_hostname="localhost")
            hs.append((time.perf_counter() - t) * 1000)
        except Exception as e:  # noqa: BLE001
            answers.append("handshake " + type(e).__name__)
            return
        try:
            s.sendall(b"GET /login HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            head = s.recv(64)
            answers.append(int(head.split()[1]) if head.startswith(b"HTTP/1.1") else "no answer")
        except Exception as e:  # noqa: BLE001
            answers.append("request " + type(e).__name__)
        finally:
            s.close()

    burst(n, one)
    line = open("/proc/stat").readline().split()
    busy = 1 - (int(line[4]) - idle0) / max(1, sum(int(x) for x in line[1:8]) - cpu0)
    return {"connections": n, "answers": counts(answers), "handshake_failures": sum(
        1 for a in answers if str(a).startswith("handshake")), "unanswered": sum(1 for a in answers if a != 200),
        "handshake_p50_ms": round(pct(hs, 50), 1), "handshake_p99_ms": round(pct(hs, 99), 1),
        "ingest_job": job, "ingest_state_after": job and job_state(port, token, job),
        "machine_cpu_busy": round(busy, 2)}


def demo_admin(care, d, env):
    """The demo's data in `d` and an administrator's API token."""
    subprocess.run([care, "--data-dir", d, "demo", "--no-serve"], check=True, env=env, capture_output=True)
    subprocess.run([care, "--data-dir", d, "user", "add", "--role", "admin", "bench"], input=b"Qz7-burst-Hx4-ward-91\n",
                   check=False, capture_output=True, env=env)
    out = subprocess.run([care, "--data-dir", d, "user", "token", "--name", "bench", "bench"], check=True,
                         capture_output=True, env=env).stdout.decode()
    return re.search(r"\b[0-9a-f]{64}\b|\bcare_[A-Za-z0-9_]+\b", out).group(0)


def serve(care, d, port, env):
    """`care serve` on `d` (its log in d/serve.log), once it answers /healthz."""
    srv = subprocess.Popen([care, "--data-dir", d, "serve", "--bind", f"127.0.0.1:{port}", "--http-bind", ""],
                           stdout=subprocess.DEVNULL, stderr=open(Path(d) / "serve.log", "w"), env=env)
    for _ in range(600):
        try:
            c = conn(port, timeout=2)
            c.request("GET", "/healthz")
            if c.getresponse().status in (200, 503):
                break
        except OSError:
            time.sleep(0.2)
    return srv


def cpu_name():
    """The CPU's model name, for a result's record of where it was measured."""
    return next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "")


def write_results(out, r, chart):
    """OUT.json and OUT.svg, and the JSON on stdout."""
    Path(out + ".json").write_text(json.dumps(r, ensure_ascii=False, indent=2) + "\n")
    Path(out + ".svg").write_text(chart)
    json.dump(r, sys.stdout, ensure_ascii=False, indent=2)
    print()


def bar_chart(title, note, rows, left=300, span=400):
    """Horizontal bars of (label, value, bound or None), a red tick at each bound."""
    w, top, bar = 760, 50, 22
    scale = span / max(max(v for _, v, _ in rows), max((b or 0) for _, _, b in rows), 1)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{top + len(rows) * (bar + 8) + 30}" '
           'font-family="sans-serif" font-size="12"><rect width="100%" height="100%" fill="white"/>',
           f'<text x="10" y="20" font-size="15">{escape(title)}</text>',
           f'<text x="10" y="38" fill="#555">{escape(note)}</text>']
    y = top
    for label, v, bound in rows:
        out.append(f'<text x="10" y="{y + 15}">{escape(label)}</text><rect x="{left}" y="{y}" '
                   f'width="{max(1, v * scale):.1f}" height="{bar - 4}" fill="#2980b9"/>'
                   f'<text x="{left + v * scale + 6:.1f}" y="{y + 15}">{v}</text>')
        if bound is not None:
            out.append(f'<rect x="{left + bound * scale:.1f}" y="{y - 2}" width="2" height="{bar}" fill="#c0392b"/>')
        y += bar + 8
    out.append("</svg>")
    return "\n".join(out)


def svg(r):
    last = r["sign_ins"]["waves"][-1]
    rows = [("RSS growth after 60+120+200 sign-ins (MB)", last["rss_growth_from_start_mb"], 64),
            ("search p99 quiet (ms)", r["quiet"]["p99_ms"], None),
            ("search p99 during 200 sign-ins (ms)", last["search_during"]["p99_ms"], 2 * r["quiet"]["p99_ms"]),
            ("search p99, 200 refused before hashing (ms)", r["control_without_hash"]["search_during"]["p99_ms"],
             2 * r["quiet"]["p99_ms"]),
            ("hashes, 500 sign-ins from one address", r["one_address"]["password_hashes"] or 0, 30),
            ("handshake p99, 300 connections (ms)", r["connections"]["handshake_p99_ms"], None),
            ("handshake failures", r["connections"]["handshake_failures"], 0)]
    return bar_chart(r["title"], "bars: measured; red ticks: the acceptance bound", rows)


def compare_svg(before, after):
    """Before and after, each figure as a share of its acceptance bound (1 = at the bound)."""
    def figures(r):
        last = r["sign_ins"]["waves"][-1]
        return [("RSS growth, 60+120+200 sign-ins (bound 64 MB)", last["rss_growth_from_start_mb"] / 64),
                ("search p99 during 200 sign-ins (bound 2x quiet)", last["search_during"]["p99_ms"] / (2 * r["quiet"]["p99_ms"])),
                ("hashes, 500 sign-ins from one address (bound 30)",
                 None if r["one_address"]["password_hashes"] is None else r["one_address"]["password_hashes"] / 30),
                ("handshake failures (share of 300; bound 0)", r["connections"]["handshake_failures"] / 300)]
    b, a = figures(before), figures(after)
    left, top, bar, scale = 330, 56, 14, 300
    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="860" height="%d" font-family="sans-serif" font-size="12">'
           % (top + len(a) * (2 * bar + 14) + 40), '<rect width="100%" height="100%" fill="white"/>',
           '<text x="10" y="20" font-size="15">Sign-in bursts before and after (share of each acceptance bound)</text>',
           '<text x="10" y="38" fill="#555">red line: the bound; the hash count before is unknown (no metric then)</text>']
    y = top
    for (label, vb), (_, va) in zip(b, a):
        out.append(f'<text x="10" y="{y + bar + 4}">{escape(label)}</text>')
        for v, colour, name in ((vb, "#95a5a6", "before"), (va, "#2980b9", "after")):
            if v is None:
                out.append(f'<text x="{left + 4}" y="{y + bar - 3}" fill="#555">{name}: not counted then</text>')
                y += bar
                continue
            out.append(f'<rect x="{left}" y="{y}" width="{max(1, min(v, 2) * scale):.1f}" height="{bar - 2}" '
                       f'fill="{colour}"/><text x="{left + min(v, 2) * scale + 4:.1f}" y="{y + bar - 3}">{name} '
                       f'{v:.2f}</text>')
            y += bar
        y += 14
    out.append(f'<rect x="{left + scale}" y="{top - 6}" width="2" height="{y - top}" fill="#c0392b"/></svg>')
    return "\n".join(out)


def main():
    if sys.argv[1:2] == ["--compare"]:
        before, after, out = sys.argv[2:5]
        Path(out).write_text(compare_svg(json.load(open(before)), json.load(open(after))))
        return
    p = argparse.ArgumentParser()
    p.add_argument("--care", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--corpus", help="a file to upload and ingest during the connection burst")
    p.add_argument("--port", type=int, default=18600)
    a = p.parse_args()
    care = os.path.abspath(a.care)
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ)
        token = demo_admin(care, d, env)
        srv = serve(care, d, a.port, env)
        try:
            lat, _ = timed_searches(a.port, token, seconds=3)  # warms the caches
            lat, _ = timed_searches(a.port, token, seconds=10)
            quiet = summary(lat)
            r = {"title": "Sign-in and connection bursts (care serve, loopback)",
                 "cpu": cpu_name(), "cores": os.cpu_count(), "binary": care, "quiet": quiet}
            r["sign_ins"] = concurrent_sign_ins(a.port, srv.pid, token, [60, 120, 200])
            print('"sign_ins"', json.dumps(r["sign_ins"], ensure_ascii=False), file=sys.stderr, flush=True)
            r["control_without_hash"] = without_hashing(a.port, token, 200)
            print('"control"', json.dumps(r["control_without_hash"]), file=sys.stderr, flush=True)
            r["one_address"] = one_address_flood(a.port, token, 500)
            print('"one_address"', json.dumps(r["one_address"], ensure_ascii=False), file=sys.stderr, flush=True)
            r["connections"] = connection_burst(a.port, token, 300, a.corpus, srv.pid)
            print('"connections"', json.dumps(r["connections"], ensure_ascii=False), file=sys.stderr, flush=True)
            last = r["sign_ins"]["waves"][-1]
            r["search_p99_ratio_200"] = round(last["search_during"]["p99_ms"] / quiet["p99_ms"], 2)
            r["rss_growth_200_mb"] = last["rss_growth_from_start_mb"]
            r["search_p99_ratio_control"] = round(
                r["control_without_hash"]["search_during"]["p99_ms"] / quiet["p99_ms"], 2)
        finally:
            srv.terminate()
            srv.wait(timeout=60)
    write_results(a.out, r, svg(r))


if __name__ == "__main__":
    main()
