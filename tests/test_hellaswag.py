import itertools
import json
import os
import re
import subprocess
import sys
import threading
import time

import pytest
import torch

from conftest import MODERN, ROOT, assert_one_line_error, save_model, script, write_jsonl
from conftest import hellaswag_example as example
from gptlib import packing
from gptlib.errors import UserError
from gptlib.runtime import Runtime
from gptlib.tokenizer import get_encoding
import hellaswag
from model import GPT, GPTConfig, Packing

SHARED = os.path.join(ROOT, "..", "shared", "data", "hellaswag_val.jsonl")


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return GPT(GPTConfig(block_size=512, vocab_size=50304, n_layer=2, n_head=2, n_embd=32)).eval()


@pytest.fixture(scope="module", params=["gpt2", "modern"])
def models(request, model):
    """The tiny GPT-2, and one with the modern options (rotary positions take the packed rows' pos too;
    zero_init aside: an untrained model that starts uniform answers the same for everything)."""
    if request.param == "gpt2":
        return model
    torch.manual_seed(0)
    modern = {name: True for name in MODERN if name != "zero_init"}
    return GPT(GPTConfig(block_size=512, vocab_size=50304, n_layer=2, n_head=2, n_embd=32, **modern)).eval()


def test_render_and_masks():
    enc = get_encoding()
    ex = hellaswag.normalize(example(3), "test")
    rows, masks = hellaswag.render(ex, enc, 1024)
    ctx = enc.encode_ordinary(ex["ctx"])
    for row, mask, ending in zip(rows, masks, ex["endings"]):
        end = enc.encode_ordinary(" " + ending)
        assert row == ctx + end and mask == [0] * len(ctx) + [1] * len(end)
    assert enc.decode(rows[0]) == ex["ctx"] + " " + ex["endings"][0]


def test_ending_losses_are_masked_cross_entropy():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 11)
    tokens = torch.randint(0, 11, (2, 5))
    mask = torch.tensor([[0, 0, 1, 1, 1], [0, 0, 0, 1, 0]], dtype=torch.float)
    total, mean = hellaswag.ending_losses(logits, tokens, mask)
    logp = torch.log_softmax(logits, -1)
    expected = [-(logp[0, 1, tokens[0, 2]] + logp[0, 2, tokens[0, 3]] + logp[0, 3, tokens[0, 4]]),
                -logp[1, 2, tokens[1, 3]]]
    assert torch.allclose(total, torch.stack(expected))
    assert torch.allclose(mean, torch.stack([expected[0] / 3, expected[1]]))


