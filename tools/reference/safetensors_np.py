#!/usr/bin/python3
"""Minimal safetensors reader/writer in plain numpy (no `safetensors` package).

Format (https://huggingface.co/docs/safetensors): 8-byte little-endian u64
header length N, then N bytes of UTF-8 JSON mapping tensor name ->
{"dtype", "shape", "data_offsets": [begin, end]} (offsets relative to the first
byte after the header) plus an optional "__metadata__" string map, then the
raw little-endian tensor bytes.

Reading returns numpy arrays; F16 stays float16, BF16 is widened exactly to
float32 (bf16 bits << 16). Everything that can be wrong in a file raises
ValueError naming the file, the tensor and the reason.

Used only by tools/reference (golden generation and its tests), never at run
time by lumen.
"""

import json
import os
import struct

import numpy as np

# dtype tag -> (numpy dtype of the stored element, element size in bytes)
_DTYPES = {
    "F64": (np.dtype("<f8"), 8),
    "F32": (np.dtype("<f4"), 4),
    "F16": (np.dtype("<f2"), 2),
    "BF16": (np.dtype("<u2"), 2),  # widened to float32 after reading
    "I64": (np.dtype("<i8"), 8),
    "I32": (np.dtype("<i4"), 4),
    "I16": (np.dtype("<i2"), 2),
    "I8": (np.dtype("i1"), 1),
    "U8": (np.dtype("u1"), 1),
    "BOOL": (np.dtype("?"), 1),
}


def bf16_bits_to_f32(bits):
    """uint16 array of bfloat16 bit patterns -> float32 array (exact)."""
    bits = np.asarray(bits, dtype=np.uint16)
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16_bits(x):
    """float32 -> bfloat16 bit patterns, round-to-nearest-even (NaN kept NaN)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    out = rounded.astype(np.uint16)
    nan = np.isnan(x)
    out[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)
    return out


def read_header(path):
    """Returns (header dict without __metadata__, metadata dict, data start offset)."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise ValueError(f"{path}: file shorter than the 8-byte header length")
        (n,) = struct.unpack("<Q", head)
        if n > size - 8:
            raise ValueError(f"{path}: header length {n} exceeds file size {size}")
        raw = f.read(n)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: header is not valid UTF-8 JSON: {e}") from e
    if not isinstance(header, dict):
        raise ValueError(f"{path}: header is not a JSON object")
    meta = header.pop("__metadata__", {}) or {}
    return header, meta, 8 + n


def read_safetensors(path, names=None):
    """Reads tensors of one .safetensors file into a dict name -> np.ndarray.

    names: optional iterable restricting which tensors are read.
    """
    header, _, start = read_header(path)
    size = os.path.getsize(path)
    data_len = size - start
    out = {}
    with open(path, "rb") as f:
        for name, info in header.items():
            if names is not None and name not in names:
                continue
            try:
                dtype_tag = info["dtype"]
                shape = [int(s) for s in info["shape"]]
                begin, end = (int(v) for v in info["data_offsets"])
            except (KeyError, TypeError, ValueError) as e:
                raise ValueError(f"{path}: tensor {name!r}: malformed entry {info!r}") from e
            if dtype_tag not in _DTYPES:
                raise ValueError(f"{path}: tensor {name!r}: unsupported dtype {dtype_tag}")
            npdt, esize = _DTYPES[dtype_tag]
            count = int(np.prod(shape)) if shape else 1
            if any(s < 0 for s in shape):
                raise ValueError(f"{path}: tensor {name!r}: negative dimension in {shape}")
            if not (0 <= begin <= end <= data_len):
                raise ValueError(
                    f"{path}: tensor {name!r}: data_offsets [{begin}, {end}] outside data of {data_len} bytes")
            if end - begin != count * esize:
                raise ValueError(
                    f"{path}: tensor {name!r}: {end - begin} bytes for shape {shape} {dtype_tag} "
                    f"(expected {count * esize})")
            f.seek(start + begin)
            buf = f.read(end - begin)
            arr = np.frombuffer(buf, dtype=npdt, count=count).reshape(shape)
            if dtype_tag == "BF16":
                arr = bf16_bits_to_f32(arr).reshape(shape)
            out[name] = arr.copy()
    return out


def tensor_dtypes(path):
    """name -> dtype tag as stored, for one file."""
    header, _, _ = read_header(path)
    return {k: v["dtype"] for k, v in header.items()}


def load_model_dir(model_dir):
    """Loads all tensors of a Hugging Face model directory.

    Accepts model.safetensors, or model.safetensors.index.json with its shards
    (weight_map name -> shard file). Returns (tensors, dtype_tags).
    """
    single = os.path.join(model_dir, "model.safetensors")
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index, "r", encoding="utf-8") as f:
            try:
                idx = json.load(f)
            except json.JSONDecodeError as e:
                raise ValueError(f"{index}: invalid JSON: {e}") from e
        weight_map = idx.get("weight_map")
        if not isinstance(weight_map, dict):
            raise ValueError(f"{index}: missing object 'weight_map'")
        shards = sorted(set(weight_map.values()))
        tensors, dtypes = {}, {}
        for shard in shards:
            p = os.path.join(model_dir, shard)
            if not os.path.exists(p):
                raise ValueError(f"{index}: shard {shard!r} does not exist")
            wanted = {n for n, s in weight_map.items() if s == shard}
            got = read_safetensors(p, names=wanted)
            missing = wanted - set(got)
            if missing:
                raise ValueError(f"{p}: tensors listed in the index are missing: {sorted(missing)[:5]}")
            tensors.update(got)
            tags = tensor_dtypes(p)
            dtypes.update({n: tags[n] for n in got})
        return tensors, dtypes
    if os.path.exists(single):
        return read_safetensors(single), tensor_dtypes(single)
    raise ValueError(f"{model_dir}: neither model.safetensors nor model.safetensors.index.json found")


def write_safetensors(path, tensors, dtype="F32", metadata=None):
    """Writes name -> array as one .safetensors file.

    dtype: "F32", "F16" or "BF16" for floating tensors (a per-tensor dict
    name -> tag is accepted too). Integer arrays are written as I32/I64 by
    their own dtype. Header padded with spaces to a multiple of 8 like the
    reference implementation.
    """
    entries = {}
    blobs = []
    offset = 0
    for name in sorted(tensors):
        a = np.asarray(tensors[name])
        tag = dtype[name] if isinstance(dtype, dict) else dtype
        if a.dtype.kind in "iu":
            tag = {np.dtype("int64"): "I64", np.dtype("int32"): "I32"}.get(a.dtype, "I64")
            data = a.astype("<" + ("i8" if tag == "I64" else "i4")).tobytes()
        elif tag == "F32":
            data = a.astype("<f4").tobytes()
        elif tag == "F16":
            data = a.astype("<f2").tobytes()
        elif tag == "BF16":
            data = f32_to_bf16_bits(a.astype(np.float32)).astype("<u2").tobytes()
        elif tag == "F64":
            data = a.astype("<f8").tobytes()
        else:
            raise ValueError(f"write_safetensors: unsupported dtype {tag} for {name}")
        entries[name] = {"dtype": tag, "shape": list(a.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    if metadata:
        entries["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    head = json.dumps(entries, separators=(",", ":")).encode("utf-8")
    head += b" " * ((8 - len(head) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)))
        f.write(head)
        for b in blobs:
            f.write(b)
