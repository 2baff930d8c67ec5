import json
import re
import shutil
import sys

import pytest
import torch

from conftest import assert_one_line_error, save_model, script
from gptlib.engine import Engine
from gptlib.errors import UserError
from gptlib.runtime import Runtime
from gptlib.tokenizer import get_encoding
from model import GPT, GPTConfig
import plot
import sample


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny model trained for a few steps on a repeated sentence, saved like train_gpt2.py saves it."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=64, vocab_size=50304, n_layer=2, n_head=2, n_embd=32))
    ids = get_encoding().encode_ordinary("To be, or not to be, that is the question. " * 8)[:65]
    x, y = torch.tensor([ids[:-1]]), torch.tensor([ids[1:]])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(60):
        opt.zero_grad()
        model(x, y)[1].backward()
        opt.step()
    path = save_model(model, tmp_path_factory.mktemp("ckpt") / "model_000060.pt", step=60)
    return path, model.eval()


def run_sample(*args):
    return script("sample.py", *args)


@pytest.mark.slow
def test_sample_cli(checkpoint, tmp_path, monkeypatch, capsys):
    """python sample.py from the repo root; then in-process, the prompt from a file, and without --model
    after training: the newest checkpoint in ./log, not a download of OpenAI's gpt2."""
    path, model = checkpoint
    args = ["--model", path, "--prompt", "To be, or not", "--num_samples", "2", "--max_new_tokens", "12",
            "--top_k", "1", "--device", "cpu"]
    r = run_sample(*args)
    assert r.returncode == 0, r.stderr
    texts = r.stdout.split("-" * 80 + "\n")[:2]
    # it learned the line
    assert all(t.startswith("To be, or not to be, that is the question") for t in texts)
    assert "2 x 12 tokens," in r.stdout and "tokens/s on cpu" in r.stdout
    (tmp_path / "prompt.txt").write_text("To be, or not", encoding="utf-8")
    monkeypatch.setattr(sys, "argv", ["sample.py"] + [a if a != "To be, or not" else
                                                      f"FILE:{tmp_path / 'prompt.txt'}" for a in args])
    sample.main()
    assert capsys.readouterr().out.split("-" * 80)[0] == r.stdout.split("-" * 80)[0]
    (tmp_path / "log").mkdir()
    for step in (3, 12):
        shutil.copy(path, tmp_path / "log" / f"model_{step:06d}.pt")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["sample.py"] + args[2:])
    sample.main()
    out = capsys.readouterr().out
    assert out.startswith("sample: log/model_000012.pt (--model picks another)")
    assert out.split("-" * 80)[0].split("\n", 1)[1] == r.stdout.split("-" * 80)[0]
    monkeypatch.chdir(tmp_path / "log")  # no log/ here: OpenAI's weights, and it says why (offline: one line)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UserError, match="could not download GPT-2 weights 'gpt2'"):
        sample.main()
    assert capsys.readouterr().out.startswith(f"sample: gpt2, OpenAI's weights: no checkpoint in "
                                              f"{tmp_path / 'log' / 'log'} (the log/ of the folder you run "
                                              "from; --model picks another)")


@pytest.mark.slow
def test_sample_matches_generate_and_is_seeded(checkpoint):
    _, model = checkpoint
    texts, tok_s, _ = sample.sample(Engine(model), "To be", 3, 10, 1.0, 50, 7, Runtime())
    enc = get_encoding()
    idx = torch.tensor([enc.encode_ordinary("To be")] * 3)
    ref = Engine(model).generate(idx, 10, top_k=50, generator=torch.Generator().manual_seed(7))
    assert texts == [enc.decode(row.tolist()) for row in ref] and tok_s > 0
    assert sample.sample(Engine(model), "To be", 3, 10, 1.0, 50, 7, Runtime())[0] == texts
    assert sample.sample(Engine(model), "To be", 3, 10, 1.0, 50, 8, Runtime())[0] != texts
    # an empty prompt starts a new document: <|endoftext|> goes in, not into the text (it did at db9da80)
    text, = sample.sample(Engine(model), "", 1, 5, 1.0, None, 0, Runtime())[0]
    ref = Engine(model).generate(torch.tensor([[enc.eot_token]]), 5,
                                 generator=torch.Generator().manual_seed(0))
    assert text == enc.decode(ref[0, 1:].tolist()) and not text.startswith("<|endoftext|>")


