#!/usr/bin/env python3
"""Scanned pages through the product path (issue 54): `care ingest` of the pages `ocr_pages.py --corpus DIR` rendered,
each file parsed and read by the OCR in the sandboxed parsing child, as an upload is.

    python3 tests/bench/ocr_ingest.py DIR --care target/debug/care --data /tmp/ocr-data --out ingest.json

Reports pages per second over the whole ingest (parsing child start, OCR, chunking, indexing), the parsing child's
peak resident memory per file (its own getrusage, logged by `care` as `peak_rss_mb`), and writes
DIR/eval/SET-product/ (the documents' stored text as a BEIR corpus, the queries and dev judgments of SET-ocr) so that
`care eval --set DIR/eval/SET-product --split dev` scores the collection as ingested.
"""
import argparse
import json
import os
import re
import shutil
import sqlite3
import statistics
import subprocess
import sys
import time
from pathlib import Path


def run(care, data, *args, env=None):
    return subprocess.run([care, "--data-dir", str(data), *args], capture_output=True, text=True, env=env)


def stitched(rows):
    """A document's text from its chunks (consecutive chunks overlap by their char offsets)."""
    text, pos = "", 0
    for start, end, chunk in rows:
        skip = max(0, pos - start)
        text += chunk[skip:] if start >= pos or skip < len(chunk) else ""
        pos = max(pos, end)
    return text


def single(src, dst, leave_out):
    """A copy of the BEIR set `src` without the documents `leave_out` and the judgments of them."""
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    with open(dst / "corpus.jsonl", "w", encoding="utf-8") as f:
        for line in open(src / "corpus.jsonl", encoding="utf-8"):
            if json.loads(line)["id"] not in leave_out:
                f.write(line)
    for qrels in (dst / "qrels").glob("*.tsv"):
        lines = qrels.read_text(encoding="utf-8").splitlines(keepends=True)
        qrels.write_text("".join(l for l in lines if len(l.split("\t")) < 2 or l.split("\t")[1] not in leave_out),
                         encoding="utf-8")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir", type=Path)
    ap.add_argument("--care", required=True)
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--limit", type=int, default=0, help="at most this many files per set (0: all)")
    a = ap.parse_args()
    truth = [json.loads(l) for l in open(a.dir / "truth.jsonl", encoding="utf-8")]
    if a.data.exists():
        shutil.rmtree(a.data)
    r = run(a.care, a.data, "init")
    assert r.returncode == 0, r.stderr
    env = dict(os.environ, CARE_LOG="info", NO_COLOR="1")
    out = {"sets": {}, "cpu": open("/proc/cpuinfo").read().split("model name")[1].split("\n")[0].strip(": ")}
    for s in sorted({t["set"] for t in truth}):
        files = sorted({t["file"] for t in truth if t["set"] == s})
        if a.limit:
            files = files[: a.limit]
        pages = sum(1 for t in truth if t["set"] == s and t["file"] in files)
        col = "scans-" + s.replace("_", "-")
        assert run(a.care, a.data, "collection", "create", col).returncode == 0
        t0 = time.monotonic()
        r = run(a.care, a.data, "ingest", col, *[str(a.dir / f) for f in files], env=env)
        seconds = time.monotonic() - t0
        log = re.sub(r"\x1b\[[0-9;]*m", "", r.stdout + r.stderr)
        rss = [int(m) for m in re.findall(r"peak_rss_mb\W+(\d+)", log)]
        failed = re.findall(r"failed", r.stdout)
        print(f"{s}: {len(files)} files, {pages} pages in {seconds:.1f} s, child peak RSS max {max(rss or [0])} MB",
              file=sys.stderr)
        out["sets"][s] = {
            "files": len(files),
            "pages": pages,
            "seconds": round(seconds, 2),
            "pages_per_second": round(pages / seconds, 3),
            "child_peak_rss_mb": {"max": max(rss or [0]), "median": statistics.median(rss or [0]), "files": len(rss)},
            "exit": r.returncode,
            "stdout_tail": r.stdout[-2000:],
        }
        # The stored text as a corpus, each page's document under its corpus id (a TIFF's pages by their scan page).
        db = sqlite3.connect(f"file:{a.data / 'care.sqlite'}?mode=ro", uri=True)
        by_file = {}
        for t in truth:
            if t["set"] == s and t["file"] in files:
                by_file.setdefault(Path(t["file"]).name, {})[t["page"]] = t["id"]
        docs = {}
        q = """SELECT d.external_id, k.char_start, k.char_end, k.text, k.scan_page, k.scan_last_page FROM chunks k
               JOIN documents d ON d.id = k.document_id JOIN collections c ON c.id = d.collection_id
               WHERE c.name = ? ORDER BY d.id, k.ordinal"""
        for ext, start, end, text, page, last in db.execute(q, (col,)):
            ids = by_file.get(ext, {})
            for p in range(page or 1, (last or page or 1) + 1):
                if p in ids:
                    docs.setdefault(ids[p], []).append((start, end, text))
        ev = a.dir / "eval" / f"{s}-product"
        src = a.dir / "eval" / f"{s}-ocr"
        if src.exists():
            shutil.rmtree(ev, ignore_errors=True)
            shutil.copytree(src, ev, ignore=shutil.ignore_patterns("corpus.jsonl"))
            with open(ev / "corpus.jsonl", "w", encoding="utf-8") as f:
                for line in open(src / "corpus.jsonl", encoding="utf-8"):
                    d = json.loads(line)
                    # A page the ingest did not turn into text is an empty document here, not the benchmark's text.
                    d["text"] = stitched(docs.get(d["id"], []))
                    f.write(json.dumps(d, ensure_ascii=False) + "\n")
            out["sets"][s]["eval_set"] = str(ev)
            out["sets"][s]["documents_from_ingest"] = len(docs)
            # A multi-page TIFF is one document as ingested: a passage spanning its pages cannot be given to one page's
            # corpus document. The single-page sets leave the TIFFs' pages out of both the ingested and the text corpus
            # (and their judgments), so that the two compare like for like.
            multi = {t["id"] for t in truth if t["set"] == s and t["file"].endswith(".tif")}
            for kind, base in (("product", ev), ("text", a.dir / "eval" / f"{s}-text")):
                single(base, a.dir / "eval" / f"{s}-{kind}-single", multi)
            out["sets"][s]["single_page_documents"] = 300 - len(multi)
    a.out.write_text(json.dumps(out, ensure_ascii=False, indent=1))


if __name__ == "__main__":
    main()
