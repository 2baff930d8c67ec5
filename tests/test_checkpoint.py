"""checkpoint.py: the checksum catches a truncated file and bytes changed inside one, before anything is
used."""
import copy
import importlib
import os
import shutil
import sys

import pytest
import torch

from gptlib.checkpoint import (CheckpointError, checkpoints, checksum, load_checkpoint, load_model, model_config,
                               newest_valid, save_checkpoint)
from gptlib.errors import UserError
from model import GPT, GPTConfig
MARK = 1.2345678  # a value no initialised weight has, to find a tensor's bytes in the file


def state():
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=16, vocab_size=64, n_layer=1, n_head=2, n_embd=16))
    with torch.no_grad():
        model.transformer.h[0].mlp.c_fc.weight.fill_(MARK)
    return {"model": model.state_dict(), "model_config": {"block_size": 16, "vocab_size": 64, "n_layer": 1,
            "n_head": 2, "n_embd": 16}, "step": 3, "config": {"B": 4, "data_root": "x"},
            "dataloader": {"row": 8},
            "rng": {"cpu": torch.get_rng_state(), "cuda": None}}


def test_round_trip_and_checksum(tmp_path):
    s = state()
    path = str(tmp_path / "model_000003.pt")
    save_checkpoint(s, path)
    assert os.listdir(tmp_path) == ["model_000003.pt"]  # no .tmp left
    got = load_checkpoint(path)
    assert got["checksum"] == checksum(s) and got["step"] == 3
    assert all(torch.equal(got["model"][k], v) for k, v in s["model"].items())
    changed = {**s, "step": 4}
    assert checksum(changed) != checksum(s) and checksum({**s}) == checksum(s)


def test_a_checkpoint_with_a_retired_setting_still_loads(tmp_path):
    """Checkpoints written at 234821a hold GPTConfig's chunked_loss (removed since): load_model and
    model_config read them, verified, without it."""
    from gptlib.checkpoint import model_config
    s = state()
    s["model_config"]["chunked_loss"] = True
    path = str(tmp_path / "model_000003.pt")
    save_checkpoint(s, path)
    assert load_model(path).config == GPTConfig(**state()["model_config"])
    plain = str(tmp_path / "model_000004.pt")
    save_checkpoint(state(), plain)
    assert model_config(path) == model_config(plain)