@pytest.mark.slow
def test_sample_compiled_gives_the_eager_texts(checkpoint, monkeypatch):
    """compile=True (sample.py's default on CUDA): a warm-up call, timed apart, then the same texts as eager
    decoding for the same seed. Dynamo with its eager backend (inductor would take a minute on 2 cores)."""
    import functools
    _, model = checkpoint
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))
    eager, _, no_warm_up = sample.sample(Engine(model), "To be", 3, 10, 1.0, 50, 7, Runtime())
    compiled, tok_s, warm_up = sample.sample(Engine(model, compile=True), "To be", 3, 10, 1.0, 50, 7, Runtime())
    assert compiled == eager and no_warm_up == 0 and warm_up > 0 and tok_s > 0


@pytest.mark.slow
def test_sample_errors(tmp_path, monkeypatch, capsys):
    """A missing checkpoint: one line (through the entry point); an unknown model name or prompt file, or
    temperature 0: the same UserError in-process."""
    assert_one_line_error(run_sample("--model", str(tmp_path / "missing.pt"), "--device", "cpu"),
                          "checkpoint", "missing.pt does not exist")
    monkeypatch.setattr(sys, "argv", ["sample.py", "--model", "gpt-7", "--device", "cpu"])
    with pytest.raises(UserError, match="unknown model 'gpt-7'"):
        sample.main()
    monkeypatch.setattr(sys, "argv", ["sample.py", "--prompt", f"FILE:{tmp_path / 'none.txt'}"])
    with pytest.raises(UserError, match="none.txt does not exist"):
        sample.main()
    monkeypatch.setattr(sys, "argv", ["sample.py", "--temperature=0"])  # greedy, as other samplers take it
    with pytest.raises(UserError, match="^--temperature=0: for greedy sampling .* drop it and use --top_k=1$"):
        sample.main()
    monkeypatch.setattr(sys, "argv", ["sample.py", "--help"])  # every option with its default
    with pytest.raises(SystemExit):
        sample.main()
    said = " ".join(capsys.readouterr().out.split())
    for option, default in (("num_samples", 4), ("max_new_tokens", 64), ("temperature", 1.0), ("top_k", 50),
                            ("seed", 42), ("span", 0), ("device", "auto")):
        assert re.search(rf"--{option} \S+ [^-]*\(default: {default}\)", said), (option, said)


def write_log(path, records, tail=""):
    with open(path, "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
        f.write(tail)


@pytest.mark.slow
def test_plot_resumed_and_live_log(tmp_path):
    recs = [{"event": "start", "step": 0, "config": {}}]
    recs += [{"step": s, "loss": 10 - s * 0.1, "lr": 1e-3} for s in range(1, 41)]
    recs += [{"step": 20, "val_loss": 8.0}, {"step": 20, "hellaswag": 0.26}, {"step": 20, "samples": ["x"]}]
    recs += [{"event": "start", "step": 30}]  # resumed at step 30: steps 31-40 are done again
    recs += [{"step": s, "loss": 5.0, "lr": 1e-3} for s in range(31, 46)]
    recs += [{"step": 40, "val_loss": 6.0}, {"step": 40, "hellaswag": 0.28}]
    log = tmp_path / "metrics.jsonl"
    write_log(log, recs, tail='{"step": 46, "lo')  # a live run is writing this line
    series = plot.load_metrics(str(log))
    assert sorted(series["loss"]) == list(range(1, 46))
    assert series["loss"][35] == 5.0 and series["loss"][30] == 7.0
    assert series["val_loss"] == {20: 8.0, 40: 6.0} and series["hellaswag"] == {20: 0.26, 40: 0.28}
    r = script("plot.py", "--log", str(log), "--logy")
    assert r.returncode == 0, r.stderr
    png = tmp_path / "plot.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert "45 train steps, 2 val evals, 2 HellaSwag evals" in r.stdout


@pytest.mark.slow
def test_plot_against_a_baseline_and_settings_diff(tmp_path):
    """--baseline: an eval-only run's one evaluation is drawn as level lines (bpb too), and the settings that
    differ between the two runs' first records are printed, the log_dir aside."""
    run = {"python": "3.11.7", "torch": "2.13.0", "devices": {"cpu": 1}, "git_commit": "abc",
           "git_dirty": False}
    mine = [{"event": "start", "step": 0, "config": {"B": 8, "init_from": "scratch", "log_dir": "a"},
             "model_config": {"n_layer": 4}, "run": run}]
    mine += [{"step": s, "loss": 10 - s * 0.1} for s in range(1, 11)]
    mine += [{"step": 10, "val_loss": 6.0, "val_bpb": 2.5}]
    base = [{"event": "start", "step": 0, "config": {"B": 8, "init_from": "gpt2", "eval_only": True,
                                                     "log_dir": "b"},
             "model_config": {"n_layer": 12}, "run": {**run, "git_dirty": True}},
            {"step": 0, "val_loss": 3.3, "val_bpb": 1.1}, {"step": 0, "hellaswag": 0.29}]
    write_log(tmp_path / "mine.jsonl", mine)
    write_log(tmp_path / "base.jsonl", base)
    assert plot.load_metrics(str(tmp_path / "mine.jsonl"))["val_bpb"] == {10: 2.5}
    r = script("plot.py", "--log", str(tmp_path / "mine.jsonl"), "--baseline",
               str(tmp_path / "base.jsonl"), "--out", str(tmp_path / "vs.png"))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "vs.png").stat().st_size > 10_000
    diff = r.stdout.split("settings that differ")[1].splitlines()[1:]
    assert [line.strip() for line in diff] == [
        "config.eval_only: '(absent)' -> True", "config.init_from: 'scratch' -> 'gpt2'",
        "model_config.n_layer: 4 -> 12", "run.git_dirty: False -> True"]


