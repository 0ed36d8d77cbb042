#!/usr/bin/env python3
"""Where a cold build's time goes: cargo's `--timings` reports of one run, summed per crate, as JSON + SVG.

Usage: build_timings.py --out tests/results/build-timings-DATE --phases PHASES.json [--tests NEXTEST.log]
                        LABEL=cargo-timing.html...

PHASES.json holds the run's measured wall times in seconds, e.g. {"setup": 51, "care build": 1275, ...}, and
under "readme_s" the figures README quotes (phrase -> seconds, checked by tests/tests/docs.rs); each
LABEL=report is one `cargo build --timings` of that run (the demo's `care`, the trainer, the test targets). A unit's
seconds are its rustc (or build script) time; on a saturated 2-core machine the wall time of a build is about half
their sum, so a crate's share of the sum is its share of the wall. NEXTEST.log is `cargo nextest run`'s output of
the same run (status-level pass): the slowest tests are listed too.
"""
import argparse
import json
import re
from collections import defaultdict
from html import escape
from pathlib import Path

# Crates that are in the build only because of LanceDB: lance, its datafusion/arrow stack and lancedb itself.
LANCE = re.compile(r"^(lance|lancedb|datafusion|arrow|sqlparser|object_store|parquet|lindera|substrait|prost|tonic)")


def units(path):
    html = Path(path).read_text()
    return json.loads(re.search(r"const UNIT_DATA = (\[.*?\]);\n", html, re.S).group(1))


def summarise(label, data):
    crates = defaultdict(lambda: {"seconds": 0.0, "frontend": 0.0, "codegen": 0.0, "script": 0.0, "units": 0})
    links = []
    for u in data:
        c = crates[u["name"]]
        c["seconds"] += u["duration"]
        c["units"] += 1
        if u["sections"]:
            for name, s in u["sections"]:
                c["frontend" if name == "frontend" else "codegen"] += s["end"] - s["start"]
        elif "build-script" in u["target"]:
            c["script"] += u["duration"]
        else:
            # Bins and test harnesses come without a frontend/codegen split: count them as codegen (and link).
            c["codegen"] += u["duration"]
        # Test binaries and bins link the whole engine; their time is mostly codegen of their own code and the link.
        if u["name"].startswith("care") and u["target"].strip():
            links.append({"crate": u["name"], "target": u["target"].strip(), "seconds": round(u["duration"], 1)})
    total = sum(c["seconds"] for c in crates.values())
    lance = sum(c["seconds"] for n, c in crates.items() if LANCE.match(n))
    top = sorted(crates.items(), key=lambda kv: -kv[1]["seconds"])
    return {
        "label": label,
        "units": len(data),
        "unit_seconds": round(total, 1),
        "frontend_seconds": round(sum(c["frontend"] for c in crates.values()), 1),
        "codegen_seconds": round(sum(c["codegen"] for c in crates.values()), 1),
        "build_script_seconds": round(sum(c["script"] for c in crates.values()), 1),
        "lance_stack_seconds": round(lance, 1),
        "care_targets": links,
        "crates": [{"crate": n, **{k: round(v, 1) if isinstance(v, float) else v for k, v in c.items()}}
                   for n, c in top[:25]],
    }


def slowest_tests(log, n=15):
    tests = []
    for line in Path(log).read_text().splitlines():
        m = re.match(r"\s+PASS \[\s*([0-9.]+)s\] \([^)]*\) (\S+) (\S+)", line)
        if m:
            tests.append({"seconds": float(m.group(1)), "binary": m.group(2), "test": m.group(3)})
    tests.sort(key=lambda t: -t["seconds"])
    return {"count": len(tests), "sum_seconds": round(sum(t["seconds"] for t in tests), 1), "slowest": tests[:n]}


