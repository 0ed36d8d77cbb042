#!/usr/bin/env python3
"""Combines `care-bench --http` reports (one per run) into one JSON and one SVG: per query encoder, the HTTPS
request against the same façade call in process, alternated query by query (`http_parts.in_process_interleaved`),
and the HTTPS path's parts from the server's Server-Timing (token check, rest of the server, transport).

Usage: https_overhead.py --out tests/results/https-overhead-DATE RUN.json...   (writes OUT.json and OUT.svg)
Each run's encoder is its report's `model` plus the file name's `-fp32` / `-int8` suffix.
"""
import argparse
import json
import os
import statistics
from html import escape
from pathlib import Path


def encoder(path: Path, report: dict) -> str:
    graph = "int8" if path.stem.endswith("int8") else "fp32"
    return f"{report['model']} {graph}"


def summarise(runs):
    by = {}
    for path, r in runs:
        by.setdefault(encoder(path, r), []).append(r)
    mean = lambda xs: round(statistics.fmean(xs), 3)  # noqa: E731
    out = {}
    for enc, rs in by.items():
        p = [r["http_parts"] for r in rs]
        out[enc] = {
            "runs": len(rs),
            "https_p50_ms": mean([r["hybrid_http"]["p50_ms"] for r in rs]),
            "https_p99_ms": mean([r["hybrid_http"]["p99_ms"] for r in rs]),
            "in_process_p50_ms": mean([x["in_process_interleaved"]["p50_ms"] for x in p]),
            "in_process_p99_ms": mean([x["in_process_interleaved"]["p99_ms"] for x in p]),
            "https_minus_in_process_p50_ms": mean([x["https_minus_in_process_p50_ms"] for x in p]),
            "https_minus_in_process_p99_ms": mean([x["https_minus_in_process_p99_ms"] for x in p]),
            "token_check_p50_ms": mean([x["auth"]["p50_ms"] for x in p]),
            "server_rest_p50_ms": mean([x["server_rest"]["p50_ms"] for x in p]),
            "transport_p50_ms": mean([x["transport"]["p50_ms"] for x in p]),
            "encode_in_process_p50_ms": mean([r["encode_query"]["p50_ms"] for r in rs]),
        }
    return out


def svg(title, subtitle, summary):
    series = [("HTTPS − in process", "https_minus_in_process_p50_ms", "#c0392b"),
              ("token check", "token_check_p50_ms", "#2980b9"),
              ("rest of the server", "server_rest_p50_ms", "#27ae60"),
              ("transport (TLS, HTTP, client)", "transport_p50_ms", "#8e44ad")]
    rows = list(summary.items())
    bar, gap, left, top = 14, 12, 230, 60
    height = top + len(rows) * (len(series) * bar + gap) + 40
    width, scale = 760, 440 / max(1.0, max(v[k] for _, v in rows for _, k, _ in series))
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
           f'font-size="12"><rect width="100%" height="100%" fill="white"/>',
           f'<text x="10" y="20" font-size="15">{escape(title)}</text>',
           f'<text x="10" y="38" fill="#555">{escape(subtitle)}</text>']
    y = top
    for enc, v in rows:
        out.append(f'<text x="10" y="{y + 2 * bar}">{escape(enc)}</text>')
        for label, key, colour in series:
            w = v[key] * scale
            out.append(f'<rect x="{left}" y="{y}" width="{w:.1f}" height="{bar - 2}" fill="{colour}"/>'
                       f'<text x="{left + w + 4:.1f}" y="{y + bar - 4}">{v[key]:.2f} ms</text>')
            y += bar
        y += gap
    for i, (label, _, colour) in enumerate(series):
        x = 10 + i * 185
        out.append(f'<rect x="{x}" y="{height - 22}" width="10" height="10" fill="{colour}"/>'
                   f'<text x="{x + 14}" y="{height - 13}">{escape(label)}</text>')
    out.append("</svg>")
    return "\n".join(out)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("runs", nargs="+")
    a = p.parse_args()
    runs = [(Path(f), json.loads(Path(f).read_text())) for f in a.runs]
    first = runs[0][1]
    summary = summarise(runs)
    doc = {"cpu": first["cpu"], "cores": os.cpu_count(), "cores_used": first["cores"], "vector_isa": first["vector_isa"],
           "int8_support": first["int8_support"], "set": first["set"], "queries": first["queries"],
           "summary": summary, "runs": [{"file": f.name, "encoder": encoder(f, r), **r} for f, r in runs]}
    Path(a.out + ".json").write_text(json.dumps(doc, indent=2, ensure_ascii=False))
    sub = (f"p50 ms, mean of each encoder's runs; {first['cpu']} ({first['vector_isa']}), pinned to "
           f"{first['cores']} of its {os.cpu_count()} cores")
    Path(a.out + ".svg").write_text(svg("HTTPS path over the same search in process", sub, summary))
    for enc, v in summary.items():
        print(f"{enc}: https {v['https_p50_ms']}/{v['https_p99_ms']}, in process {v['in_process_p50_ms']}/"
              f"{v['in_process_p99_ms']}, difference {v['https_minus_in_process_p50_ms']} p50")


if __name__ == "__main__":
    main()
