#!/usr/bin/env python3
"""Builds the absent-name probe of issue 53 over a BEIR set's corpus (default kuake_qtr).

Names: the words of THUOCL's medical list (appliance/engine/assets/lexicon) shaped like a drug or a disease name
(by their ending, below) that occur nowhere in the corpus (titles and texts, as substrings). Each name falls into
the tune or the dev part by a hash of its text, so tuning never sees a dev name. Queries:

* template: a name in short clinical questions (X的副作用, X的禁忌症, 孕妇能用X吗; X的症状, X怎么治疗, X会遗传吗);
* swapped: a real query of the set (train queries for tune, dev queries for dev) that holds a drug or disease name
  the corpus does hold, with that name replaced by an absent one of the same kind;
* unmodified: the set's real queries as they are (for dev: every dev query), where nothing should be flagged.

Writes absent-{tune,dev}.jsonl: {"query", "name" (null for unmodified), "kind", "source"}.
"""
import argparse
import hashlib
import json
import os
import random
from pathlib import Path

DRUG_ENDINGS = ("沙班", "替尼", "单抗", "韦", "肽", "沙星", "霉素", "西林", "头孢", "洛尔", "地平", "普利", "沙坦",
                "他汀", "格列净", "格列汀", "唑", "胺", "嗪", "酮", "芬", "松", "林", "片", "胶囊", "颗粒", "注射液",
                "口服液", "滴眼液", "软膏", "乳膏", "丸", "散", "汤")
DISEASE_ENDINGS = ("综合征", "病", "症", "炎", "癌", "瘤", "肿", "溃疡", "结石", "梗死", "梗塞", "衰竭", "不良",
                   "障碍", "畸形", "感染", "中毒", "出血", "硬化", "狭窄", "贫血", "疹", "癣", "瘘", "疝")
DRUG_TEMPLATES = ("{}的副作用", "{}的禁忌症", "孕妇能用{}吗")
DISEASE_TEMPLATES = ("{}的症状", "{}怎么治疗", "{}会遗传吗")


def kind_of(word):
    if any(word.endswith(e) for e in DRUG_ENDINGS):
        return "drug"
    if any(word.endswith(e) for e in DISEASE_ENDINGS):
        return "disease"
    return None


def part_of(name):
    return "tune" if hashlib.sha256(name.encode()).digest()[0] % 2 == 0 else "dev"


def main():
    root = Path(__file__).resolve().parents[2]
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--set", default=os.path.join(os.environ.get("CARE_SHARED", root.parent / "shared"),
                                                  "data/retrieval/kuake_qtr"))
    p.add_argument("--lexicon", default=root / "appliance/engine/assets/lexicon/thuocl_medical.txt")
    p.add_argument("--out-dir", default=".")
    p.add_argument("--per-kind", type=int, default=200, help="names per kind and part")
    a = p.parse_args()
    s = Path(a.set)
    corpus = []
    with open(s / "corpus.jsonl", encoding="utf-8") as f:
        for line in f:
            d = json.loads(line)
            corpus.append(d.get("title", "") + "\n" + d.get("text", ""))
    text = "\n".join(corpus)
    words = [l.split("\t")[0].strip() for l in open(a.lexicon, encoding="utf-8") if l.strip()]
    present, absent = {"drug": [], "disease": []}, {("tune", "drug"): [], ("tune", "disease"): [],
                                                  ("dev", "drug"): [], ("dev", "disease"): []}
    for w in words:
        k = kind_of(w)
        if k is None or not (3 <= len(w) <= 10):
            continue
        if w in text:
            present[k].append(w)
        else:
            absent[(part_of(w), k)].append(w)
    queries = {}
    for l in open(s / "queries.jsonl", encoding="utf-8"):
        d = json.loads(l)
        queries.setdefault(d.get("split", "train"), []).append(d["text"])
    for part, split in (("tune", "train"), ("dev", "dev")):
        rng = random.Random(53)
        rows = []
        for k, templates in (("drug", DRUG_TEMPLATES), ("disease", DISEASE_TEMPLATES)):
            names = sorted(absent[(part, k)])
            rng.shuffle(names)
            names = names[: a.per_kind]
            for i, n in enumerate(names):
                rows.append({"query": templates[i % len(templates)].format(n), "name": n, "kind": k,
                             "source": "template"})
            # Swapped: real queries holding a present name of this kind (the longest), that name replaced.
            held = sorted(present[k], key=len, reverse=True)
            swaps = 0
            for q in queries.get(split, []):
                w = next((w for w in held if w in q), None)
                if w is None or swaps >= len(names):
                    continue
                n = names[swaps]
                rows.append({"query": q.replace(w, n, 1), "name": n, "kind": k, "source": "swapped", "was": w})
                swaps += 1
        plain = queries.get(split, [])
        if part == "tune":
            plain = rng.sample(plain, min(1000, len(plain)))
        rows += [{"query": q, "name": None, "kind": None, "source": "unmodified"} for q in plain]
        out = Path(a.out_dir) / f"absent-{part}.jsonl"
        with open(out, "w", encoding="utf-8") as f:
            for r in rows:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
        counts = {}
        for r in rows:
            counts[(r["source"], r["kind"])] = counts.get((r["source"], r["kind"]), 0) + 1
        print(out, {f"{s}/{k}": n for (s, k), n in sorted(counts.items(), key=str)})


if __name__ == "__main__":
    main()