def svg(title, subtitle, phases, builds, tests):
    width, left, scale_w = 900, 250, 560
    rows = [(k, v) for k, v in phases.items()]
    first = builds[0]
    crates = first["crates"][:18]
    slow = tests["slowest"][:10] if tests else []
    height = 80 + 22 * len(rows) + 60 + 20 * len(crates) + 40 + (60 + 20 * len(slow) if slow else 0)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
           f'font-size="12"><rect width="100%" height="100%" fill="white"/>',
           f'<text x="10" y="20" font-size="15">{escape(title)}</text>',
           f'<text x="10" y="38" fill="#555">{escape(subtitle)}</text>']
    y = 60
    out.append(f'<text x="10" y="{y}" font-weight="bold">Wall time of each phase (s)</text>')
    y += 8
    most = max(v for _, v in rows) or 1
    for k, v in rows:
        w = scale_w * v / most
        out.append(f'<text x="10" y="{y + 14}">{escape(k)}</text>'
                   f'<rect x="{left}" y="{y + 2}" width="{w:.1f}" height="16" fill="#4c78a8"/>'
                   f'<text x="{left + w + 4:.1f}" y="{y + 14}">{v:.0f} s</text>')
        y += 22
    y += 30
    out.append(f'<text x="10" y="{y}" font-weight="bold">{escape(first["label"])}: rustc seconds per crate '
               f'(frontend / codegen / build script); total {first["unit_seconds"]:.0f} s on 2 cores</text>')
    y += 8
    most = max(c["seconds"] for c in crates) or 1
    for c in crates:
        x = left
        for key, colour in (("frontend", "#f58518"), ("codegen", "#54a24b"), ("script", "#b279a2")):
            w = scale_w * c[key] / most
            if w > 0:
                out.append(f'<rect x="{x:.1f}" y="{y + 2}" width="{w:.1f}" height="14" fill="{colour}"/>')
            x += w
        name = c["crate"] + (" (lance stack)" if LANCE.match(c["crate"]) else "")
        out.append(f'<text x="10" y="{y + 13}">{escape(name)}</text>'
                   f'<text x="{x + 4:.1f}" y="{y + 13}">{c["seconds"]:.0f} s</text>')
        y += 20
    x = 10
    for label, colour in (("frontend (type checking, to .rmeta)", "#f58518"), ("codegen (and link)", "#54a24b"),
                          ("build script", "#b279a2")):
        out.append(f'<rect x="{x}" y="{y + 10}" width="10" height="10" fill="{colour}"/>'
                   f'<text x="{x + 14}" y="{y + 19}">{escape(label)}</text>')
        x += 260
    y += 40
    if slow:
        y += 20
        out.append(f'<text x="10" y="{y}" font-weight="bold">Slowest tests (s; {tests["count"]} tests, '
                   f'{tests["sum_seconds"]:.0f} s in all on 2 cores)</text>')
        y += 8
        most = slow[0]["seconds"] or 1
        for t in slow:
            w = scale_w * t["seconds"] / most
            name = t["test"].rsplit("::", 1)[-1][:34]
            out.append(f'<text x="10" y="{y + 13}">{escape(name)}</text>'
                       f'<rect x="{left}" y="{y + 2}" width="{w:.1f}" height="14" fill="#e45756"/>'
                       f'<text x="{left + w + 4:.1f}" y="{y + 13}">{t["seconds"]:.0f} s</text>')
            y += 20
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--phases", required=True)
    ap.add_argument("--title", default="Cold build on 2 cores")
    ap.add_argument("--subtitle", default="")
    ap.add_argument("--tests")
    ap.add_argument("reports", nargs="+")
    a = ap.parse_args()
    phases = json.loads(Path(a.phases).read_text())
    # README's figures (phrase -> seconds) travel with the chart; tests/tests/docs.rs checks README against them.
    readme = phases.pop("readme_s", {})
    builds = []
    for r in a.reports:
        label, path = r.split("=", 1)
        builds.append(summarise(label, units(path)))
    tests = slowest_tests(a.tests) if a.tests else None
    report = {"phases_s": phases, "readme_s": readme, "builds": builds, "tests": tests}
    Path(a.out + ".json").write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n")
    Path(a.out + ".svg").write_text(svg(a.title, a.subtitle, phases, builds, tests))


if __name__ == "__main__":
    main()
