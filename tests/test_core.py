"""CORE (core_eval.py) and the packing it shares with HellaSwag (packing.py): a bundle in DCLM's layout that
the tests make, the packed evaluation against a one-example-at-a-time reference written here (prompts
rendered with Jinja templates, as DCLM and nanochat render them), ranks, the command line, the inline
setting."""
import json
import os
import random
import re
import subprocess
import sys
import urllib.error

import jinja2
import pytest
import torch

from conftest import (ENV, ROOT, TINY, hellaswag_example, records, save_model, write_core_bundle,
                      write_jsonl)
import core_eval
from gptlib import packing
from gptlib.engine import Engine
from gptlib.errors import UserError
from gptlib.runtime import Runtime
from gptlib.tokenizer import encode_many, get_encoding
from model import GPT, GPTConfig

BLOCK = 64  # few positions: lm_long's prompts are cropped

# the prompt formats of DCLM's in-context tasks (few-shot examples, each followed by a blank line, then the
# example); written here as templates, independently of core_eval.prompts
TEMPLATES = {
    "multiple_choice": "{% for s in shots %}{{ s.query }}{{ d }}{{ s.choices[s.gold] }}\n\n{% endfor %}"
                       "{{ ex.query }}{{ d }}{{ option }}",
    "schema": "{% for s in shots %}{{ s.context_options[s.gold] }}{{ d }}{{ s.continuation }}\n\n{% endfor %}"
              "{{ option }}{{ d }}{{ ex.continuation }}",
    "language_modeling": "{% for s in shots %}{{ s.context | trim }}{{ d }}{{ s.continuation }}\n\n{% endfor %}"
                         "{{ ex.context | trim }}{{ d }}{{ option }}",
}


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return GPT(GPTConfig(block_size=BLOCK, vocab_size=50304, n_layer=2, n_head=2, n_embd=32)).double().eval()


@pytest.fixture(scope="module")
def bundle(tmp_path_factory, model):
    """write_core_bundle's 5 tasks, and a sixth whose continuations are, for half of its examples, the
    model's own greedy tokens: language modelling is then right for some examples, wrong for others."""
    folder = write_core_bundle(tmp_path_factory.mktemp("bundle"))
    enc, rows = get_encoding(), []
    for i, row in enumerate(json.loads(line) for line in open(os.path.join(folder, "eval_data/mc/zeroshot.jsonl"))):
        context = row["query"].strip()
        greedy = Engine(model).generate(torch.tensor([[enc.eot_token] + enc.encode_ordinary(context)]), 2,
                                        top_k=1)[0, -2:].tolist()
        rows.append({"context": context, "continuation": enc.decode(greedy) if i % 2 else " so it goes"})
    write_jsonl(os.path.join(folder, "eval_data", "lm", "greedy.jsonl"), rows)
    with open(os.path.join(folder, "core.yaml"), "a", encoding="utf-8") as f:
        f.write("- label: lm_greedy\n  dataset_uri: lm/greedy.jsonl\n  num_fewshot: [0]\n"
                "  icl_task_type: language_modeling\n  continuation_delimiter: ''\n")
    with open(os.path.join(folder, "eval_meta_data.csv"), "a", encoding="utf-8") as f:
        f.write("lm_greedy,test,language_modeling,0,12,0.0,\n")
    return folder


