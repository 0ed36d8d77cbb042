#!/usr/bin/env python3
"""The plain Python reference search stack that `care-bench` is compared against side by side.

jieba (search mode, with the appliance's medical dictionary) + bm25s BM25, the appliance's own ONNX graph and
tokenizer run by the onnxruntime wheel, numpy exact inner product, min-max weighted fusion; one pinned core, one ONNX
Runtime thread. Per-stage latency is reported in the shape of `care-bench`'s JSON (encode_query, bm25, dense, fuse,
hybrid_in_process), plus nDCG@10 of the hybrid ranking on the queries used.

What it mirrors from the appliance (so both stacks do the same work on the same text):
- queries: the first N queries of queries.jsonl (file order) that have a judgement in qrels/<split>.tsv, as
  `care-bench` (eval::BeirSet::load) selects them; `care-bench` always uses the dev split;
- documents: JSONL rows parsed and normalised like the appliance (text::normalize: full-width folding, control
  characters dropped, whitespace collapsed; rows whose text is empty skipped) and chunked like `care-bench` chunks
  them (ingest runs before the model is imported there, so by characters, 400 with an overlap of 80;
  `--chunker tokens` cuts by the query tokenizer's tokens, 300/60, as `care ingest` does with a model active);
- the document encoder sees hybrid::embedding_text (title, heading path, text joined by newlines) with the
  manifest's document template ("passage: {text}"); queries get the query template ("query: {text}"); tokens are
  truncated to the manifest's max_length; mean pooling over the attention mask, cut to the manifest width, L2
  normalised (encoders.rs);
- documents are always embedded with the fp32 graph; `--precision int8` swaps only the query encoder, as
  `care-bench --int8` does (there the appliance's own int8 graph; here ORT quantize_dynamic of the same fp32 graph);
- BM25: jieba search-mode tokens with HMM, words without a letter or digit dropped, lower-cased (lexical.rs),
  k1 1.2, b 0.75, Lucene IDF (tantivy's), every query token one clause (repeats count again, as in tantivy's
  BooleanQuery); only chunks matching some token are candidates; top 100. Chunk titles are scored as a second
  field and added (tantivy's title field, boost 1) when the corpus has titles;
- dense: `corpus @ q`, np.argpartition top 100, sorted by score then row;
- fusion: min-max weighted, w · dense + (1 − w) · bm25, missing entries 0, ties by chunk order (fusion.rs);
  w defaults to the appliance's search.default_dense_weight (0.7);
- percentiles: sorted samples, xs[round((n − 1) · p)] with halves rounded away from zero (cli/src/bench.rs).
"""

from __future__ import annotations

import argparse
import os
import sys


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--set", required=True, help="BEIR-layout set: corpus.jsonl, queries.jsonl, qrels/<split>.tsv")
    p.add_argument("--model", required=True, help="model package dir (model.onnx, tokenizer.json, manifest.toml) "
                   "as `care model import-e5s1` writes it under <data-dir>/models/e5-small/<version>; the fp32 package "
                   "(without --int8): documents are embedded with it, and --precision int8 quantises it")
    p.add_argument("--precision", choices=["fp32", "int8"], default="fp32",
                   help="query encoder graph: fp32 (model.onnx) or int8 (ORT quantize_dynamic of it)")
    p.add_argument("--queries", type=int, default=1000, help="first N judged queries of the split (default 1000)")
    p.add_argument("--split", default="dev", help="qrels split (default dev, what `care-bench` uses)")
    p.add_argument("--cache", default=None, help="cache dir for corpus vectors (.npy) and the int8 graph (.onnx)")
    p.add_argument("--max-docs", type=int, default=0, help="only the first N corpus rows (quick trials)")
    p.add_argument("--fusion-weight", type=float, default=0.7,
                   help="dense weight of min-max weighted fusion (default 0.7 = search.default_dense_weight)")
    p.add_argument("--chunker", choices=["chars", "tokens"], default="chars",
                   help="chars: 400/80 characters as `care-bench` (ingest before model import); tokens: 300/60")
    p.add_argument("--core", type=int, default=None, help="CPU core to pin to (default: the last allowed core)")
    p.add_argument("--warmup", type=int, default=10, help="warm-up queries before timing (default 10, as care-bench)")
    p.add_argument("--embed-batch", type=int, default=32, help="documents per ONNX call when embedding the corpus")
    p.add_argument("--dict", default=None, help="medical dictionary for jieba "
                   "(default: appliance/engine/assets/medical_dict.txt of this repository)")
    p.add_argument("--user-dict", default=None, help="the data dir's user_dict.txt (admin additions), if any")
    p.add_argument("--dump-query-vectors", default=None, help="write the query vectors used to this .npy (checks)")
    p.add_argument("--out", default=None, help="write the report JSON here (it is printed either way)")
    return p.parse_args(argv)


