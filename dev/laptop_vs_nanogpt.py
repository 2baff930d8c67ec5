"""The laptop run, side by side: `python train_gpt2.py` without a GPU (our CPU default, or candidates for it)
against nanoGPT's "I only have a macbook" recipe (its README), each run its own process, in turns, on the
same input.txt; each final model scored on the same held-out bytes, as bits per byte. Each run prints its
wall time, the CPU seconds of its processes (user + system), its steps, its held-out bpb and one sample; the
end, a table of medians (with ranges) over the rounds. Measure on an idle machine: a loaded one changes the
ratio, not only the times.

    python dev/laptop_vs_nanogpt.py --peer ../shared/peers/nanogpt                 # 3 rounds, ~12 min alone
    python dev/laptop_vs_nanogpt.py --peer PEER --ours "" --ours="--recipe=modern" --ours="--n_layer=8"
    python dev/laptop_vs_nanogpt.py --peer PEER --only ours --ours="--recipe=modern" --pairs 1
    python dev/laptop_vs_nanogpt.py --peer PEER --pairs 1 --ours="--max_steps=10" \\
        --peer_flags="--max_iters=50 --lr_decay_iters=50 --eval_interval=50"  # a smoke run, a minute

--ours="FLAGS" (repeatable, with "=": FLAGS start with a dash; default: none, the CPU default) is one
candidate's train_gpt2.py flags; each round runs every candidate, then nanoGPT, so the machine's drift falls
on all alike. --peer is nanoGPT's folder (a clone of github.com/karpathy/nanoGPT: train.py, model.py,
configurator.py, config/, data/shakespeare_char/prepare.py); it is run where it is, never copied: its data
is prepared once by its own prepare.py in a work folder that links its files (prepare.py reads the input.txt
beside it, train.py reads configurator.py, config/ and data/ from the folder it runs in), and its model is
loaded by its own model.py. --peer_flags are added after the recipe's (nanoGPT's configurator: the last
wins). Each run's output file is named as the run starts. --keep DIR keeps the runs' folders (default:
removed, also when stopped: SIGTERM or Ctrl-C ends the run in progress and what it started). --text PATH
trains both on another ASCII text (each --ours then needs --data_root=PATH: a plain run's fallback is
input.txt); the tests' is short.

The held-out bytes: each project cuts input.txt at 90% for its validation, ours by GPT-2 tokens (the
tokens of <|endoftext|> + the text, cut at int(0.9 * n): dataloader.split_point), nanoGPT's by characters
(int(0.9 * n) in its prepare.py); the held-out bytes are the end of the file after the later of the two
cuts, which neither trained on. Both cuts are read from each code's own output (our loader's validation
split, nanoGPT's val.bin), not recomputed here (input.txt's: docs/compare.md). The text must be ASCII (so
nanoGPT's characters are bytes) without carriage returns (which its text-mode read would drop).

Scoring: each model reads the held-out units (our GPT-2 tokens of those bytes, nanoGPT's characters) in
non-overlapping windows of its own context (ours: the T it trained at; nanoGPT's: its block_size), each
unit but the first predicted from those before it in its window; bits per byte = the summed negative
log-likelihood / ln 2 / the bytes of the predicted units (ours: those tokens' bytes; nanoGPT's: one byte a
character). The figures are the final models': our last checkpoint, nanoGPT's ckpt.pt (it saves at its
evaluations when the validation loss improved: with its recipe at step 2000 of the 2001 it trains). The
samples: both from "\\n", temperature 0.8, top_k 200 (nanoGPT's sample.py's), seed 1337; ours 64 tokens,
nanoGPT's 256 characters (about as much text).

A dev/ script rather than a bench.py section: bench.py times steps of this project's code paths (ms/step,
tok/s; its --peer is llm.c's GPU reference at the same B and T), in one process for its sections; this
measures what whole runs of two projects leave behind (quality in the time a laptop gives), run after run
for minutes, and is the harness the CPU default's sweep runs.
"""
import contextlib
import importlib.util
import io
import math
import os
import pickle
import re
import resource
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from dataloader import DataLoaderLite  # noqa: E402
from gptlib.checkpoint import checkpoints, load_checkpoint, load_model  # noqa: E402
from gptlib.engine import Engine  # noqa: E402
from gptlib.errors import UserError, check_range, command_line, main_guard, plural  # noqa: E402
from gptlib.runtime import Runtime  # noqa: E402
from gptlib.settings import SHAKESPEARE  # noqa: E402
from gptlib.tokenizer import get_encoding, token_bytes  # noqa: E402
from sample import sample  # noqa: E402

