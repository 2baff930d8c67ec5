"""What a newcomer runs first, run the way they run it: from the repo root, in a fresh process.

The repo root is on sys.path when a user runs `python sample.py`, so a file here named like a package that a
dependency imports (even optionally, as transformers does with `kernels`) replaces that package for it.
"""
import glob
import importlib.util
import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT
DEPENDENCIES = ("torch", "transformers", "datasets", "huggingface_hub", "tiktoken", "numpy", "tqdm",
                "safetensors",
                "matplotlib", "triton", "pyarrow")


def our_modules():
    """The names our repo root makes importable: its .py files and its package (gptlib)."""
    packages = glob.glob(os.path.join(ROOT, "*", "__init__.py"))
    return sorted([os.path.basename(p)[:-3] for p in glob.glob(os.path.join(ROOT, "*.py"))]
                  + [os.path.basename(os.path.dirname(p)) for p in packages])


@pytest.mark.slow
def test_no_file_in_the_repo_root_is_a_module_a_dependency_imports():
    """Scans the installed dependencies' sources for `import X`, `from X import` and availability checks
    (importlib.util.find_spec("X"), transformers' _is_package_available("X")) naming one of our files."""
    names = "|".join(map(re.escape, our_modules()))
    pattern = re.compile(rf"^\s*(?:import ({names})\b|from ({names}) import)|"
                         rf"(?:find_spec|is_package_available|import_module)\(\s*['\"]({names})['\"]", re.M)
    hits, scanned = [], 0
    for dep in DEPENDENCIES:
        spec = importlib.util.find_spec(dep)
        if spec is None or not spec.submodule_search_locations:
            continue
        for folder in spec.submodule_search_locations:
            for path in glob.glob(os.path.join(folder, "**", "*.py"), recursive=True):
                with open(path, encoding="utf-8", errors="replace") as f:
                    text = f.read()
                scanned += 1
                for m in pattern.finditer(text):
                    hits.append(f"{os.path.relpath(path, os.path.dirname(folder))}: {m.group(0).strip()}")
    assert scanned > 1000  # torch alone has thousands of files: the scan really ran
    assert not hits, "a dependency imports a module named like a file here:\n" + "\n".join(hits[:20])


@pytest.fixture(scope="module")
def no_triton(tmp_path_factory):
    """PYTHONPATH that makes `import triton` fail, as on the CPU wheel, Macs and Windows."""
    d = tmp_path_factory.mktemp("block")
    (d / "triton").mkdir()
    (d / "triton" / "__init__.py").write_text("raise ImportError('triton is not installed (blocked by the "
                                              "test)')\n")
    return {**os.environ, "PYTHONPATH": str(d)}


@pytest.mark.slow
def test_hf_paths_from_the_repo_root_without_triton(tmp_path, no_triton):
    """sample.py on an HF GPT-2 folder, and the export round trip through transformers, from the repo root."""
    transformers = pytest.importorskip("transformers")
    import torch
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32,
                                                              vocab_size=50257,
                                                              n_positions=64))
    hf.save_pretrained(tmp_path / "hf")
    # one process: sample.py as `python sample.py` runs it (runpy, from the repo root), then the round trip
    code = f"""
import runpy, sys
sys.argv = ["sample.py", "--model", {str(tmp_path / "hf")!r}, "--num_samples", "1", "--max_new_tokens", "5",
            "--device", "cpu", "--prompt", "Hello"]
try:
    runpy.run_path("sample.py", run_name="__main__")
except SystemExit as e:
    assert not e.code, e.code
print("SAMPLED")
import torch, transformers
try:
    import triton
    raise SystemExit("triton importable")
except ImportError:
    pass
from gptlib import hf_gpt2
from model import GPT, GPTConfig
torch.manual_seed(0)
m = GPT(GPTConfig(block_size=64, vocab_size=50304, n_layer=2, n_head=2, n_embd=32)).eval()
hf_gpt2.save_pretrained(m, {str(tmp_path / 'export')!r})
hf = transformers.GPT2LMHeadModel.from_pretrained({str(tmp_path / 'export')!r}).eval()
back = hf_gpt2.from_pretrained({str(tmp_path / 'export')!r}).eval()
x = torch.randint(0, 50257, (2, 64))
with torch.no_grad():
    ours = m(x)[0][..., :50257]
    assert (ours - hf(x).logits).abs().max() < 1e-4 and torch.equal(ours, back(x)[0])
print("ok")
"""
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=no_triton, capture_output=True, text=True)
    sampled, _, rest = r.stdout.partition("SAMPLED\n")
    assert sampled.startswith("Hello") and "1 x 5 tokens" in sampled, r.stdout + r.stderr[-2000:]
    assert r.returncode == 0 and rest.strip() == "ok", r.stdout + r.stderr[-3000:]


