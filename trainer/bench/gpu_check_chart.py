"""Draws tests/results/gpu-check-*.svg from the JSON `gpu_check.sh` brings back (stdlib only, no plotting library).

    python3 trainer/bench/gpu_check_chart.py tests/results/gpu-check-2026-11-26.json

Left: Stage II LoRA step time (median of 10) of care-train and PyTorch + PEFT per batch; right: peak device memory
of both against the doctor's estimate.
"""
import json
import sys


def bars(x0, title, groups, unit, fmt):
    """groups: [(label, [(name, value, colour)])] -> SVG elements of one bar panel at x offset x0."""
    w, h, top = 330, 220, 40
    vmax = max(v for _, series in groups for _, v, _ in series) * 1.15
    out = [f'<text x="{x0 + w / 2}" y="22" text-anchor="middle" font-size="14">{title}</text>',
           f'<line x1="{x0 + 40}" y1="{top + h}" x2="{x0 + w}" y2="{top + h}" stroke="#333"/>']
    gw = (w - 50) / len(groups)
    for gi, (label, series) in enumerate(groups):
        bw = (gw - 20) / len(series)
        for si, (name, v, colour) in enumerate(series):
            bh = h * v / vmax
            x = x0 + 50 + gi * gw + si * bw
            out.append(f'<rect x="{x:.1f}" y="{top + h - bh:.1f}" width="{bw - 4:.1f}" height="{bh:.1f}" fill="{colour}"/>')
            out.append(f'<text x="{x + (bw - 4) / 2:.1f}" y="{top + h - bh - 4:.1f}" text-anchor="middle" '
                       f'font-size="10">{fmt(v)}</text>')
        out.append(f'<text x="{x0 + 50 + gi * gw + (gw - 20) / 2:.1f}" y="{top + h + 16}" text-anchor="middle" '
                   f'font-size="11">{label}</text>')
    out.append(f'<text x="{x0 + 8}" y="{top + h / 2}" font-size="11" transform="rotate(-90 {x0 + 12} {top + h / 2})">'
               f'{unit}</text>')
    return out


def main(path):
    r = json.load(open(path))
    care = {c["case"]: c for c in r["care_train"]["cases"]}
    ref = {c["batch"]: c for c in r["pytorch_peft"]["cases"]}
    batches = sorted(ref)
    C, P, E = "#2b6cb0", "#dd6b20", "#718096"
    time = [(f"{b}×8 docs", [("care-train", care[f"qwen3-0.6b:b{b}"]["step_seconds_median"] * 1000, C),
                             ("PyTorch+PEFT", ref[b]["step_seconds_median"] * 1000, P)]) for b in batches]
    mem = [(f"{b}×8 docs", [("care-train", care[f"qwen3-0.6b:b{b}"]["peak_mib"] / 1024, C),
                            ("PyTorch+PEFT", ref[b]["device_used_mib"] / 1024, P),
                            ("doctor estimate", care[f"qwen3-0.6b:b{b}"]["estimate_mib"] / 1024, E)]) for b in batches]
    gpu = r["pytorch_peft"]["gpu"]
    els = bars(0, "Stage II step (ms, median)", time, "ms", lambda v: f"{v:.0f}")
    els += bars(360, "Peak GPU memory (GiB)", mem, "GiB", lambda v: f"{v:.1f}")
    legend = [(C, "care-train (tch, sdpa, bf16)"), (P, "PyTorch + PEFT (sdpa, bf16)"), (E, "care-train doctor estimate")]
    for i, (c, t) in enumerate(legend):
        els.append(f'<rect x="{20 + i * 230}" y="292" width="12" height="12" fill="{c}"/>')
        els.append(f'<text x="{36 + i * 230}" y="302" font-size="11">{t}</text>')
    els.append(f'<text x="350" y="326" text-anchor="middle" font-size="11" fill="#555">Qwen3-0.6B-shaped document '
               f'encoder (LoRA r=32) + e5-small-shaped query encoder, 256/32 tokens, {gpu}, {r["date"]}</text>')
    svg = ('<svg xmlns="http://www.w3.org/2000/svg" width="700" height="336" font-family="sans-serif">'
           '<rect width="700" height="336" fill="white"/>' + "".join(els) + "</svg>\n")
    open(path[:-5] + ".svg", "w").write(svg)


if __name__ == "__main__":
    main(sys.argv[1])