def reference(model, bundle, max_per_task=None):
    """{label: [right or not, per example]}: the bundle read, shuffled and cut as nanochat does, each example
    rendered, tokenized, cropped and scored alone, its options padded into one forward."""
    import csv
    import yaml
    enc = get_encoding()
    config = yaml.safe_load(open(os.path.join(bundle, "core.yaml")))["icl_tasks"]
    baselines = {r["Eval Task"]: float(r["Random baseline"])
                 for r in csv.DictReader(open(os.path.join(bundle, "eval_meta_data.csv")))}
    out = {}
    for t in config:
        rows = [json.loads(line) for line in open(os.path.join(bundle, "eval_data", t["dataset_uri"]))]
        random.Random(1337).shuffle(rows)
        rows = rows[:max_per_task]
        template, d, kind = jinja2.Template(TEMPLATES[t["icl_task_type"]]), t["continuation_delimiter"], \
            t["icl_task_type"]
        right = []
        for i, ex in enumerate(rows):
            others = [j for j in range(len(rows)) if j != i]
            shots = [rows[j] for j in random.Random(1234 + i).sample(others, min(t["num_fewshot"][0], len(others)))]
            options = {"multiple_choice": ex.get("choices"), "schema": ex.get("context_options"),
                       "language_modeling": ["", ex.get("continuation")]}[kind]
            texts = [template.render(shots=shots, d=d, ex=ex, option=o) for o in options]
            if kind == "language_modeling":
                texts[0] = texts[0].strip()
            seqs = [[enc.eot_token] + enc.encode_ordinary(x) for x in texts]
            if kind == "multiple_choice":  # scored: after the common prefix
                k = 0
                while all(len(s) > k and s[k] == seqs[0][k] for s in seqs):
                    k += 1
                spans = [(k, len(s)) for s in seqs]
            elif kind == "schema":  # the common suffix
                k = 0
                while all(len(s) > k and s[-1 - k] == seqs[0][-1 - k] for s in seqs):
                    k += 1
                spans = [(len(s) - k, len(s)) for s in seqs]
            else:
                spans, seqs = [(len(seqs[0]), len(seqs[1]))], [seqs[1]]
            scores = []
            for s, (a, b) in zip(seqs, spans):
                cut = max(0, len(s) - BLOCK)
                s, a, b = s[cut:], a - cut, b - cut
                logits = model(torch.tensor([s]))[0][0]  # alone, no padding
                if kind == "language_modeling":
                    scores.append(bool((logits[a - 1:b - 1].argmax(-1) == torch.tensor(s[a:b])).all()))
                else:
                    scores.append(torch.nn.functional.cross_entropy(logits[a - 1:b - 1], torch.tensor(s[a:b])).item())
            right.append(scores[0] if kind == "language_modeling" else scores.index(min(scores)) == ex["gold"])
        out[t["label"]] = (right, baselines[t["label"]])
    return out


@pytest.mark.slow
def test_packed_equals_the_one_example_reference(model, bundle):
    """Per example the same verdict as the reference, in every task: multiple choice of 2-4 options, few-shot,
    a non-space delimiter, schema, language modelling (some right, some wrong), prompts cropped at the
    model's positions; accuracies, centered scores and CORE follow. The per-example loop of core_eval
    (--unbatched) agrees too."""
    tasks = core_eval.load_tasks(bundle)
    assert [t.label for t in tasks] == ["mc_zeroshot", "mc_fewshot", "schema", "lm_short", "lm_long", "lm_greedy"]
    enc = get_encoding()
    long = tasks[4]
    assert all(len(enc.encode_ordinary(core_eval.texts(long, i)[1])) > BLOCK
               for i in range(len(long.examples)))
    got = core_eval.evaluate(model, core_eval.Prepared(tasks, Runtime(), 3, BLOCK), Runtime())
    ref = reference(model, bundle)
    flat = [ok for right, _ in ref.values() for ok in right]
    assert [ok for _, ok in got["predictions"]] == flat
    assert 0 < sum(ref["lm_greedy"][0]) < len(ref["lm_greedy"][0]) and 0 < sum(flat) < len(flat)
    for label, (right, baseline) in ref.items():
        accuracy = sum(right) / len(right)
        assert got["tasks"][label] == {"accuracy": accuracy, "centered": (accuracy - baseline / 100) /
                                       (1 - baseline / 100), "n": len(right)}
    assert got["core"] == pytest.approx(sum(t["centered"] for t in got["tasks"].values()) / 6)
    unbatched = core_eval.evaluate_unbatched(model, tasks, Runtime())
    assert unbatched["predictions"] == got["predictions"] and unbatched["core"] == got["core"]