def test_plot_panels_share_the_step_axis_and_skip_an_empty_hellaswag(tmp_path):
    """A CPU run (--hellaswag=0) gets no empty HellaSwag panel, and bits per byte (evaluated every 50 steps)
    is drawn over the same steps as the loss, so the panels line up."""
    series = {"loss": {s: 10 - s * 0.01 for s in range(1, 151)}, "val_loss": {50: 7.0, 100: 6.5, 150: 6.0},
              "val_bpb": {50: 3.0, 100: 2.8, 150: 2.6}, "hellaswag": {}}
    drawn = plot.plot(series, str(tmp_path / "a.png"))
    assert [title for title, _ in drawn] == ["loss (nats per token)", "val bits per byte"]
    assert drawn[0][1] == drawn[1][1] and drawn[1][1][0] < 10
    drawn = plot.plot({**series, "hellaswag": {150: 0.26}}, str(tmp_path / "b.png"))
    assert [title for title, _ in drawn][2] == "HellaSwag acc_norm" and len({xlim for _, xlim in drawn}) == 1
    drawn = plot.plot({**series, "core": {100: 0.05, 150: 0.08}}, str(tmp_path / "c.png"))  # --core=N
    assert [title for title, _ in drawn][2:] == ["CORE"] and len({xlim for _, xlim in drawn}) == 1


def test_plot_takes_log_folders_and_draws_gpt2s_own_loss(tmp_path, monkeypatch, capsys):
    """--log and --gpt2_log take a log folder (its metrics.jsonl); --gpt2_log, the log of an --eval_only=True
    --init_from=gpt2 run on the user's shard, draws GPT-2's own validation loss on the loss panel; one
    evaluation is said as one."""
    import matplotlib.figure
    mine = [{"event": "start", "step": 0, "config": {"init_from": "scratch"}}, {"step": 1, "loss": 9.0},
            {"step": 2, "loss": 8.0}, {"step": 2, "val_loss": 7.5}]
    gpt2 = [{"event": "start", "step": 0, "config": {"init_from": "gpt2", "eval_only": True}},
            {"step": 0, "val_loss": 3.3101, "val_bpb": 1.1}]
    for name, records in (("log", mine), ("log_gpt2", gpt2)):
        (tmp_path / name).mkdir()
        write_log(tmp_path / name / "metrics.jsonl", records)
    figures, save = [], matplotlib.figure.Figure.savefig
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig",
                        lambda fig, *args, **kwargs: figures.append(fig) or save(fig, *args, **kwargs))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["plot.py", "--log=log", "--gpt2_log=log_gpt2"])
    plot.main()
    out = capsys.readouterr().out
    assert out.startswith("wrote log/plot.png: 2 train steps, 1 val eval, 0 HellaSwag evals\n")
    drawn = {line.get_label(): list(line.get_ydata()) for line in figures[0].axes[0].get_lines()}
    assert drawn == {"train loss": [9.0, 8.0], "val loss": [7.5],
                     "gpt2 (eval only) (3.3101)": [3.3101, 3.3101]}


def test_plot_errors(tmp_path, monkeypatch):
    """UserErrors (plot.py's one line: test_plot_into_a_missing_folder_is_one_line)."""
    monkeypatch.setattr(sys, "argv", ["plot.py", "--log", str(tmp_path / "nope.jsonl")])
    with pytest.raises(UserError, match="nope.jsonl does not exist"):
        plot.main()
    write_log(tmp_path / "start.jsonl", [{"event": "start", "step": 0}])
    with pytest.raises(UserError, match="no loss or evaluation records"):
        plot.load_metrics(str(tmp_path / "start.jsonl"))
    write_log(tmp_path / "bad.jsonl", [], tail="not json\n{}\n")
    with pytest.raises(UserError, match="bad.jsonl:1: not valid JSON"):
        plot.load_metrics(str(tmp_path / "bad.jsonl"))


