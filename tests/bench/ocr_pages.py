#!/usr/bin/env python3
"""Page images of Chinese medical text, rendered with a CJK font, for the OCR tests and benchmark (issue 54).

--fixture DIR writes the unit tests' page (ocr-page.png and its text, ocr-page.txt): a heading, label/value lines
and a table row, as a photographed package insert has them.

--corpus OUT renders documents of BEIR sets (default kuake_qtr and huatuo26m_test under $CARE_SHARED/data/retrieval)
as scanned pages: for each set, documents judged relevant to its dev queries first, then others, --per-set of them.
Each page gets a resolution of 150, 200 or 300 dpi (body text 10.5 pt); half of them are degraded (turned 1–3°,
blurred, noise, JPEG artefacts); one in five is wrapped in a PDF (embedded JPEG), and one in ten goes into a
three-page TIFF. OUT/truth.jsonl holds each page's text and how it was made; OUT/SET/corpus.jsonl, queries.jsonl and
qrels/dev.tsv hold the chosen documents as text, so the same documents can be ingested both ways.

--eval-sets DIR, after `care-bench --ocr DIR` (which writes DIR/SET/recognised.jsonl), writes two BEIR sets per set
for `care eval`: DIR/eval/SET-text (the pages' documents as text) and DIR/eval/SET-ocr (as recognised), over the
same documents (those read) and the dev queries judged on them.

Needs Pillow and numpy (`packaging/dev.sh bench-venv`) and fonts-noto-cjk (Debian).
"""
import argparse
import hashlib
import io
import json
import os
import pathlib
import random
import textwrap

from PIL import Image, ImageDraw, ImageFilter, ImageFont

FONT = "/usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc"


def font(size):
    # The collection's faces: pick the simplified-Chinese one by name, not by a fixed index.
    for index in range(10):
        f = ImageFont.truetype(FONT, size, index=index)
        if f.getname()[0].endswith("CJK SC"):
            return f
    raise SystemExit("Noto Sans CJK SC not found in " + FONT)


FIXTURE_LINES = [
    ("二甲双胍片说明书", 44),
    ("【适应症】用于单纯饮食控制不满意的2型糖尿病患者。", 30),
    ("【禁忌症】肾功能不全、严重感染、酮症酸中毒者禁用。", 30),
    ("【用法用量】口服，一次0.5g，一日2次，随餐服用。", 30),
    ("【不良反应】常见恶心、腹泻、食欲减退。", 30),
]
TABLE_ROW = ["阿卡波糖", "50mg", "每日三次"]


def fixture(out: pathlib.Path):
    page = Image.new("L", (1100, 560), 255)
    draw = ImageDraw.Draw(page)
    y = 40
    for text, size in FIXTURE_LINES:
        draw.text((60, y), text, font=font(size), fill=0)
        y += int(size * 1.9)
    cells = font(30)
    for x, cell in zip((60, 420, 700), TABLE_ROW):
        draw.text((x, y + 10), cell, font=cells, fill=0)
    page.save(out / "ocr-page.png", optimize=True)
    lines = [t for t, _ in FIXTURE_LINES] + [" ".join(TABLE_ROW)]
    (out / "ocr-page.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")


def wrap(text, per_line):
    lines = []
    for paragraph in text.replace("\u001a", "").split("\n"):
        paragraph = paragraph.strip()
        if paragraph:
            lines.extend(textwrap.wrap(paragraph, per_line, drop_whitespace=True) or [""])
    return lines


