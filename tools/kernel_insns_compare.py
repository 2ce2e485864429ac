#!/usr/bin/python3
"""tools/kernel_insns_compare.py OLD NEW [MB ...]: every AVX512-VNNI int8
kernel instantiation (Rows, RowsK, RowsMlx) of two builds (lumen or
lumen_bench_kernels) side by side, from their disassembly: instructions,
vpdpbusd, FMAs and stack accesses, at the activation-row counts MB (default
1 and 4), two levels. For checking that a refactor left the hot code as it
was, or what a kernel change removed, where timings are the host's noise.
The names are matched whether the kernels sit in an anonymous namespace
(before session 44) or in int8_vnni's. Format numbers: tools/kernel_insns.sh.

  /usr/bin/python3 tools/kernel_insns_compare.py /tmp/kb_old build/dev/bench/lumen_bench_kernels
"""
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


def counts(binary, address, size):
    dis = subprocess.run(["objdump", "-d", "--no-show-raw-insn", f"--start-address={address}",
                          f"--stop-address={address + size}", binary],
                         capture_output=True, text=True, check=True).stdout
    lines = [l for l in dis.splitlines() if re.match(r"^ +[0-9a-f]+:\t", l)]
    return (len(lines), sum("vpdpbusd" in l for l in lines), sum("vfmadd" in l for l in lines),
            sum("(%rsp)" in l for l in lines))


def main():
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # piped into head: stop quietly
    if len(sys.argv) < 3:
        print(__doc__.strip().splitlines()[0], file=sys.stderr)
        sys.exit(2)
    old, new = sys.argv[1], sys.argv[2]
    try:
        rows = [int(a) for a in sys.argv[3:]] or [1, 4]
    except ValueError:
        print("kernel_insns_compare: MB must be integers", file=sys.stderr)
        sys.exit(2)
    try:
        a, b = symbols(old), symbols(new)
    except (subprocess.CalledProcessError, FileNotFoundError) as e:
        print(f"kernel_insns_compare: {e}", file=sys.stderr)
        sys.exit(2)
    keys = sorted(k for k in set(a) | set(b) if k[2] in rows and k[3] == 2)
    if not keys:
        print("kernel_insns_compare: no int8 kernels found", file=sys.stderr)
        sys.exit(1)
    print("| kernel <fmt, rows, levels> | old: insns / vpdpbusd / FMAs / stack | new | insns new / old |")
    print("|---|---|---|---|")
    for k in keys:
        ca = counts(old, *a[k]) if k in a else None
        cb = counts(new, *b[k]) if k in b else None
        show = lambda c: " / ".join(map(str, c)) if c else "absent"
        ratio = f"{cb[0] / ca[0]:.3f}" if ca and cb else "-"
        print(f"| {k[0]}<{k[1]}, {k[2]}, {k[3]}> | {show(ca)} | {show(cb)} | {ratio} |")


if __name__ == "__main__":
    main()