def test_a_subset_is_the_first_after_nanochats_shuffle(model, bundle):
    """--max_per_task N keeps the first N rows after random.Random(1337)'s shuffle, and few-shot examples are
    drawn from those (so a subset agrees with nanochat's numbers for it)."""
    tasks = core_eval.load_tasks(bundle, 5)
    rows = [json.loads(line) for line in open(os.path.join(bundle, "eval_data", "mc", "fewshot.jsonl"))]
    random.Random(1337).shuffle(rows)
    assert tasks[1].examples == rows[:5] and all(len(t.examples) == 5 for t in tasks)
    got = core_eval.evaluate(model, core_eval.Prepared(tasks, Runtime(), 4, BLOCK), Runtime())
    assert [ok for _, ok in got["predictions"]] == [ok for right, _ in reference(model, bundle, 5).values()
                                                    for ok in right]


@pytest.mark.parametrize("world_size", [2, 3])
def test_ranks_split_the_examples_once(model, bundle, world_size):
    tasks = core_eval.load_tasks(bundle)
    single = core_eval.evaluate(model, core_eval.Prepared(tasks, Runtime(), 4, BLOCK), Runtime())
    parts = [core_eval.evaluate(model, core_eval.Prepared(tasks, rt, 4, BLOCK), rt)
             for rt in (Runtime(rank=r, world_size=world_size) for r in range(world_size))]
    assert sorted(p for part in parts for p in part["predictions"]) == single["predictions"]


def test_bundle_mistakes_are_one_line(tmp_path, monkeypatch):
    """A folder without the bundle's files, a missing task file, and a download without network each name
    the file or the way to place the bundle by hand; the failed download leaves no bundle or lock behind."""
    with pytest.raises(UserError, match=r"core.yaml does not exist: --bundle takes the eval bundle's folder"):
        core_eval.load_tasks(str(tmp_path))
    folder = write_core_bundle(tmp_path / "b")
    with open(os.path.join(folder, "eval_data", "lm", "short.jsonl"), "a") as f:
        f.write('{"context": "cut off\n')  # a damaged line: the file and line named
    with pytest.raises(UserError, match=r"short.jsonl:13: not valid JSON"):
        core_eval.load_tasks(folder)
    import re
    import shutil
    for path, line, said in [  # each a KeyError traceback, or scored silently, at db9da80
            ("mc/zeroshot.jsonl", '{"query": "q", "gold": 0}',
             "zeroshot.jsonl:13: a multiple_choice row without choices (a damaged bundle?)"),
            ("mc/fewshot.jsonl", '{"query": "q", "choices": ["a", "b"], "gold": 2}',
             "fewshot.jsonl:13: gold=2 is not the index of one of its 2 options (a damaged bundle?)")]:
        fixed = write_core_bundle(tmp_path / "c")
        with open(os.path.join(fixed, "eval_data", path), "a") as f:
            f.write(line + "\n")
        with pytest.raises(UserError, match=re.escape(said)):
            core_eval.load_tasks(fixed)
        shutil.rmtree(fixed)
    fixed = write_core_bundle(tmp_path / "c")
    with open(os.path.join(fixed, "core.yaml")) as f:
        text = f.read()
    with open(os.path.join(fixed, "core.yaml"), "w") as f:
        f.write(text.replace("  num_fewshot: [0]\n", "", 1))
    with pytest.raises(UserError, match=r"core.yaml: task 1 has no num_fewshot: not DCLM's core.yaml"):
        core_eval.load_tasks(fixed)
    os.remove(os.path.join(folder, "eval_data", "schema.jsonl"))
    with pytest.raises(UserError, match=r"schema.jsonl does not exist: the bundle is incomplete"):
        core_eval.load_tasks(folder)
    with open(os.path.join(folder, "core.yaml"), "w") as f:
        f.write("icl_tasks: [unclosed\n")
    with pytest.raises(UserError, match=r"core.yaml: not valid YAML \("):
        core_eval.load_tasks(folder)

    def offline(url, path):
        raise urllib.error.URLError("Name or service not known")
    monkeypatch.setattr(core_eval.urllib.request, "urlretrieve", offline)
    with pytest.raises(UserError, match=r"could not download the CORE eval bundle .*unzip it and pass its "
                                        r"eval_bundle folder with --bundle"):
        core_eval.download(str(tmp_path / "cache"))
    assert os.listdir(tmp_path / "cache") == []  # no eval_bundle, and no eval_bundle.lock left behind


