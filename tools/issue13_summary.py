#!/usr/bin/python3
"""tools/issue13_summary.py OUT: issue 13's targets counted from one campaign.

Reads the files tools/issue13_campaign.sh writes under OUT (peer.md,
batch.txt, depth.md, mlx.txt, rss.txt, membw.txt, ceilings.md; short.md
where the campaign ran it) and prints
each target's count and misses: prefill 1.5x and decode 1.15x llama.cpp per
GGUF row, a batch-4 step's aggregate 2.5x a single stream (median of the
rounds), decode at depth 8192 1.15x, peak RSS within weights + KV + 10%, and
the MLX rows (no peer): batch 4, and one-thread decode (times the weight
bytes per token rss.txt names) against every read bandwidth the campaign
measured (the bandwidth clause asks 90%); the one-thread GGUF rows under
1.15x are put against the same bandwidths, the issue's other decode clause
where one thread is bound by the memory. A file that
is missing or holds no row is named, not guessed. short.md (16-token
prompts, not a target) is counted against llama.cpp's prefill at 1x.
  /usr/bin/python3 tools/issue13_summary.py /tmp/i13
"""
import os
import re
import statistics
import sys

PREFILL, DECODE, BATCH, DEPTH, RSS, ROOF = 1.5, 1.15, 2.5, 1.15, 110.0, 0.90


def read(out, name):
    path = os.path.join(out, name)
    if not os.path.exists(path):
        print(f"{name}: missing")
        return None
    with open(path, encoding="utf-8") as f:
        return f.read()


def table_rows(text):
    """The cells of each model row of a peer_bench table."""
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 8 and cells[0].startswith("pb_"):
            yield cells


def ratio_rows(text):
    """(model, threads, [ratios...]) of a peer_bench table."""
    return [(cells[0].removeprefix("pb_").removesuffix(".gguf"), cells[1],
             [float(c.rstrip("x")) for c in cells if re.fullmatch(r"[0-9.]+x", c)])
            for cells in table_rows(text)]


def one_thread_decode(text):
    """{model: lumen's one-thread decode tok/s, or None} of a peer_bench table."""
    found = {}
    for cells in table_rows(text):
        if cells[1] == "1":
            model = cells[0].removeprefix("pb_").removesuffix(".gguf")
            found[model] = float(cells[6]) if re.fullmatch(r"[0-9.]+", cells[6]) else None
    return found


def count(label, items, target):
    """items: (name, value); prints how many reach target and the rest."""
    if not items:
        print(f"{label}: no rows")
        return
    misses = [f"{n} {v:.2f}x" for n, v in items if v < target]
    print(f"{label}: {len(items) - len(misses)} of {len(items)} at {target}x"
          + (f" (misses: {', '.join(misses)})" if misses else ""))


def main():
    if len(sys.argv) != 2 or not os.path.isdir(sys.argv[1]):
        sys.exit("usage: tools/issue13_summary.py OUT (a tools/issue13_campaign.sh folder)")
    out = sys.argv[1]
    peer = read(out, "peer.md")
    decode_misses = []  # one-thread decode rows under 1.15x: (type, lumen tok/s)
    if peer is not None:
        rows = ratio_rows(peer)
        for m, t, r in rows:
            if len(r) < 2:
                print(f"peer.md: {m} -t {t} has no prefill and decode ratios (a failed run?)")
        rows = [row for row in rows if len(row[2]) >= 2]
        count("prefill", [(f"{m} -t {t}", r[0]) for m, t, r in rows], PREFILL)
        count("decode", [(f"{m} -t {t}", r[1]) for m, t, r in rows], DECODE)
        decode = one_thread_decode(peer)
        decode_misses = [(m, decode.get(m)) for m, t, r in rows if t == "1" and r[1] < DECODE]
    if os.path.exists(os.path.join(out, "short.md")):
        rows = [row for row in ratio_rows(read(out, "short.md")) if row[2]]
        count("16-token prefill (not a target)", [(f"{m} -t {t}", r[0]) for m, t, r in rows], 1.0)
    batch = read(out, "batch.txt")
    if batch is not None:
        per = {}
        for line in batch.splitlines():
            m = re.search(r"= ([0-9.]+)x batch 1", line)
            if m:
                per.setdefault(line.split()[0], []).append(float(m.group(1)))
        count("batch 4 (median of rounds)", [(t, statistics.median(v)) for t, v in per.items()],
              BATCH)
    depth = read(out, "depth.md")
    if depth is not None:
        count("depth 8192", [(f"{m} -t {t}", r[2]) for m, t, r in ratio_rows(depth) if len(r) > 2],
              DEPTH)
    rss = read(out, "rss.txt")
    gb = {}  # weights read per decoded token, GB, per type
    if rss is not None:
        for line in rss.splitlines():
            w = re.search(r"weights read per token ([0-9.]+) GB", line)
            if w:
                gb[line.split()[0]] = float(w.group(1))
        pct = [(l.split()[0], float(p)) for l in rss.splitlines()
               for p in re.findall(r"= ([0-9.]+)%", l)]
        over = [f"{t} {p:.0f}%" for t, p in pct if p > RSS]
        print(f"memory: {len(pct) - len(over)} of {len(pct)} within weights + KV + 10%"
              + (f" (over: {', '.join(over)})" if over else "")
              + (f"; highest {max(p for _, p in pct):.0f}%" if pct else ""))
    bw = []
    membw = read(out, "membw.txt")
    if membw is not None:
        bw += [float(x) for x in re.findall(r"read bandwidth, 1 thread: ([0-9.]+) GB/s", membw)]
    ceil = read(out, "ceilings.md")
    if ceil is not None:
        bw += [float(x) for x in re.findall(r"1 thread ([0-9.]+) GB/s", ceil)]
    # The other decode clause: where one thread is bound by the
    # memory, 90% of the same-run roofline (the weight bytes per token at
    # the read bandwidths the campaign measured).
    for m, tok_s in decode_misses:
        if m not in gb or not bw or tok_s is None:
            print(f"{m} -t 1 decode: no weight bytes in rss.txt or no read bandwidth")
            continue
        gbs = tok_s * gb[m]
        shares = ", ".join(f"{gbs / x:.0%} of {x}" for x in bw)
        print(f"{m} -t 1 decode (under {DECODE}x): {gbs:.1f} GB/s = {shares} GB/s "
              f"(the bandwidth clause: {ROOF:.0%})")
    mlx = read(out, "mlx.txt")
    if mlx is not None:
        model = threads = None
        for line in mlx.splitlines():
            head = re.fullmatch(r"(mlx[48]) -t ([0-9]+)", line.strip())
            if head:
                model, threads = head.group(1), head.group(2)
                continue
            b = re.search(r"= ([0-9.]+)x batch 1", line)
            if b:
                ok = "meets" if float(b.group(1)) >= BATCH else "misses"
                print(f"{model} -t {threads} batch 4: {b.group(1)}x ({ok} {BATCH}x)")
            d = re.match(r"decode: ([0-9.]+) tok/s", line)
            if d and threads == "1":
                if model not in gb or not bw:
                    print(f"{model} -t 1 decode: {d.group(1)} tok/s (no weight bytes in rss.txt "
                          "or no read bandwidth in membw.txt / ceilings.md)")
                    continue
                gbs = float(d.group(1)) * gb[model]
                shares = ", ".join(f"{gbs / x:.0%} of {x}" for x in bw)
                print(f"{model} -t 1 decode: {gbs:.1f} GB/s = {shares} GB/s "
                      f"(the clause: {ROOF:.0%})")


if __name__ == "__main__":
    main()
