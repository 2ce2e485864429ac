#!/usr/bin/python3
"""Writes the seed corpus for tests/fuzz/gguf_fuzz.cc into tests/fuzz/corpus/gguf/.

Small valid GGUF files (every metadata value type, nested arrays, every
quantized block type, a non-default alignment, v2) plus truncated copies.
Deterministic: rerunning rewrites identical files. Usage: make_gguf_seeds.py
"""
import os
import random
import struct

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "gguf")

# ggml type id -> (block elements, block bytes)
TYPES = {0: (1, 4), 1: (1, 2), 30: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24),
         8: (32, 34), 9: (32, 36), 10: (256, 84), 11: (256, 110), 12: (256, 144),
         13: (256, 176), 14: (256, 210), 15: (256, 292), 24: (1, 1), 25: (1, 2), 26: (1, 4),
         27: (1, 8), 28: (1, 8)}


def s(x):
    b = x.encode() if isinstance(x, str) else x
    return struct.pack("<Q", len(b)) + b


SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
          11: "<q", 12: "<d"}


def value(t, v):
    if t == 8:
        return s(v)
    if t == 9:
        et, items = v
        return struct.pack("<IQ", et, len(items)) + b"".join(value(et, i) for i in items)
    return struct.pack(SCALAR[t], v)


def gguf(kv, tensors, version=3, alignment=32):
    out = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kv))
    for k, t, v in kv:
        out += s(k) + struct.pack("<I", t) + value(t, v)
    off = 0
    offsets = []
    for name, ne, typ, data in tensors:
        off = (off + alignment - 1) // alignment * alignment
        offsets.append(off)
        out += s(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", n) for n in ne)
        out += struct.pack("<IQ", typ, off)
        off += len(data)
    out += b"\0" * (-len(out) % alignment)
    for (name, ne, typ, data), o in zip(tensors, offsets):
        out += b"\0" * (-len(out) % alignment)
        out += data
    return out


def tensor(rng, name, typ, rows, blocks=1):
    be, bb = TYPES[typ]
    data = bytearray(rng.randbytes(rows * blocks * bb))
    if typ in (2, 3, 6, 7, 8, 9):  # keep the f16 scales small and finite
        for i in range(0, len(data), bb):
            data[i:i + 2] = struct.pack("<e", 0.01)
    return (name, [be * blocks, rows], typ, bytes(data))


def main():
    rng = random.Random(1234)
    os.makedirs(OUT, exist_ok=True)
    files = {}
    files["empty.gguf"] = gguf([], [])
    kv = [("general.architecture", 8, "llama"), ("u8", 0, 255), ("i8", 1, -1), ("u16", 2, 7),
          ("i16", 3, -7), ("u32", 4, 1 << 31), ("i32", 5, -5), ("f32", 6, 0.5), ("bool", 7, True),
          ("u64", 10, 1 << 63), ("i64", 11, -(1 << 62)), ("f64", 12, 2.5),
          ("tokens", 9, (8, ["<unk>", "<s>", "\u2581the"])), ("ids", 9, (5, [1, 2, 3])),
          ("nested", 9, (9, [(4, [1, 2]), (8, ["a"])])), ("empty", 9, (0, []))]
    files["values.gguf"] = gguf(kv, [])
    tensors = [tensor(rng, f"t{typ}", typ, 2) for typ in sorted(TYPES)]
    files["types.gguf"] = gguf(kv[:1], tensors)
    files["align64_v2.gguf"] = gguf([("general.alignment", 4, 64)], tensors[:4], version=2,
                                     alignment=64)
    files["ranks.gguf"] = gguf([], [("r1", [32], 0, bytes(128)), ("r3", [2, 2, 2], 1, bytes(16)),
                                    ("r4", [256, 1, 1, 2], 12, rng.randbytes(288))])
    full = files["types.gguf"]
    for cut in (3, 11, 24, 40, 100, len(full) // 2, len(full) - 1):
        files[f"types_cut{cut}.gguf"] = full[:cut]
    for name, data in files.items():
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
