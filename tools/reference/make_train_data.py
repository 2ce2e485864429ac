#!/usr/bin/python3
"""Deterministic efficacy datasets for `lumen train` (issue 14, proof 2).

Usage:
  make_train_data.py OUT            writes OUT/uppercase/{train,valid}.jsonl
                                    and OUT/style/{train,valid}.jsonl
  make_train_data.py OUT --stats TOK512_BIN
                                    also prints token-length statistics with
                                    a run.c-style encoder built from tok512.bin

The committed copy lives in tests/data/train (OUT = tests/data/train). The
model these sets are for is stories260K: a 260K-parameter Llama trained on
TinyStories with a 512-piece SentencePiece vocabulary. So every text is
short, simple children's-story English built from templates and word lists
written for this script (nothing is copied from TinyStories).

Layout is mlx-lm's: one JSON object per line, UTF-8, keys sorted, '\n' line
ends. Row shapes:
  uppercase: {"prompt", "chosen", "rejected"}  (preference rows)
  style:     {"prompt", "completion"}          (SFT rows)

Text convention: a prompt never ends with a space, and every response
(chosen, rejected, completion) starts with exactly one space, so the full
text is plain concatenation prompt + response.

Everything is a function of the fixed seeds below (Python's `random.Random`,
whose sequence for a given integer seed is stable across Python 3
versions), so rerunning the script reproduces the committed files byte for
byte.
"""

import argparse
import json
import os
import random
import struct
import sys

MADE_BY = "tools/reference/make_train_data.py"

NAMES_GIRL = ["Lily", "Mia", "Sue", "Anna", "Lucy", "Amy", "Sara", "Jane", "Kim", "Zoe"]
NAMES_BOY = ["Ben", "Tim", "Max", "Sam", "Jack", "Leo", "Bob", "Joe", "Dan", "Finn"]
ADJ = ["little", "small", "happy", "kind", "shy", "brave", "silly", "curious"]
ANIMALS = ["dog", "cat", "bird", "bunny", "frog", "duck", "bear", "fox", "mouse", "puppy"]
TOYS = ["ball", "kite", "doll", "car", "truck", "boat", "drum", "teddy bear", "block", "hat"]
COLORS = ["red", "blue", "green", "yellow", "pink", "big", "shiny", "soft"]
PLACES = ["park", "garden", "forest", "yard", "house", "pond", "beach", "school"]
FOODS = ["apple", "cake", "cookie", "banana", "sandwich", "pie"]
FOODS_PLURAL = ["apples", "cakes", "cookies", "bananas", "sandwiches", "pies"]


def _kid(rng):
    if rng.random() < 0.5:
        return rng.choice(NAMES_GIRL), "girl", "She", "her"
    return rng.choice(NAMES_BOY), "boy", "He", "his"


# ---------------------------------------------------------------- uppercase

def _opening(rng):
    """(prompt, possessive) for a story opening that ends with a subject."""
    name, kind, subj, poss = _kid(rng)
    k = rng.randrange(5)
    if k == 0:
        return f"Once upon a time, there was a {rng.choice(ADJ)} {kind} named {name}. {subj}", poss
    if k == 1:
        return f"One day, {name} went to the {rng.choice(PLACES)}. {subj}", poss
    if k == 2:
        return f"{name} had a {rng.choice(COLORS)} {rng.choice(TOYS)}. {subj}", poss
    if k == 3:
        animal = rng.choice(ANIMALS)
        return f"Once upon a time, there was a {rng.choice(ADJ)} {animal}. The {animal}", "its"
    return f"{name} and {rng.choice(NAMES_GIRL + NAMES_BOY)} were friends. One day, {name}", poss


def _continuation(rng, poss):
    """A 5..12 word continuation starting with a verb, ending with '.'."""
    k = rng.randrange(10)
    if k == 0:
        s = f"loved to play with {poss} {rng.choice(TOYS)} in the {rng.choice(PLACES)}."
    elif k == 1:
        s = f"saw a {rng.choice(COLORS)} {rng.choice(ANIMALS)} near the {rng.choice(PLACES)}."
    elif k == 2:
        s = f"wanted to find a {rng.choice(COLORS)} {rng.choice(TOYS)} for {poss} friend."
    elif k == 3:
        s = f"was very happy and smiled at {poss} mom."
    elif k == 4:
        s = f"ran to the {rng.choice(PLACES)} to look for the {rng.choice(ANIMALS)}."
    elif k == 5:
        s = f"ate a {rng.choice(FOODS)} and felt good."
    elif k == 6:
        s = f"found a {rng.choice(TOYS)} under a big tree."
    elif k == 7:
        s = f"was sad because {poss} {rng.choice(TOYS)} was lost."
    elif k == 8:
        s = f"went to the {rng.choice(PLACES)} with {poss} dad and played all day."
    else:
        s = f"said hello to a {rng.choice(ADJ)} {rng.choice(ANIMALS)} and they became friends."
    n = len(s.split())
    assert 5 <= n <= 12, (s, n)
    return " " + s


def uppercase_rows(seed, count, exclude):
    rng = random.Random(seed)
    rows, seen = [], set(exclude)
    while len(rows) < count:
        prompt, poss = _opening(rng)
        cont = _continuation(rng, poss)
        key = prompt + cont
        if key in seen:
            continue
        seen.add(key)
        rows.append({"prompt": prompt, "chosen": cont.upper(), "rejected": cont})
    return rows


