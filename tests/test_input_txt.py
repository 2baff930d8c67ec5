import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_tiny_shakespeare_layout():
    with open(os.path.join(ROOT, "input.txt"), encoding="ascii") as f:  # plain ASCII
        text = f.read()
    assert 1_000_000 <= len(text) <= 1_200_000
    assert text.endswith(".\n") or text.endswith("!\n") or text.endswith("?\n")  # one final newline
    speeches = text[:-1].split("\n\n")
    assert len(speeches) > 5000
    for s in speeches:  # "Speaker Name:" on its own line, then the speech, then a blank line
        speaker, *lines = s.split("\n")
        assert re.fullmatch(r"[A-Z][A-Za-z' &-]*:", speaker), speaker
        assert lines and all(l.strip() and "[" not in l and "]" not in l for l in lines), s
    assert text.startswith("First Citizen:\nBefore we proceed any further, hear me speak.\n\n")