ARGS = parse_args() if __name__ == "__main__" else None
# One core, one thread everywhere: set before numpy / onnxruntime load their thread pools.
for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import hashlib  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import time  # noqa: E402
import tomllib  # noqa: E402
import unicodedata  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
MEDICAL_DICT = REPO / "appliance" / "engine" / "assets" / "medical_dict.txt"


def log(*a):
    print("[reference]", *a, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------------------------
# Text: text.rs normalize and chunk_measured, hybrid.rs embedding_text, lexical.rs tokenize.

_FOLD_SYMBOLS = set("＂＃＄％＆＇＊＋－．／＜＝＞＠［＼］＾＿｀｛｜｝～")
_DROP = {"\ufeff", "\u200b", "\u200c", "\u200d"}


def _is_space_or_control(c: str) -> bool:
    return c.isspace() or unicodedata.category(c) == "Cc"


def normalize(text: str) -> str:
    out = []
    pending_space = pending_newline = False
    for c in text:
        o = ord(c)
        if c == "\u3000":
            c = " "
        elif 0xFF10 <= o <= 0xFF19 or 0xFF21 <= o <= 0xFF3A or 0xFF41 <= o <= 0xFF5A or c in _FOLD_SYMBOLS:
            c = chr(o - 0xFEE0)
        elif c == "\uff61":
            c = "。"
        elif c == "\uff64":
            c = "、"
        elif c in _DROP:
            continue
        if c == "\n":
            pending_newline = True
            continue
        if _is_space_or_control(c):
            pending_space = True
            continue
        if out:
            if pending_newline:
                out.append("\n")
            elif pending_space:
                out.append(" ")
        pending_space = pending_newline = False
        out.append(c)
    return "".join(out)


_SENTENCE_END = set("。！？；!?;\n")


class Chars:
    is_chars = True

    def len(self, s):
        return len(s)

    def cut_points(self, s, mx):
        return list(range(mx, len(s), mx))


class Tokens:
    """Tokens of the query encoder's tokenizer, no special tokens, no truncation (engine.rs Chunker)."""

    is_chars = False

    def __init__(self, tokenizer):
        self.t = tokenizer

    def len(self, s):
        return len(self.t.encode(s, add_special_tokens=False).ids)

    def cut_points(self, s, mx):
        offsets = self.t.encode(s, add_special_tokens=False).offsets  # character offsets in Python
        mx = max(mx, 1)
        pts = []
        t = mx
        while t < len(offsets):
            b = offsets[t][0]
            if 0 < b < len(s) and (not pts or pts[-1] != b):
                pts.append(b)
            t += mx
        return pts


def chunk_measured(text: str, mx: int, overlap: int, m) -> list[tuple[str, str]]:
    """(heading path, chunk text) pairs, as text::chunk_measured cuts them."""
    chars = text
    mx = max(mx, 1)
    hard = mx if m.is_chars else max(mx * 8, 64)
    headings = [""]
    stack: list[tuple[int, str]] = []
    raw: list[tuple[int, int, int]] = []

    def push_raw(s, e, h):
        if s < e and any(not c.isspace() for c in chars[s:e]):
            raw.append((s, e, h))

    line_start = 0
    n = len(chars)
    while line_start < n:
        nl = chars.find("\n", line_start)
        line_end = n if nl < 0 else nl
        line = chars[line_start:line_end]
        level = len(line) - len(line.lstrip("#"))
        if 1 <= level <= 6 and line[level:level + 1] == " ":
            title = line[level:].strip()
            while stack and stack[-1][0] >= level:
                stack.pop()
            stack.append((level, title))
            headings.append(" > ".join(t for _, t in stack))
        else:
            h = len(headings) - 1
            s = line_start
            for i in range(line_start, line_end):
                if chars[i] in _SENTENCE_END or i - s + 1 >= hard:
                    push_raw(s, i + 1, h)
                    s = i + 1
            push_raw(s, line_end, h)
        line_start = line_end + 1

    sentences = []  # (start, end, heading, size)
    for start, end, heading in raw:
        if m.is_chars:
            sentences.append((start, end, heading, end - start))
            continue
        piece = chars[start:end]
        size = m.len(piece)
        if size <= mx:
            sentences.append((start, end, heading, size))
            continue
        prev = start
        for cut in [start + c for c in m.cut_points(piece, mx)] + [end]:
            if cut > prev:
                sentences.append((prev, cut, heading, m.len(chars[prev:cut])))
                prev = cut
    prefix = [0]
    for s in sentences:
        prefix.append(prefix[-1] + s[3])

    def size_of(i, j):
        return sentences[j][1] - sentences[i][0] if m.is_chars else prefix[j + 1] - prefix[i]

    out = []
    i = 0
    while i < len(sentences):
        heading = sentences[i][2]
        start = sentences[i][0]
        j = i
        while j + 1 < len(sentences) and sentences[j + 1][2] == heading and size_of(i, j + 1) <= mx:
            j += 1
        t = chars[start:sentences[j][1]].strip()
        while not m.is_chars and j > i and m.len(t) > mx:
            j -= 1
            t = chars[start:sentences[j][1]].strip()
        out.append((headings[heading], t))
        if j + 1 >= len(sentences) or sentences[j + 1][2] != heading:
            i = j + 1
            continue
        k = j + 1
        while k > i + 1 and size_of(k - 1, j) <= overlap:
            k -= 1
        i = k
    return out


def embedding_text(title: str, heading: str, text: str) -> str:
    parts = []
    if title and not heading.startswith(title):
        parts.append(title)
    if heading:
        parts.append(heading)
    parts.append(text)
    return "\n".join(parts)


def lexical_fields(title: str, heading: str, text: str) -> tuple[str, str]:
    """(title field, body field) as LexicalIndex::replace_documents fills them."""
    if not heading:
        t = title
    elif heading.startswith(title):
        t = heading
    else:
        t = f"{title} > {heading}"
    body = f"{heading}\n{text}" if heading else text
    return t, body


def _is_indexable(word: str) -> bool:
    return any(c.isalnum() for c in word)


def make_jieba(dict_path: Path, user_dict: Path | None):
    import jieba

    jieba.setLogLevel(60)
    jieba.initialize()
    jieba.load_userdict(str(dict_path))
    if user_dict and user_dict.exists():
        # The appliance accepts `word`, `word freq` or `word freq tag`; a bare word gets frequency 20000.
        for line in user_dict.read_text(encoding="utf-8").splitlines():
            parts = line.strip().split()
            if not parts or parts[0].startswith("#"):
                continue
            jieba.add_word(parts[0], int(parts[1]) if len(parts) > 1 else 20000, parts[2] if len(parts) > 2 else None)

    def tokenize(text: str) -> list[str]:
        return [w.lower() for w, _, _ in jieba.tokenize(text, mode="search", HMM=True) if _is_indexable(w)]

    return tokenize


# ---------------------------------------------------------------------------------------------------------------
# Data.


def load_set(set_dir: Path, split: str, n: int):
    qrels: dict[str, dict[str, int]] = {}
    with open(set_dir / "qrels" / f"{split}.tsv", encoding="utf-8") as f:
        for i, line in enumerate(f):
            parts = line.rstrip("\n").split("\t")
            if i == 0 and parts[0] == "query-id":
                continue
            if not line.strip():
                continue
            qrels.setdefault(parts[0], {})[parts[1]] = max(int(parts[2].strip()), 0)
    queries = []
    with open(set_dir / "queries.jsonl", encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            q = json.loads(line)
            qid = q.get("id", q.get("_id"))
            if qid in qrels:
                queries.append((qid, q["text"]))
    return queries[:n], qrels


def load_corpus(set_dir: Path, max_docs: int):
    """(external id, title, text) of every row with non-empty normalised text, in file order."""
    docs = []
    with open(set_dir / "corpus.jsonl", encoding="utf-8") as f:
        rows = 0
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            rows += 1
            if max_docs and rows > max_docs:
                break
            r = json.loads(line)
            rid = r.get("id", r.get("_id"))
            rid = f"corpus.jsonl:{line_no}" if rid is None else str(rid)
            text = r.get("text", r.get("content", r.get("body", "")))
            body = normalize(text)
            if not body:
                continue
            docs.append((rid, normalize(r.get("title") or ""), body))
    return docs


# ---------------------------------------------------------------------------------------------------------------
# Encoder: encoders.rs OrtEncoder with one intra-op thread.


class Encoder:
    def __init__(self, model_dir: Path, onnx_path: Path, threads: int, profile_prefix: str | None = None):
        import onnxruntime as ort
        from tokenizers import Tokenizer

        self.manifest = tomllib.loads((model_dir / "manifest.toml").read_text(encoding="utf-8"))
        m = self.manifest
        self.pooling = m.get("pooling", "mean")
        self.width = int(m["width"])
        self.normalize = bool(m.get("normalize", False))
        self.tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self.tok.enable_truncation(max_length=int(m["max_length"]))
        self.tok.no_padding()
        self.pad_id = next((i for i in (self.tok.token_to_id(t) for t in ("<pad>", "[PAD]", "<|endoftext|>"))
                            if i is not None), 0)
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if profile_prefix:  # ORT's per-operator timings (tests/bench/encoder_ceiling.py)
            so.enable_profiling = True
            so.profile_file_prefix = profile_prefix
        self.sess = ort.InferenceSession(str(onnx_path), sess_options=so, providers=["CPUExecutionProvider"])
        self.inputs = [i.name for i in self.sess.get_inputs()]
        self.output = self.sess.get_outputs()[0].name

    def render(self, text: str, kind: str) -> str:
        t = self.manifest["query_template" if kind == "query" else "document_template"]
        return t.replace("{instruction}", self.manifest.get("instruction", "")).replace("{text}", text)

    def run(self, ids_batch: list[list[int]]) -> np.ndarray:
        n, seq = len(ids_batch), max(1, max(len(x) for x in ids_batch))
        left = self.pooling == "last-token" or self.pooling == "last_token"
        ids = np.full((n, seq), self.pad_id, dtype=np.int64)
        mask = np.zeros((n, seq), dtype=np.int64)
        for r, x in enumerate(ids_batch):
            off = seq - len(x) if left else 0
            ids[r, off:off + len(x)] = x
            mask[r, off:off + len(x)] = 1
        feed = {}
        for name in self.inputs:
            if name == "input_ids":
                feed[name] = ids
            elif name == "attention_mask":
                feed[name] = mask
            elif name == "position_ids":
                feed[name] = np.broadcast_to(np.arange(seq, dtype=np.int64), (n, seq)).copy()
            else:
                feed[name] = np.zeros((n, seq), dtype=np.int64)
        out = self.sess.run([self.output], feed)[0]
        if out.ndim == 2:
            v = out
        elif self.pooling == "cls":
            v = out[:, 0, :]
        elif left:
            v = out[:, -1, :]
        else:
            mf = mask.astype(np.float32)[:, :, None]
            v = (out * mf).sum(axis=1) / np.maximum(mf.sum(axis=1), 1.0)
        v = np.ascontiguousarray(v[:, : self.width], dtype=np.float32)
        if self.normalize:
            norms = np.linalg.norm(v, axis=1, keepdims=True)
            v = v / np.where(norms > 0, norms, 1.0)
        return v

    def encode_query(self, text: str) -> np.ndarray:
        return self.run([self.tok.encode(self.render(text, "query"), add_special_tokens=True).ids])[0]

    def encode_documents(self, texts: list[str], batch: int, progress=None) -> np.ndarray:
        encs = self.tok.encode_batch([self.render(t, "document") for t in texts], add_special_tokens=True)
        ids = [e.ids for e in encs]
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))  # similar lengths together, little padding
        out = np.zeros((len(ids), self.width), dtype=np.float32)
        for s in range(0, len(order), batch):
            rows = order[s:s + batch]
            out[rows] = self.run([ids[i] for i in rows])
            if progress:
                progress(min(s + batch, len(order)), len(order))
        return out


