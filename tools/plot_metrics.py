#!/usr/bin/python3
"""Line charts (SVG, no dependencies) of lumen train's metrics.jsonl files.

usage: plot_metrics.py OUT.svg --field eval:accuracy --field train:loss LABEL=RUN_DIR ...

Each --field is KIND:NAME (kind "train" or "eval" rows of metrics.jsonl);
one panel per field, one line per run, x = step.
"""
import argparse
import json
import os

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf"]


def load(run_dir):
    rows = []
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            if line.strip():
                rows.append(json.loads(line))
    return rows


def panel(x0, y0, w, h, title, series):
    out = []
    xs = [x for _, pts in series for x, _ in pts]
    ys = [y for _, pts in series for _, y in pts]
    if not xs:
        return out
    xmin, xmax = min(xs), max(xs) or 1
    ymin, ymax = min(ys), max(ys)
    if ymax == ymin:
        ymax = ymin + 1
    pad = 0.05 * (ymax - ymin)
    ymin, ymax = ymin - pad, ymax + pad
    sx = lambda x: x0 + 50 + (x - xmin) / max(1e-12, xmax - xmin) * (w - 60)
    sy = lambda y: y0 + h - 30 - (y - ymin) / (ymax - ymin) * (h - 50)
    out.append(f'<rect x="{x0 + 50}" y="{y0 + 20}" width="{w - 60}" height="{h - 50}" '
               'fill="none" stroke="#999"/>')
    out.append(f'<text x="{x0 + w / 2}" y="{y0 + 14}" text-anchor="middle" '
               f'font-size="13">{title}</text>')
    for i in range(5):
        v = ymin + (ymax - ymin) * i / 4
        out.append(f'<text x="{x0 + 46}" y="{sy(v) + 4:.1f}" text-anchor="end" '
                   f'font-size="10">{v:.3g}</text>')
    for v in (xmin, (xmin + xmax) / 2, xmax):
        out.append(f'<text x="{sx(v):.1f}" y="{y0 + h - 14}" text-anchor="middle" '
                   f'font-size="10">{v:.0f}</text>')
    for k, (label, pts) in enumerate(series):
        c = COLORS[k % len(COLORS)]
        d = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in pts)
        out.append(f'<polyline points="{d}" fill="none" stroke="{c}" stroke-width="1.8"/>')
        out.append(f'<text x="{x0 + 56}" y="{y0 + 34 + 13 * k}" font-size="11" '
                   f'fill="{c}">{label}</text>')
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--field", action="append", required=True)
    ap.add_argument("runs", nargs="+")
    a = ap.parse_args()
    runs = [(r.split("=", 1)[0], load(r.split("=", 1)[1])) for r in a.runs]
    w, h = 420, 260
    cols = min(2, len(a.field))
    rows = (len(a.field) + cols - 1) // cols
    body = []
    for i, field in enumerate(a.field):
        kind, name = field.split(":")
        series = []
        for label, rs in runs:
            pts = [(r["step"], r[name]) for r in rs if r.get("kind") == kind and name in r]
            if pts:
                series.append((label, pts))
        body += panel((i % cols) * w, (i // cols) * h, w, h, f"{kind} {name} vs step", series)
    svg = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{cols * w}" height="{rows * h}" '
           f'font-family="sans-serif"><rect width="100%" height="100%" fill="white"/>'
           + "".join(body) + "</svg>\n")
    with open(a.out, "w") as f:
        f.write(svg)


if __name__ == "__main__":
    main()