@pytest.mark.slow
def test_inline_core_logs_every_task(tmp_path, text, bundle):
    """--core=N evaluates the first N examples of each task at every evaluation, packed once at start-up,
    and logs CORE and each task's accuracy beside the validation loss."""
    log = tmp_path / "log"
    assert __import__("train_gpt2").main(TINY + [f"--data_root={text}", "--max_steps=2", "--eval_interval=1",
                                                 "--core=4", f"--core_bundle={bundle}", f"--log_dir={log}"]) == 0
    core = [r for r in records(log) if "core" in r]
    assert [r["step"] for r in core] == [1, 2] and set(core[0]["core_tasks"]) == {
        "mc_zeroshot", "mc_fewshot", "schema", "lm_short", "lm_long", "lm_greedy"}
    assert core[0]["core"] == pytest.approx(sum(core_eval.centered(a, b) for a, b in zip(
        core[0]["core_tasks"].values(), [30.0, 25.0, 50.0, 0.0, 0.0, 0.0])) / 6)
    report = (log / "report.md").read_text()  # the run's report: CORE beside HellaSwag, and each task
    assert f"- CORE: {core[-1]['core']:.4f} at step 2" in report and "- CORE's tasks at step 2 (accuracy): " in report
    assert "![loss, bits per byte and CORE](plot.png)" in report


@pytest.mark.slow
def test_cli_and_torchrun_agree(tmp_path, bundle, model, monkeypatch, capsys):
    """core_eval.py's main() prints the table, CORE and its time split, and writes --json; python core_eval.py
    from the repo root, in 2 gloo processes under torchrun, gives the same numbers. (CORE through the
    compiled model: test_compile.py's DDP run, against an eager evaluation.)"""
    ckpt = save_model(model.float(), tmp_path / "m.pt")
    model.double()
    args = ["core_eval.py", "--model", ckpt, "--bundle", bundle, "--device", "cpu"]
    monkeypatch.setattr(sys, "argv", args + ["--json", str(tmp_path / "one.json")])
    core_eval.main()
    out = capsys.readouterr().out
    assert "| mc_fewshot | 3 | multiple_choice |" in out
    assert re.search(r"\nCORE -?[.\d]+ \(72 examples, 6 tasks; [.\d]+ s: reading [.\d]+ s, tokenizing and "
                     r"packing [.\d]+ s, forwards [.\d]+ s\)", out), out
    two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
                         + [a.replace("--bundle", "--core_bundle") for a in args]  # train_gpt2.py's name
                         + ["--json", str(tmp_path / "two.json")], cwd=ROOT, env=ENV,
                         capture_output=True, text=True, timeout=300)
    assert two.returncode == 0, two.stderr[-3000:]
    one, two = (json.load(open(tmp_path / f"{n}.json")) for n in ("one", "two"))
    assert {k: one[k] for k in ("core", "tasks")} == {k: two[k] for k in ("core", "tasks")}
    assert one["tasks"]["lm_greedy"]["n"] == 12 and "forwards" in two["seconds"]


