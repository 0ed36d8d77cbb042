#!/usr/bin/env python3
"""Combines the runs of side_by_side.sh into one JSON (every run + machine info + a summary) and a plain SVG chart:
grouped bars of p50 and p99 per stage, one bar per stack and precision (the mean of that configuration's runs).

    combine.py --runs DIR --machine machine.json --out-json tests/results/reference.json --out-svg tests/results/reference.svg

DIR holds NN-<stack>-<precision>.json files (stack: care or python), NN giving the order they ran in.
"""

import argparse
import json
import re
from pathlib import Path

STAGES = [("encode_query", "encode query"), ("bm25", "BM25 top 100"), ("dense", "dense exact top 100"),
          ("fuse", "fusion"), ("hybrid_in_process", "hybrid end to end")]
SERIES = [("care", "fp32"), ("python", "fp32"), ("care", "int8"), ("python", "int8")]
COLORS = {("care", "fp32"): "#0b6e99", ("python", "fp32"): "#e07b39", ("care", "int8"): "#6fb7d6",
          ("python", "int8"): "#f2b47e"}


def series_label(stack, precision):
    return f"{'care (Rust)' if stack == 'care' else 'Python reference'} {precision}"


def esc(s):
    return str(s).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def panel(title, stat, summary, y_off):
    """One horizontal grouped-bar panel (like appliance/cli/src/chart.rs); returns (svg fragment, height)."""
    bar_h, gap, left, width = 14.0, 12.0, 170.0, 760.0
    plot_w = width - left - 110.0
    present = [s for s in SERIES if f"{s[0]} {s[1]}" in summary]
    group_h = len(present) * bar_h + gap
    vals = [summary[f"{s} {p}"][st][stat] for s, p in present for st, _ in STAGES
            if summary[f"{s} {p}"].get(st) is not None]
    mx = max(vals + [1e-9])
    out = [f'<text x="10" y="{y_off + 22}" font-size="14" font-weight="bold">{esc(title)}</text>']
    for i, (s, p) in enumerate(present):
        x = 10 + i * 185.0
        out.append(f'<rect x="{x}" y="{y_off + 32}" width="10" height="10" fill="{COLORS[(s, p)]}"/>'
                   f'<text x="{x + 14}" y="{y_off + 41}">{esc(series_label(s, p))}</text>')
    y0 = y_off + 56
    for r, (st, label) in enumerate(STAGES):
        gy = y0 + r * group_h
        out.append(f'<text x="{left - 8}" y="{gy + group_h / 2:.1f}" text-anchor="end">{esc(label)}</text>')
        for i, (s, p) in enumerate(present):
            lat = summary[f"{s} {p}"].get(st)
            if lat is None:
                continue
            v = lat[stat]
            w = plot_w * v / mx
            y = gy + i * bar_h
            out.append(f'<rect x="{left}" y="{y:.1f}" width="{w:.1f}" height="{bar_h - 2}" fill="{COLORS[(s, p)]}"/>'
                       f'<text x="{left + w + 4:.1f}" y="{y + bar_h - 4:.1f}">{v:.3f} ms</text>')
    height = 56 + len(STAGES) * group_h + 16
    return "\n".join(out), height


def svg_chart(title, subtitle, summary):
    p50, h1 = panel("p50 (ms)", "p50_ms", summary, 44)
    p99, h2 = panel("p99 (ms)", "p99_ms", summary, 44 + h1)
    width, height = 760, 44 + h1 + h2 + 10
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height:.0f}" font-family="sans-serif" '
            f'font-size="12">\n<rect width="100%" height="100%" fill="white"/>\n'
            f'<text x="10" y="20" font-size="15" font-weight="bold">{esc(title)}</text>\n'
            f'<text x="10" y="37" font-size="11" fill="#555">{esc(subtitle)}</text>\n{p50}\n{p99}\n</svg>\n')


def mean_latency(reports, stage):
    xs = [r[stage] for r in reports if r.get(stage)]
    if not xs:
        return None
    return {k: sum(x[k] for x in xs) / len(xs) for k in ("p50_ms", "p90_ms", "p99_ms", "mean_ms")} | {
        "n": xs[0]["n"], "runs": len(xs)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", required=True)
    ap.add_argument("--machine", required=True)
    ap.add_argument("--out-json", required=True)
    ap.add_argument("--out-svg", required=True)
    a = ap.parse_args()
    machine = json.loads(Path(a.machine).read_text())
    runs = []
    for f in sorted(Path(a.runs).glob("*.json")):
        m = re.fullmatch(r"(\d+)-(care|python)-(fp32|int8)\.json", f.name)
        if not m:
            continue
        runs.append({"order": int(m.group(1)), "stack": m.group(2), "precision": m.group(3),
                     "report": json.loads(f.read_text())})
    summary = {}
    for s, p in SERIES:
        reps = [r["report"] for r in runs if (r["stack"], r["precision"]) == (s, p)]
        if not reps:
            continue
        summary[f"{s} {p}"] = {st: mean_latency(reps, st) for st, _ in STAGES}
        summary[f"{s} {p}"]["queries"] = sorted({r.get("queries") for r in reps})
        summary[f"{s} {p}"]["corpus_documents"] = sorted({r.get("corpus_documents") for r in reps})
        nd = [r["ndcg_at_10"] for r in reps if "ndcg_at_10" in r]
        if nd:
            summary[f"{s} {p}"]["ndcg_at_10"] = sum(nd) / len(nd)
    first = runs[0]["report"] if runs else {}
    doc = {
        "what": "care-bench vs the plain Python reference stack (tests/bench/reference.py), interleaved on one "
                "machine in one window; latency per stage in ms; summary = mean over a configuration's runs",
        "machine": machine,
        "set": first.get("set"),
        "queries": first.get("queries"),
        "summary": summary,
        "runs": runs,
    }
    Path(a.out_json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out_json).write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
    cpu = machine.get("cpu", {})
    sub = (f"{doc['set']}, {doc['queries']} queries, core {machine.get('core')} pinned, 1 ONNX Runtime thread; "
           f"{cpu.get('model', '?')}, {machine.get('cores', '?')} cores; {machine.get('date', '')}")
    Path(a.out_svg).write_text(svg_chart("Search latency: care vs plain Python reference", sub, summary))


if __name__ == "__main__":
    main()