def test_what_runs_leave_is_ignored_by_git():
    """git status stays clean after training into any log_dir, making shards in any folder, downloading
    HellaSwag or working in a virtual environment; the project's own files are not ignored."""
    if subprocess.run(["git", "rev-parse"], cwd=ROOT, capture_output=True).returncode:
        pytest.skip("not a git checkout")
    left = ["log/metrics.jsonl", "log_gpt2/model_000150.pt", "run 2/model_000010.pt.damaged", "run 2/.lock",
            "run 2/.owner", "log/plot.png", "log/report.md", "log/tensorboard/events.out.tfevents.1.vm",
            "log/wandb/offline-run-1-abc/run-abc.wandb", "log/wandb_id", "mine/edufineweb_train_000001.bin",
            "mine/t_val_000000.bin", "mine/corpus_val_000000.bin",
            "nano/edufineweb_train_000001.npy", "hellaswag_data/hellaswag_val.jsonl", ".venv/bin/python",
            "venv/lib/x.py", "bench.md", "gpu_report/report.md", "gpu_report/checks.log", "trace.json",
            "my-gpt2/model.safetensors", "my-gpt2/config.json", "export/model.safetensors"]
    ours = ["train_gpt2.py", "gptlib/gpt2.tiktoken", "gptlib/settings.py", "input.txt", "LICENSE",
            "tests/conftest.py", "docs/cpu_run.png",
            "docs/gpu/h100-2026-11-25/report/report.md", "docs/gpu/h100-2026-11-25/report/script_log/metrics.jsonl"]
    r = subprocess.run(["git", "check-ignore", "--no-index", *left, *ours], cwd=ROOT, capture_output=True,
                       text=True)
    assert sorted(r.stdout.split("\n")[:-1]) == sorted(left), r.stdout


# ------------------------------------------------------------------------------------------------ numbers


@pytest.mark.parametrize("arg, said", [
    ("--max_lr=-0.001", "--max_lr=-0.001 must be above 0"),  # before: a traceback at the first step
    ("--weight_decay=-0.1", "--weight_decay=-0.1 must be at least 0"),  # before: it trained
    ("--hellaswag=-5", "--hellaswag=-5 must be at least 0"),  # before: silently skipped
    ("--min_lr_ratio=2", "--min_lr_ratio=2.0 must be between 0 and 1"),
    ("--max_lr=nan", "--max_lr=nan must be above 0"),
    ("--grad_clip=0", "--grad_clip=0.0 must be above 0"),
    ("--vocab_size=1000", "--vocab_size=1000 must be at least 50257"),
    ("--seed=-1", "--seed=-1 must be at least 0"),
])
def test_train_refuses_numbers_out_of_range(tmp_path, arg, said):
    from gptlib.errors import UserError
    import train_gpt2
    with pytest.raises(UserError) as e:
        train_gpt2.main(["--device=cpu", f"--log_dir={tmp_path / 'log'}", arg])
    assert str(e.value) == said
    assert not os.path.exists(tmp_path / "log")


