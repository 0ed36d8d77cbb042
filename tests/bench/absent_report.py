#!/usr/bin/env python3
"""Combines `care-bench --absent` reports (issue 53's probe) into one JSON and a chart.

Usage: absent_report.py OUT_STEM DEV.json DEV_HELD_OUT.json TUNE.json TUNE_HELD_OUT.json [SET=UNMODIFIED.json ...]
Writes OUT_STEM.json and OUT_STEM.svg.
"""
import json
import platform
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from signin_burst import bar_chart  # noqa: E402


def summary(path):
    d = json.load(open(path))
    return {k: {f: g[f] for f in ("queries", "through_synonym", "named", "named_share", "named_exactly_share",
                                 "flagged", "flagged_share")} for k, g in d["groups"].items()} | {
        "flagged_but_present": d["flagged_but_present"], "read_as_pinyin": d["read_as_pinyin"]}


def main():
    stem, dev, dev_h, tune, tune_h, *others = sys.argv[1:]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    r = {
        "title": "Absent drug and disease names named (issue 53), kuake_qtr corpus",
        "commit": commit,
        "machine": platform.processor() or platform.machine(),
        "probe": "tests/bench/absent_names.py: THUOCL medical names absent from the corpus, split tune/dev by a hash "
                 "of the name; templates, swaps into real queries, real queries unmodified",
        "dev": summary(dev),
        "dev_names_held_out_of_lexicon": summary(dev_h),
        "tune": summary(tune),
        "tune_names_held_out_of_lexicon": summary(tune_h),
        "unmodified_dev_other_sets": {o.split("=")[0]: summary(o.split("=")[1]) for o in others},
    }
    Path(stem + ".json").write_text(json.dumps(r, ensure_ascii=False, indent=2) + "\n")
    pct = lambda x: round(100 * x, 1)
    rows = []
    for label, key in (("dev", "dev"), ("dev, names kept out of the lexicon", "dev_names_held_out_of_lexicon")):
        for g in ("template/drug", "template/disease", "swapped/drug", "swapped/disease"):
            rows.append((f"{label}: {g} named %", pct(r[key][g]["named_share"]), 95 if key == "dev" else None))
    rows.append(("dev: unmodified kuake_qtr flagged %", pct(r["dev"]["unmodified/none"]["flagged_share"]), 1))
    for name, s in r["unmodified_dev_other_sets"].items():
        rows.append((f"dev: unmodified {name} flagged %", pct(s["unmodified/none"]["flagged_share"]), None))
    Path(stem + ".svg").write_text(bar_chart(r["title"], "bars: measured; red ticks: the acceptance bound", rows,
                                             left=440, span=280) + "\n")


if __name__ == "__main__":
    main()
