"""Shared by the tests: the tiny training settings and text, running the entry points the way users do (from
the repo root, in a fresh process, under torchrun where it matters), and reading what a run leaves behind."""
import atexit
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest
import torch

from gptlib.checkpoint import checkpoints, save_checkpoint
from gptlib.settings import RECIPES
from model import GPT, GPTConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "train_gpt2.py")
TINY = ["--device=cpu", "--recipe=gpt2", "--n_layer=2", "--n_head=2", "--n_kv_head=2", "--n_embd=32", "--B=4",
        "--T=32", "--total_batch_size=256", "--warmup_steps=2", "--max_lr=3e-3", "--val_tokens=256",
        "--hellaswag=0", "--compile=False"]
# One thread per process: the exact-resume tests compare runs bit for bit, and a multi-threaded CPU math
# library does not promise the same rounding from run to run.
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
torch.set_num_threads(1)  # the same in the test workers, whose in-process runs are compared with those
# and in every other process a test starts (sample.py, bench.py's sections, ...): on CI's 2 cores, shared by 3
# test workers, a second math thread per process only competes for them
os.environ.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
# Each test worker compiles into an inductor cache of its own, new for the session, which the processes it
# starts share: not the user's (a run the tests kill while compiling can leave a half-written kernel library
# in a cache), and not another worker's.
ENV["TORCHINDUCTOR_CACHE_DIR"] = os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor-")
atexit.register(shutil.rmtree, ENV["TORCHINDUCTOR_CACHE_DIR"], ignore_errors=True)
DOCS = ["Hello, I'm a language model,", "", "naïve café 日本語 🙂", "a literal <|endoftext|> inside",
        "Line one.\n\nLine two.\n"] + [f"Document number {i}: " + "the quick brown fox " * (i % 7 + 1)
                                       for i in range(60)]


@pytest.fixture(scope="session")
def text(tmp_path_factory, worker_id):
    """~16k tokens of input.txt: enough for tiny runs, quick to tokenize. One path for all test workers: the
    shared reference runs name it as their data_root."""
    def write(folder):
        with open(os.path.join(ROOT, "input.txt"), encoding="utf-8") as f:
            (folder / "play.txt").write_text(f.read(60_000), encoding="utf-8")
    return str(once(tmp_path_factory, worker_id, "data", write) / "play.txt")


def run_args(text):
    """An 8-step run on the tiny text: 4 micro-steps a step in one process, 2 on each of 2 ranks; evaluations
    after steps 4 and 8, a checkpoint every 2 steps."""
    return TINY + [f"--data_root={text}", "--max_steps=8", "--eval_interval=4", "--checkpoint_interval=2",
                   "--total_batch_size=512"]


def once(tmp_path_factory, worker_id, name, make):
    """A folder that make(folder) fills once per test session, however many test workers ask for it (each
    pytest-xdist worker runs its own session): the first makes it, the others wait and read it."""
    from filelock import FileLock
    if worker_id == "master":  # no xdist
        folder = tmp_path_factory.mktemp(name)
        make(folder)
        return folder
    shared = tmp_path_factory.getbasetemp().parent  # this session's, common to its workers
    folder = shared / name
    with FileLock(str(shared / f"{name}.lock")):
        if not (folder / "done").exists():
            folder.mkdir(exist_ok=True)
            make(folder)
            (folder / "done").touch()
    return folder


@pytest.fixture(scope="session")
def reference(tmp_path_factory, worker_id, text):
    """run_args uninterrupted in one process: (losses, final weights, log_dir); copy the log_dir to change
    it (the test workers share it)."""
    d = once(tmp_path_factory, worker_id, "ref", lambda d: train_in_process(run_args(text), d / "log"))
    return losses(d / "log"), final_weights(d / "log")["model"], d / "log"


MODERN = [k for k, v in RECIPES["modern"].items() if v is True]  # the model options of the modern recipe
MODERN_RUN = ["--recipe=modern"]  # every model option, Muon for the block matrices


