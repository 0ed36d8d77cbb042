#!/usr/bin/env python3
"""The reference for `care-bench --ocr`: RapidOCR's Python package (rapidocr-onnxruntime 1.4.4, the same PP-OCRv4
ONNX files) on the same pages, with the same ONNX Runtime threads: CER (white space left out, full-width forms
folded) and pages per second, decoding included. Image files only (RapidOCR reads no PDF).

    python3 tests/bench/ocr_rapidocr.py DIR --threads 2 --out rapidocr.json
"""
import argparse
import json
import pathlib
import time

import numpy as np
from PIL import Image
from rapidocr_onnxruntime import RapidOCR


def squeeze(s):
    out = []
    for c in s:
        if c.isspace():
            continue
        o = ord(c)
        out.append(chr(o - 0xFEE0) if 0xFF01 <= o <= 0xFF5E else c)
    return out


def edits(a, b):
    row = list(range(len(b) + 1))
    for i, ca in enumerate(a):
        diagonal, row[0] = row[0], i + 1
        for j, cb in enumerate(b):
            diagonal, row[j + 1] = row[j + 1], min(row[j + 1] + 1, row[j] + 1, diagonal + (ca != cb))
    return row[len(b)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", type=pathlib.Path)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--out", type=pathlib.Path)
    args = ap.parse_args()
    engine = RapidOCR(intra_op_num_threads=args.threads, inter_op_num_threads=1)
    truth = [json.loads(l) for l in open(args.dir / "truth.jsonl", encoding="utf-8") if l.strip()]
    truth = [t for t in truth if not t["file"].endswith(".pdf")]
    if args.limit:
        truth = truth[: args.limit]
    groups = {"clean": [0, 0, 0, 0.0], "degraded": [0, 0, 0, 0.0]}
    for n, t in enumerate(truth, 1):
        start = time.perf_counter()
        with Image.open(args.dir / t["file"]) as img:
            img.seek(t["page"] - 1)
            bgr = np.asarray(img.convert("RGB"))[:, :, ::-1].copy()
        result, _ = engine(bgr)
        seconds = time.perf_counter() - start
        read = "\n".join(r[1] for r in (result or []))
        want = squeeze(t["text"])
        g = groups["degraded" if t["degraded"] else "clean"]
        g[0] += 1
        g[1] += len(want)
        g[2] += edits(squeeze(read), want)
        g[3] += seconds
        print(f"\r{n} / {len(truth)} pages", end="", flush=True)
    print()
    report = {
        "pages": len(truth),
        "threads": args.threads,
        **{
            k: {"pages": p, "characters": c, "edits": e, "cer": e / max(c, 1), "seconds": s, "pages_per_second": p / max(s, 1e-9)}
            for k, (p, c, e, s) in groups.items()
        },
    }
    text = json.dumps(report, ensure_ascii=False, indent=2)
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
