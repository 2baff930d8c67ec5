"""The edits researchers make flow through with nothing else touched: a model option (a GPTConfig field, its
MLP and a settings-block line) and a new numeric setting, made in a scratch copy of the project and run the
way users run it (docs/edits.md)."""
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from conftest import ENV, ROOT


def edit(path, old, new):
    with open(path, encoding="utf-8") as f:
        source = f.read()
    assert source.count(old) == 1, old
    with open(path, "w", encoding="utf-8") as f:
        f.write(source.replace(old, new))


@pytest.mark.slow
def test_a_model_option_and_a_setting_are_one_edit_each(tmp_path):
    """SwiGLU as a GPTConfig field, its MLP and a block line, and warmdown_frac as a block line alone: the run
    takes --swiglu=True into the model that trains (its weights' shape, its parameter count), logs and saves
    it, resumes it, refuses to change it, and export refuses it in one line, writing nothing."""
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    copy = tmp_path / "copy"
    for name in files.split():
        if not name.startswith(("docs/", "tests/", "dev/")):
            os.makedirs(copy / os.path.dirname(name), exist_ok=True)
            shutil.copy(os.path.join(ROOT, name), copy / name)
    edit(copy / "model.py", "    embed_norm: bool = False  # the token embeddings RMS-normalized before the first block\n",
         "    embed_norm: bool = False  # the token embeddings RMS-normalized before the first block\n"
         "    swiglu: bool = False  # MLP: SiLU(x W) * (x V), two matrices in c_fc\n")
    edit(copy / "model.py", "        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd)\n",
         "        self.swiglu = config.swiglu\n"
         "        self.c_fc = nn.Linear(config.n_embd, (8 if config.swiglu else 4) * config.n_embd)\n")
    edit(copy / "model.py", "        return self.c_proj(self.act(self.c_fc(x)))\n",
         "        if self.swiglu:\n"
         "            gate, value = self.c_fc(x).chunk(2, dim=-1)\n"
         "            return self.c_proj(F.silu(gate) * value)\n"
         "        return self.c_proj(self.act(self.c_fc(x)))\n")
    edit(copy / "train_gpt2.py", "embed_norm = False  # the token embeddings RMS-normalized before the first block\n",
         "embed_norm = False  # the token embeddings RMS-normalized before the first block\n"
         "swiglu = False  # SwiGLU MLP\n"
         "warmdown_frac = 0.2  # the last fraction of the steps decays the learning rate\n")
    tiny = ["--device=cpu", "--recipe=gpt2", "--n_layer=2", "--n_head=2", "--n_kv_head=2", "--n_embd=32", "--B=4",
            "--T=32", "--total_batch_size=128", "--val_tokens=256", "--hellaswag=0", "--log_dir=log"]

    def run(*args):
        return subprocess.run([sys.executable, "train_gpt2.py", *tiny, *args], cwd=copy, env=ENV,
                              capture_output=True, text=True, timeout=300)
    r = run("--swiglu=True", "--max_steps=2", "--warmdown_frac=0.5")
    assert r.returncode == 0, r.stderr
    with open(copy / "log" / "metrics.jsonl") as f:
        start = json.loads(f.readline())
    assert start["config"]["swiglu"] and start["model_config"]["swiglu"] and start["config"]["warmdown_frac"] == 0.5
    ckpt = torch.load(copy / "log" / "model_000002.pt", weights_only=True)
    assert ckpt["model"]["transformer.h.0.mlp.c_fc.weight"].shape == (256, 32)  # SwiGLU's, not GELU's 128
    n = sum(v.numel() for k, v in ckpt["model"].items() if k != "lm_head.weight")  # tied: counted once
    assert f"model: {n:,} parameters" in r.stdout
    counted = subprocess.run([sys.executable, "-c", "from gptlib.accounting import count_params; from model import "
                              "GPTConfig; print(count_params(GPTConfig(block_size=1024, vocab_size=50304, n_layer=2, "
                              "n_head=2, n_embd=32, swiglu=True)))"], cwd=copy, capture_output=True, text=True)
    assert counted.stdout.strip() == str(n), counted.stderr  # what MFU and the GPU's memory fit count
    r = run("--max_steps=3")  # resumed: the run's own swiglu
    assert r.returncode == 0 and "resuming from" in r.stdout, r.stderr
    assert torch.load(copy / "log" / "model_000003.pt", weights_only=True)["config"]["swiglu"] is True
    r = run("--max_steps=4", "--swiglu=False")
    assert r.returncode == 1 and r.stderr.strip().endswith(
        "has swiglu=True (now False, this command), which a resume cannot change: restore it (--swiglu=True) to "
        "continue that run, or start a fresh experiment with --log_dir=NEW"), r.stderr
    r = subprocess.run([sys.executable, "checkpoint.py", "log/model_000003.pt", "--hf", "out"], cwd=copy, env=ENV,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "swiglu=True: Hugging Face GPT-2 has no such option" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (copy / "out").exists()


@pytest.mark.slow
def test_one_step_is_short_to_read():
    """dev/step_path.py on a tiny CPU run (one micro-batch a step, so a whole first step): at most 10 of the
    project's files and 1,000 lines of their functions (issue #80's bar), and nothing a fresh run does not
    need (a resume's machinery, the GPU's memory fit, the trackers, the weights' shape)."""
    import importlib.util
    from conftest import TINY
    spec = importlib.util.spec_from_file_location("step_path", os.path.join(ROOT, "dev", "step_path.py"))
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    text = os.path.join(ROOT, "input.txt")
    seen = tool.step_path(TINY + ["--total_batch_size=128", f"--data_root={text}"])
    names = {name for _, _, name in seen}
    assert {"train_step", "next_batch", "forward", "set_lr", "resolve", "first_start"} <= names  # a whole step
    assert len({path for path, _, _ in seen}) <= 10, sorted({path for path, _, _ in seen})
    assert sum(seen.values()) <= 1000, sorted(seen.items(), key=lambda item: -item[1])[:10]
    off = {"read_newest", "continued", "changes", "restore", "fit_memory", "memory_estimate", "open_trackers",
           "weights_shape", "count_params", "training_memory"}
    assert not names & off, names & off
