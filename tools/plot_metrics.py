#!/usr/bin/python3
"""Line charts (SVG, no dependencies) of lumen train's metrics.jsonl files.

usage: plot_metrics.py OUT.svg --field eval:accuracy --field train:loss LABEL=RUN_DIR ...

Each --field is KIND:NAME (kind "train" or "eval" rows of metrics.jsonl);
one panel per field, one line per run, x = step.

RUN_DIR may list several runs separated by commas (LABEL=DIR1,DIR2,DIR3, e.g.
the seeds of one arm): the line is then their mean at each step that every
one of them reports, and --band adds a light min..max band around it.
"""
import argparse
import json
import os

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf", "#e377c2",
          "#7f7f7f"]


def load(run_dir):
    rows = []
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            if line.strip():
                rows.append(json.loads(line))
    return rows


def points(rs, kind, name):
    return [(r["step"], r[name]) for r in rs if r.get("kind") == kind and name in r]


def mean_points(runs, kind, name):
    """[(step, mean, lo, hi)] over the steps every run reports."""
    per = [dict(points(rs, kind, name)) for rs in runs]
    steps = sorted(set.intersection(*(set(p) for p in per))) if per else []
    return [(x, sum(p[x] for p in per) / len(per), min(p[x] for p in per), max(p[x] for p in per))
            for x in steps]


def panel(x0, y0, w, h, title, series, bands=None):
    out = []
    bands = bands or {}
    xs = [x for _, pts in series for x, _ in pts]
    ys = [y for _, pts in series for _, y in pts]
    ys += [v for b in bands.values() for _, lo, hi in b for v in (lo, hi)]
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
        if bands.get(label):
            b = bands[label]
            poly = [(sx(x), sy(hi)) for x, _, hi in b] + [(sx(x), sy(lo)) for x, lo, _ in reversed(b)]
            out.append('<polygon points="' + " ".join(f"{u:.1f},{v:.1f}" for u, v in poly)
                       + f'" fill="{c}" fill-opacity="0.12" stroke="none"/>')
        d = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in pts)
        out.append(f'<polyline points="{d}" fill="none" stroke="{c}" stroke-width="1.8"/>')
        out.append(f'<text x="{x0 + 56}" y="{y0 + 34 + 13 * k}" font-size="11" '
                   f'fill="{c}">{label}</text>')
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--field", action="append", required=True)
    ap.add_argument("--band", action="store_true", help="min..max band for comma-listed runs")
    ap.add_argument("--title", default="", help="a line of text above the panels")
    ap.add_argument("runs", nargs="+")
    a = ap.parse_args()
    runs = [(r.split("=", 1)[0], [load(d) for d in r.split("=", 1)[1].split(",")]) for r in a.runs]
    w, h = 420, 260
    cols = min(2, len(a.field))
    rows = (len(a.field) + cols - 1) // cols
    top = 20 if a.title else 0
    body = []
    if a.title:
        body.append(f'<text x="8" y="14" font-size="12">{a.title}</text>')
    for i, field in enumerate(a.field):
        kind, name = field.split(":")
        series, bands = [], {}
        for label, group in runs:
            if len(group) == 1:
                pts = points(group[0], kind, name)
            else:
                m = mean_points(group, kind, name)
                pts = [(x, y) for x, y, _, _ in m]
                if a.band:
                    bands[label] = [(x, lo, hi) for x, _, lo, hi in m]
            if pts:
                series.append((label, pts))
        suffix = " (mean over runs)" if any(len(g) > 1 for _, g in runs) else ""
        body += panel((i % cols) * w, top + (i // cols) * h, w, h, f"{kind} {name} vs step{suffix}",
                      series, bands)
    svg = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{cols * w}" height="{rows * h + top}" '
           f'font-family="sans-serif"><rect width="100%" height="100%" fill="white"/>'
           + "".join(body) + "</svg>\n")
    with open(a.out, "w") as f:
        f.write(svg)


if __name__ == "__main__":
    main()
