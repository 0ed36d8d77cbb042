"""Draws tests/results/search-trust.svg from search-trust.json (the engine's ignored test search_trust_benchmark).

    python3 tests/bench/search_trust_chart.py tests/results/search-trust.json

Per set: nDCG@10 of the served hybrid for the dev queries as given and in traditional characters; the share of the
absent-term queries that get the not-found statement and of their unmodified twins that get it, with the targets.
"""
import json
import sys


def main(path):
    r = json.load(open(path))
    sets = list(r)
    w, h = 720, 300
    els = [f'<rect width="{w}" height="{h}" fill="white"/>',
           '<text x="180" y="22" text-anchor="middle" font-size="14">nDCG@10 (served hybrid)</text>',
           '<text x="540" y="22" text-anchor="middle" font-size="14">Not-found statement shown</text>']
    top, ph = 40, 190
    for i, name in enumerate(sets):
        s = r[name]
        x0 = 40 + i * 140
        for j, (label, v, c) in enumerate([("简体", s["ndcg10_simplified"], "#2b6cb0"),
                                           ("繁体", s["ndcg10_traditional"], "#dd6b20")]):
            bh = ph * v
            x = x0 + j * 50
            els.append(f'<rect x="{x}" y="{top + ph - bh:.1f}" width="44" height="{bh:.1f}" fill="{c}"/>')
            els.append(f'<text x="{x + 22}" y="{top + ph - bh - 4:.1f}" text-anchor="middle" font-size="10">{v:.4f}</text>')
            els.append(f'<text x="{x + 22}" y="{top + ph + 14}" text-anchor="middle" font-size="11">{label}</text>')
        els.append(f'<text x="{x0 + 47}" y="{top + ph + 30}" text-anchor="middle" font-size="11">{name}</text>')
        x1 = 400 + i * 160
        for j, (label, v, target, c) in enumerate([("缺词查询", s["altered_not_found_rate"], 0.98, "#2f855a"),
                                                   ("原查询", s["twins_not_found_rate"], 0.02, "#c53030")]):
            bh = ph * v
            x = x1 + j * 60
            els.append(f'<rect x="{x}" y="{top + ph - bh:.1f}" width="50" height="{bh:.1f}" fill="{c}"/>')
            els.append(f'<text x="{x + 25}" y="{top + ph - bh - 4:.1f}" text-anchor="middle" font-size="10">{v:.1%}</text>')
            ty = top + ph - ph * target
            els.append(f'<line x1="{x - 2}" y1="{ty:.1f}" x2="{x + 52}" y2="{ty:.1f}" stroke="#000" stroke-dasharray="3,2"/>')
            els.append(f'<text x="{x + 25}" y="{top + ph + 14}" text-anchor="middle" font-size="11">{label}</text>')
        els.append(f'<text x="{x1 + 55}" y="{top + ph + 30}" text-anchor="middle" font-size="11">{name} ({s["split"]})</text>')
    els.append(f'<text x="{w / 2}" y="{h - 12}" text-anchor="middle" font-size="10" fill="#555">dashed: targets '
               '(≥ 98 % of absent-term queries, ≤ 2 % of their unmodified twins)</text>')
    svg = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif">'
           + "".join(els) + "</svg>\n")
    open(path[:-5] + ".svg", "w").write(svg)


if __name__ == "__main__":
    main(sys.argv[1])