@pytest.mark.parametrize("module, argv, said", [
    ("sample", ["--temperature=-1"], "--temperature=-1.0 must be above 0"),  # 0: greedy's hint (test_sample)
    ("sample", ["--top_k=-1"], "--top_k=-1 must be at least 0"),
    ("sample", ["--num_samples=0"], "--num_samples=0 must be at least 1"),
    ("hellaswag", ["--limit=0"], "--limit=0 must be at least 1"),
    ("hellaswag", ["--batch_size=-2"], "--batch_size=-2 must be at least 1"),
    ("bench", ["--device=cpu", "--steps=0"], "--steps=0 must be at least 1"),
    ("bench", ["--device=cpu", "--T=4096"], "--T=4096 must be between 1 and 256"),
    ("fineweb", ["--input=x.txt", "--workers=0"], "--workers=0 must be at least 1"),
    ("fineweb", ["--input=x.txt", "--shard_size=-5"], "--shard_size=-5 must be at least 1"),
])
def test_entry_points_refuse_numbers_out_of_range(monkeypatch, module, argv, said):
    """Each entry point's numeric options are checked at start, before any model or data is read."""
    from gptlib.errors import UserError
    import importlib
    main = getattr(importlib.import_module(module), "cli" if module == "fineweb" else "main")
    monkeypatch.setattr(sys, "argv", [f"{module}.py", *argv])
    with pytest.raises(UserError) as e:
        main()
    assert str(e.value) == said


@pytest.mark.slow
def test_a_mistyped_option_is_one_line():
    """argparse's own mistakes (a value of the wrong type, an unknown option) are one line too, not usage
    text."""
    from conftest import assert_one_line_error, script
    assert_one_line_error(script("fineweb.py", "--workers=two"),
                          "argument --workers: invalid int value: 'two' (python fineweb.py --help lists")


def test_every_entry_point_ends_through_one_guard(monkeypatch, capsys):
    """errors.main_guard: main()'s status is the exit status (None: 0); a UserError is its line on stderr and
    status 1, said by each node's first process only (LOCAL_RANK 0: every rank meets the same mistake), and a
    process that may hold a process group ends through exit_process, waiting for the others only after a
    success. Every entry point's __main__ is that one call."""
    import ast
    from gptlib.errors import UserError, main_guard
    ended = []

    def exit_process(status, wait):
        ended.append((status, wait))
        raise SystemExit(status)

    def mistake():
        raise UserError("--x=1: use 2")
    for main, local_rank, status, said in [(lambda: 3, "0", 3, ""), (lambda: None, "0", 0, ""),
                                           (mistake, "0", 1, "error: --x=1: use 2\n"), (mistake, "1", 1, "")]:
        monkeypatch.setenv("LOCAL_RANK", local_rank)
        for exit in (exit_process, None):
            with pytest.raises(SystemExit) as e:
                main_guard(main, exit)
            assert e.value.code == status and capsys.readouterr().err == said
    assert ended == [(3, True), (0, True), (1, False), (1, False)]
    from gptlib.errors import RankError

    def out_of_memory():  # one rank's GPU: that rank says it, whatever its LOCAL_RANK
        raise RankError("out of memory at B=64")

    def ctrl_c():
        raise KeyboardInterrupt
    for main, env, status, said in [(out_of_memory, {"RANK": "5", "LOCAL_RANK": "1"}, 1,
                                     "error (rank 5): out of memory at B=64\n"),
                                    (out_of_memory, {"LOCAL_RANK": "0"}, 1, "error: out of memory at B=64\n"),
                                    (ctrl_c, {"LOCAL_RANK": "0"}, 130, "stopped by Ctrl-C\n"),
                                    (ctrl_c, {"RANK": "1", "LOCAL_RANK": "1"}, 130, "")]:
        monkeypatch.delenv("RANK", raising=False)
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        with pytest.raises(SystemExit) as e:
            main_guard(main, exit_process)
        assert e.value.code == status and capsys.readouterr().err == said
    for name in ("train_gpt2", "hellaswag", "sample", "fineweb", "checkpoint", "plot", "bench"):
        with open(os.path.join(ROOT, f"{name}.py")) as f:
            guarded = [node for node in ast.parse(f.read()).body if isinstance(node, ast.If)][-1]
        assert ast.unparse(guarded.test) == "__name__ == '__main__'" and len(guarded.body) == 1, name
        assert ast.unparse(guarded.body[0]).startswith("main_guard("), name


