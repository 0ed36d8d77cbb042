#!/usr/bin/env python3
"""Checks that reference.py embeds what the appliance embeds, on a data dir where the appliance ingested the first
rows of a set with the model active:

    care --data-dir D init && care --data-dir D model import-e5s1 $CARE_E5S1
    head -300 $SET/corpus.jsonl > /tmp/sub/corpus.jsonl && care --data-dir D ingest --create sub /tmp/sub/corpus.jsonl
    python tests/bench/parity.py --care $CARE --data D --collection sub --set $SET --max-docs 300 --queries 20

1. Query side: for each query `care search --method dense --json -n 100` gives the appliance's scores
   q_appliance · d_appliance; the reference computes q_python · d_python for the same documents. Equal scores on
   100 documents per query mean equal query vectors in every direction the documents span.
2. Document side (when the `lance` module is importable, e.g. `pip install pylance` in a scratch venv): the stored
   LanceDB vectors against the reference's document vectors, cosine per document.
3. BM25: overlap of the appliance's BM25 top 10 (`--method bm25`) with the reference's (jieba + bm25s).
Prints a JSON summary.
"""

import argparse
import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import reference as ref  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--care", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--collection", required=True)
    p.add_argument("--set", required=True)
    p.add_argument("--max-docs", type=int, required=True)
    p.add_argument("--queries", type=int, default=20)
    p.add_argument("--model", default=None, help="model package (default: <data>/models/e5-small/1)")
    a = p.parse_args()
    data, set_dir = Path(a.data), Path(a.set)
    model_dir = Path(a.model) if a.model else data / "models" / "e5-small" / "1"
    docs = ref.load_corpus(set_dir, a.max_docs)
    queries, _ = ref.load_set(set_dir, "dev", a.queries)
    enc = ref.Encoder(model_dir, model_dir / "model.onnx", threads=1)
    rows = []  # (external id, embedding text) per chunk, chunked as `care ingest` with a model active does
    tok = ref._untruncated(enc.tok)
    for ext, title, text in docs:
        for heading, ct in ref.chunk_measured(text, 300, 60, ref.Tokens(tok)):
            rows.append((ext, ref.embedding_text(title, heading, ct)))
    dvec = enc.encode_documents([t for _, t in rows], 32)
    by_ext = {}
    for (ext, _), v in zip(rows, dvec):
        by_ext.setdefault(ext, v)  # kuake-like sets: one chunk per document
    tokenize = ref.make_jieba(ref.MEDICAL_DICT, data / "user_dict.txt")
    bm25 = ref.Bm25([tokenize(t) for _, t in rows], None)
    out = {"documents": len(docs), "chunks": len(rows), "queries": len(queries)}

    diffs, overlaps, qvecs = [], [], []
    for _, q in queries:
        qv = enc.encode_query(q)
        qvecs.append(qv)
        hits = json.loads(subprocess.run([a.care, "--data-dir", str(data), "search", "--method", "dense", "--json",
                                          "-n", "100", "-c", a.collection, q], check=True, capture_output=True,
                                         text=True).stdout)["hits"]
        for h in hits:
            diffs.append(abs(float(h["parts"]["dense"]) - float(by_ext[h["external_id"]] @ qv)))
        hits = json.loads(subprocess.run([a.care, "--data-dir", str(data), "search", "--method", "bm25", "--json",
                                          "-n", "10", "-c", a.collection, q], check=True, capture_output=True,
                                         text=True).stdout)["hits"]
        app = [h["external_id"] for h in hits]
        br, _ = bm25.search(tokenize(q), 10)
        mine = [rows[r][0] for r in br.tolist()]
        if app or mine:
            overlaps.append(len(set(app) & set(mine)) / max(len(app), len(mine)))
    out["dense_score_abs_diff_max"] = max(diffs) if diffs else None
    out["dense_score_abs_diff_mean"] = float(np.mean(diffs)) if diffs else None
    out["dense_scores_compared"] = len(diffs)
    out["bm25_top10_overlap_mean"] = float(np.mean(overlaps)) if overlaps else None

    try:
        import lance
    except ImportError:
        out["document_vectors"] = "skipped: python module lance (pip install pylance) not importable"
    else:
        con = sqlite3.connect(f"file:{data / 'care.sqlite'}?mode=ro", uri=True)
        names = dict(con.execute("SELECT id, external_id FROM documents"))
        cos = []
        for table in sorted((data / "dense").glob("*.lance")):
            t = lance.dataset(str(table)).to_table().to_pydict()
            for d, v in zip(t["document_id"], t["vector"]):
                ext = names.get(d)
                if ext in by_ext:
                    v = np.asarray(v, dtype=np.float32)
                    cos.append(float(v @ by_ext[ext] / (np.linalg.norm(v) * np.linalg.norm(by_ext[ext]))))
        out["document_vectors_compared"] = len(cos)
        out["document_cosine_min"] = min(cos) if cos else None
        out["document_cosine_mean"] = float(np.mean(cos)) if cos else None
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