def model_hash(model_dir: Path) -> str:
    """sha256 of model.onnx, from the manifest when it records it (the appliance verifies it on load)."""
    try:
        m = tomllib.loads((model_dir / "manifest.toml").read_text(encoding="utf-8"))
        h = m.get("files", {}).get("model.onnx")
        if h:
            return h
    except (OSError, tomllib.TOMLDecodeError):
        pass
    d = hashlib.sha256()
    with open(model_dir / "model.onnx", "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            d.update(b)
    return d.hexdigest()


def int8_graph(model_dir: Path, cache: Path, mhash: str) -> Path:
    from onnxruntime.quantization import quantize_dynamic

    path = cache / f"model-{mhash[:16]}-int8-dynamic.onnx"
    if not path.exists():
        log(f"quantising {model_dir / 'model.onnx'} with onnxruntime.quantization.quantize_dynamic -> {path}")
        tmp = path.with_suffix(".tmp.onnx")
        t = time.perf_counter()
        quantize_dynamic(str(model_dir / "model.onnx"), str(tmp))
        os.replace(tmp, path)
        log(f"quantised in {time.perf_counter() - t:.1f} s")
    return path


# ---------------------------------------------------------------------------------------------------------------
# Retrieval.


class Bm25:
    def __init__(self, body_tokens: list[list[str]], title_tokens: list[list[str]] | None, k1=1.2, b=0.75):
        import bm25s

        def build(corpus):
            r = bm25s.BM25(k1=k1, b=b, method="lucene")
            r.index(corpus, show_progress=False)
            return r

        self.body = build(body_tokens)
        self.title = build(title_tokens) if title_tokens and any(title_tokens) else None
        self.n = len(body_tokens)

    def search(self, tokens: list[str], k: int):
        """Top-k (rows, scores) among rows that match some query token, best first (ties by row)."""
        if not tokens:
            return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.float32)
        scores = self.body.get_scores(tokens)
        if self.title is not None:
            scores = scores + self.title.get_scores(tokens)
        return top_k(scores, k, positive_only=True)


