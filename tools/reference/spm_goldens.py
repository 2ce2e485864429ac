#!/usr/bin/python3
"""Writes SentencePiece goldens for lumen's SPM tokenizers over
tests/goldens/tokenizers/corpus.txt, using python3-sentencepiece (Debian).

* tok512.jsonl: stories260K/tok512.model with remove_extra_whitespaces turned
  off (run.c keeps every space; see fixtures/tokenizers/test-vectors/README.md).
* llama2.jsonl: a SentencePiece BPE model built from the vocabulary inside
  llama-2-tiny-random.gguf (pieces, scores, types) with Llama-2's normalizer
  settings (identity, dummy prefix, keep whitespace, byte fallback).

There is no protobuf module on the system, so the few ModelProto fields needed
are written by hand (field numbers from sentencepiece_model.proto).
Usage: /usr/bin/python3 tools/reference/spm_goldens.py [fixtures_dir]
"""
import json
import os
import struct
import sys

import sentencepiece as spm

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIX = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, '..', 'shared', 'fixtures')
GOLD = os.path.join(ROOT, 'tests', 'goldens', 'tokenizers')


def varint(n):
    out = b''
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])


def field(num, wire, payload):
    key = varint((num << 3) | wire)
    if wire == 2:
        return key + varint(len(payload)) + payload
    return key + payload


def read_varint(b, i):
    n = shift = 0
    while True:
        c = b[i]
        i += 1
        n |= (c & 0x7F) << shift
        shift += 7
        if not c & 0x80:
            return n, i


def fields(b):
    i = 0
    while i < len(b):
        key, i = read_varint(b, i)
        num, wire = key >> 3, key & 7
        start = i
        if wire == 0:
            _, i = read_varint(b, i)
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        elif wire == 2:
            ln, i = read_varint(b, i)
            start = i
            i += ln
        yield num, wire, b[start:i] if wire == 2 else b[start:i]


def encode_msg(items):
    out = b''
    for num, wire, payload in items:
        if wire == 0 and isinstance(payload, int):
            payload = varint(payload)
        out += field(num, wire, payload)
    return out


def normalizer(keep_fields, overrides):
    items = [f for f in keep_fields if f[0] not in overrides]
    for num, val in overrides.items():
        items.append((num, 0, val) if isinstance(val, int) else (num, 2, val))
    return encode_msg(items)


def tok512_model():
    raw = open(os.path.join(FIX, 'stories260K', 'tok512.model'), 'rb').read()
    items = list(fields(raw))
    out = []
    for num, wire, payload in items:
        if num == 3:  # normalizer_spec: keep every space
            payload = normalizer(list(fields(payload)), {4: 0})
        out.append((num, wire, payload))
    return encode_msg(out)


def gguf_vocab(path):
    b = open(path, 'rb').read()
    off = 0

    def rd(fmt):
        nonlocal off
        v = struct.unpack_from('<' + fmt, b, off)
        off += struct.calcsize('<' + fmt)
        return v[0]

    def rstr():
        nonlocal off
        n = rd('Q')
        s = b[off:off + n]
        off += n
        return s

    sizes = {0: 'B', 1: 'b', 2: 'H', 3: 'h', 4: 'I', 5: 'i', 6: 'f', 7: '?', 10: 'Q', 11: 'q', 12: 'd'}

    def rval(t):
        if t == 8:
            return rstr()
        if t == 9:
            et = rd('I')
            n = rd('Q')
            return [rval(et) for _ in range(n)]
        return rd(sizes[t])

    assert b[:4] == b'GGUF'
    off = 4
    rd('I')
    rd('Q')
    nkv = rd('Q')
    kv = {}
    for _ in range(nkv):
        k = rstr().decode()
        kv[k] = rval(rd('I'))
    return kv


def llama2_model():
    kv = gguf_vocab(os.path.join(FIX, 'llama-2-tiny-random-gguf', 'llama-2-tiny-random.gguf'))
    pieces = b''
    for p, s, t in zip(kv['tokenizer.ggml.tokens'], kv['tokenizer.ggml.scores'],
                       kv['tokenizer.ggml.token_type']):
        pieces += field(1, 2, encode_msg([(1, 2, p), (2, 5, struct.pack('<f', s)), (3, 0, t)]))
    trainer = encode_msg([(3, 0, 2), (4, 0, len(kv['tokenizer.ggml.tokens'])), (35, 0, 1)])
    norm = encode_msg([(1, 2, b'identity'), (3, 0, 1), (4, 0, 0), (5, 0, 1)])
    return pieces + field(2, 2, trainer) + field(3, 2, norm)


def read_cases():
    raw = open(os.path.join(GOLD, 'corpus.txt'), 'rb').read()
    parts = raw.split(b'\n__lumen_case__\n')
    if parts and parts[-1] == b'':
        parts.pop()
    return [p.decode('utf-8', errors='replace') for p in parts]


def main():
    cases = read_cases()
    for name, proto, what in [
            ('tok512', tok512_model(), 'stories260K/tok512.model with remove_extra_whitespaces=false'),
            ('llama2', llama2_model(), 'SentencePiece BPE built from llama-2-tiny-random.gguf vocab')]:
        sp = spm.SentencePieceProcessor(model_proto=proto)
        lines = [json.dumps({'generated_by': 'tools/reference/spm_goldens.py: sentencepiece %s, %s, '
                             'encode without BOS, decode(ids)' % (spm.__version__, what)})]
        for text in cases:
            ids = sp.encode(text)
            lines.append(json.dumps({'text': text, 'ids': ids, 'decoded': sp.decode(ids)},
                                    ensure_ascii=False))
        with open(os.path.join(GOLD, name + '.jsonl'), 'w', encoding='utf-8') as f:
            f.write('\n'.join(lines) + '\n')
        print(name, len(cases))


if __name__ == '__main__':
    main()