def test_a_packed_row_scores_each_ending_as_its_own_row(models):
    model = models
    """One row per example (the context once, then the 4 endings, each seeing the context and itself at the
    positions it has after the context; the head at the ending tokens only) gives each ending the summed
    cross-entropy its own row context + ending gives, also with an empty context (nothing predicts a row's
    first token) and for examples of different lengths padded into one batch."""
    enc = get_encoding()
    examples = [hellaswag.normalize(example(i), "t") for i in (0, 7, 11)]
    examples.append({**examples[0], "ctx": ""})
    for ex in examples:
        ctx, ends = hellaswag.encode(ex, enc, 1024)
        (tokens, pos, group), scored, n = packing.pack([ctx + end for end in ends],
                                                       [(len(ctx), len(ctx) + len(end)) for end in ends])
        assert tokens[:len(ctx)].tolist() == ctx and (group == -1).sum() >= len(ctx) and n == 4  # + shared
        assert len(scored) == sum(map(len, ends)) - (0 if ctx else 4)
    prepared = hellaswag.prepare(examples, Runtime(), 6, 1024)  # one batch, 2 padding rows
    [(_, _, order)] = prepared.batches
    tokens, pos, group, select, targets, owner = prepared.arrays(0, "cpu")
    assert tokens.shape[0] == 6 and tokens.shape[1] % packing.BUCKET == 0
    assert prepared.labels == {i: ex["label"] for i, ex in enumerate(examples)}
    logits, _ = model(tokens, packing=Packing(pos, packing.attention_mask(group), select))
    assert logits.shape == (len(select), 50304)
    losses = torch.nn.functional.cross_entropy(logits, targets, reduction="none")
    total = torch.zeros(4 * len(examples)).index_add_(0, owner, losses)
    ref = []
    for ex in [examples[i] for i in order]:  # the batch's rows are sorted by length
        rows, masks = hellaswag.render(ex, enc, 1024)
        T = max(len(r) for r in rows)
        row_tokens = torch.tensor([r + [0] * (T - len(r)) for r in rows])
        mask = torch.tensor([m + [0] * (T - len(m)) for m in masks], dtype=torch.float)
        ref.append(hellaswag.ending_losses(model(row_tokens)[0], row_tokens, mask)[0])
    torch.testing.assert_close(total, torch.cat(ref), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("batch_size", [1, 3, 8])
def test_batched_equals_unbatched(models, batch_size):
    model = models
    examples = [hellaswag.normalize(example(i), "t") for i in range(20)]
    ref = hellaswag.evaluate_unbatched(model, examples, Runtime())
    got = hellaswag.evaluate(model, hellaswag.prepare(examples, Runtime(), batch_size, model.config.block_size),
                             Runtime())
    assert got["predictions"] == ref["predictions"]
    assert (got["n"], got["acc"], got["acc_norm"]) == (ref["n"], ref["acc"],
                                                       ref["acc_norm"]) and got["n"] == 20
    assert len({p[1] for p in ref["predictions"]}) > 1  # the model does not answer the same for everything


def test_progress_into_a_redirected_log_is_a_line_or_two(model, capsys, monkeypatch):
    """Into a file (not a terminal) the progress bar writes its first and last state, not one update a batch
    (1,256 lines for HellaSwag's 10,042 at db9da80, a line a batch at 234821a): tqdm's clock goes 0.5 s on at
    each look, so every batch takes longer than a terminal's 0.1 s between updates, and all of them together
    less than a log's 30 s."""
    import tqdm.std
    looks = itertools.count()
    monkeypatch.setattr(tqdm.std, "time", lambda: 0.5 * next(looks))  # what each new bar reads the time with
    examples = [hellaswag.normalize(example(i), "t") for i in range(20)]
    prepared = hellaswag.prepare(examples, Runtime(), 1, model.config.block_size)
    assert len(prepared.batches) >= 10
    hellaswag.evaluate(model, prepared, Runtime(), progress=True)
    err = capsys.readouterr().err  # pytest's capture is no terminal
    assert f"{len(prepared.batches)}/{len(prepared.batches)}" in err and err.count("\r") <= 3, err


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_ranks_split_examples_once(model, world_size):
    examples = [hellaswag.normalize(example(i), "t") for i in range(10)]  # 10 does not divide by 3 or 4
    block = model.config.block_size
    single = hellaswag.evaluate(model, hellaswag.prepare(examples, Runtime(), 4, block), Runtime())
    ranks = [Runtime(rank=rank, world_size=world_size) for rank in range(world_size)]
    parts = [hellaswag.evaluate(model, hellaswag.prepare(examples, rt, 4, block), rt) for rt in ranks]
    indices = [i for p in parts for i, _, _ in p["predictions"]]
    assert sorted(indices) == list(range(10))  # every example once
    assert sorted(pred for p in parts for pred in p["predictions"]) == single["predictions"]
    assert sum(p["n"] for p in parts) == 10  # (no process group: counts stay per rank)


def test_fewer_examples_than_ranks(model):
    """3 examples over 4 ranks: rank 3 has none and still runs its padding batch (an IndexError in
    packing.padded_lengths at db9da80), the others one each."""
    examples = [hellaswag.normalize(example(i), "t") for i in range(3)]
    block = model.config.block_size
    single = hellaswag.evaluate(model, hellaswag.prepare(examples, Runtime(), 4, block), Runtime())
    ranks = [Runtime(rank=rank, world_size=4) for rank in range(4)]
    # each rank's forwards (its counts are summed by hellaswag.evaluate's all-reduce, which needs a group)
    parts = [packing.evaluate(model, hellaswag.prepare(examples, rt, 4, block), rt) for rt in ranks]
    assert [len(p) for p in parts] == [1, 1, 1, 0]
    assert sorted(pred[:3] for p in parts for pred in p) == single["predictions"]
    assert packing.padded_lengths([]) == []


def test_labels_and_bad_examples(tmp_path):
    assert hellaswag.normalize({**example(0), "label": "2"}, "x")["label"] == 2  # the HF copy's str labels
    for bad, match in [({**example(0), "label": "x"}, "integer "
                                                      "label"), ({**example(0), "label": 4}, "label 0-3"),
                       ({**example(0), "endings": ["a", "b"]}, "4 strings"), ({"ctx": "c"}, "needs ctx")]:
        with pytest.raises(UserError, match=match):
            hellaswag.normalize(bad, "where")
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(example(0)) + "\n{broken\n")
    with pytest.raises(UserError, match="bad.jsonl:2: not valid JSON"):
        hellaswag.load_examples(str(path))
    with pytest.raises(UserError, match="does not exist"):
        hellaswag.load_examples(str(tmp_path / "missing.jsonl"))
    empty = write_jsonl(tmp_path / "empty.jsonl", [])
    with pytest.raises(UserError, match="no HellaSwag examples"):
        hellaswag.load_examples(empty)
    with pytest.raises(UserError, match="no HellaSwag examples"):
        hellaswag.load_examples(write_jsonl(tmp_path / "one.jsonl", [example(0)]), limit=0)


