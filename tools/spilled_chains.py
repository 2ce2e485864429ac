#!/usr/bin/env python3
"""Lists the functions of a disassembly whose vector accumulators go through
the stack: an FMA or add that reads a %rsp slot, and a later store of a vector
register to that same slot in the same function (the compiler ran out of the
16 AVX2 registers and spilled a loop-carried sum, so its chain pays a store
and a load per step). A heuristic for finding them, not a proof: read the
loop it names.

  objdump -d --no-show-raw-insn -C build/dev/lumen | tools/spilled_chains.py [SUBSTRING]

SUBSTRING (default int8_avx2) keeps the functions whose names contain it.
Prints "count name" per function, most first.
"""
import re
import sys

READ = re.compile(r"\b(vfn?m(?:add|sub)\w*|vaddps|vpaddd)\s+(-?0x[0-9a-f]+)\(%rsp\)")
STORE = re.compile(r"\bvmov(?:aps|ups|dqa|dqu)\s+%ymm\d+,(-?0x[0-9a-f]+)\(%rsp\)")
START = re.compile(r"^[0-9a-f]+ <(.*)>:$")


def main():
    keep = sys.argv[1] if len(sys.argv) > 1 else "int8_avx2"
    counts, name, read = {}, None, set()
    for line in sys.stdin:
        m = START.match(line)
        if m:
            name, read = m.group(1), set()
            continue
        if name is None or keep not in name:
            continue
        m = READ.search(line)
        if m:
            read.add(m.group(2))
        m = STORE.search(line)
        if m and m.group(1) in read:
            counts[name] = counts.get(name, 0) + 1
    for n, c in sorted(counts.items(), key=lambda kv: -kv[1]):
        print(c, re.sub(r"\(.*", "", n.replace("(anonymous namespace)::", "")))


if __name__ == "__main__":
    main()