def top_k(scores: np.ndarray, k: int, positive_only=False):
    if positive_only:
        cand = np.flatnonzero(scores > 0)
        s = scores[cand]
    else:
        cand, s = None, scores
    k = min(k, len(s))
    if k == 0:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.float32)
    part = np.argpartition(-s, k - 1)[:k]
    rows = part if cand is None else cand[part]
    order = np.lexsort((rows, -scores[rows]))
    rows = rows[order]
    return rows, scores[rows]


def min_max(scores: np.ndarray):
    if len(scores) == 0:
        return None
    hi, lo = float(scores.max()), float(scores.min())
    if hi > lo:
        return lambda s: (s - lo) / (hi - lo)
    return lambda s: 1.0


def fuse(bm_rows, bm_scores, de_rows, de_scores, w: float) -> list[int]:
    """fusion::fuse(Method::Weighted): chunk rows by fused score, ties by row."""
    nb, nd = min_max(bm_scores), min_max(de_scores)
    fused: dict[int, float] = {}
    for r, s in zip(bm_rows.tolist(), bm_scores.tolist()):
        fused[r] = (1.0 - w) * nb(s)
    for r, s in zip(de_rows.tolist(), de_scores.tolist()):
        fused[r] = fused.get(r, 0.0) + w * nd(s)
    return sorted(fused, key=lambda r: (-fused[r], r))