def test_save_to_disk_folder(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = [{**example(i), "label": str(example(i)["label"])} for i in range(5)]  # HF layout: str labels
    datasets.DatasetDict({"validation": datasets.Dataset.from_list(rows)}).save_to_disk(str(tmp_path / "hs"))
    got = hellaswag.load_examples(str(tmp_path / "hs"), limit=3)
    assert got == [hellaswag.normalize(example(i), "t") for i in range(3)]


@pytest.mark.parametrize("posix", [True, False])
def test_one_process_downloads_the_others_wait(tmp_path, monkeypatch, posix):
    """The first caller downloads, the others wait for its file. posix=False hides fcntl, as on Windows."""
    datasets = pytest.importorskip("datasets")
    if not posix:
        monkeypatch.setitem(sys.modules, "fcntl", None)  # `import fcntl` raises ImportError
    calls = []

    def fake_load_dataset(name, split):
        calls.append((name, split))
        time.sleep(0.3)  # the other callers arrive while this one downloads
        return [{**example(i), "label": str(example(i)["label"])} for i in range(7)]

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    monkeypatch.setattr(hellaswag, "hub_online", lambda: True)
    results = []

    def load():
        results.append(hellaswag.load_examples(cache_dir=str(tmp_path)))
    threads = [threading.Thread(target=load) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls == [("Rowan/hellaswag", "validation")]
    assert len(results) == 4 and all(r == results[0] and len(r) == 7 for r in results)
    assert sorted(os.listdir(tmp_path)) == ["hellaswag_val.jsonl", "hellaswag_val.jsonl.lock"]


@pytest.mark.slow
def test_cli_single_and_torchrun_gloo(model, tmp_path, monkeypatch, capsys):
    """hellaswag.py in one process (in-process) and under torchrun on 2 gloo ranks: the reference's acc and
    acc_norm, said once."""
    data = write_jsonl(tmp_path / "hs.jsonl", [example(i) for i in range(11)])
    ckpt = save_model(model, tmp_path / "model.pt")
    ref = hellaswag.evaluate_unbatched(model, hellaswag.load_examples(data), Runtime())
    line = re.compile(r"hellaswag: (\d+) examples, acc (\S+), acc_norm (\S+), \S+ examples/s")
    args = ["hellaswag.py", "--model", ckpt, "--data", data, "--device", "cpu", "--batch_size", "4"]
    monkeypatch.setattr(sys, "argv", args)
    hellaswag.main()
    torchrun = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                               "--nproc_per_node=2"] + args, cwd=ROOT, capture_output=True, text=True)
    assert torchrun.returncode == 0, torchrun.stderr[-3000:]
    for out in (capsys.readouterr().out, torchrun.stdout):
        m = line.search(out)
        assert m and int(m.group(1)) == 11, out
        assert (float(m.group(2)), float(m.group(3))) == (round(ref["acc"], 4), round(ref["acc_norm"], 4))
        assert len(line.findall(out)) == 1  # printed by rank 0 only


