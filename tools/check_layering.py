#!/usr/bin/env python3
"""Fails if a file under src/lumen/<sub>/ includes a subsystem its layer may not
use (DESIGN.md section 2), or if Highway appears outside kernels/.

Allowed dependencies (transitively closed):
  core -> nothing; kernels, formats -> core; tokenize -> formats;
  model -> kernels, formats; sample -> kernels; engine -> model, sample, tokenize;
  serve, train, eval -> engine; cli -> everything.
"""
import pathlib
import re
import sys

DIRECT = {
    "core": set(),
    "kernels": {"core"},
    "formats": {"core"},
    "tokenize": {"formats"},
    "model": {"kernels", "formats"},
    "sample": {"kernels"},
    "engine": {"model", "sample", "tokenize"},
    "serve": {"engine"},
    "train": {"engine"},
    "eval": {"engine"},
    "cli": {"serve", "train", "eval"},
}


def closure(sub):
    seen, todo = set(), [sub]
    while todo:
        for d in DIRECT[todo.pop()]:
            if d not in seen:
                seen.add(d)
                todo.append(d)
    return seen | {sub}


def main():
    root = pathlib.Path(__file__).resolve().parent.parent / "src" / "lumen"
    bad = []
    inc = re.compile(r'#include\s+[<"]lumen/([a-z_]+)/')
    for path in sorted(root.rglob("*")):
        if path.suffix not in (".h", ".cc"):
            continue
        sub = path.relative_to(root).parts[0]
        allowed = closure(sub)
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            m = inc.search(line)
            if m and m.group(1) not in allowed:
                bad.append(f"{path}:{n}: {sub}/ may not include lumen/{m.group(1)}/")
            if sub != "kernels" and ("hwy/" in line and "#include" in line or "hn::" in line):
                bad.append(f"{path}:{n}: Highway outside kernels/")
    for b in bad:
        print(b)
    print(f"layering: {len(bad)} violation(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