# nanoGPT's README, "I only have a macbook" (after `python data/shakespeare_char/prepare.py`)
RECIPE = ["config/train_shakespeare_char.py", "--device=cpu", "--compile=False", "--eval_iters=20",
          "--log_interval=1", "--block_size=64", "--batch_size=12", "--n_layer=4", "--n_head=4",
          "--n_embd=128", "--max_iters=2000", "--lr_decay_iters=2000", "--dropout=0.0"]
PEER_FILES = ("train.py", "model.py", "configurator.py", "config/train_shakespeare_char.py",
              "data/shakespeare_char/prepare.py")
PEER_DATA = os.path.join("data", "shakespeare_char")  # its dataset's folder, in the folder train.py runs in
PROMPT, TEMPERATURE, TOP_K, SEED = "\n", 0.8, 200, 1337  # nanoGPT's sample.py's
OURS_TOKENS, PEER_CHARS = 64, 256  # a sample's length: about the same text
UNITS = 2048  # tokens (characters) scored in one forward: ours, 2048 x 50,304 logits, 412 MB


def check_peer(peer):
    """peer as an absolute path, or a UserError naming what is missing."""
    clone = "a clone of github.com/karpathy/nanoGPT (its folder of train.py)"
    if not os.path.isdir(peer):
        raise UserError(f"--peer {peer}: no such folder: give {clone}")
    missing = [f for f in PEER_FILES if not os.path.isfile(os.path.join(peer, f))]
    if missing:
        raise UserError(f"--peer {peer}: not nanoGPT's folder (no {missing[0]} in it): give {clone}")
    return os.path.abspath(peer)


