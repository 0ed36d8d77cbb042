"""Draws tests/results/search-trust.svg from search-trust.json (the engine's ignored test search_trust_benchmark).

    python3 tests/bench/search_trust_chart.py tests/results/search-trust.json

Top, per set: nDCG@10 of the served hybrid for the queries as given (synonym table on), converted to traditional
characters, and as typed with the table off (exact). Bottom, per set: the share of the absent-term queries that get
the not-found statement and of their unmodified twins that get it, with the targets.
"""
import json
import sys


def bars(els, x0, top, ph, items, fmt, width=44, gap=6):
    for j, (label, v, c, target) in enumerate(items):
        bh = ph * v
        x = x0 + j * (width + gap)
        els.append(f'<rect x="{x}" y="{top + ph - bh:.1f}" width="{width}" height="{bh:.1f}" fill="{c}"/>')
        els.append(f'<text x="{x + width / 2}" y="{top + ph - bh - 4:.1f}" text-anchor="middle" '
                   f'font-size="10">{fmt(v)}</text>')
        els.append(f'<text x="{x + width / 2}" y="{top + ph + 14}" text-anchor="middle" font-size="11">{label}</text>')
        if target is not None:
            ty = top + ph - ph * target
            els.append(f'<line x1="{x - 2}" y1="{ty:.1f}" x2="{x + width + 2}" y2="{ty:.1f}" stroke="#000" '
                       'stroke-dasharray="3,2"/>')


def main(path):
    r = json.load(open(path))
    sets = list(r)
    group = 170
    w, h = max(720, 40 + group * len(sets)), 560
    els = [f'<rect width="{w}" height="{h}" fill="white"/>',
           f'<text x="{w / 2}" y="22" text-anchor="middle" font-size="14">nDCG@10 (served hybrid)</text>',
           f'<text x="{w / 2}" y="292" text-anchor="middle" font-size="14">Not-found statement shown</text>']
    ph = 190
    for i, name in enumerate(sets):
        s = r[name]
        x0 = 30 + i * group
        items = [("简体", s["ndcg10_simplified"], "#2b6cb0", None),
                 ("繁体", s["ndcg10_traditional"], "#dd6b20", None)]
        if "ndcg10_exact" in s:
            items.append(("无同义词", s["ndcg10_exact"], "#718096", None))
        bars(els, x0, 40, ph, items, lambda v: f"{v:.4f}")
        els.append(f'<text x="{x0 + 72}" y="{40 + ph + 30}" text-anchor="middle" font-size="11">{name}</text>')
        items = [("缺词查询", s["altered_not_found_rate"], "#2f855a", 0.98),
                 ("原查询", s["twins_not_found_rate"], "#c53030", 0.02)]
        bars(els, x0 + 10, 310, ph, items, lambda v: f"{v:.1%}", width=56)
        els.append(f'<text x="{x0 + 72}" y="{310 + ph + 30}" text-anchor="middle" font-size="11">{name} '
                   f'({s["split"]})</text>')
    els.append(f'<text x="{w / 2}" y="{h - 8}" text-anchor="middle" font-size="10" fill="#555">dashed: targets '
               '(≥ 98 % of absent-term queries, ≤ 2 % of their unmodified twins)</text>')
    svg = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif">'
           + "".join(els) + "</svg>\n")
    open(path[:-5] + ".svg", "w").write(svg)


if __name__ == "__main__":
    main(sys.argv[1])