def ndcg_at(ranked: list[str], judged: dict[str, int], k: int) -> float:
    got = sum(judged.get(d, 0) / math.log2(i + 2) for i, d in enumerate(ranked[:k]))
    ideal = sorted((g for g in judged.values() if g > 0), reverse=True)[:k]
    best = sum(g / math.log2(i + 2) for i, g in enumerate(ideal))
    return 0.0 if best == 0 else got / best


def latency(xs: list[float]) -> dict:
    if not xs:
        return {"p50_ms": 0.0, "p90_ms": 0.0, "p99_ms": 0.0, "mean_ms": 0.0, "n": 0}
    xs = sorted(xs)

    def q(p):  # Rust: xs[((len - 1) * p).round()], f64::round rounds halves away from zero
        return xs[int(math.floor((len(xs) - 1) * p + 0.5))]

    return {"p50_ms": q(0.5), "p90_ms": q(0.9), "p99_ms": q(0.99), "mean_ms": sum(xs) / len(xs), "n": len(xs)}


def cpu_info() -> dict:
    info = {"model": platform.processor() or platform.machine(), "machine": platform.machine(), "simd": []}
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return info
    flags: set[str] = set()
    for line in text.splitlines():
        key, _, val = line.partition(":")
        key = key.strip().lower()
        if key in ("model name", "cpu model") and info["model"] in ("", platform.machine(), platform.processor()):
            info["model"] = val.strip()
        if key in ("flags", "features") and not flags:
            flags = set(val.split())
    want = ["sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx_vnni",
            "avx512_bf16", "amx_tile", "amx_int8", "neon", "asimd", "asimddp", "sve", "i8mm", "bf16"]
    info["simd"] = [f for f in want if f in flags]
    return info