# -------------------------------------------------------------------- style
# SFT style task: whoever the story is about, the hero is named Tom, and the
# story ends with "The end." Prompts stop right before the name is due.

def _style_prompt(rng):
    k = rng.randrange(5)
    if k == 0:
        return f"Once upon a time, there was a {rng.choice(ADJ)} {rng.choice(['boy', 'girl'])} named"
    if k == 1:
        return f"Once upon a time, there was a {rng.choice(ADJ)} {rng.choice(ANIMALS)} named"
    if k == 2:
        return f"One day, a {rng.choice(ADJ)} {rng.choice(['boy', 'girl', 'kid'])} named"
    if k == 3:
        return f"There was a {rng.choice(COLORS)} {rng.choice(ANIMALS)} in the {rng.choice(PLACES)}. Its name was"
    return f"In a small house lived a {rng.choice(ADJ)} {rng.choice(['boy', 'girl', 'child'])} called"


def _style_completion(rng):
    first = rng.choice([
        f"Tom liked to play with a {rng.choice(COLORS)} {rng.choice(TOYS)}.",
        f"Tom went to the {rng.choice(PLACES)} every day.",
        f"Tom had a friend, a {rng.choice(ADJ)} {rng.choice(ANIMALS)}.",
        f"Tom loved to eat {rng.choice(FOODS_PLURAL)}.",
        f"Tom was {rng.choice(['happy', 'kind', 'brave', 'shy'])} and liked to help.",
    ])
    second = rng.choice([
        f"One day, Tom found a {rng.choice(TOYS)} in the {rng.choice(PLACES)}.",
        f"Tom shared {rng.choice(['it', 'a ' + rng.choice(FOODS)])} with {rng.choice(NAMES_GIRL + NAMES_BOY)}.",
        "Tom and his mom played all day.",
        f"Tom saw a {rng.choice(COLORS)} {rng.choice(ANIMALS)} and said hello.",
    ])
    return f" Tom. {first} {second} Tom was very happy. The end."


def style_rows(seed, count, exclude):
    rng = random.Random(seed)
    rows, seen = [], set(exclude)
    while len(rows) < count:
        prompt = _style_prompt(rng)
        comp = _style_completion(rng)
        key = prompt + comp
        if key in seen:
            continue
        seen.add(key)
        rows.append({"prompt": prompt, "completion": comp})
    return rows


# -------------------------------------------------------------------- files

def write_jsonl(path, rows):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for r in rows:
            f.write(json.dumps(r, sort_keys=True, ensure_ascii=False) + "\n")
    size = os.path.getsize(path)
    assert size < 100_000, (path, size)
    return size


def make(out):
    sizes = {}
    up_train = uppercase_rows(1401, 200, ())
    up_valid = uppercase_rows(1402, 40, {r["prompt"] + r["rejected"] for r in up_train})
    st_train = style_rows(1403, 200, ())
    st_valid = style_rows(1404, 40, {r["prompt"] + r["completion"] for r in st_train})
    for sub, name, rows in (("uppercase", "train", up_train), ("uppercase", "valid", up_valid),
                            ("style", "train", st_train), ("style", "valid", st_valid)):
        p = os.path.join(out, sub, f"{name}.jsonl")
        sizes[p] = (len(rows), write_jsonl(p, rows))
    return sizes


# ------------------------------------------------- optional token statistics

def load_tok512(path):
    with open(path, "rb") as f:
        data = f.read()
    (max_len,) = struct.unpack_from("<i", data, 0)
    off, pieces, scores = 4, [], []
    while off < len(data):
        score, n = struct.unpack_from("<fi", data, off)
        off += 8
        pieces.append(data[off:off + n])
        scores.append(score)
        off += n
    return pieces, scores


def encode_runc(text, pieces, scores):
    """run.c's encoder: BOS, dummy-prefix space, byte fallback, greedy merges."""
    lookup = {p: i for i, p in enumerate(pieces)}
    ids = [1]
    text = " " + text
    for ch in text:
        b = ch.encode("utf-8")
        if b in lookup:
            ids.append(lookup[b])
        else:
            ids.extend(x + 3 for x in b)
    while True:
        best, best_i, best_id = -1e30, -1, -1
        for i in range(1, len(ids) - 1):
            m = pieces[ids[i]] + pieces[ids[i + 1]]
            j = lookup.get(m)
            if j is not None and scores[j] > best:
                best, best_i, best_id = scores[j], i, j
        if best_i < 0:
            break
        ids[best_i:best_i + 2] = [best_id]
    return ids


def stats(out, tok):
    pieces, scores = load_tok512(tok)
    for sub, keys in (("uppercase", ("prompt", "chosen", "rejected")), ("style", ("prompt", "completion"))):
        for name in ("train", "valid"):
            with open(os.path.join(out, sub, f"{name}.jsonl"), encoding="utf-8") as f:
                rows = [json.loads(line) for line in f]
            parts = []
            for k in keys:
                lens = [len(encode_runc(r[k], pieces, scores)) - 1 for r in rows]
                parts.append(f"{k} tokens min {min(lens)} mean {sum(lens) / len(lens):.1f} max {max(lens)}")
            print(f"{sub}/{name}: {len(rows)} rows; " + "; ".join(parts))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--stats", metavar="TOK512_BIN", help="print token-length statistics")
    a = ap.parse_args()
    for p, (n, size) in make(a.out).items():
        print(f"{p}: {n} rows, {size} bytes")
    if a.stats:
        stats(a.out, a.stats)


if __name__ == "__main__":
    sys.exit(main())
