#!/usr/bin/env python3
"""How much CPU the fp32 query encoder costs per query, and what that caps search throughput at on this machine.

The server issue asks for 2x closed-loop throughput at 16 clients with the fp32 e5-small query encoder on 2 cores.
Every search encodes its query, so the encoder's CPU per query bounds requests/s from above, however well the rest
is built. This measures that bound directly with the reference stack's encoder (reference.py: the appliance's own
graph, tokenizer and query template on the onnxruntime wheel, one thread, all graph optimisations):

* per-query CPU time at batch sizes 1..16 (real kuake_qtr queries, padded to the batch's longest, as the encoder
  service batches concurrent queries);
* where the time goes (ORT's profiler, by operator type) and the FLOP rate of the MatMuls;
* the core's own fp32 GEMM rate (numpy, one thread) at the encoder's shapes, i.e. how close MatMul already runs to
  what the core can do;
* the ceiling: cores / (encoder CPU per query) requests per second.

Usage: encoder_ceiling.py --model DATA/models/e5-small/1 --set ../shared/data/retrieval/kuake_qtr --out JSON
(.care-dev/bench-venv/bin/python; `packaging/dev.sh bench-venv` makes it).
"""

import argparse
import collections
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reference import Encoder, cpu_info, versions  # noqa: E402  (also pins numpy/BLAS to one thread)

import numpy as np  # noqa: E402


def per_query_cpu(enc, ids, bs, n):
    for i in range(0, 8 * bs, bs):  # warm-up
        enc.run(ids[i : i + bs])
    t0, w0 = time.process_time(), time.perf_counter()
    for i in range(0, n, bs):
        enc.run(ids[i : i + bs])
    return 1000 * (time.process_time() - t0) / n, 1000 * (time.perf_counter() - w0) / n


def profile_ops(model, ids, n):
    enc = Encoder(model, model / "model.onnx", 1, profile_prefix="/tmp/care-encoder-ceiling")
    for i in range(n):
        enc.run([ids[i]])
    path = enc.sess.end_profiling()
    with open(path) as f:
        events = json.load(f)
    os.remove(path)
    by_op = collections.Counter()
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            by_op[e["args"]["op_name"]] += e["dur"]
    total = sum(by_op.values())
    return {op: {"ms_per_query": us / n / 1000, "share": us / total} for op, us in by_op.most_common(8)}


def gemm_gflops(m, k, n_, reps=30):
    a = np.random.rand(m, k).astype(np.float32)
    b = np.random.rand(k, n_).astype(np.float32)
    for _ in range(3):
        a @ b
    t = time.perf_counter()
    for _ in range(reps):
        a @ b
    return 2 * m * k * n_ / ((time.perf_counter() - t) / reps) / 1e9


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="model package dir (model.onnx, tokenizer.json, config.json)")
    p.add_argument("--set", required=True, help="BEIR set whose queries.jsonl is encoded")
    p.add_argument("--queries", type=int, default=256)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    model = Path(a.model)
    enc = Encoder(model, model / "model.onnx", 1)
    with open(Path(a.set) / "queries.jsonl") as f:
        texts = [json.loads(line)["text"] for line in f if line.strip()]
    ids = [enc.tok.encode(enc.render(t, "query"), add_special_tokens=True).ids for t in texts[: a.queries + 256]]
    lens = np.array([len(i) for i in ids[: a.queries]])
    cfg = json.loads((model / "config.json").read_text())
    h, layers, ffn = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["intermediate_size"]
    # FLOPs per query of the encoder layers: Q, K, V, O projections and the feed-forward pair per token, plus the
    # attention products (4·seq·h per token per layer, small at query lengths).
    flops_query = float(np.mean([n * layers * 2 * (4 * h * h + 2 * h * ffn + 2 * n * h) for n in lens]))
    batches = {}
    for bs in (1, 2, 4, 8, 16):
        cpu, wall = per_query_cpu(enc, ids, bs, a.queries)
        batches[str(bs)] = {"cpu_ms_per_query": cpu, "wall_ms_per_query": wall}
        print(f"batch {bs:2d}: {cpu:6.2f} ms CPU per query")
    ops = profile_ops(model, ids, min(a.queries, 128))
    mm = ops.get("MatMul", {}).get("ms_per_query", 0.0)
    med = int(np.median(lens))
    gemm = {f"{m}x{h}x{ffn}": gemm_gflops(m, h, ffn) for m in (med, 16 * med, 2048)}
    best_cpu = min(b["cpu_ms_per_query"] for b in batches.values())
    cores = os.cpu_count()
    report = {
        "tool": "tests/bench/encoder_ceiling.py",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {**cpu_info(), "cores": cores},
        "versions": versions(),
        "model": a.model,
        "queries": a.queries,
        "query_tokens": {"p50": float(np.median(lens)), "p90": float(np.percentile(lens, 90)), "max": int(lens.max())},
        "gflop_per_query": flops_query / 1e9,
        "batches": batches,
        "ops_batch_1": ops,
        # The layers' FLOPs over the time in MatMul kernels (the attention products, a few percent, are in both).
        "matmul_gflops_batch_1": flops_query / (mm / 1000) / 1e9 if mm else None,
        "numpy_gemm_gflops_one_thread": gemm,
        "ceiling_rps": cores * 1000 / best_cpu,
        "ceiling_note": f"{cores} cores / {best_cpu:.2f} ms of encoder CPU per query (best batch size)",
    }
    with open(a.out, "w") as f:
        json.dump(report, f, indent=1)
    print(json.dumps({k: report[k] for k in ("query_tokens", "gflop_per_query", "ceiling_rps", "ceiling_note")}))


if __name__ == "__main__":
    main()
