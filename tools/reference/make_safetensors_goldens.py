#!/usr/bin/python3
"""Writes the safetensors goldens in tests/goldens/safetensors/ by hand.

An independent writer of the format (numpy + struct, no safetensors package),
so lumen's reader is checked against bytes it did not produce, and lumen's
writer against the reference writer's layout:

  mixed.safetensors      every supported dtype, a scalar, a zero-size and a 5-D
                         tensor; pretty-printed header with keys in a shuffled
                         order and data laid out in yet another order.
  unpadded.safetensors   header length not a multiple of 8 (old writers).
  canonical.safetensors  laid out as huggingface/safetensors' serialize does:
                         tensors sorted by descending dtype alignment then name,
                         compact JSON with "__metadata__" first, padded with
                         spaces to 8 bytes. lumen's writer must match it byte
                         for byte (safetensors_test.cc).

Values are simple formulas restated in safetensors_test.cc.
Run: /usr/bin/python3 tools/reference/make_safetensors_goldens.py
"""
import json
import os
import struct

import numpy as np

OUT = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "goldens", "safetensors")


def bf16_bytes(values):
    # Values chosen exactly representable in bf16: keep the top 16 bits.
    bits = np.asarray(values, dtype="<f4").view("<u4")
    assert np.all((bits & 0xFFFF) == 0), "not exactly representable in bf16"
    return (bits >> 16).astype("<u2").tobytes()


def tensors():
    return {
        "a.f32": ("F32", [2, 3], (np.arange(6, dtype="<f4") * 0.5 - 1.0).tobytes()),
        "b.f16": ("F16", [4], np.array([1.0, -2.5, 65504.0, 2.0**-24], dtype="<f2").tobytes()),
        "c.bf16": ("BF16", [3], bf16_bytes([1.0, -3.140625, 2.0**100])),
        "d.i64": ("I64", [2, 2], np.array([-1, 2**40, 3, -(2**62)], dtype="<i8").tobytes()),
        "e.u8": ("U8", [5], bytes([0, 1, 127, 128, 255])),
        "f.bool": ("BOOL", [3], bytes([1, 0, 1])),
        "g.i32": ("I32", [], np.array([-7], dtype="<i4").tobytes()),
        "h.empty": ("F32", [0, 4], b""),
        "i.f64": ("F64", [2], np.array([np.pi, -1e300], dtype="<f8").tobytes()),
        "j.i8": ("I8", [4], np.array([-128, -1, 0, 127], dtype="<i1").tobytes()),
        "k.i16": ("I16", [2], np.array([-32768, 32767], dtype="<i2").tobytes()),
        "l.u32": ("U32", [2], np.array([0, 0xDEADBEEF], dtype="<u4").tobytes()),
        "m.u16": ("U16", [1], np.array([65535], dtype="<u2").tobytes()),
        "n.5d": ("F32", [1, 2, 1, 2, 2], np.arange(8, dtype="<f4").tobytes()),
    }


def write(path, header_obj_items, data, pad_to_8, indent=None):
    header = {}
    for k, v in header_obj_items:
        header[k] = v
    if indent is None:
        text = json.dumps(header, separators=(",", ":"))
    else:
        text = json.dumps(header, indent=indent)
    raw = text.encode("utf-8")
    if pad_to_8:
        raw += b" " * ((8 - len(raw) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        f.write(data)
    return len(raw)


def mixed():
    ts = tensors()
    # Data order: reverse alphabetical; header key order: a fixed shuffle.
    data_order = sorted(ts, reverse=True)
    offsets, data, off = {}, b"", 0
    for name in data_order:
        blob = ts[name][2]
        offsets[name] = [off, off + len(blob)]
        data += blob
        off += len(blob)
    key_order = ["g.i32", "a.f32", "n.5d", "c.bf16", "m.u16", "e.u8", "__metadata__", "h.empty",
                 "b.f16", "l.u32", "d.i64", "k.i16", "f.bool", "j.i8", "i.f64"]
    items = []
    for k in key_order:
        if k == "__metadata__":
            items.append((k, {"format": "pt", "made_by": "make_safetensors_goldens.py"}))
        else:
            dt, shape, _ = ts[k]
            # Key order inside an entry differs from the reference writer too.
            items.append((k, {"data_offsets": offsets[k], "shape": shape, "dtype": dt}))
    write(os.path.join(OUT, "mixed.safetensors"), items, data, pad_to_8=True, indent=2)


def unpadded():
    a = np.array([1.0, 2.0, 3.0], dtype="<f4").tobytes()
    items = [("x", {"dtype": "F32", "shape": [3], "data_offsets": [0, 12]}),
             ("y", {"dtype": "U8", "shape": [1], "data_offsets": [12, 13]})]
    n = write(os.path.join(OUT, "unpadded.safetensors"), items, a + bytes([42]), pad_to_8=False)
    assert n % 8 != 0, n


RANK = ["BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "I16", "U16", "F16", "BF16", "I32", "U32",
        "F32", "F64", "I64", "U64"]


def canonical():
    ts = tensors()
    order = sorted(ts, key=lambda n: (-RANK.index(ts[n][0]), n))
    items = [("__metadata__", {"format": "pt", "made_by": "make_safetensors_goldens.py"})]
    data, off = b"", 0
    for name in order:
        dt, shape, blob = ts[name]
        items.append((name, {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(blob)]}))
        data += blob
        off += len(blob)
    write(os.path.join(OUT, "canonical.safetensors"), items, data, pad_to_8=True)


if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    mixed()
    unpadded()
    canonical()
    with open(os.path.join(OUT, "README.md"), "w") as f:
        f.write("Made by tools/reference/make_safetensors_goldens.py (see its docstring).\n")
