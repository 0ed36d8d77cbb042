#!/usr/bin/env python3
"""How many int8 candidates the exact dense scan must re-score to return the exact top k.

The engine's scan (appliance/engine/src/kernels.rs, `top_k_int8_pair`) reads an int8 copy of the rows (one symmetric
scale per row), quantises the query the same way (the AVX-512 VNNI pass), keeps the best `oversample × k` rows by that
score and re-scores them in f32. This replays it in numpy on real vectors and counts, per k and oversample, the queries
whose top k equals an f32 exact scan's (rows and order; ties by row).

Usage: int8_oversample.py CORPUS_VECTORS.npy MODEL_DIR SET_DIR [--queries N] [--split train]
  CORPUS_VECTORS.npy  the corpus's document vectors (tests/bench/reference.py's cache, `corpus-*-fp32.npy`)
  MODEL_DIR           the query encoder's package (model.onnx, tokenizer.json, manifest.toml)
  SET_DIR             a BEIR set (queries.jsonl, qrels/<split>.tsv); training queries by default (tuning, not dev)
"""
import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import reference as R  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("vectors")
    p.add_argument("model")
    p.add_argument("set")
    p.add_argument("--queries", type=int, default=300)
    p.add_argument("--split", default="train")
    a = p.parse_args()
    x = np.load(a.vectors).astype(np.float32)
    model = Path(a.model)
    enc = R.Encoder(model, model / "model.onnx", 2)
    queries, _ = R.load_set(Path(a.set), a.split, a.queries)
    qv = np.stack([enc.encode_query(t) for _, t in queries])
    scale = np.abs(x).max(1) / 127.0
    codes = np.clip(np.round(x / scale[:, None]), -127, 127).astype(np.int32)
    rows = np.arange(len(x))
    res = {}
    for q in qv:
        exact = x @ q
        qs = np.abs(q).max() / 127.0
        u = np.clip(np.round(q / qs), -127, 127).astype(np.int32)
        approx = (codes @ u).astype(np.float64) * qs * scale
        by_exact = np.lexsort((rows, -exact))
        by_approx = np.lexsort((rows, -approx))
        for k in (100, 1100):
            want = by_exact[:k]
            for f in (1.0, 1.1, 1.25, 1.5, 2.0, 4.0):
                cand = by_approx[: int(np.ceil(k * f))]
                got = cand[np.lexsort((cand, -exact[cand]))][:k]
                missed = k - len(np.intersect1d(got, want))
                r = res.setdefault((k, f), [0, 0, 0])
                r[0] += bool(np.array_equal(got, want))
                r[1] += missed
                r[2] = max(r[2], missed)
    print(f"{len(x)} rows, {len(qv)} {a.split} queries")
    for (k, f), (same, missed, most) in sorted(res.items()):
        print(f"k={k} oversample={f}: exact top k in {same}/{len(qv)} queries; rows missed {missed} in all, at most {most}")


if __name__ == "__main__":
    main()