@pytest.fixture(scope="session")
def modern_reference(tmp_path_factory, worker_id, text):
    """run_args with --recipe=modern (Muon), uninterrupted in one process: its log_dir (the test workers share
    it)."""
    d = once(tmp_path_factory, worker_id, "modern",
             lambda d: train_in_process(run_args(text) + MODERN_RUN, d / "log"))
    return d / "log"


def train_in_process(args, log_dir):
    """train_gpt2.main(args) into log_dir, which must succeed."""
    import train_gpt2
    assert train_gpt2.main(args + [f"--log_dir={log_dir}"]) == 0


def train(args, cwd, check=True, nproc=None, env=None, timeout=600):
    """train_gpt2.py with args (under torchrun with nproc gloo processes); env: more environment variables,
    and then stderr comes in stdout, in order (the recompile log among the step lines)."""
    cmd = [sys.executable] + (["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
                              if nproc else []) + [SCRIPT] + args
    r = subprocess.run(cmd, cwd=cwd, env={**ENV, **(env or {})}, stdout=subprocess.PIPE, text=True,
                       stderr=subprocess.STDOUT if env else subprocess.PIPE, timeout=timeout)
    if check:
        assert r.returncode == 0, r.stdout[-3000:] + (r.stderr or "")[-3000:]
    return r


def script(name, *args, env=None):
    """python NAME args, from the repo root, as a user runs it."""
    return subprocess.run([sys.executable, name, *args], cwd=ROOT, capture_output=True, text=True, env=env)


def records(log_dir):
    """The records of log_dir/metrics.jsonl, through its one reader (a live run's half-written line is left
    out)."""
    from gptlib.runlog import read_log
    return read_log(os.path.join(log_dir, "metrics.jsonl"))


def losses(log_dir):
    """step -> loss; a step redone after a resume keeps its last value."""
    return {r["step"]: r["loss"] for r in records(log_dir) if "loss" in r and "event" not in r}


def loss_steps(log_dir):
    """The step of every training record, in file order: one per step after any resume."""
    return [r["step"] for r in records(log_dir) if "loss" in r and "event" not in r]


def final_weights(log_dir):
    return torch.load(checkpoints(log_dir)[-1], map_location="cpu", weights_only=True)


def assert_one_line_error(r, *phrases):
    """An expected mistake: exit status 1, one line on stderr naming what is wrong, no traceback."""
    err = r.stderr.strip()
    assert r.returncode == 1 and "Traceback" not in err, (r.returncode, err[-3000:])
    assert len(err.splitlines()) == 1, err[-3000:]
    for phrase in phrases:
        assert phrase in err, (phrase, err)


def write_jsonl(path, rows):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    return str(path)


def hellaswag_example(i, label=None):
    """A HellaSwag example in the original jsonl format; lengths vary so several padding buckets are used."""
    ctx = f"Example {i}: a person is standing in a kitchen and" + " then" * (i * 5 % 70)
    endings = [f"picks up a knife number {j}" + " slowly" * ((i + j) % 4) for j in range(4)]
    return {"ind": i, "activity_label": "Cooking", "ctx_a": ctx, "ctx_b": "", "ctx": ctx, "split": "val",
            "split_type": "indomain", "endings": endings,
            # not the shortest ending's index, -i % 4, except by chance: a model's accuracy is not fixed
            "label": (i * i + i // 3) % 4 if label is None else label,
            "source_id": f"test~{i}"}


def write_core_bundle(folder, n=12):
    """An eval bundle in DCLM's layout (core.yaml, eval_meta_data.csv, eval_data/<dataset_uri>) whose 5 tasks
    of n examples, cut from input.txt, cover each task type, few-shot examples, two-, three- and four-way
    choices, a delimiter that is not a space, and contexts of a few hundred tokens that a model of few
    positions must crop. Returns the folder."""
    with open(os.path.join(ROOT, "input.txt"), encoding="utf-8") as f:
        lines = [line.strip() for line in f if len(line.strip()) > 15][:400]
    tasks = {  # label: (type, shots, delimiter, baseline, dataset_uri, row(i))
        "mc_zeroshot": ("multiple_choice", 0, " ", 30.0, "mc/zeroshot.jsonl", lambda i: {
            "query": lines[i], "choices": lines[i + 1:i + 3 + i % 3], "gold": i % 2}),
        "mc_fewshot": ("multiple_choice", 3, "\nAnswer: ", 25.0, "mc/fewshot.jsonl", lambda i: {
            "query": f"Question: who says {lines[20 + i]!r}?", "choices": ["the king", "the queen", "a fool",
                                                                           "nobody"], "gold": i % 4}),
        "schema": ("schema", 2, " ", 50.0, "schema.jsonl", lambda i: {
            "context_options": [lines[40 + i], lines[60 + i]], "continuation": lines[80 + i], "gold": i % 2}),
        "lm_short": ("language_modeling", 2, " ", 0.0, "lm/short.jsonl", lambda i: {
            "context": " " + lines[100 + i] + " ", "continuation": lines[120 + i].split()[0]}),
        "lm_long": ("language_modeling", 1, ": ", 0.0, "lm/long.jsonl", lambda i: {
            "context": " ".join(lines[140 + 5 * i:160 + 5 * i]), "continuation": "and " + lines[300 + i]}),
    }
    yaml_lines = ["icl_tasks:"]
    meta = ["Eval Task,Task Category,Task Type,#shots,#datapoints,Random baseline,Centered Metric?"]
    for label, (kind, shots, delim, baseline, uri, row) in tasks.items():
        yaml_lines += [f"- label: {label}", f"  dataset_uri: {uri}", f"  num_fewshot: [{shots}]",
                       f"  icl_task_type: {kind}", f"  continuation_delimiter: {json.dumps(delim)}"]
        meta.append(f"{label},test,{kind},{shots},{n},{baseline},")
        write_jsonl(os.path.join(folder, "eval_data", uri), [row(i) for i in range(n)])
    with open(os.path.join(folder, "core.yaml"), "w", encoding="utf-8") as f:
        f.write("\n".join(yaml_lines) + "\n")
    with open(os.path.join(folder, "eval_meta_data.csv"), "w", encoding="utf-8") as f:
        f.write("\n".join(meta) + "\n")
    return str(folder)


def save_model(model, path, step=0):
    """model as a train_gpt2.py checkpoint (weights and config, checksummed), for load_model."""
    save_checkpoint({"model": model.state_dict(), "model_config": dataclasses.asdict(model.config),
                     "step": step},
                    str(path))
    return str(path)


# a tiny model in-process (test_model.py, test_engine.py)
def tiny(**kw):
    """A 2-layer model; vocab 512 keeps it fast, tests about the padded GPT-2 vocab pass vocab_size=50304."""
    return GPTConfig(**{**dict(block_size=32, vocab_size=512, n_layer=2, n_head=4, n_embd=32), **kw})


def build(config, seed=0):
    torch.manual_seed(seed)
    return GPT(config).eval()


def trained_modern(seed=0):
    """The modern options with weights moved off their zero init, so that every path matters."""
    m = build(tiny(**{name: True for name in MODERN}), seed)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return m


# The files whose tests take longest (compiling, torchrun) go first: each runs on one test worker
# (--dist loadfile), and started last, one of them would leave the other workers idle at the end
# (pytest.ini's --no-loadscope-reorder keeps this order: xdist's own puts the files with most tests first,
# and test_compile.py ran alone for the last 150 s of a 650 s suite). Each worker starts on two of these.
LONGEST_FIRST = ("test_train.py", "test_fsdp.py", "test_faults.py", "test_compile.py", "test_core.py",
                 "test_bench.py", "test_eval.py", "test_laptop.py", "test_edits.py", "test_sample_plot.py",
                 "test_data.py")


def pytest_collection_modifyitems(items):
    def rank(item):
        name = os.path.basename(str(item.fspath))
        return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)
    items.sort(key=rank)  # stable: the order within a file is kept


def pytest_xdist_auto_num_workers(config):
    """-n auto (pytest.ini): one test worker more than the cores. Many tests wait on the processes they start
    (a timeout running out, torchrun restarting a run, a signal's handler), and meanwhile a third worker keeps
    2 cores busy: the suite took 474 s with 3 workers against 598 s with 2 on this project's 2-core VM."""
    return (os.cpu_count() or 1) + 1