def test_damage_is_detected(tmp_path):
    path = str(tmp_path / "model_000003.pt")
    save_checkpoint(state(), path)
    data = open(path, "rb").read()
    at = data.index(torch.tensor([MARK] * 4).numpy().tobytes())  # inside c_fc.weight's bytes
    (tmp_path / "flipped.pt").write_bytes(data[:at] + os.urandom(8) + data[at + 8:])
    (tmp_path / "truncated.pt").write_bytes(data[:len(data) * 2 // 3])
    (tmp_path / "other.pt").write_bytes(b"not a checkpoint at all")
    torch.save({"weights": {}}, tmp_path / "foreign.pt")
    for name, match in [("flipped.pt", "is damaged: its contents do not match its checksum"),
                        ("truncated.pt", "is damaged: it cannot be read"),
                        ("other.pt", "is damaged: it cannot be read"),
                        ("foreign.pt", "is not a train_gpt2.py checkpoint"),
                        ("missing.pt", "does not exist")]:
        with pytest.raises(CheckpointError, match=match):
            load_checkpoint(str(tmp_path / name))
    # what a plain torch.load would have used
    flipped = torch.load(tmp_path / "flipped.pt", weights_only=True)
    key = "transformer.h.0.mlp.c_fc.weight"
    assert not torch.equal(flipped["model"][key], state()["model"][key])


def test_a_checkpoint_without_a_checksum_is_refused(tmp_path):
    torch.save(state(), tmp_path / "unverifiable.pt")
    with pytest.raises(CheckpointError, match="is not a train_gpt2.py checkpoint .*'checksum'"):
        load_checkpoint(str(tmp_path / "unverifiable.pt"))


def test_load_model_errors(tmp_path):
    with pytest.raises(UserError, match="checkpoint .*nope.pt does not exist \\(a training run writes its "
                                        "model_NNNNNN.pt in its log_dir\\)$"):
        load_model(str(tmp_path / "nope.pt"))
    # one a resume's rotation deleted (README's model_000150.pt once the quick start is extended): the newest
    # beside it named, and how to pick it
    old = tmp_path / "run" / "model_000150.pt"
    old.parent.mkdir()
    for step in (160, 170):
        (old.parent / f"model_{step:06d}.pt").touch()
    newest = old.parent / "model_000170.pt"
    for read in (load_model, model_config):
        with pytest.raises(UserError, match=f"^checkpoint {old} does not exist; the newest in its folder is "
                                            f"{newest}: --model {newest} picks it$"):
            read(str(old), "--model")
    torch.save({"weights": {}}, tmp_path / "other.pt")
    with pytest.raises(UserError, match="not a train_gpt2.py checkpoint"):
        load_model(str(tmp_path / "other.pt"))
    # a run's log_dir where weights belong (sample.py --model=log, --init_from=log): its newest checkpoint named
    log = tmp_path / "log"
    log.mkdir()
    for step in (2, 10):
        (log / f"model_{step:06d}.pt").touch()
    for read in (load_model, model_config):
        with pytest.raises(UserError, match=f"^{log} is a training run's log_dir, not an HF GPT-2 folder: "
                                            f"give one of its checkpoints, such as its newest: "
                                            f"--model={log}/model_000010.pt$"):
            read(str(log), "--model")


def test_newest_valid(tmp_path):
    for step in (2, 4, 6):
        save_checkpoint({**state(), "step": step}, str(tmp_path / f"model_{step:06d}.pt"))
    (tmp_path / "model_000006.pt").write_bytes(b"")
    notes = []
    path, ckpt = newest_valid(str(tmp_path), notes.append)
    assert path.endswith("model_000004.pt") and ckpt["step"] == 4
    assert len(notes) == 1 and "model_000006.pt is damaged" in notes[0]
    # moved aside: no longer among the checkpoints, so rotation never keeps it in place of a good one
    assert notes[0].endswith("aside to model_000006.pt.damaged") and (tmp_path / "model_000006.pt.damaged").exists()
    assert [os.path.basename(p) for p in checkpoints(str(tmp_path))] == ["model_000002.pt", "model_000004.pt"]
    for step in (2, 4):
        (tmp_path / f"model_{step:06d}.pt").write_bytes(b"PK")
    with pytest.raises(CheckpointError, match=r"none of the 2 checkpoints in .* verifies \(see above; each moved "
                                              r"aside as \*.damaged\): restore one from a copy, or start afresh"):
        newest_valid(str(tmp_path), notes.append)
    assert checkpoints(str(tmp_path)) == []  # the same as when an older one verifies: each damaged moved aside
    assert len(notes) == 3 and all(note.endswith(".pt.damaged") for note in notes)
    save_checkpoint({**state(), "step": 2}, str(tmp_path / "model_000002.pt"))  # damaged again: both kept
    (tmp_path / "model_000002.pt").write_bytes(b"PK")
    with pytest.raises(CheckpointError):
        newest_valid(str(tmp_path), notes.append)
    assert notes[-1].endswith("moved aside to model_000002.pt.damaged.1")
    assert (tmp_path / "model_000002.pt.damaged").exists() and (tmp_path / "model_000002.pt.damaged.1").exists()


def test_a_checkpoint_of_another_model_py_is_one_line_and_not_moved_aside(tmp_path):
    """A model option another copy of model.py has (swiglu) and this one lacks: one line naming it, and the
    checkpoint, which is not damaged, stays where it is."""
    path = str(tmp_path / "model_000002.pt")
    ckpt = state()
    save_checkpoint({**ckpt, "model_config": {**ckpt["model_config"], "swiglu": True}}, path)
    for read in (lambda: load_checkpoint(path), lambda: newest_valid(str(tmp_path))):
        with pytest.raises(UserError, match="holds a model with swiglu, which this model.py's GPTConfig lacks"):
            read()
    assert os.path.exists(path)


@pytest.mark.parametrize("name", ["sample", "hellaswag"])
def test_damaged_checkpoint_is_one_line_in_sample_and_hellaswag(tmp_path, name, monkeypatch):
    """The UserError (its one line through each entry point: test_sample_plot.py, test_hellaswag.py), naming
    the earlier checkpoint beside it that verifies, and --model to pick it."""
    path, earlier = str(tmp_path / "model_000003.pt"), str(tmp_path / "model_000002.pt")
    save_checkpoint(state(), path)
    save_checkpoint(state(), earlier)
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 200)
    data = tmp_path / "hs.jsonl"
    data.write_text('{"ctx": "a", "endings": ["b", "c", "d", "e"], "label": 0}\n')
    monkeypatch.setattr(sys, "argv", [f"{name}.py", "--model", path, "--device", "cpu",
                                      *(["--data", str(data)] if name == "hellaswag" else [])])
    with pytest.raises(UserError, match=f"^checkpoint {path} is damaged: it cannot be read .*; {earlier}, an "
                                        f"earlier one beside it, verifies: --model {earlier} picks it$"):
        importlib.import_module(name).main()


def test_a_damaged_checkpoints_line_names_the_earlier_one_that_verifies(tmp_path, monkeypatch):
    """Named by a command, a damaged checkpoint's one line ends with the newest earlier checkpoint in its
    folder that verifies and the setting that picks it (passing over an earlier damaged one), or says that
    none does; a resume's own check (no setting) adds nothing. train_gpt2.py --init_from meets it reading
    the weights' shape, checkpoint.py as its argument."""
    import checkpoint
    import train_gpt2
    paths = [str(tmp_path / f"model_{step:06d}.pt") for step in (1, 2, 3)]
    for step, path in enumerate(paths, 1):
        save_checkpoint({**state(), "step": step}, path)
    for path in paths[1:]:
        with open(path, "r+b") as f:
            f.truncate(os.path.getsize(path) - 200)
    hint = f"; {paths[0]}, an earlier one beside it, verifies: --model {paths[0]} picks it"
    with pytest.raises(UserError) as e:
        load_model(paths[2], "--model")
    assert str(e.value).startswith(f"checkpoint {paths[2]} is damaged: it cannot be read (")
    assert str(e.value).endswith(hint) and "\n" not in str(e.value)
    assert len(str(e.value).split(" (", 1)[1].split(")")[0]) <= 80  # torch's own text runs to ~500 characters
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(paths[2])
    assert ";" not in str(e.value).split(")")[-1]
    with pytest.raises(UserError, match=f"verifies: --init_from {paths[0]} picks it$"):
        train_gpt2.main([f"--init_from={paths[2]}", f"--log_dir={tmp_path / 'ft'}"])
    data = open(paths[0], "rb").read()  # bytes changed inside: its recorded shape still reads
    at = data.index(torch.tensor([MARK] * 4).numpy().tobytes())
    flipped = tmp_path / "flipped" / "model_000004.pt"
    flipped.parent.mkdir()
    flipped.write_bytes(data[:at] + os.urandom(8) + data[at + 8:])
    with pytest.raises(UserError, match=f"checksum; no earlier checkpoint in {flipped.parent} verifies: "):
        train_gpt2.main([f"--init_from={flipped}", "--T=16", f"--log_dir={tmp_path / 'ft'}"])
    monkeypatch.setattr(sys, "argv", ["checkpoint.py", paths[1]])
    with pytest.raises(UserError, match=f"verifies: python checkpoint.py {paths[0]} picks it$"):
        checkpoint.main()
    best = str(tmp_path / "best.pt")  # not one of the run's model_N.pt: any beside it, not "earlier"
    shutil.copy(paths[2], best)
    with pytest.raises(UserError, match=f"; {paths[0]}, another beside it, verifies: --model {paths[0]} "
                                        "picks it$"):
        load_model(best, "--model")
    os.remove(paths[0])
    with pytest.raises(UserError, match=f"; no earlier checkpoint in {tmp_path} verifies: restore this one "
                                        "from a copy, or train it again$"):
        load_model(paths[2], "--model")


@pytest.mark.parametrize("saved_fused, fused", [(False, True), (True, False)])
def test_a_resumed_adamw_keeps_this_devices_kernel(saved_fused, fused):
    """A checkpoint of an unfused AdamW (a CPU run) resumed where AdamW is fused (CUDA; fused AdamW runs on
    the CPU too, so the test can): load_state_dict would copy fused=False back, and the run would step
    unfused while its log says fused. The fresh optimizer's kernel is kept, its step counts go where that
    kernel reads them, and its next step equals the saved run's. Its hyperparameters are this run's too (a
    resume may change a learning rate or the weight decay); only the state comes from the checkpoint."""
    from gptlib.checkpoint import gather_state, load_state
    from gptlib.optimizers import ROLES, make_optimizers

    def make(fused_kernel, weight_decay=0.1):
        torch.manual_seed(0)
        model = GPT(GPTConfig(block_size=16, vocab_size=64, n_layer=1, n_head=2, n_embd=16))
        peaks = dict.fromkeys(ROLES, 1e-2)
        return model, make_optimizers(model, "adamw", weight_decay, peaks, fused_kernel)[0]

    def step(model, opt):
        x = torch.arange(32).view(2, 16) % 64
        opt.zero_grad()
        model(x, x)[1].backward()
        opt.step()

    model, opt = make(saved_fused)
    for _ in range(2):
        step(model, opt)
    # on the CPU the gathered tensors are the optimizer's own; copied, as they are when read from a file
    model_state, optim_state = copy.deepcopy(gather_state(model, [opt]))
    resumed, resumed_opt = make(fused)
    load_state(resumed, [resumed_opt], {"model": model_state, "optimizer": optim_state}, distributed=False)
    assert all(bool(g["fused"]) == fused for g in resumed_opt.param_groups)
    steps = [resumed_opt.state[p]["step"] for p in resumed.parameters()]
    assert all(s.item() == 2 and s.dtype == torch.float32 for s in steps)
    step(model, opt)
    step(resumed, resumed_opt)
    for (name, a), b in zip(model.named_parameters(), resumed.parameters()):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-7), name
    # this run's weight decay, not the checkpoint's; the checkpoint's moments
    other, other_opt = make(fused, weight_decay=0.0)
    load_state(other, [other_opt], {"model": model_state, "optimizer": optim_state}, distributed=False)
    assert [g["weight_decay"] for g in other_opt.param_groups] == [0.0, 0.0, 0.0]
    for name, p in other.named_parameters():
        assert torch.equal(other_opt.state[p]["exp_avg"], optim_state["state"][name]["exp_avg"]), name