def test_a_line_is_said_in_one_write(monkeypatch):
    """errors.say, behind print0 and every error line: a line and its newline go out in one write, so that
    another process's line cannot land inside it (torchrun's processes share one pipe; print's two writes
    let rank 1's error into rank 0's "step 3: val loss 10.5996 | val bpb 4.2230" in a CI run)."""
    from gptlib.errors import say
    from gptlib.runtime import print0
    writes = []

    class Pipe:
        def write(self, text):
            writes.append(text)

        def flush(self):
            writes.append("flush")
    monkeypatch.setattr(sys, "stdout", Pipe())
    monkeypatch.delenv("RANK", raising=False)
    print0("step 3: val loss", 10.5996)
    say("error (rank 1): out of memory", Pipe())
    monkeypatch.setenv("RANK", "1")
    print0("rank 0 alone")
    assert writes == ["step 3: val loss 10.5996\n", "flush", "error (rank 1): out of memory\n", "flush"]


def test_a_checkpoint_exports_for_transformers_with_its_tokenizer(tmp_path, monkeypatch, capsys):
    """checkpoint.py CKPT --hf DIR verifies the checkpoint and writes it with GPT-2's tokenizer files.
    Offline, transformers' AutoTokenizer on DIR spells every token as tiktoken does and encodes text into the
    same ids, and its GPT2LMHeadModel continues a prompt as our greedy generate does."""
    transformers = pytest.importorskip("transformers")
    import torch

    import checkpoint
    from conftest import DOCS, save_model
    from gptlib.engine import Engine
    from gptlib.errors import UserError
    from gptlib.tokenizer import byte_chars, get_encoding
    from model import GPT, GPTConfig
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=64, vocab_size=50304, n_layer=2, n_head=2, n_embd=32)).eval()
    ckpt = save_model(model, tmp_path / "model_000005.pt", step=5)
    monkeypatch.setattr(sys, "argv", ["checkpoint.py", ckpt, "--hf", str(tmp_path / "hf")])
    checkpoint.main()
    out = capsys.readouterr().out
    assert f"{ckpt}: verified (its checksum matches); step 5, " in out
    assert "merges.txt" in out and "vocab.json" in out
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    enc, byte_of = get_encoding(), {c: b for b, c in byte_chars().items()}
    spelled = tok.convert_ids_to_tokens(list(range(50256)))
    assert [bytes(byte_of[c] for c in t) for t in spelled] == [enc.decode_single_token_bytes(i)
                                                               for i in range(50256)]
    with open(os.path.join(ROOT, "input.txt"), encoding="utf-8") as f:
        text = "\n\n".join(DOCS) + f.read(30_000) + "  tabs\t\tand   spaces \n\n 12345 it's I'LL"
    assert tok(text)["input_ids"] == enc.encode_ordinary(text)
    prompt = "Hello, I'm a language model,"  # what pipeline("text-generation", DIR) does, greedily
    hf = transformers.GPT2LMHeadModel.from_pretrained(str(tmp_path / "hf")).eval()
    got = hf.generate(**tok(prompt, return_tensors="pt"), max_new_tokens=8, do_sample=False)
    ours = Engine(model).generate(torch.tensor([enc.encode_ordinary(prompt)]), 8, top_k=1)
    assert tok.decode(got[0]) == enc.decode(ours[0].tolist())
    (tmp_path / "taken").write_text("")
    monkeypatch.setattr(sys, "argv", ["checkpoint.py", ckpt, "--hf", str(tmp_path / "taken")])
    with pytest.raises(UserError, match="taken is a file: give a folder"):
        checkpoint.main()