def test_hellaswag_reference_levels_follow_the_model_size(tmp_path):
    """The published levels drawn on the HellaSwag panel are those of the run's model size, read from its
    start record: GPT-2 and GPT-3 for 124M, GPT-2 for 1558M, none for a shape nothing was published for."""
    def levels(n_layer, n_embd):
        write_log(tmp_path / "m.jsonl", [{"event": "start", "step": 0, "config": {},
                                          "model_config": {"n_layer": n_layer, "n_embd": n_embd}},
                                         {"step": 1, "loss": 5.0}, {"step": 1, "hellaswag": 0.25}])
        run = plot.settings(str(tmp_path / "m.jsonl"))
        plot.plot(plot.load_metrics(str(tmp_path / "m.jsonl")), str(tmp_path / "m.png"),
                  references=plot.reference_levels(run))
        return plot.reference_levels(run)
    assert levels(12, 768) == [("OpenAI GPT-2 124M", 0.2955), ("OpenAI GPT-3 125M", 0.337)]
    assert levels(48, 1600) == [("OpenAI GPT-2 1558M", 0.4893)]
    assert levels(4, 64) == [] and levels(24, 1024) == []  # the CPU default; 350M: none published here


@pytest.mark.slow
def test_a_finished_run_reports_from_its_log_alone(tmp_path, monkeypatch, reference):
    """The report a finished run writes (report.md, plot.png) holds its log's numbers, and the same report
    made again later from the log (python plot.py --report) is the same text."""
    import os
    from conftest import records
    log = tmp_path / "log"
    shutil.copytree(reference[2], log)
    written = (log / "report.md").read_text()
    recs = records(log)
    start = recs[0]
    vals = {r["step"]: r["val_loss"] for r in recs if "val_loss" in r}
    steps = [r for r in recs if "loss" in r and "event" not in r]
    assert f"- steps: 8 of 8; tokens seen: {8 * start['config']['total_batch_size']:,}" in written
    assert f"- val loss: {vals[8]:.4f} at step 8 (best {min(vals.values()):.4f} at step " in written
    assert f"- final train loss {steps[-1]['loss']:.4f}" in written and (log / "plot.png").exists()
    assert all(f"    {text!r}" in written for text in recs[-1]["samples"])
    assert '"n_layer": 2' in written and start["run"]["torch"] in written
    assert "- hardware: 1 process on 1 host: 1 x " in written  # not "1 processes on 1 host(s)"
    assert "![loss and bits per byte](plot.png)" in written  # --hellaswag=0: the panels drawn, no others
    os.remove(log / "report.md")
    monkeypatch.setattr(sys, "argv", ["plot.py", "--report", f"--log={log / 'metrics.jsonl'}"])
    plot.main()
    assert (log / "report.md").read_text() == written


@pytest.mark.slow
def test_sample_cli_where_compile_cannot_work(checkpoint, monkeypatch, capsys):
    """--compile=True where inductor cannot work (here: no C++ compiler): one NOTE, then eager decoding, the
    same texts as --compile=False (in-process)."""
    import os
    path, _ = checkpoint
    args = ["--model", path, "--prompt", "To be", "--num_samples", "2", "--max_new_tokens", "8",
            "--device", "cpu"]
    r = script("sample.py", *args, "--compile=True", env={**os.environ, "CXX": "/nonexistent/g++"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith("NOTE: torch.compile does not work here (") and "(eager)" in r.stdout
    monkeypatch.setattr(sys, "argv", ["sample.py", *args, "--compile=False"])
    sample.main()
    eager = capsys.readouterr().out
    assert eager.split("-" * 80)[:2] == r.stdout.split("\n", 1)[1].split("-" * 80)[:2]


@pytest.mark.slow
def test_plot_into_a_missing_folder_is_one_line(tmp_path):
    """plot.py --out missing_dir/x.png: one line naming the folder, not matplotlib's traceback."""
    import json
    log = tmp_path / "metrics.jsonl"
    log.write_text(json.dumps({"event": "start", "step": 0, "config": {}}) + "\n"
                   + json.dumps({"step": 1, "loss": 5.0}) + "\n")
    r = script("plot.py", "--log", str(log), "--out", str(tmp_path / "missing" / "x.png"))
    assert_one_line_error(r, f"--out {tmp_path / 'missing' / 'x.png'}: the folder {tmp_path / 'missing'} does "
                             "not exist: create it, or choose another --out")