def run(cmd, cwd, out):
    """(wall seconds, CPU seconds of the process and its children) of cmd run in cwd, its output in the
    file out (named when it starts); a UserError with its last line if it fails. A stop (SIGTERM, Ctrl-C)
    ends cmd and every process it started."""
    print(f"running {os.path.basename(cmd[1])}, its output in {out}", flush=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    with open(out, "w") as f:
        done = subprocess.Popen(cmd, cwd=cwd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            done.wait()
        except BaseException:  # a stop: re-raised, once what the run started has ended
            os.killpg(done.pid, signal.SIGKILL)
            done.wait()
            raise
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode:
        with open(out) as f:
            last = (f.read().strip().splitlines() or ["no output"])[-1]
        raise UserError(f"{' '.join(cmd)} (in {cwd}) failed, exit status {done.returncode}: {last} (its "
                        f"whole output: {out}, kept with --keep DIR)")
    return wall, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def prepare_peer(peer, text, work):
    """A folder in work that nanoGPT's train.py runs in: links to its configurator.py and config/, and
    data/shakespeare_char/ with its prepare.py's output for text (train.bin, val.bin, meta.pkl)."""
    folder = os.path.join(work, "nanogpt")
    data = os.path.join(folder, PEER_DATA)
    os.makedirs(data)
    for name in ("configurator.py", "config"):
        os.symlink(os.path.join(peer, name), os.path.join(folder, name))
    os.symlink(os.path.join(peer, PEER_DATA, "prepare.py"), os.path.join(data, "prepare.py"))
    os.symlink(text, os.path.join(data, "input.txt"))  # what prepare.py reads (else it downloads)
    run([sys.executable, os.path.join(PEER_DATA, "prepare.py")], folder, os.path.join(work, "prepare.out"))
    return folder


def held_out(text, peer_folder):
    """(offset, bytes): the end of text after both projects' validation cuts, our loader's and nanoGPT's
    (its val.bin), and neither's training data."""
    with open(text, "rb") as f:
        data = f.read()
    if not data.isascii() or b"\r" in data:
        raise UserError(f"{text}: not ASCII text with \\n line ends, so nanoGPT's characters would not be "
                        "its bytes: give an ASCII text, such as input.txt")
    (_, ours), = DataLoaderLite.open_split(text, "val")
    ours = get_encoding().decode_bytes(ours.tolist())  # <|endoftext|> (the text's first token) decodes to b""
    with open(os.path.join(peer_folder, PEER_DATA, "meta.pkl"), "rb") as f:
        itos = pickle.load(f)["itos"]
    theirs = "".join(itos[i] for i in np.fromfile(os.path.join(peer_folder, PEER_DATA, "val.bin"),
                                                   dtype=np.uint16)).encode()
    assert data.endswith(ours) and data.endswith(theirs), "a validation split is not the end of the text"
    offset = len(data) - min(len(ours), len(theirs))
    return offset, data[offset:]


def nll_bits(loss_sum, ids, context):
    """The negative log-likelihood in bits of ids[1:], each predicted from the ids before it in its window:
    non-overlapping windows of `context` predictions (the last one shorter), ~UNITS at a time. loss_sum(x,
    y): the summed NLL (nats) of targets y given inputs x, both (rows, length)."""
    ids = torch.as_tensor(ids, dtype=torch.long)
    n = len(ids) - 1  # predictions
    full, rows = n // context, max(1, UNITS // context)
    x, y = ids[:full * context].view(full, context), ids[1:full * context + 1].view(full, context)
    with torch.no_grad():
        total = sum(loss_sum(x[i:i + rows], y[i:i + rows]) for i in range(0, full, rows))
        if n % context:
            total += loss_sum(ids[full * context:-1][None], ids[full * context + 1:][None])
    return total / math.log(2)


def score_ours(model, T, text_bytes):
    """Bits per byte of our model on text_bytes, in windows of T tokens (the T it trained at)."""
    enc = get_encoding()
    ids = enc.encode_ordinary(text_bytes.decode())

    def loss_sum(x, y):
        return model(x, y, reduction="none")[1].sum().item()

    lengths = token_bytes(enc, model.config.vocab_size)
    return nll_bits(loss_sum, ids, T) / sum(lengths[t] for t in ids[1:])


def check_trained_on(ckpt, text, flags):
    """A UserError unless our checkpoint's run trained on text (its data_root, from the root it ran in)."""
    data_root = os.path.join(ROOT, ckpt["config"]["data_root"])
    if not os.path.isfile(data_root) or not os.path.samefile(data_root, text):
        raise UserError(f"train_gpt2.py {flags} trained on {data_root}, not {text}: pass --data_root={text} "
                        "in --ours, or (for input.txt) move edu_fineweb10B/ out of the project's root, where "
                        "a plain run trains on it")


def peer_model(peer, ckpt_path):
    """(model, checkpoint): nanoGPT's from ckpt_path, built by its own model.py (from the peer's folder)."""
    spec = importlib.util.spec_from_file_location("nanogpt_model", os.path.join(peer, "model.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=True)
    with contextlib.redirect_stdout(io.StringIO()):  # its count of parameters, not this run's output
        model = module.GPT(module.GPTConfig(**ckpt["model_args"]))
    model.load_state_dict({k.removeprefix("_orig_mod."): v for k, v in ckpt["model"].items()})
    return model.eval(), ckpt


def score_peer(model, stoi, text_bytes):
    """Bits per byte of nanoGPT's model on text_bytes (ASCII: a character a byte), in windows of its
    block_size."""
    ids = [stoi[c] for c in text_bytes.decode()]

    def loss_sum(x, y):
        return model(x, y)[1].item() * y.numel()  # its loss is the mean

    return nll_bits(loss_sum, ids, model.config.block_size) / (len(ids) - 1)


def ours_run(flags, work, k, text, held):
    """One train_gpt2.py run with flags, from the project's root as a user runs it, into work: its results."""
    log_dir = os.path.join(work, f"ours{k}")
    cmd = [sys.executable, os.path.join(ROOT, "train_gpt2.py"), f"--log_dir={log_dir}", *shlex.split(flags)]
    wall, cpu = run(cmd, ROOT, os.path.join(work, f"ours{k}.out"))
    found = checkpoints(log_dir)
    if not found:
        raise UserError(f"train_gpt2.py {flags} wrote no checkpoint in {log_dir}")
    ckpt = load_checkpoint(found[-1])
    check_trained_on(ckpt, text, flags)
    model = load_model(found[-1]).eval()
    bpb = score_ours(model, ckpt["config"]["T"], held)
    texts, _, _ = sample(Engine(model, False), PROMPT, 1, OURS_TOKENS, TEMPERATURE, TOP_K, SEED, Runtime())
    return dict(wall=wall, cpu=cpu, steps=ckpt["step"], bpb=bpb, sample=texts[0],
                note=f"T={ckpt['config']['T']}")


def peer_run(peer, folder, flags, work, k, held):
    """One run of nanoGPT's recipe (flags after it) in folder: its figures and sample."""
    out_dir = f"out{k}"
    out = os.path.join(work, f"peer{k}.out")
    cmd = [sys.executable, os.path.join(peer, "train.py"), *RECIPE, f"--out_dir={out_dir}",
           *shlex.split(flags)]
    wall, cpu = run(cmd, folder, out)
    ckpt_path = os.path.join(folder, out_dir, "ckpt.pt")
    if not os.path.isfile(ckpt_path):
        raise UserError(f"nanoGPT's train.py wrote no {ckpt_path}: it saves at its evaluations (every "
                        "eval_interval steps) where the validation loss improved; with a shorter --max_iters "
                        "in --peer_flags pass --eval_interval too")
    with open(out) as f:
        logged = re.findall(r"^iter (\d+):", f.read(), re.M)  # a line a step: the recipe's --log_interval=1
    if not logged:
        raise UserError(f"no 'iter N:' line in nanoGPT's output ({out}): keep its --log_interval=1")
    model, ckpt = peer_model(peer, ckpt_path)
    with open(os.path.join(folder, PEER_DATA, "meta.pkl"), "rb") as f:
        meta = pickle.load(f)
    bpb = score_peer(model, meta["stoi"], held)
    torch.manual_seed(SEED)  # its generate draws from the global generator, as its sample.py
    with torch.no_grad():
        idx = model.generate(torch.tensor([[meta["stoi"][c] for c in PROMPT]]), PEER_CHARS,
                             temperature=TEMPERATURE, top_k=TOP_K)
    text = "".join(meta["itos"][i] for i in idx[0].tolist())  # the prompt too, as ours (and its sample.py)
    return dict(wall=wall, cpu=cpu, steps=int(logged[-1]) + 1, bpb=bpb, sample=text,
                note=f"its checkpoint: step {ckpt['iter_num']}, "
                f"block_size={ckpt['model_args']['block_size']}")


def label(side, flags):
    """A run's name in the output."""
    if side == "peer":
        return "nanoGPT's recipe" + (f" {flags}" if flags else "")
    return f"`python train_gpt2.py{' ' + flags if flags else ''}`"


def spread(values, fmt):
    """The median, and the range where there are several."""
    median = format(statistics.median(values), fmt)
    return median if len(values) == 1 else f"{median} ({format(min(values), fmt)}-{format(max(values), fmt)})"


def main():
    parser = command_line(__doc__)
    parser.add_argument("--peer", required=True, metavar="PATH", help="nanoGPT's folder (its train.py ...)")
    parser.add_argument("--pairs", type=int, default=3, help="rounds, each every --ours run then nanoGPT's")
    parser.add_argument("--only", choices=("ours", "peer"), default=None, help="run one side alone")
    parser.add_argument("--ours", action="append", default=None, metavar="FLAGS",
                        help="a candidate's train_gpt2.py flags, as --ours=\"FLAGS\" (repeatable; default: "
                        "none)")
    parser.add_argument("--peer_flags", default="", metavar="FLAGS",
                        help="nanoGPT's train.py flags after its recipe's, as --peer_flags=\"FLAGS\"")
    parser.add_argument("--keep", default=None, metavar="DIR", help="keep the runs' folders in DIR (new)")
    parser.add_argument("--text", default=SHAKESPEARE, metavar="PATH",
                        help="the text both train on (default: input.txt, where a plain train_gpt2.py run "
                        "falls back to; another needs --data_root=PATH in each --ours)")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))  # as Ctrl-C: cleans up
    check_range("--pairs", args.pairs, 1)
    if not os.path.isfile(args.text):
        raise UserError(f"--text {args.text}: no such file")
    text = os.path.abspath(args.text)
    peer = check_peer(args.peer)
    if args.keep and os.path.exists(args.keep):
        raise UserError(f"--keep {args.keep} exists: name a new folder")
    rounds = plural(args.pairs, "round")
    candidates = args.ours if args.ours is not None else [""]
    sides = ([] if args.only == "peer" else [("ours", f) for f in candidates]) + \
        ([] if args.only == "ours" else [("peer", args.peer_flags)])
    with tempfile.TemporaryDirectory() as tmp:
        work = os.path.abspath(args.keep) if args.keep else tmp
        os.makedirs(work, exist_ok=True)
        folder = prepare_peer(peer, text, work)
        offset, held = held_out(text, folder)
        print(f"held-out: {text} from byte {offset:,} to its end, {len(held):,} bytes; nanoGPT: "
              f"{peer}; {rounds} in turns: {', '.join(label(*side) for side in sides)}",
              flush=True)
        results = {side: [] for side in sides}
        for r in range(args.pairs):
            for i, (side, flags) in enumerate(sides):
                k = f"{r}_{i}"
                got = (peer_run(peer, folder, flags, work, k, held) if side == "peer" else
                       ours_run(flags, work, k, text, held))
                results[side, flags].append(got)
                print(f"\nround {r + 1}, {label(side, flags)}: {got['wall']:.1f} s, {got['cpu']:.1f} CPU-s, "
                      f"{got['steps']} steps ({got['note']}), held-out {got['bpb']:.4f} bpb; sample:\n"
                      f"{got['sample']}", flush=True)
    print("\n| run | wall s | CPU s | steps | held-out bpb |\n| --- | ---: | ---: | ---: | ---: |")
    for side, runs in results.items():
        print(f"| {label(*side)} | " + " | ".join(spread([x[key] for x in runs], fmt) for key, fmt in
                                                 (("wall", ".0f"), ("cpu", ".0f"), ("steps", ".0f"),
                                                  ("bpb", ".4f"))) + " |")
    print(f"\nmedians of {rounds} (range); held-out: bytes {offset:,} to {offset + len(held):,} "
          f"of {os.path.basename(text)}, each model in windows of its own context")


if __name__ == "__main__":
    main_guard(main)
