#!/usr/bin/env python3
"""Joins `ocr_ingest.py`'s JSON with the `care eval` results of its sets into one JSON and an SVG chart.

    python3 tests/bench/ocr_ingest_report.py tests/results/ocr-ingest-DATE ingest.json EVAL_DIR

EVAL_DIR holds `care eval --out` files named eval-SET-KIND.json, KIND one of product, text, product-single,
text-single.
"""
import json
import sys
from pathlib import Path


def main():
    out, ingest, evals = Path(sys.argv[1]), json.loads(Path(sys.argv[2]).read_text()), Path(sys.argv[3])
    kinds = ["product", "text", "product-single", "text-single"]
    for s, v in ingest["sets"].items():
        v.pop("stdout_tail", None)
        v["ndcg_at_10_weighted"] = {}
        for k in kinds:
            f = evals / f"eval-{s}-{k}.json"
            if f.exists():
                e = json.loads(f.read_text())
                v["ndcg_at_10_weighted"][k] = {"ndcg": e["methods"]["weighted"]["ndcg_at_10"], "queries": e["queries"],
                                               "documents": e["corpus_documents"]}
        n = v["ndcg_at_10_weighted"]
        for a, b in (("product", "text"), ("product-single", "text-single")):
            if a in n and b in n:
                v[f"ratio_{a}"] = round(n[a]["ndcg"] / n[b]["ndcg"], 4)
    out.with_suffix(".json").write_text(json.dumps(ingest, ensure_ascii=False, indent=1))
    # Two panels: nDCG@10 ingested / as text (single-page documents and all), and the child's peak RSS.
    sets = list(ingest["sets"])
    w, h, bar = 780, 300, 22
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">',
           '<text x="10" y="18" font-size="14">Scanned pages through ingest: nDCG@10 (weighted) and the parsing child\'s peak RSS</text>']
    x0, y0, ph = 40, 50, 180
    colors = {"text-single": "#9ab", "product-single": "#1f5f8b", "text": "#ccc", "product": "#6a9fc5"}
    x = x0
    for s in sets:
        n = ingest["sets"][s]["ndcg_at_10_weighted"]
        svg.append(f'<text x="{x}" y="{y0 + ph + 20}">{s}</text>')
        for k in ["text-single", "product-single", "text", "product"]:
            if k in n:
                v = n[k]["ndcg"]
                bh = ph * v
                svg.append(f'<rect x="{x}" y="{y0 + ph - bh:.1f}" width="{bar}" height="{bh:.1f}" fill="{colors[k]}"/>')
                svg.append(f'<text x="{x}" y="{y0 + ph - bh - 3:.1f}" font-size="9">{v:.3f}</text>')
                x += bar + 4
        x += 30
    lx = x0
    for k in ["text-single", "product-single", "text", "product"]:
        svg.append(f'<rect x="{lx}" y="{h - 30}" width="10" height="10" fill="{colors[k]}"/>')
        svg.append(f'<text x="{lx + 14}" y="{h - 21}">{k}</text>')
        lx += 120
    rx = 470
    svg.append(f'<text x="{rx}" y="{y0 - 8}">child peak RSS, MB (bound 1,000)</text>')
    for i, s in enumerate(sets):
        r = ingest["sets"][s]["child_peak_rss_mb"]["max"]
        bw = 200 * r / 1000
        y = y0 + 20 + i * 40
        svg.append(f'<rect x="{rx}" y="{y}" width="{bw:.1f}" height="{bar}" fill="#1f5f8b"/>')
        svg.append(f'<text x="{rx + bw + 4:.1f}" y="{y + 15}">{s} {r}</text>')
    svg.append(f'<line x1="{rx + 200}" y1="{y0}" x2="{rx + 200}" y2="{y0 + 100}" stroke="#c00" stroke-dasharray="4"/>')
    svg.append("</svg>")
    out.with_suffix(".svg").write_text("\n".join(svg))


if __name__ == "__main__":
    main()
