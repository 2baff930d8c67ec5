"""README's promises that code can check: its Python snippet runs as printed, and it shows the test command
CI runs."""
import os
import re

import pytest
import torch

from conftest import ROOT, build, save_model, tiny
from gptlib.tokenizer import get_encoding

START, END = "<!-- README snippet: start -->\n```python\n", "```\n<!-- README snippet: end -->"


def readme():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        return f.read()


def test_the_python_snippet_loads_a_checkpoint_and_generates(tmp_path, monkeypatch, capsys):
    """README's lines between its snippet markers, run as they stand from a folder whose log/ holds the quick
    start's run extended (model_000150.pt deleted by rotation; model_000170.pt, the newest, a tiny model the
    test saves there; model_000160.pt not one), print the prompt and 20 new tokens."""
    text = readme()
    assert text.count(START) == 1 and text.count(END) == 1
    snippet = text.split(START, 1)[1].split(END, 1)[0]
    assert len(snippet.strip().splitlines()) <= 12, snippet  # about five lines after the imports
    (tmp_path / "log").mkdir()
    save_model(build(tiny(vocab_size=50304, block_size=64)), tmp_path / "log" / "model_000170.pt", step=170)
    (tmp_path / "log" / "model_000160.pt").write_bytes(b"not the newest")
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    exec(compile(snippet, "README.md", "exec"), {"__name__": "readme_snippet"})
    out = capsys.readouterr().out
    prompt = "Hello, I'm a language model,"
    assert out.startswith(prompt), out
    assert len(get_encoding().encode(out.rstrip("\n"), disallowed_special=())) >= len(
        get_encoding().encode(prompt)) + 10, out  # 20 tokens drawn; decoded and encoded again, some merge


def test_the_python_snippet_without_a_run_names_the_folder_and_the_fix(tmp_path, monkeypatch):
    """The snippet run from a folder without log/ (a script outside the repository), then with an empty log/:
    a line naming the folder it looked in and the fix (before: IndexError from checkpoints("log")[-1])."""
    from gptlib.checkpoint import CheckpointError
    snippet = readme().split(START, 1)[1].split(END, 1)[0]
    monkeypatch.chdir(tmp_path)
    fix = ": give a training run's log_dir as a path from the folder you run in, or its full path$"
    for where in (f"{tmp_path / 'log'}, no such folder", f"{tmp_path / 'log'}"):
        with pytest.raises(CheckpointError, match=f"^no checkpoint in {where}{fix}"):
            exec(compile(snippet, "README.md", "exec"), {"__name__": "readme_snippet"})
        os.makedirs(tmp_path / "log", exist_ok=True)


def test_the_test_command_ci_runs_is_readmes():
    """.ci/run's last line is the test command README shows."""
    with open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8") as f:
        command = f.read().strip().splitlines()[-1]
    assert command == "python -m pytest" and re.search(rf"&& {re.escape(command)}\s", readme())