def test_a_bundle_made_for_timing_says_its_core_means_nothing(tmp_path, bundle, model, monkeypatch, capsys):
    """dev/make_core_bundle.py's --help describes it, and core_eval.py on the bundle it makes prints CORE,
    then one NOTE that such a CORE means nothing; on another bundle, no NOTE. A bundle made before the mark in
    core.yaml is known by its tasks' category, "bench"."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("make_core_bundle", os.path.join(ROOT, "dev",
                                                                                    "make_core_bundle.py"))
    maker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(maker)
    monkeypatch.setattr(sys, "argv", ["make_core_bundle.py", "--help"])
    with pytest.raises(SystemExit):
        maker.main()
    assert "A CORE eval bundle in DCLM's layout built from local files" in capsys.readouterr().out
    hs = write_jsonl(tmp_path / "hellaswag_val.jsonl", [hellaswag_example(i) for i in range(3)])
    made = str(tmp_path / "made")
    monkeypatch.setattr(sys, "argv", ["make_core_bundle.py", hs, made, "--n", "3"])
    maker.main()
    ckpt = save_model(model.float(), tmp_path / "m.pt")
    model.double()
    for folder, noted in ((made, True), (bundle, False)):
        monkeypatch.setattr(sys, "argv", ["core_eval.py", "--model", ckpt, "--bundle", folder, "--device",
                                          "cpu"])
        capsys.readouterr()
        core_eval.main()
        out = capsys.readouterr().out.splitlines()
        notes = [line for line in out if line.startswith("NOTE: ")]
        assert notes == ([f"NOTE: {made} was made by dev/make_core_bundle.py to time CORE's shapes from "
                          "local files, not DCLM's data: this CORE means nothing (without --bundle, DCLM's "
                          "is downloaded)"] if noted else []), out
        if noted:
            assert out[-2].startswith("CORE "), out  # the NOTE right under the score
    import train_gpt2  # its --eval_only says the same, right under the score
    (tmp_path / "t.txt").write_text(open(os.path.join(ROOT, "input.txt"), encoding="utf-8").read(20_000))
    assert train_gpt2.main(["--device=cpu", "--eval_only=True", f"--init_from={ckpt}", f"--data_root={tmp_path / 't.txt'}",
                            "--core=3", f"--core_bundle={made}", "--T=32", "--B=4", "--total_batch_size=128",
                            "--val_tokens=128", f"--log_dir={tmp_path / 'eval'}"]) == 0
    out = capsys.readouterr().out.splitlines()
    at = next(i for i, line in enumerate(out) if ": CORE " in line)
    assert out[at + 1] == (f"NOTE: {made} was made by dev/make_core_bundle.py to time CORE's shapes from local "
                           "files, not DCLM's data: this CORE means nothing (without --core_bundle, DCLM's is "
                           "downloaded)"), out
    yaml_path = os.path.join(made, "core.yaml")
    with open(yaml_path, encoding="utf-8") as f:
        first, rest = f.read().split("\n", 1)
    assert first.startswith("made_by: dev/make_core_bundle.py")
    with open(yaml_path, "w", encoding="utf-8") as f:
        f.write(rest)  # as the maker wrote it before the mark
    assert core_eval.made_for_timing(made) and not core_eval.made_for_timing(bundle)


def test_padded_lengths_are_few_and_pad_the_least():
    """At most `most` lengths, each batch padded to one at or above its longest row, and no other grouping of
    consecutive batches pads fewer tokens (all of them tried)."""
    import itertools
    import random
    random.seed(0)

    def padding(lengths, longest):
        return sum(p - -(-n // packing.BUCKET) * packing.BUCKET for p, n in zip(lengths, longest))

    for _ in range(100):
        longest = sorted(random.randint(1, 300) for _ in range(random.randint(1, 8)))
        most = random.randint(1, 4)
        got = packing.padded_lengths(longest, most)
        assert len(set(got)) <= most
        assert all(p >= n and p % packing.BUCKET == 0 for p, n in zip(got, longest))
        least = min(padding([max(-(-n // 8) * 8 for n in longest[i:j]) for i, j in zip(b, b[1:])
                             for _ in range(i, j)], longest)
                    for k in range(min(most, len(longest)))
                    for cuts in itertools.combinations(range(1, len(longest)), k)
                    for b in [(0, *cuts, len(longest))])
        assert padding(got, longest) == least
    # thousands of batches (a 10,042-example run at 4 a batch), against the same program over every batch
    # boundary (quadratic in the batches, so on a sample that it finishes quickly): the same padding
    longest = sorted(random.randint(20, 336) for _ in range(2512))
    got = packing.padded_lengths(longest)
    assert len(set(got)) <= packing.SHAPES and all(p >= n for p, n in zip(got, longest))
    sample = longest[::8]
    m = [-(-n // 8) * 8 for n in sample]
    best = [[0] + [float("inf")] * len(m)]
    for _ in range(packing.SHAPES):
        best.append([0] + [min(best[-1][i] + m[j - 1] * (j - i) - sum(m[i:j]) for i in range(j))
                           for j in range(1, len(m) + 1)])
    assert padding(packing.padded_lengths(sample), sample) == min(row[-1] for row in best)




def test_prompts_encode_in_parts_as_their_whole_texts():
    """core_eval.parts keeps a prompt's pieces apart (its few-shot examples, its context, its delimiter and
    what follows) where a non-space meets whitespace, and Prepared encodes each distinct part once: on
    prompts made to stress the cuts (spaces and other whitespace at either end, the delimiters "", " ",
    "\\n" and "\\nAnswer: ", digits, punctuation, contractions, non-ASCII, choices without a leading space),
    every prompt's parts, encoded and joined, are its whole text's tokens, and cuts of both kinds were made.
    The pieces join into the texts as nanochat renders them (test_packed_equals_the_one_example_reference)."""
    enc = get_encoding()
    bits = ["word", "word ", " word", "12", " 3.5", "!", "?!", " ", "\t", "\n", "é", "日本", "🙂", "'s",
            "don't", "  ", "\u00a0", "\u2028", "a\n", "\n\n", "x\r", "\x1c", "Answer:", "end."]
    rng = random.Random(0)

    def text():
        return "".join(rng.choice(bits) for _ in range(rng.randint(1, 5)))
    made, cut, texts = 0, {"few-shot": 0, "delimiter": 0}, []
    for delim in ("", " ", "\n", "\nAnswer: "):
        rows = {"multiple_choice": [{"query": text(), "choices": [text() for _ in range(3)], "gold": j % 3}
                                    for j in range(12)],
                "schema": [{"context_options": [text(), text()], "continuation": text(), "gold": j % 2}
                           for j in range(12)],
                "language_modeling": [{"context": text(), "continuation": text()} for j in range(12)]}
        for kind, examples in rows.items():
            task = core_eval.Task("t", kind, 5, delim, 0.0, examples)
            demos = [core_eval.demo(task, row) for row in examples]
            for i in range(len(examples)):
                assert core_eval.prompts(task, i, demos) == core_eval.prompts(task, i)
                head, tails = core_eval.prompts(task, i, demos)
                shared, *rests = core_eval.split(head, tails)
                for tail, rest in zip(tails, rests):
                    pieces, kept = head + tail, shared + rest
                    t = "".join(pieces)
                    assert kept == core_eval.parts(pieces) and "".join(kept) == t and all(kept[:-1])
                    joined = [token for part in kept for token in enc.encode_ordinary(part)]
                    assert joined == enc.encode_ordinary(t), (delim, kind, t, kept)
                    last = len(pieces) > 6 and kept[-1] == pieces[-1]  # 5 shots of 2 pieces, context, rest
                    cut["delimiter"] += last
                    cut["few-shot"] += len(kept) - 1 - last
                    made += 1
                    texts += kept
    assert made == 4 * 12 * (3 + 2 + 2)
    assert cut["few-shot"] > 100 and cut["delimiter"] > 20, cut
    assert len(texts) > 3 * 256  # encode_many's threads: each takes a share, in order
    assert encode_many(enc, texts, threads=3) == [enc.encode_ordinary(t) for t in texts]


def test_edge_cases_score_as_nanochat_does(model):
    """An option whose tokens are all shared with the others scores no token: nanochat's mean loss of it is
    NaN, and Python's min() keeps a NaN it starts with, so an option 0 of that kind wins and any other never
    does. A schema task whose contexts are identical is the extreme of it (db9da80 refused it: "do not fit
    block_size", though nothing was cropped). Each verdict equals nanochat's computation, written out here
    (padded batch, the rolled targets, NaN in the last column, mean over [start - 1, end - 1), min and index),
    for the packed and the per-example evaluation alike. A task with fewer examples than its shots takes all
    the others (nanochat's sample() would raise)."""
    enc = get_encoding()
    tasks = [core_eval.Task("mc_empty", "multiple_choice", 0, "\n", 25.0,
                            [{"query": f"Question {i}: who?",
                              "choices": ["", "the king", "a fool"] if i % 2 else ["the king", "", "a fool"],
                              "gold": i % 3} for i in range(6)]),
             core_eval.Task("schema_same", "schema", 0, " ", 50.0,
                            [{"context_options": ["The same words."] * 2, "continuation": "follow.",
                              "gold": i % 2} for i in range(4)]),
             core_eval.Task("few", "multiple_choice", 5, " ", 50.0,
                            [{"query": f"Is {i} even?", "choices": ["yes", "no"], "gold": i % 2}
                             for i in range(3)])]
    assert all(len(core_eval.prompts(tasks[2], i)[0]) == 2 * 2 + 1 for i in range(3))  # 2 shots, query

    def nanochat(task, i):
        seqs = [[enc.eot_token] + enc.encode_ordinary(t) for t in core_eval.texts(task, i)]
        n = min(len(s) for s in seqs)
        if task.kind == "multiple_choice":
            k = next((j for j in range(n) if any(s[j] != seqs[0][j] for s in seqs)), n)
            spans = [(k, len(s)) for s in seqs]
        else:
            k = next((j for j in range(n) if any(s[-1 - j] != seqs[0][-1 - j] for s in seqs)), n)
            spans = [(len(s) - k, len(s)) for s in seqs]
        T = max(len(s) for s in seqs)
        x = torch.tensor([s + [enc.eot_token] * (T - len(s)) for s in seqs])
        with torch.no_grad():
            logits = model(x)[0]
        losses = torch.nn.functional.cross_entropy(logits.flatten(0, 1), torch.roll(x, -1, 1).flatten(),
                                                   reduction="none").view(len(seqs), T)
        losses[:, -1] = float("nan")
        means = [losses[j, a - 1:b - 1].mean().item() for j, (a, b) in enumerate(spans)]
        return means.index(min(means)) == task.examples[i]["gold"]
    want = [nanochat(task, i) for task in tasks for i in range(len(task.examples))]
    got = core_eval.evaluate(model, core_eval.Prepared(tasks, Runtime(), 4, BLOCK), Runtime())
    assert [ok for _, ok in got["predictions"]] == want
    assert [ok for _, ok in core_eval.evaluate_unbatched(model, tasks, Runtime())["predictions"]] == want
    assert want[6:10] == [True, False, True, False]  # identical contexts: option 0, whatever the gold
    packed = core_eval.Prepared(tasks, Runtime(), 4, BLOCK).packed
    by_mean = {i: p for i, _, p, _ in packing.evaluate(model, packed, Runtime())}
    assert [by_mean[i] for i in range(0, 6, 2)].count(1) == 0  # an empty option 1: never picked
    assert [by_mean[i] for i in range(1, 6, 2)] == [0, 0, 0]  # an empty option 0: always