def render(title, text, dpi, max_chars=900):
    """One page: A4 wide, as tall as its text (a full page at most); returns (image, the text drawn)."""
    width = int(8.27 * dpi)
    size = int(10.5 / 72 * dpi)
    margin = int(0.8 * dpi)
    per_line = max(8, (width - 2 * margin) // size)
    body = wrap(text[:max_chars], per_line)
    lines = ([title] if title else []) + body
    lines = lines[: int((11.69 * dpi - 2 * margin) // (size * 1.6))]
    height = int(2 * margin + len(lines) * size * 1.6)
    page = Image.new("L", (width, max(height, margin * 3)), 255)
    draw = ImageDraw.Draw(page)
    f = font(size)
    for i, line in enumerate(lines):
        draw.text((margin, margin + i * size * 1.6), line, font=f, fill=0)
    return page, "\n".join(lines)


def degrade(page, rng):
    import numpy as np

    angle = rng.uniform(1, 3) * rng.choice([-1, 1])
    page = page.rotate(angle, resample=Image.BICUBIC, expand=True, fillcolor=255)
    page = page.filter(ImageFilter.GaussianBlur(rng.uniform(0.5, 1.0)))
    a = np.asarray(page, dtype=np.float32)
    a = a + np.random.default_rng(rng.randrange(1 << 30)).normal(0, rng.uniform(6, 14), a.shape)
    page = Image.fromarray(a.clip(0, 255).astype("uint8"))
    buf = io.BytesIO()
    page.save(buf, "JPEG", quality=rng.randrange(35, 61))
    return Image.open(io.BytesIO(buf.getvalue())), buf.getvalue(), angle


def read_jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def corpus(out, sets, per_set):
    out.mkdir(parents=True, exist_ok=True)
    truth = []
    tiff_pages = []
    for set_dir in sets:
        name = set_dir.name
        docs = {d["id"]: d for d in read_jsonl(set_dir / "corpus.jsonl")}
        qrels = [line.rstrip("\n").split("\t") for line in open(set_dir / "qrels/dev.tsv", encoding="utf-8")][1:]
        judged = sorted({c for _, c, s in qrels if int(s) > 0}, key=lambda i: hashlib.sha1(i.encode()).hexdigest())
        others = sorted(set(docs) - set(judged), key=lambda i: hashlib.sha1(i.encode()).hexdigest())
        chosen = (judged + others)[:per_set]
        kept = set(chosen)
        (out / name / "qrels").mkdir(parents=True, exist_ok=True)
        with open(out / name / "corpus.jsonl", "w", encoding="utf-8") as f:
            for i in chosen:
                f.write(json.dumps(docs[i], ensure_ascii=False) + "\n")
        queries = {q["id"] if "id" in q else q["_id"]: q for q in read_jsonl(set_dir / "queries.jsonl")}
        judged_queries = sorted({q for q, c, s in qrels if c in kept})
        with open(out / name / "queries.jsonl", "w", encoding="utf-8") as f:
            for q in judged_queries:
                f.write(json.dumps(queries[q], ensure_ascii=False) + "\n")
        with open(out / name / "qrels/dev.tsv", "w", encoding="utf-8") as f:
            f.write("query-id\tcorpus-id\tscore\n")
            for q, c, s in qrels:
                if c in kept:
                    f.write(f"{q}\t{c}\t{s}\n")
        (out / name / "pages").mkdir(exist_ok=True)
        for n, doc_id in enumerate(chosen):
            rng = random.Random(doc_id)
            dpi = rng.choice([150, 200, 300])
            page, text = render(docs[doc_id].get("title", ""), docs[doc_id]["text"], dpi)
            degraded = n % 2 == 1
            record = {"set": name, "id": doc_id, "dpi": dpi, "degraded": degraded, "text": text}
            if degraded:
                page, jpeg, angle = degrade(page, rng)
                record["angle"] = round(angle, 2)
            stem = out / name / "pages" / doc_id
            if n % 10 == 3:
                tiff_pages.append((record, page))
                continue
            if n % 5 == 0:
                page.convert("RGB").save(f"{stem}.pdf", "PDF", resolution=dpi)
                record["file"] = f"{name}/pages/{doc_id}.pdf"
            elif degraded:
                (stem.with_suffix(".jpg")).write_bytes(jpeg)
                record["file"] = f"{name}/pages/{doc_id}.jpg"
            else:
                page.save(f"{stem}.png", optimize=False)
                record["file"] = f"{name}/pages/{doc_id}.png"
            record["page"] = 1
            truth.append(record)
    # Three pages a TIFF (one document per page, named by the first).
    for k in range(0, len(tiff_pages), 3):
        group = tiff_pages[k : k + 3]
        rel = f"{group[0][0]['set']}/pages/{group[0][0]['id']}-multi.tif"
        images = [p.convert("L") for _, p in group]
        images[0].save(out / rel, save_all=True, append_images=images[1:], compression="tiff_deflate")
        for page_no, (record, _) in enumerate(group, 1):
            truth.append(dict(record, file=rel, page=page_no))
    with open(out / "truth.jsonl", "w", encoding="utf-8") as f:
        for r in truth:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    print(f"{len(truth)} pages in {out}")


def eval_sets(root):
    truth = [json.loads(l) for l in open(root / "truth.jsonl", encoding="utf-8") if l.strip()]
    for name in sorted({t["set"] for t in truth}):
        recognised = {d["id"]: d for d in read_jsonl(root / name / "recognised.jsonl")}
        docs = {d["id"]: d for d in read_jsonl(root / name / "corpus.jsonl") if d["id"] in recognised}
        qrels = [line.rstrip("\n").split("\t") for line in open(root / name / "qrels/dev.tsv", encoding="utf-8")][1:]
        qrels = [r for r in qrels if r[1] in docs]
        judged = {q for q, _, s in qrels if int(s) > 0}
        queries = [q for q in read_jsonl(root / name / "queries.jsonl") if q.get("id", q.get("_id")) in judged]
        for kind, corpus_docs in (("text", docs), ("ocr", recognised)):
            out = root / "eval" / f"{name}-{kind}"
            (out / "qrels").mkdir(parents=True, exist_ok=True)
            with open(out / "corpus.jsonl", "w", encoding="utf-8") as f:
                for i in docs:
                    f.write(json.dumps(corpus_docs[i], ensure_ascii=False) + "\n")
            with open(out / "queries.jsonl", "w", encoding="utf-8") as f:
                for q in queries:
                    f.write(json.dumps(dict(q, split="dev"), ensure_ascii=False) + "\n")
            with open(out / "qrels/dev.tsv", "w", encoding="utf-8") as f:
                f.write("query-id\tcorpus-id\tscore\n")
                for q, c, s in qrels:
                    f.write(f"{q}\t{c}\t{s}\n")
        print(f"{name}: {len(docs)} documents, {len(queries)} dev queries")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fixture", type=pathlib.Path, help="write the unit tests' page into this folder")
    ap.add_argument("--corpus", type=pathlib.Path, help="render the benchmark's pages into this folder")
    ap.add_argument("--per-set", type=int, default=300)
    ap.add_argument("--sets", nargs="*", default=["kuake_qtr", "huatuo26m_test"])
    ap.add_argument("--eval-sets", type=pathlib.Path, help="write text and recognised BEIR sets for care eval")
    args = ap.parse_args()
    if args.fixture:
        args.fixture.mkdir(parents=True, exist_ok=True)
        fixture(args.fixture)
    if args.corpus:
        root = pathlib.Path(os.environ.get("CARE_SHARED", "../shared")) / "data/retrieval"
        corpus(args.corpus, [root / s for s in args.sets], args.per_set)
    if args.eval_sets:
        eval_sets(args.eval_sets)


if __name__ == "__main__":
    main()
