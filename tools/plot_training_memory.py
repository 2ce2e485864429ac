#!/usr/bin/python3
"""Bar charts (SVG, no dependencies) of `lumen bench train` results.

usage: plot_training_memory.py OUT.svg BENCH_OUTPUT.txt...

Reads the first table of each file (| seq | configuration | step s | peak RSS
MB | ...), as `lumen bench train` prints it, and draws two panels: peak RSS
and step time, one group of bars per sequence length, one bar per
configuration. A later file's row replaces an earlier one with the same seq
and configuration. Rows that failed (an "error:" cell) are left out.
"""
import sys

COLORS = {"plain": "#7f7f7f", "fused-ce": "#1f77b4", "prefix-share": "#2ca02c",
          "segment": "#9467bd", "mlp-chunk": "#ff7f0e", "all": "#d62728"}
ORDER = ["plain", "fused-ce", "prefix-share", "segment", "mlp-chunk", "all"]


def read(paths):
    rows = {}
    for path in paths:
        with open(path) as f:
            lines = f.read().splitlines()
        head = next((i for i, l in enumerate(lines) if "| step s |" in l and "peak RSS MB" in l),
                    None)
        if head is None:
            sys.exit(f"{path}: no bench train table (a header with 'step s' and 'peak RSS MB')")
        for line in lines[head + 2:]:
            if not line.startswith("|"):
                break
            cells = [c.strip() for c in line.strip("|").split("|")]
            if len(cells) < 4 or cells[2].startswith("error"):
                continue
            rows[(int(cells[0]), cells[1])] = (float(cells[2]), float(cells[3]))
    if not rows:
        sys.exit("no measured rows")
    return rows


def panel(x0, y0, w, h, title, unit, rows, index):
    seqs = sorted({s for s, _ in rows})
    configs = [c for c in ORDER if any((s, c) in rows for s in seqs)]
    top = max(v[index] for v in rows.values()) * 1.1
    out = [f'<text x="{x0 + w / 2}" y="{y0 + 16}" text-anchor="middle" font-size="14">{title}</text>']
    px, py, pw, ph = x0 + 60, y0 + 30, w - 80, h - 70
    for i in range(5):
        v = top * i / 4
        y = py + ph - ph * i / 4
        out.append(f'<line x1="{px}" y1="{y}" x2="{px + pw}" y2="{y}" stroke="#ddd"/>')
        out.append(f'<text x="{px - 6}" y="{y + 4}" text-anchor="end" font-size="11">{v:.0f}</text>')
    out.append(f'<text x="{x0 + 14}" y="{py + ph / 2}" font-size="11" '
               f'transform="rotate(-90 {x0 + 14} {py + ph / 2})" text-anchor="middle">{unit}</text>')
    group = pw / len(seqs)
    bar = group * 0.8 / max(1, len(configs))
    for gi, s in enumerate(seqs):
        gx = px + gi * group + group * 0.1
        out.append(f'<text x="{px + gi * group + group / 2}" y="{py + ph + 16}" '
                   f'text-anchor="middle" font-size="12">seq {s}</text>')
        for ci, c in enumerate(configs):
            if (s, c) not in rows:
                continue
            v = rows[(s, c)][index]
            bh = ph * v / top
            x = gx + ci * bar
            out.append(f'<rect x="{x:.1f}" y="{py + ph - bh:.1f}" width="{bar * 0.9:.1f}" '
                       f'height="{bh:.1f}" fill="{COLORS.get(c, "#333")}"><title>{c} seq {s}: '
                       f'{v:g} {unit}</title></rect>')
            out.append(f'<text x="{x + bar * 0.45:.1f}" y="{py + ph - bh - 3:.1f}" '
                       f'text-anchor="middle" font-size="9">{v:.0f}</text>')
    lx = px
    for c in configs:
        out.append(f'<rect x="{lx}" y="{py + ph + 26}" width="10" height="10" fill="{COLORS.get(c, "#333")}"/>')
        out.append(f'<text x="{lx + 14}" y="{py + ph + 35}" font-size="11">{c}</text>')
        lx += 14 + 7 * len(c) + 18
    return out


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    rows = read(sys.argv[2:])
    w, h = 520, 330
    body = panel(0, 0, w, h, "peak RSS (weights included)", "MB", rows, 1)
    body += panel(w, 0, w, h, "step time", "s", rows, 0)
    svg = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{2 * w}" height="{h}" '
           f'font-family="sans-serif"><rect width="100%" height="100%" fill="white"/>'
           + "".join(body) + "</svg>\n")
    with open(sys.argv[1], "w") as f:
        f.write(svg)


if __name__ == "__main__":
    main()