def test_an_optimizer_state_of_another_layout_is_one_line(tmp_path):
    """A checkpoint whose optimizer groups were keyed by learning rate (before they were named by role)
    cannot fit this code's groups: one UserError naming both layouts and the way out (its weights with a
    fresh optimizer), before anything is loaded."""
    from gptlib.checkpoint import Resume
    from gptlib.optimizers import ROLES, make_optimizers
    from gptlib.runtime import Runtime
    model = GPT(GPTConfig(block_size=16, vocab_size=64, n_layer=1, n_head=2, n_embd=16))
    opts = make_optimizers(model, "adamw", 0.1, dict.fromkeys(ROLES, 1e-2), False)
    meta = {"step": 4, "path": "log/model_000004.pt", "model_config": {}, "roles": [None, None]}
    match = (r"another layout \(parameter groups \[None, None\], this code's \['decay', 'no_decay', "
             r"'embedding'\]\).*--init_from=log/model_000004.pt")
    with pytest.raises(UserError, match=match):
        Resume(meta, None).restore(model, opts, None, None, None, Runtime())


def test_checkpoints_sort_by_step_past_a_million(tmp_path):
    """%06d names stop sorting by step at 1,000,000: the list (and so rotation, which deletes the oldest)
    goes by the step number; other files named like them are not checkpoints."""
    for name in ("model_1000000.pt", "model_999999.pt", "model_000010.pt", "model_best.pt",
                 "model_000020.pt.tmp"):
        (tmp_path / name).write_bytes(b"")
    assert [os.path.basename(p) for p in checkpoints(str(tmp_path))] == [
        "model_000010.pt", "model_999999.pt", "model_1000000.pt"]


def test_export_into_an_unwritable_folder_is_one_line(tmp_path, monkeypatch, capsys):
    """checkpoint.py CKPT --hf DIR where DIR (or the folder it would be made in) cannot be written: one line
    before anything is written (os.access faked: root may write anywhere here)."""
    import checkpoint
    ckpt = tmp_path / "model_000001.pt"
    model = GPT(GPTConfig(block_size=16, vocab_size=50304, n_layer=1, n_head=2, n_embd=16))
    config = {"block_size": 16, "vocab_size": 50304, "n_layer": 1, "n_head": 2, "n_embd": 16}
    save_checkpoint({"model": model.state_dict(), "model_config": config, "step": 1}, str(ckpt))
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if str(p) == str(tmp_path) else real(p, mode))
    monkeypatch.setattr(sys, "argv", ["checkpoint.py", str(ckpt), "--hf", str(tmp_path / "new" / "hf")])
    with pytest.raises(UserError,
                       match=rf"--hf .*hf: {tmp_path} is not writable \(read-only or no permission\)"):
        checkpoint.main()
    assert not (tmp_path / "new").exists()