def versions() -> dict:
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for name in ("numpy", "onnxruntime", "onnx", "tokenizers", "bm25s", "jieba"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = None
    return out


def ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1e3


# ---------------------------------------------------------------------------------------------------------------


def main(a) -> dict:
    set_dir, model_dir = Path(a.set), Path(a.model)
    allowed = sorted(os.sched_getaffinity(0))
    core = a.core if a.core is not None else allowed[-1]
    cache = Path(a.cache) if a.cache else None
    if cache:
        cache.mkdir(parents=True, exist_ok=True)
    mhash = model_hash(model_dir)

    queries, qrels = load_set(set_dir, a.split, a.queries)
    t = time.perf_counter()
    docs = load_corpus(set_dir, a.max_docs)
    log(f"{set_dir.name}: {len(docs)} documents, {len(queries)} {a.split} queries")

    # Corpus side, untimed: chunk, tokenise for BM25, embed (fp32 document encoder, every allowed core).
    doc_enc = Encoder(model_dir, model_dir / "model.onnx", threads=len(allowed))
    measure = Chars() if a.chunker == "chars" else Tokens(_untruncated(doc_enc.tok))
    mx, ov = (400, 80) if a.chunker == "chars" else (300, 60)
    chunk_doc, chunk_title, chunk_body, chunk_embed = [], [], [], []
    for di, (_, title, text) in enumerate(docs):
        for heading, ct in chunk_measured(text, mx, ov, measure):
            tf, bf = lexical_fields(title, heading, ct)
            chunk_doc.append(di)
            chunk_title.append(tf)
            chunk_body.append(bf)
            chunk_embed.append(embedding_text(title, heading, ct))
    chunk_doc_arr = np.asarray(chunk_doc, dtype=np.int64)
    log(f"{len(chunk_embed)} chunks ({a.chunker}) in {time.perf_counter() - t:.1f} s")

    tokenize = make_jieba(Path(a.dict) if a.dict else MEDICAL_DICT, Path(a.user_dict) if a.user_dict else None)
    t = time.perf_counter()
    body_tokens = [tokenize(x) for x in chunk_body]
    title_tokens = [tokenize(x) for x in chunk_title] if any(chunk_title) else None
    bm25 = Bm25(body_tokens, title_tokens)
    index_seconds = time.perf_counter() - t
    log(f"BM25 index (jieba + bm25s) in {index_seconds:.1f} s")

    key = hashlib.sha256(json.dumps([mhash, str(set_dir.resolve()), a.max_docs, a.chunker, "doc-fp32",
                                     hashlib.sha256("\x00".join(chunk_embed).encode()).hexdigest()]).encode())
    vec_path = cache / f"corpus-{set_dir.name}-{mhash[:12]}-{key.hexdigest()[:16]}-fp32.npy" if cache else None
    embed_seconds = 0.0
    if vec_path and vec_path.exists():
        corpus = np.load(vec_path)
        log(f"corpus vectors from cache {vec_path}")
    else:
        t = time.perf_counter()
        last = [0.0]

        def progress(done, total):
            if time.perf_counter() - last[0] > 10:
                last[0] = time.perf_counter()
                log(f"embedded {done}/{total}")

        corpus = doc_enc.encode_documents(chunk_embed, a.embed_batch, progress)
        embed_seconds = time.perf_counter() - t
        log(f"embedded {len(chunk_embed)} chunks in {embed_seconds:.1f} s")
        if vec_path:
            tmp = vec_path.with_suffix(".tmp.npy")
            np.save(tmp, corpus)
            os.replace(tmp, vec_path)
    corpus = np.ascontiguousarray(corpus, dtype=np.float32)
    del doc_enc

    # Query side, timed: one pinned core, one ORT thread.
    if a.precision == "int8":
        if cache is None:
            raise SystemExit("--precision int8 needs --cache (where the quantised graph is written)")
        onnx_path = int8_graph(model_dir, cache, mhash)
    else:
        onnx_path = model_dir / "model.onnx"
    os.sched_setaffinity(0, {core})
    enc = Encoder(model_dir, onnx_path, threads=1)
    w = a.fusion_weight
    K = 100

    def hybrid(text):
        q = enc.encode_query(text)
        br, bs = bm25.search(tokenize(text), K)
        dr, ds = top_k(corpus @ q, K)
        return fuse(br, bs, dr, ds, w)

    for _, text in queries[: a.warmup]:
        hybrid(text)

    enc_t, bm_t, de_t, fu_t, all_t = [], [], [], [], []
    ndcg = {"hybrid": 0.0, "bm25": 0.0, "dense": 0.0}
    qvecs = []
    ext = [d[0] for d in docs]

    def doc_ranking(rows):
        seen, out = set(), []
        for r in rows:
            d = chunk_doc_arr[r]
            if d not in seen:
                seen.add(d)
                out.append(ext[d])
        return out

    for qid, text in queries:
        t0 = time.perf_counter()
        q = enc.encode_query(text)
        enc_t.append(ms(t0))
        t0 = time.perf_counter()
        br, bs = bm25.search(tokenize(text), K)
        bm_t.append(ms(t0))
        t0 = time.perf_counter()
        dr, ds = top_k(corpus @ q, K)
        de_t.append(ms(t0))
        t0 = time.perf_counter()
        fused = fuse(br, bs, dr, ds, w)
        fu_t.append(ms(t0))
        t0 = time.perf_counter()
        ranked = hybrid(text)
        all_t.append(ms(t0))
        judged = qrels[qid]
        ndcg["hybrid"] += ndcg_at(doc_ranking(ranked), judged, 10)
        ndcg["bm25"] += ndcg_at(doc_ranking(br.tolist()), judged, 10)
        ndcg["dense"] += ndcg_at(doc_ranking(dr.tolist()), judged, 10)
        assert fused == ranked
        if a.dump_query_vectors:
            qvecs.append(q)
    nq = max(len(queries), 1)
    if a.dump_query_vectors:
        np.save(a.dump_query_vectors, np.stack(qvecs) if qvecs else np.zeros((0, enc.width), np.float32))

    return {
        "stack": "python-reference",
        "set": set_dir.name,
        "queries": len(queries),
        "corpus_documents": len(docs),
        "chunks": len(chunk_embed),
        "model": f"{enc.manifest.get('name')}@{enc.manifest.get('version')}",
        "model_sha256": mhash,
        "precision": a.precision,
        "query_graph": str(onnx_path),
        "model_threads": 1,
        "pinned_core": core,
        "fusion_weight": w,
        "chunker": a.chunker,
        "max_docs": a.max_docs,
        "split": a.split,
        "index_seconds": index_seconds,
        "embed_seconds": embed_seconds,
        "embed_chunks_per_second": len(chunk_embed) / embed_seconds if embed_seconds > 0 else 0.0,
        "encode_query": latency(enc_t),
        "bm25": latency(bm_t),
        "dense": latency(de_t),
        "fuse": latency(fu_t),
        "hybrid_in_process": latency(all_t),
        "hybrid_http": None,
        "ndcg_at_10": ndcg["hybrid"] / nq,
        "ndcg_at_10_bm25": ndcg["bm25"] / nq,
        "ndcg_at_10_dense": ndcg["dense"] / nq,
        "cpu": cpu_info(),
        "cores": os.cpu_count(),
        "versions": versions(),
    }


def _untruncated(tok):
    from tokenizers import Tokenizer

    t = Tokenizer.from_str(tok.to_str())
    t.no_truncation()
    t.no_padding()
    return t


if __name__ == "__main__":
    report = main(ARGS)
    text = json.dumps(report, indent=2, ensure_ascii=False)
    if ARGS.out:
        Path(ARGS.out).parent.mkdir(parents=True, exist_ok=True)
        Path(ARGS.out).write_text(text + "\n", encoding="utf-8")
    print(text)
