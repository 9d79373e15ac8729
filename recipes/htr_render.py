"""Renders text lines as handwriting images for recipes/htr_lines_data.lua (FreeType via PIL).

Usage: /usr/bin/python3 recipes/htr_render.py JOBS OUT [PNG_DIR]
  JOBS: UTF-8 text, one job per line: "seed<TAB>font file<TAB>text"
  OUT:  binary, per job in order: height, width (two little-endian uint32), then height*width
        bytes, row-major, 0 = paper .. 255 = full ink
  PNG_DIR (optional): also writes each image as PNG_DIR/NNNNN.png (dark ink on white) to look at.

Each image depends only on its job line (random.Random and numpy's generator seeded by the job's
seed), so the same jobs give the same bytes with the same PIL, FreeType and numpy.

Augmentation, all drawn per line: stroke width (FreeType's stroker), a baseline offset per word,
word spacing, slant (a shear of -0.35..0.35), horizontal stretch 0.8..1.2, a final height of
32..48 pixels, blur, ink and paper intensity, Gaussian pixel noise.
"""
import random
import struct
import sys

import numpy as np
from PIL import Image, ImageDraw, ImageFilter, ImageFont

SIZE = 64  # rendering size in pixels per em; lines are drawn large and scaled down
_fonts = {}


def font(path):
    if path not in _fonts:
        f = ImageFont.truetype(path, SIZE)
        # The reference band: from the top of a capital to the bottom of a descender, relative to
        # the baseline. Scaling every line by it (not by its own ink) keeps letters of one font
        # the same size whether or not the line has capitals or descenders.
        _, top, _, bottom = f.getbbox("Hgjy", anchor="ls")
        _fonts[path] = (f, top, bottom)
    return _fonts[path]


def render(seed, path, text):
    rng = random.Random(seed)
    f, ref_top, ref_bottom = font(path)
    stroke = rng.choice((0, 0, 1, 2))
    words = text.split(" ")
    space = f.getlength(" ")
    width = int(sum(f.getlength(w) for w in words) + 2 * space * len(words) + 4 * SIZE)
    height = 4 * SIZE
    base = 2 * SIZE
    img = Image.new("L", (width, height), 0)
    draw = ImageDraw.Draw(img)
    x = SIZE
    for w in words:
        dy = max(-0.12, min(0.12, rng.gauss(0, 0.05))) * SIZE
        draw.text((x, base + dy), w, font=f, fill=255, anchor="ls", stroke_width=stroke,
                  stroke_fill=255)
        x += f.getlength(w) + 2 * stroke + space * rng.uniform(0.7, 1.5)
    # slant: input x = output x + k (y - base) - shift, so the baseline stays where it was
    k = rng.uniform(-0.35, 0.35)
    shift = abs(k) * base
    img = img.transform((width + int(2 * shift), height), Image.AFFINE,
                        (1, k, -k * base - shift, 0, 1, 0), resample=Image.BILINEAR)
    ink = img.getbbox()
    if ink is None:
        raise ValueError("no ink for %r in %s" % (text, path))
    top = min(ink[1], int(base + ref_top - stroke))
    bottom = max(ink[3], int(base + ref_bottom + stroke + 1))
    pad = lambda: int(rng.uniform(0.02, 0.15) * SIZE)
    img = img.crop((ink[0] - pad(), top - pad(), ink[2] + pad(), bottom + pad()))
    h = rng.randint(32, 48)
    scale = h / img.height
    w = max(8, int(round(img.width * scale * rng.uniform(0.8, 1.2))))
    img = img.resize((w, h), Image.LANCZOS)
    blur = rng.uniform(0, 0.8)
    if blur > 0.3:
        img = img.filter(ImageFilter.GaussianBlur(blur))
    a = np.asarray(img, dtype=np.float32) / 255.0
    paper, ink_level, noise = rng.uniform(0, 0.15), rng.uniform(0.6, 1.0), rng.uniform(0, 0.08)
    a = paper + (ink_level - paper) * a
    a += np.random.default_rng(seed).normal(0.0, noise, a.shape).astype(np.float32)
    return (np.clip(a, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)


def main(argv):
    if len(argv) not in (3, 4):
        sys.exit(__doc__)
    png_dir = argv[3] if len(argv) == 4 else None
    with open(argv[1], encoding="utf-8") as jobs, open(argv[2], "wb") as out:
        for n, line in enumerate(jobs):
            seed, path, text = line.rstrip("\n").split("\t")
            a = render(int(seed), path, text)
            out.write(struct.pack("<II", a.shape[0], a.shape[1]))
            out.write(a.tobytes())
            if png_dir:
                Image.fromarray(255 - a).save("%s/%05d.png" % (png_dir, n))


if __name__ == "__main__":
    main(sys.argv)
