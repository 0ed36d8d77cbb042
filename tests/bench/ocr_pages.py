#!/usr/bin/env python3
"""Page images of Chinese medical text, rendered with a CJK font, for the OCR tests and benchmark (issue 54).

--fixture DIR writes the unit tests' page (ocr-page.png and its text, ocr-page.txt): a heading, label/value lines
and a table row, as a photographed package insert has them. Needs Pillow and fonts-noto-cjk (Debian).
"""
import argparse
import pathlib

from PIL import Image, ImageDraw, ImageFont

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


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fixture", type=pathlib.Path, help="write the unit tests' page into this folder")
    args = ap.parse_args()
    if args.fixture:
        args.fixture.mkdir(parents=True, exist_ok=True)
        fixture(args.fixture)


if __name__ == "__main__":
    main()
