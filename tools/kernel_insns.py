#!/usr/bin/python3
"""tools/kernel_insns.py [OLD_BIN] BIN [--rows MB ...] [--only KERNEL:FMT]

Static counts of the AVX512-VNNI int8 kernel instantiations (Rows, RowsK,
RowsMlx; two levels) in a build (lumen or lumen_bench_kernels), from its
disassembly: instructions, vpdpbusd, FMAs, stack accesses, calls, and
reloads (vector ops that read an address an earlier op of the same basic
block read: a loaded vector folded into each of its uses). With OLD_BIN
first, both builds side by side and the instruction ratio new / old: for
checking what a kernel change removed, or that a refactor left the hot code
as it was, where timings are the host's noise. The names are matched whether
the kernels sit in an anonymous namespace (before session 44) or in
int8_vnni's.

--rows: activation-row counts (default 1 4). --only: one kernel and format,
e.g. RowsK:15. Formats (int8_vnni::Fmt, matmul_q8_internal.h): Q4_0 0, Q4_0
groups 1, Q4_1 groups 2, Q5_0 groups 3, Q5_1 groups 4, Q4_1 5, Q5_0 6,
Q5_1 7, Q8_0 8, Q2_K 9, Q2_K records 10, Q3_K 11, Q3_K planes 12, Q4_K 13,
Q5_K 14, Q4_K groups 15, Q5_K groups 16, Q6_K 17, Q6_K slices 18, Q8_0
groups 19, MLX 4-bit 20, 8-bit 21.

  /usr/bin/python3 tools/kernel_insns.py build/dev/bench/lumen_bench_kernels --only RowsK:15
  /usr/bin/python3 tools/kernel_insns.py /tmp/kb_old build/dev/bench/lumen_bench_kernels
"""
import argparse
import re
import signal
import subprocess
import sys

PATTERN = re.compile(r"[0-9](Rows|RowsK|RowsMlx)ILN.*?FmtE(\d+)ELi(\d)ELi(\d)E")


def symbols(binary):
    """{(kernel, fmt, mb, levels): (address, size)} of binary's kernels."""
    out = subprocess.run(["nm", "-S", binary], capture_output=True, text=True, check=True).stdout
    found = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) != 4:
            continue
        m = PATTERN.search(parts[3])
        if m:
            key = (m.group(1), int(m.group(2)), int(m.group(3)), int(m.group(4)))
            found.setdefault(key, (int(parts[0], 16), int(parts[1], 16)))
    return found


# A memory operand off a general register other than the stack and
# instruction pointers.
OPERAND = re.compile(r"(?<![\w])(-?0x[0-9a-f]+)?\((%r(?!sp|ip)[a-z0-9]+)(,%r[a-z0-9]+,\d)?\)")
# The 64-bit register a scalar instruction writes (its last operand), from
# its 64- or 32-bit name: a 32-bit write replaces the whole register.
WRITTEN = re.compile(r",%(?:r([a-z]{2})|e([a-z]{2})|(r\d+)d?)$")


def written_register(insn):
    m = None if insn.startswith("v") else WRITTEN.search(insn)
    if not m:
        return None
    return "%r" + (m.group(1) or m.group(2)) if m.group(3) is None else "%" + m.group(3)


def reloads(insns):
    """Vector ops (not moves or dot products) that read an address an earlier
    op of the same basic block read, its base register unchanged: a loaded
    vector GCC folded into each of its uses (session 51: Q6_K slices read each
    of their three vectors two to four times)."""
    found, seen = 0, set()
    for x in insns:
        if re.match(r"(j|ret|call)", x):
            seen.clear()
            continue
        m = OPERAND.search(x)
        if m and x.startswith("v") and "mm" in x:
            if m.group(0) in seen and not x.startswith(("vmov", "vpdpbusd")):
                found += 1
            seen.add(m.group(0))
        reg = written_register(x)
        if reg:
            seen = {a for a in seen if not re.search(re.escape(reg) + r"\b", a)}
    return found


def counts(binary, address, size):
    """(instructions, vpdpbusd, FMAs, stack accesses, calls, reloads) between
    address and its end."""
    dis = subprocess.run(["objdump", "-d", "--no-show-raw-insn", f"--start-address={address}",
                          f"--stop-address={address + size}", binary],
                         capture_output=True, text=True, check=True).stdout
    lines = [l for l in dis.splitlines() if re.match(r"^ +[0-9a-f]+:\t", l)]
    insns = [l.split("\t", 1)[1].strip() for l in lines]
    return (len(lines), sum("vpdpbusd" in l for l in lines), sum("vfmadd" in l for l in lines),
            sum("(%rsp)" in l for l in lines), sum("\tcall" in l for l in lines), reloads(insns))


def main():
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # piped into head: stop quietly
    ap = argparse.ArgumentParser(prog="tools/kernel_insns.py",
                                 usage="%(prog)s [OLD_BIN] BIN [--rows MB ...] [--only KERNEL:FMT]")
    ap.add_argument("bins", nargs="+", metavar="BIN")
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--only", help="KERNEL:FMT, e.g. RowsK:10")
    args = ap.parse_args()
    if len(args.bins) > 2:
        ap.error("at most two builds: OLD_BIN BIN")
    args.old, args.new = (args.bins[0], args.bins[1]) if len(args.bins) == 2 else (None, args.bins[0])
    only = None
    if args.only:
        m = re.fullmatch(r"(Rows|RowsK|RowsMlx):(\d+)", args.only)
        if not m:
            ap.error(f"--only takes Rows|RowsK|RowsMlx:FMT, got '{args.only}'")
        only = (m.group(1), int(m.group(2)))
    bins = [b for b in (args.old, args.new) if b]
    syms = {}
    for b in bins:
        try:
            syms[b] = symbols(b)
        except (subprocess.CalledProcessError, FileNotFoundError) as e:
            detail = e.stderr.strip() if isinstance(e, subprocess.CalledProcessError) else str(e)
            print(f"kernel_insns: {b}: cannot read its symbols ({detail})", file=sys.stderr)
            sys.exit(2)
    keys = sorted(k for s in syms.values() for k in s
                  if k[2] in args.rows and k[3] == 2 and (only is None or k[:2] == only))
    keys = sorted(set(keys))
    if not keys:
        print("kernel_insns: no int8 kernel instantiation matches", file=sys.stderr)
        sys.exit(1)
    show = lambda c: " / ".join(map(str, c)) if c else "absent"
    head = "insns / vpdpbusd / FMAs / stack / calls / reloads"
    if args.old:
        print(f"| kernel <fmt, rows, levels> | old: {head} | new | insns new / old |")
        print("|---|---|---|---|")
    else:
        print(f"| kernel <fmt, rows, levels> | {head} |")
        print("|---|---|")
    for k in keys:
        c = {b: counts(b, *syms[b][k]) if k in syms[b] else None for b in bins}
        name = f"{k[0]}<{k[1]}, {k[2]}, {k[3]}>"
        if not args.old:
            print(f"| {name} | {show(c[args.new])} |")
            continue
        ca, cb = c[args.old], c[args.new]
        ratio = f"{cb[0] / ca[0]:.3f}" if ca and cb else "-"
        print(f"| {name} | {show(ca)} | {show(cb)} | {ratio} |")


if __name__ == "__main__":
    main()
