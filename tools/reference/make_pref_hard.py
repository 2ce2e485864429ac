#!/usr/bin/python3
"""Deterministic 'feeling matches the event' preference set (issue 17's hard task).

Usage:
  make_pref_hard.py OUT     writes OUT/feeling/{train,valid}.jsonl
                            (the committed copy: OUT = tests/data/train)

Each row is {"prompt", "chosen", "rejected"}. The prompt is a short story
opening in which something good or bad happens to the hero and stops at
"<Name> felt"; chosen and rejected are the same continuation except for one
word: the feeling. chosen has the feeling that matches the event ("happy"
after a good event, "sad" after a bad one), rejected the other one. Half the
rows are good events, half bad, so no context-free answer wins: the model has
to read the event. Everything after the feeling word is shared, which is what
makes the task hard for ORPO: the easy way to widen the odds ratio is to
crush the tokens that follow the rejected word, and those are the same
tokens that follow the chosen one (likelihood displacement).

The text is simple story English for stories260K (TinyStories, 512-piece
vocabulary), built from this script's own templates, in the layout and text
convention of make_train_data.py: keys sorted, a prompt never ends with a
space, every response starts with exactly one space.

Deterministic: fixed seeds and Python's random.Random, so a rerun writes
byte-identical files. Valid rows use events and names in the same lists but
no prompt of valid appears in train.
"""

import argparse
import json
import os
import random
import sys

GIRLS = ["Lily", "Mia", "Sue", "Anna", "Lucy", "Amy", "Sara", "Jane", "Kim", "Zoe"]
BOYS = ["Ben", "Tim", "Max", "Sam", "Jack", "Leo", "Bob", "Joe", "Dan", "Finn"]
ADJ = ["little", "small", "kind", "shy", "brave", "silly", "curious"]
TOYS = ["ball", "kite", "doll", "car", "truck", "boat", "drum", "teddy bear", "hat"]
COLORS = ["red", "blue", "green", "yellow", "pink", "shiny", "soft"]
PLACES = ["park", "garden", "forest", "yard", "pond", "beach", "school"]
PETS = ["dog", "cat", "bird", "bunny", "puppy", "kitten"]

# {p}: possessive (her/his), {s}: subject pronoun (she/he)
GOOD = [
    "found a {c} {t} in the {pl}",
    "got a new {c} {t} from {p} mom",
    "made a new friend at the {pl}",
    "ate a big cake with {p} dad",
    "saw a pretty rainbow over the {pl}",
    "won a race at the {pl}",
    "got a little {pet} for {p} birthday",
    "found {p} lost {t} under the bed",
    "played with {p} {pet} all day",
    "went to the {pl} with {p} best friend",
]
BAD = [
    "lost {p} {c} {t} in the {pl}",
    "broke {p} new {t}",
    "fell down and hurt {p} knee",
    "could not find {p} {pet}",
    "dropped {p} ice cream on the ground",
    "saw the rain fall on the {pl} all day",
    "had a big fight with {p} friend",
    "was all alone at the {pl}",
    "saw {p} {t} break into pieces",
    "got lost in the {pl}",
]
OPEN = [
    "Once upon a time, there was a {a} {k} named {n}. One day, {s} {e}.",
    "One day, {n} went out to play. {S} {e}.",
    "{n} was a {a} {k}. Today {s} {e}.",
    "There was a {a} {k} called {n}. In the morning, {s} {e}.",
]
# The shared tail after the feeling word (identical in chosen and rejected).
TAIL = [
    " and went to tell {p} mom.",
    " and sat down under a big tree.",
    " and gave {p} {pet} a hug.",
    ". {S} went home and had some soup.",
    " all day long.",
    ". Then {s} went to sleep.",
    " and looked up at the sky.",
    ". {S} told {p} dad about it.",
]


def row(rng):
    if rng.random() < 0.5:
        n, k, s, p = rng.choice(GIRLS), "girl", "she", "her"
    else:
        n, k, s, p = rng.choice(BOYS), "boy", "he", "his"
    good = rng.random() < 0.5
    f = dict(c=rng.choice(COLORS), t=rng.choice(TOYS), pl=rng.choice(PLACES), pet=rng.choice(PETS),
             p=p, s=s, S=s.capitalize(), n=n, k=k, a=rng.choice(ADJ))
    f["e"] = rng.choice(GOOD if good else BAD).format(**f)
    prompt = rng.choice(OPEN).format(**f) + f" {n} felt"
    tail = rng.choice(TAIL).format(**f)
    w, l = ("happy", "sad") if good else ("sad", "happy")
    return {"prompt": prompt, "chosen": f" {w}{tail}", "rejected": f" {l}{tail}"}, good


def rows(seed, count, exclude):
    rng = random.Random(seed)
    out, seen, n_good = [], set(exclude), 0
    while len(out) < count:
        r, good = row(rng)
        if r["prompt"] in seen:
            continue
        # Balance exactly: half good, half bad.
        if good and n_good >= count // 2 or not good and len(out) - n_good >= count - count // 2:
            continue
        seen.add(r["prompt"])
        n_good += good
        out.append(r)
    return out


def write_jsonl(path, rs):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for r in rs:
            f.write(json.dumps(r, sort_keys=True, ensure_ascii=False) + "\n")
    size = os.path.getsize(path)
    assert size < 100_000, (path, size)
    return size


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    a = ap.parse_args()
    train = rows(1701, 240, ())
    valid = rows(1702, 48, {r["prompt"] for r in train})
    for name, rs in (("train", train), ("valid", valid)):
        p = os.path.join(a.out, "feeling", f"{name}.jsonl")
        print(f"{p}: {len(rs)} rows, {write_jsonl(p, rs)} bytes")


if __name__ == "__main__":
    sys.exit(main())
