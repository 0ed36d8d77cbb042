#!/usr/bin/env python3
"""Combines the OCR benchmark's runs (issue 54) into one JSON and a chart.

Usage: ocr_report.py OUT_STEM CARE.json RAPIDOCR.json EVAL_DIR
  CARE.json      care-bench --ocr DIR --out CARE.json
  RAPIDOCR.json  tests/bench/ocr_rapidocr.py DIR --out RAPIDOCR.json (same pages, same threads)
  EVAL_DIR       holds eval-SET-text.json and eval-SET-ocr.json (care eval --set DIR/eval/SET-{text,ocr} --split dev)
Writes OUT_STEM.json and OUT_STEM.svg.
"""
import json
import platform
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from signin_burst import bar_chart  # noqa: E402


def images_only(care):
    kinds = [v for k, v in care["by_kind"].items() if not k.endswith("pdf")]
    pages, seconds = sum(v["pages"] for v in kinds), sum(v["seconds"] for v in kinds)
    return {"pages": pages, "seconds": seconds, "pages_per_second": pages / seconds}


def main():
    stem, care_path, rapid_path, eval_dir = sys.argv[1:5]
    care, rapid = json.load(open(care_path)), json.load(open(rapid_path))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    ndcg = {}
    for f in sorted(Path(eval_dir).glob("eval-*-text.json")):
        name = f.name[len("eval-") : -len("-text.json")]
        served = lambda p: json.load(open(p))["methods"]["weighted"]["ndcg_at_10"]
        text, ocr = served(f), served(f.with_name(f"eval-{name}-ocr.json"))
        ndcg[name] = {"text": text, "recognised": ocr, "ratio": ocr / text}
    rapid_pps = (rapid["clean"]["pages"] + rapid["degraded"]["pages"]) / (
        rapid["clean"]["seconds"] + rapid["degraded"]["seconds"])
    ours = images_only(care)
    r = {
        "title": "OCR of rendered scans (issue 54): CER, speed beside RapidOCR, retrieval on the recognised text",
        "commit": commit,
        "machine": care["cpu"],
        "cores": care["cores"],
        "threads": care["threads"],
        "pages": care["pages"],
        "care": {k: care[k] for k in ("clean", "degraded", "by_kind", "peak_rss_mb")},
        "care_images_only": ours,
        "rapidocr": {k: rapid[k] for k in ("pages", "clean", "degraded")} | {"pages_per_second": rapid_pps},
        "speed_ratio": ours["pages_per_second"] / rapid_pps,
        "ndcg_at_10_served": ndcg,
    }
    Path(stem + ".json").write_text(json.dumps(r, ensure_ascii=False, indent=2) + "\n")
    pct = lambda x: round(100 * x, 2)
    rows = [
        ("CER % clean pages (care)", pct(care["clean"]["cer"]), 3),
        ("CER % clean pages (RapidOCR)", pct(rapid["clean"]["cer"]), None),
        ("CER % degraded pages (care)", pct(care["degraded"]["cer"]), 6),
        ("CER % degraded pages (RapidOCR)", pct(rapid["degraded"]["cer"]), None),
        ("pages per second, care / RapidOCR (×)", round(r["speed_ratio"], 2), 1.0),
    ] + [(f"nDCG@10 recognised / text, {n} (×)", round(v["ratio"], 3), 0.97) for n, v in ndcg.items()]
    Path(stem + ".svg").write_text(bar_chart(r["title"], "bars: measured; red ticks: the acceptance bound", rows,
                                             left=360, span=300) + "\n")


if __name__ == "__main__":
    main()
