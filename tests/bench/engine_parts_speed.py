#!/usr/bin/env python3
"""The search pipeline's speed before and after the engine was made of parts (issue 52), side by side.

  engine_parts_speed.py --old OLD_CARE --new CARE_BENCH --work DIR --out tests/results/engine-parts-speed-DATE

OLD_CARE is a release `care` built from 07ef50e with tests/bench/07ef50e-whole-only.patch applied (its `care bench`;
the patch only adds CARE_BENCH_WHOLE_ONLY, below), CARE_BENCH a release `care-bench` of the code under test. Each prepares its own directory of kuake_qtr (32,171 documents, e5-small fp32, one ONNX Runtime thread
per query), then the two are run in turn, ROUNDS times each, old first: the hybrid search in process over the
first QUERIES dev queries. The figure is the whole search as clinicians' searches run it (`hybrid_in_process`);
p50 and p99 per run, and the ratios new / old of the medians of the runs. Writes OUT.json and OUT.svg.

07ef50e's `care bench` calls the encoder, BM25 and the dense scan on each query just before timing the whole search
on it (each timed search finds that query's pages warm); today's times the whole search alone. The old build is
therefore run both ways: as it shipped ("old") and with CARE_BENCH_WHOLE_ONLY=1 ("old_whole": the whole search
alone, today's protocol). The ratios are new / old_whole (same protocol) and new / old.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from signin_burst import bar_chart, cpu_name, write_results  # noqa: E402

SHARED = Path(os.environ.get("CARE_SHARED", Path(__file__).resolve().parents[3] / "shared"))


def run(cmd, out, env=None):
    subprocess.run(cmd + ["--out", str(out)], check=True, stdout=subprocess.DEVNULL, env=env)
    return json.loads(Path(out).read_text())


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--old", required=True)
    p.add_argument("--new", required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--queries", type=int, default=300)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    e5s1 = os.environ["CARE_E5S1"]
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    kq = str(SHARED / "data/retrieval/kuake_qtr")
    common = ["--set", kq, "--queries", str(a.queries), "--e5s1", e5s1, "--threads", "1"]
    cmds = {"old": [a.old, "bench", *common, "--reuse", str(work / "old")],
            "old_whole": [a.old, "bench", *common, "--reuse", str(work / "old")],
            "new": [a.new, *common, "--reuse", str(work / "new")]}
    envs = {"old_whole": {**os.environ, "CARE_BENCH_WHOLE_ONLY": "1"}}
    for name in ("old", "new"):  # prepares each directory (ingest and embedding), not timed here
        run(cmds[name], work / f"{name}-prepare.json")
    runs = {n: [] for n in cmds}
    stages = []  # the new build's stages, mean ms per search, per run
    names = list(cmds)
    for i in range(a.rounds):
        # Each round starts with the next build, so that none always runs first or last.
        for name in names[i % len(names):] + names[:i % len(names)]:
            cmd = cmds[name]
            report = run(cmd, work / f"{name}-{i}.json", envs.get(name))
            runs[name].append(report["hybrid_in_process"])
            if "stages_mean_ms" in report:
                stages.append({k: round(v, 3) for k, v in report["stages_mean_ms"].items()})
            print(name, i, runs[name][-1]["p50_ms"], runs[name][-1]["p99_ms"], file=sys.stderr)
    med = {n: {k: round(statistics.median(r[k] for r in rs), 3) for k in ("p50_ms", "p99_ms")}
           for n, rs in runs.items()}
    ratio = {k: round(med["new"][k] / med["old_whole"][k], 3) for k in ("p50_ms", "p99_ms")}
    ratio_shipped = {k: round(med["new"][k] / med["old"][k], 3) for k in ("p50_ms", "p99_ms")}
    r = {"set": "kuake_qtr", "queries": a.queries, "model": "e5-small@1 (fp32), 1 ONNX Runtime thread",
         "cpu": cpu_name(), "cores": os.cpu_count(), "old": "07ef50e (care bench)",
         "new": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip(),
         "runs": runs, "median_of_runs": med, "ratio_new_over_old_whole": ratio,
         "ratio_new_over_old_as_shipped": ratio_shipped, "bound": 1.05,
         "new_stages_mean_ms": stages}
    rows = [(f"{n} p50 (ms)", med[n]["p50_ms"], None) for n in cmds]
    rows += [(f"{n} p99 (ms)", med[n]["p99_ms"], None) for n in cmds]
    rows += [("new / old_whole p50", ratio["p50_ms"], 1.05), ("new / old_whole p99", ratio["p99_ms"], 1.05)]
    rows += [("new / old p50", ratio_shipped["p50_ms"], 1.05), ("new / old p99", ratio_shipped["p99_ms"], 1.05)]
    chart = bar_chart("Hybrid search in process: 07ef50e against the engine of parts",
                      f"kuake_qtr, {a.queries} queries, e5-small fp32, release builds, {a.rounds} alternated runs "
                      "each; red: the 1.05 bound", rows)
    write_results(a.out, r, chart)


if __name__ == "__main__":
    main()