@pytest.mark.slow
def test_cli_missing_data_is_one_line(model, tmp_path):
    ckpt = save_model(model, tmp_path / "model.pt")
    r = script("hellaswag.py", "--model", ckpt, "--hellaswag_data", str(tmp_path / "hs.jsonl"), "--device",
               "cpu")  # train_gpt2.py's name for --data
    assert_one_line_error(r, "HellaSwag data", "hs.jsonl does not exist")


def test_download_failure_names_the_way_out(tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets")

    def offline(name, split):
        raise ConnectionError("Couldn't reach 'Rowan/hellaswag' on the Hub (LocalEntryNotFoundError)\nmore "
                              "detail")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    monkeypatch.setattr(hellaswag, "hub_online", lambda: True)  # reachable, then the download fails
    with pytest.raises(UserError) as e:
        hellaswag.load_examples(cache_dir=str(tmp_path))
    assert str(e.value) == ("could not download HellaSwag (Couldn't reach 'Rowan/hellaswag' on the Hub "
                            "(LocalEntryNotFoundError)); offline, pass a local copy of hellaswag_val.jsonl "
                            "(github.com/rowanz/hellaswag) with --data")
    assert not os.path.exists(tmp_path / "hellaswag_val.jsonl")


@pytest.mark.skipif(not os.path.exists(SHARED),
                    reason="the real HellaSwag file lives in ../shared (developers only)")
def test_real_validation_file():
    examples = hellaswag.load_examples(SHARED)
    assert len(examples) == 10042
    assert sorted({e["label"] for e in examples}) == [0, 1, 2, 3]


def test_offline_download_fails_at_once_and_leaves_nothing(tmp_path, monkeypatch):
    """The Hub unreachable (HF_ENDPOINT at a closed local port): one line naming --data, without waiting for
    retries, and no folder or lock file left behind."""
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    for proxy in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(proxy, raising=False)
    with pytest.raises(UserError, match="the Hugging Face Hub cannot be reached; offline, pass a local copy "
                                        "of hellaswag_val.jsonl .* with --data"):
        hellaswag.load_examples(cache_dir=str(tmp_path / "hs"))
    assert not os.path.exists(tmp_path / "hs")


def test_download_alone_for_a_machine_without_internet(tmp_path, monkeypatch, capsys):
    """python hellaswag.py --download, the way to fetch the data for offline nodes: the file's path once it is
    there; offline, a UserError (one line) naming the setting that takes a copy (docs/reproduce.md's `python
    -c "import hellaswag; hellaswag.download(...)"` ended in a traceback)."""
    monkeypatch.setattr(hellaswag, "CACHE_DIR", str(tmp_path / "hs"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(sys, "argv", ["hellaswag.py", "--download"])
    with pytest.raises(UserError, match=r"the Hugging Face Hub cannot be reached; offline, pass a local copy "
                                        r"of hellaswag_val.jsonl \(.+\) with --hellaswag_data$"):
        hellaswag.main()
    write_jsonl(tmp_path / "hs" / "hellaswag_val.jsonl", [example(0)])
    hellaswag.main()
    assert capsys.readouterr().out == f"hellaswag: {tmp_path / 'hs' / 'hellaswag_val.jsonl'}\n"


def test_offline_hellaswag_in_training_names_its_setting(tmp_path, monkeypatch, text):
    """train_gpt2.py with HellaSwag on and the Hub unreachable: the line names --hellaswag_data, the setting
    that takes a local copy there (before: hellaswag.py's --data)."""
    import train_gpt2
    from conftest import TINY
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    for proxy in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(proxy, raising=False)
    monkeypatch.chdir(tmp_path)  # hellaswag_data/ would be made here
    with pytest.raises(UserError, match=r"offline, pass a local copy of hellaswag_val.jsonl "
                                        r"\(github.com/rowanz/hellaswag\) with --hellaswag_data$"):
        train_gpt2.main(TINY + [f"--data_root={text}", "--hellaswag=5", f"--log_dir={tmp_path / 'log'}"])


def test_a_training_run_tokenizes_hellaswag_once(tmp_path, monkeypatch, text):
    """train_gpt2.py tokenizes and packs HellaSwag once, at start-up, for all its evaluations (here 3: steps
    2, 4 and 6), each of which scores every example."""
    import train_gpt2
    from conftest import TINY, records
    data = write_jsonl(tmp_path / "hs.jsonl", [example(i) for i in range(9)])
    calls = []
    real = hellaswag.encode_all
    monkeypatch.setattr(hellaswag, "encode_all",
                        lambda *args: calls.append(1) or real(*args))
    log = tmp_path / "log"
    assert train_gpt2.main(TINY + [f"--data_root={text}", "--max_steps=6", "--eval_interval=2",
                                   "--checkpoint_interval=6", "--hellaswag=9", f"--hellaswag_data={data}",
                                   f"--log_dir={log}"]) == 0
    evaluated = [(r["step"], r["hellaswag_n"]) for r in records(log) if "hellaswag" in r]
    assert evaluated == [(2, 9), (4, 9), (6, 9)]
    assert len(calls) == 1


def test_a_model_of_few_positions_evaluates_cropped_contexts(tmp_path, capsys, text):
    """A packed row (the context once, then 4 endings) is longer than the positions it uses, and a small
    model's block_size may not hold a context and its longest ending: each context is cropped from the left
    to fit, the same way in the packed evaluation and the one-example reference (their predictions equal),
    and a training run with block_size 48 evaluates HellaSwag instead of dying at its first evaluation; an
    ending longer than block_size is one line at start-up."""
    import train_gpt2
    from conftest import TINY, records
    examples = [hellaswag.normalize(example(i), "t") for i in range(12)]  # contexts up to ~90 tokens
    ctx, ends = hellaswag.encode(examples[11], get_encoding(), 40)
    assert len(ctx) + max(map(len, ends)) == 40
    assert len(hellaswag.encode(examples[11], get_encoding(), 1024)[0]) > 40  # cropped from more
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=40, vocab_size=50304, n_layer=2, n_head=2, n_embd=32)).double().eval()
    ref = hellaswag.evaluate_unbatched(model, examples, Runtime())
    got = hellaswag.evaluate(model, hellaswag.prepare(examples, Runtime(), 4, 40), Runtime())
    assert got["predictions"] == ref["predictions"] and got["n"] == 12
    data = write_jsonl(tmp_path / "hs.jsonl", [example(i) for i in range(12)])
    log = tmp_path / "log"
    assert train_gpt2.main(TINY + [f"--data_root={text}", "--block_size=48", "--max_steps=2", "--hellaswag=12",
                                   f"--hellaswag_data={data}", f"--log_dir={log}"]) == 0
    assert [r["step"] for r in records(str(log)) if "hellaswag" in r] == [2]
    with pytest.raises(UserError, match="a HellaSwag ending of .* tokens does not fit the model's block_size=4"):
        hellaswag.prepare(examples, Runtime(), 4, 4)
