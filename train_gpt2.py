"""Train GPT-2 (124M) from scratch: one GPU, eight, several nodes, or a laptop CPU.

    python train_gpt2.py                                    # 1 process (on a CPU: a small model on input.txt)
    torchrun --standalone --nproc_per_node=8 train_gpt2.py  # 8 GPUs, one node
    python train_gpt2.py --max_steps=100 --B=32             # any setting below, as --name=value
    torchrun --nnodes=2 --nproc_per_node=8 --rdzv_backend=c10d --rdzv_endpoint=HOST:29500 train_gpt2.py
                                                            # on each of 2 nodes (HOST: the first one)

Prepare the data first with `python fineweb.py` (FineWeb-Edu, ~10B tokens). Without it the script trains
on input.txt and says so. A rerun with the same log_dir continues from its latest checkpoint.
"""
import contextlib
import dataclasses
import difflib
import json
import math
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import runtime
from accounting import Clock, duration, mfu, peak_flops, training_memory
from checkpoint import MODEL, find_resume, load_model, model_config, save_run, space_note, weights_shape
from dataloader import DataLoaderLite, make_shards
from errors import UserError, check_range
from hellaswag import Prepared, evaluate as hellaswag_eval, load_examples
from model import GPT, GPT2_SIZES, GPT2_VOCAB, GPTConfig
from optimizers import make_optimizers
from plot import write_report
from runlog import RunLog, hold_log_dir
from trackers import TRACKERS
from runtime import autocast, print0, synchronize
from sample import sample
from tokenizer import get_encoding, token_bytes

_IMPORTED = set(globals())  # the names above are not settings
# ------------------------------------------------------------------------------------------------------------
# settings: the GPT-2 124M recipe (edit here, or override any name on the command line as --name=value)
data_root = "edu_fineweb10B"  # token shards from fineweb.py, or a .txt/.jsonl/.parquet file such as input.txt
total_batch_size = 524288  # tokens per optimizer step, over all GPUs and micro-steps (2**19, ~0.5M as GPT-3)
B = 64  # micro-batch per GPU; lower it if memory runs out (gradient accumulation keeps total_batch_size)
T = 1024  # sequence length
block_size = 1024  # the model's maximum sequence length (position embeddings)
vocab_size = 50304  # GPT-2's 50,257 tokens padded to a multiple of 128: faster matmuls, never sampled
size = ""  # 124M, 350M, 774M or 1558M: sets n_layer, n_head, n_kv_head, n_embd and max_lr (--name=value wins)
n_layer = 12  # transformer blocks
n_head = 12  # attention heads per block
n_kv_head = 12  # key/value heads: n_head for GPT-2; 1 for multi-query, a divisor of n_head for grouped-query
n_embd = 768  # width of the residual stream
recipe = "gpt2"  # gpt2 (GPT-2's model and AdamW) or modern: the options below, Muon and its LRs (RECIPES)
rotary = False  # rotary position embeddings on queries and keys instead of learned ones (no wpe)
qk_norm = False  # queries and keys RMS-normalized per head
relu2 = False  # MLP activation ReLU(x)^2 instead of GELU
untied_head = False  # lm_head its own matrix instead of wte's
zero_init = False  # output projections (attention, MLP, an untied lm_head) start at zero
rmsnorm = False  # parameter-free RMSNorm instead of LayerNorm
embed_norm = False  # the token embeddings RMS-normalized before the first block
max_lr = 6e-4  # peak learning rate (GPT-3 small's)
min_lr_ratio = 0.1  # the cosine decays to max_lr * min_lr_ratio
warmup_steps = 715  # linear warmup: 375M tokens, as GPT-3
max_steps = 19073  # 19,073 x 524,288 tokens = 10B tokens: one epoch of edu_fineweb10B
weight_decay = 0.1  # AdamW's, on matrices only (not biases, LayerNorms)
optimizer = "adamw"  # adamw (GPT-2's recipe) or muon: Muon for the blocks' matrices, AdamW for the rest
muon_lr = 0.02  # optimizer=muon: the Muon matrices' peak learning rate, nanochat's (max_lr: the AdamW part's)
embed_lr = 0.0  # wte's own peak learning rate (AdamW) for a 768-wide model, x sqrt(768/n_embd); 0: max_lr
head_lr = 0.0  # the same for an untied lm_head
grad_clip = 1.0  # global gradient-norm clipping
shuffle = False  # shuffle shard and window order (seeded, the same on every rank, new each epoch)
eval_interval = 250  # steps between validation loss, HellaSwag and samples (and always after the last step)
val_tokens = 20 * 524288  # validation tokens per eval: the split's first, whatever B or the number of GPUs
eval_B = 0  # micro-batch of evaluation (validation rows, HellaSwag's ~B*T tokens a forward); 0: B
hellaswag = 10042  # HellaSwag examples per eval (the validation split has 10,042; 0 = skip)
hellaswag_data = ""  # hellaswag_val.jsonl or a save_to_disk folder; "" = download once into hellaswag_data/
checkpoint_interval = 5000  # steps between checkpoints (and always after the last step, or on SIGTERM)
keep_checkpoints = 2  # the newest K checkpoints are kept (a damaged one is renamed *.damaged)
# scratch | resume (default when log_dir has a checkpoint) | gpt2, gpt2-medium, gpt2-large, gpt2-xl
# (OpenAI's weights) | an HF GPT-2 folder | a model_*.pt: those weights, with a fresh optimizer
init_from = "scratch"
eval_only = False  # evaluate init_from's model (val loss, bpb, HellaSwag, samples) into log_dir; no training
compile = True  # torch.compile the model: ~2x faster steps after a minute of compiling
fsdp = False  # shard parameters, gradients and AdamW states over the ranks (FSDP2): models past one GPU
grad_checkpoint = False  # recompute activations in backward: less memory, ~1/3 more compute
device = "auto"  # auto (cuda, then mps, then cpu), cuda, mps or cpu
# auto: bf16 on GPUs that have it, else fp16 (loss scaling) on CUDA, else fp32; or bf16, fp16, fp32
dtype = "auto"
loss_scale = 65536.0  # fp16 only: the first loss scale (halved on overflow, doubled after 2000 clean steps)
log_dir = "log"  # metrics.jsonl and checkpoints; a rerun into it resumes (one run at a time)
collective_timeout = 300  # seconds a step waits for the other processes (a hung one) before the run stops
tracker = ""  # tensorboard, wandb or tensorboard,wandb: the log goes there too (each a pip install)
seed = 1337  # initial weights, data order (shuffle) and samples
# ------------------------------------------------------------------------------------------------------------
CONFIG = {k: v for k, v in dict(globals()).items()
          if k not in _IMPORTED and not k.startswith("_") and type(v) in (int, float, str, bool)}
# the run's settings, resolved once by resolve() and read-only after: s.B, s.max_lr, ...
Settings = dataclasses.make_dataclass("Settings", [(k, type(v), v) for k, v in CONFIG.items()], frozen=True)

# --recipe=modern: the changes nanochat and modded-nanogpt make to GPT-2, each overridable (--rotary=False);
# nanochat's head learning rate (its embedding's 0.2 is for embeddings of std 1: ours start at 0.02)
RECIPES = {"gpt2": {}, "modern": {**{name: True for name in GPTConfig.MODERN}, "optimizer": "muon",
                                  "max_lr": 6e-3, "embed_lr": 0.004, "head_lr": 0.004}}
PEAK_LR = {"124M": 6e-4, "350M": 3e-4, "774M": 2.5e-4, "1558M": 2e-4}  # GPT-3's table, for those model sizes
SIZES = {name: {**shape, "n_kv_head": shape["n_head"], "max_lr": PEAK_LR[name]}
         for name, shape in GPT2_SIZES.items()}
FINEWEB_DIR = "edu_fineweb10B"  # the shipped data_root: only this one falls back to input.txt when missing
SHAKESPEARE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "input.txt")
SHAKESPEARE_CONFIG = dict(  # input.txt is ~300k tokens: small steps (its 10% val split must hold one)
    total_batch_size=4096, B=8, T=256, max_steps=300, warmup_steps=30, eval_interval=100, val_tokens=32768,
    checkpoint_interval=300)
CPU_CONFIG = dict(  # without a GPU: a model and schedule that train on 2 cores in a few minutes
    total_batch_size=2048, B=8, T=128, n_layer=4, n_head=4, n_kv_head=4, n_embd=64, max_lr=3e-3,
    warmup_steps=20, max_steps=150, eval_interval=50, val_tokens=8192, hellaswag=0, checkpoint_interval=50,
    compile=False)
SAMPLE_PROMPT = "Hello, I'm a language model,"  # 8 tokens; each evaluation samples 4 x 24 more
# the valid values of every numeric setting, as check_range's (low, high, above) bounds
RANGES = {**{k: (1, None, None) for k in ("total_batch_size", "B", "T", "block_size", "n_layer", "n_head",
                                          "n_kv_head", "n_embd", "max_steps", "eval_interval", "val_tokens",
                                          "checkpoint_interval", "keep_checkpoints", "collective_timeout")},
          **{k: (0, None, None) for k in ("warmup_steps", "hellaswag", "embed_lr", "head_lr", "weight_decay",
                                          "seed", "eval_B")},
          **{k: (None, None, 0) for k in ("max_lr", "muon_lr", "grad_clip", "loss_scale")},
          "vocab_size": (GPT2_VOCAB, None, None), "min_lr_ratio": (0, 1, None)}  # vocab: GPT-2's tokens fit


# ------------------------------------------------------------------------------------------------------------
# settings: the block above, then the command line, presets, fallbacks and checks, resolved once

KINDS = {bool: "True or False", int: "a whole number", float: "a number", str: "text"}


def settings_help():
    """--help: each setting with its default and the comments beside or above it, read from the settings
    block of this file (so it cannot drift from it)."""
    with open(__file__, encoding="utf-8") as f:
        block = f.read().split("# settings:", 1)[1].split("\n# ---", 1)[0].splitlines()[1:]
    lines, above = [], []
    for line in block:
        code, _, comment = line.partition("  # ") if not line.startswith("#") else ("", "", line[2:])
        if not code:
            above.append(comment)
            continue
        name = code.split(" = ")[0]
        lines.append(f"  --{name}={CONFIG[name]!r}".ljust(34) + " ".join(above + [comment]).strip())
        above = []
    return (f"{__doc__.strip()}\n\nSettings (--name=value or --name value; the defaults are the settings "
            f"block at the top of train_gpt2.py):\n" + "\n".join(lines))


def parse_overrides(argv):
    """{name: value} of the command line's --name=value (or --name value) pairs, each checked against the
    settings' names and converted to its type; --help prints the settings and exits."""
    overrides, argv = {}, list(argv)
    while argv:
        arg = argv.pop(0)
        if arg in ("-h", "--help"):
            print(settings_help())
            raise SystemExit(0)
        if not arg.startswith("--") or arg == "--":
            raise UserError(f"expected --name=value, got {arg!r} (python train_gpt2.py --help lists the "
                            f"settings)")
        key, eq, value = arg[2:].partition("=")
        if not eq:  # --name value
            if not argv or argv[0].startswith("--"):
                raise UserError(f"--{key} needs a value: --{key}=VALUE")
            value = argv.pop(0)
        if key not in CONFIG:
            close = difflib.get_close_matches(key, CONFIG, n=1)
            hint = f"; did you mean --{close[0]}?" if close else " (python train_gpt2.py --help lists them)"
            raise UserError(f"unknown setting {key!r}{hint}")
        kind = type(CONFIG[key])
        try:
            if kind is bool:
                if value.lower() not in ("true", "false", "1", "0"):
                    raise ValueError
                overrides[key] = value.lower() in ("true", "1")
            elif kind is int:  # also 1e8 or 5.24288e5, as long as it is a whole number
                if not float(value).is_integer():
                    raise ValueError
                overrides[key] = int(float(value))
            else:
                overrides[key] = kind(value)
        except ValueError:
            raise UserError(f"--{key}={value!r} is not {KINDS[kind]} (default: {CONFIG[key]!r})") from None
    return overrides


def resolve(given, rt):
    """(settings, given, notes): the settings block, then the command line (`given`), the size and recipe
    presets, the fallbacks without data or a GPU, the checks, and whether torch.compile works here, in that
    order, into one read-only Settings. given comes back with the presets chosen on the command line counted
    as given. A setting that cannot work is a UserError."""
    cfg, given = apply_presets({**CONFIG, **given}, given)
    cfg, notes = apply_fallbacks(cfg, given, rt)
    notes += validate(cfg, rt)
    if cfg["compile"] and rt.kind == "mps":
        notes.append("compile=True: torch.compile is not used on Apple GPUs (mps); running eager")
        cfg["compile"] = False
    elif cfg["compile"] and (why := runtime.compile_blocker(rt)):
        notes.append(f"compile=True but {runtime.eager_note(why)}")
        cfg["compile"] = False
    return Settings(**cfg), given, notes


def apply_presets(cfg, given):
    """(cfg, given) with the size preset's and then the recipe's settings, except those given on the command
    line. A preset chosen on the command line counts as its settings given there (the CPU fallback keeps
    them)."""
    if cfg["size"] and cfg["size"] not in SIZES:
        raise UserError(f"--size={cfg['size']!r}: use one of {', '.join(SIZES)}, or \"\" for the settings "
                        f"n_layer, n_head, n_kv_head, n_embd and max_lr as they are")
    if cfg["recipe"] not in RECIPES:
        raise UserError(f"--recipe={cfg['recipe']!r}: use gpt2 (GPT-2's) or modern")
    for name, presets in (("size", SIZES), ("recipe", RECIPES)):
        preset = {k: v for k, v in presets.get(cfg[name], {}).items() if k not in given}
        cfg, given = {**cfg, **preset}, ({**given, **preset} if name in given else given)
    return cfg, given


def apply_fallbacks(cfg, given, rt):
    """(cfg, notes): without shards at the shipped data_root, train on input.txt (a plain `python` run only:
    under torchrun that is a mistake); without a GPU, a small model. Both with settings to match, except those
    given on the command line. Their batch is a fixed number of tokens, whatever the number of processes (so
    a resume may change it, as B): B is lowered where needed to keep it whole."""
    small, notes = {}, []
    if cfg["data_root"] == FINEWEB_DIR and not os.path.exists(FINEWEB_DIR):
        if rt.distributed:
            raise UserError(f"no shards in {os.path.abspath(FINEWEB_DIR)} (data_root is relative to the "
                            f"directory you run from): make them there with `python fineweb.py`, or pass "
                            f"--data_root=PATH")
        notes.append(f"no shards in {FINEWEB_DIR}/ (run `python fineweb.py` to make them): "
                     + ("evaluating" if cfg["eval_only"] else "training") + " on input.txt")
        small.update(SHAKESPEARE_CONFIG, data_root=SHAKESPEARE)
    if rt.kind != "cuda":
        small_model = cfg["init_from"] in ("scratch", "resume") and not set(MODEL) & set(given)
        notes.append("no CUDA device: " + ("evaluating" if cfg["eval_only"] else "training")
                     + (" a small model" if small_model else "") + " with a small batch on the CPU (settings "
                     "given on the command line are kept)")
        small.update(CPU_CONFIG)
    cfg = {**cfg, **{k: v for k, v in small.items() if k not in given}}
    fits = micro_batches(cfg["total_batch_size"], cfg["T"], rt.world_size)
    if "B" not in given and fits and cfg["total_batch_size"] % (cfg["B"] * cfg["T"] * rt.world_size):
        b = next((b for b in fits if b <= cfg["B"]), cfg["B"])  # the largest B that keeps the batch whole
        if not small:
            notes.append(f"B={b}: B={cfg['B']} does not divide total_batch_size={cfg['total_batch_size']:,} "
                         f"into whole micro-steps of {cfg['T']} tokens x {rt.world_size} processes (set --B "
                         "to choose)")
        cfg["B"] = b
    return cfg, notes


def validate(cfg, rt):
    """The first setting that cannot work is a UserError naming the fix, raised before any model or log_dir
    exists. Returns NOTEs on settings that work but are likely mistakes."""
    if cfg["optimizer"] not in ("adamw", "muon"):
        raise UserError(f"--optimizer={cfg['optimizer']!r}: use adamw or muon")
    if set(filter(None, cfg["tracker"].split(","))) - set(TRACKERS):
        raise UserError(f"--tracker={cfg['tracker']!r}: use {' or '.join(TRACKERS)}, both as "
                        f"{','.join(TRACKERS)}, or \"\" for none")
    if cfg["fsdp"] and runtime.torch_older_than(runtime.MIN_TORCH):  # FSDP2 changed most before 2.9
        raise UserError(f"--fsdp=True needs torch >= 2.9 (on the CPU 2.6's FSDP2 fails and 2.7's and 2.8's "
                        f"sum the ranks' gradients instead of averaging them), this is {torch.__version__}: "
                        f"upgrade torch or drop --fsdp (DDP)")
    if cfg["optimizer"] == "muon" and cfg["fsdp"]:
        raise UserError("--optimizer=muon does not work with --fsdp=True: Muon orthogonalizes each whole "
                        "weight matrix and FSDP2 gives each rank a shard of it; drop --fsdp (DDP) or use "
                        "--optimizer=adamw")
    if cfg["eval_only"] and cfg["init_from"] in ("scratch", "resume"):
        raise UserError("--eval_only=True evaluates given weights: set --init_from to gpt2 (or gpt2-medium, "
                        "gpt2-large, gpt2-xl), an HF GPT-2 folder or a model_*.pt checkpoint")
    if cfg["fsdp"] and not rt.distributed:
        raise UserError("--fsdp=True shards the model over the processes torchrun starts: run it as "
                        "`torchrun --nproc_per_node=N train_gpt2.py --fsdp=True`")
    if os.path.exists(cfg["log_dir"]) and not os.path.isdir(cfg["log_dir"]):
        raise UserError(f"--log_dir={cfg['log_dir']} is a file, not a directory: choose another --log_dir")
    if not os.path.exists(cfg["data_root"]):
        raise UserError(f"data_root {cfg['data_root']} does not exist: {make_shards(cfg['data_root'])}, or "
                        "point --data_root at a .txt, .jsonl or .parquet file")
    for key, bounds in RANGES.items():
        check_range(f"--{key}", cfg[key], *bounds)
    if cfg["T"] > cfg["block_size"] and cfg["init_from"] in ("scratch", "resume"):  # weights: their own
        raise UserError(f"T={cfg['T']} exceeds block_size={cfg['block_size']}: lower T or raise block_size")
    row = cfg["T"] * rt.world_size  # tokens of one row on every process
    if cfg["total_batch_size"] % row:
        raise UserError(f"total_batch_size={cfg['total_batch_size']:,} is not a multiple of T*world_size = "
                        f"{cfg['T']}*{rt.world_size} = {row:,}: use a multiple of it, such as "
                        f"{max(1, round(cfg['total_batch_size'] / row)) * row:,}, or change T")
    if cfg["total_batch_size"] % (cfg["B"] * row):  # a B given on the command line
        fits = micro_batches(cfg["total_batch_size"], cfg["T"], rt.world_size)
        raise UserError(f"--B={cfg['B']} does not divide total_batch_size={cfg['total_batch_size']:,} into "
                        f"whole micro-steps of {cfg['T']} tokens x {rt.world_size} processes: use one of "
                        f"{', '.join(map(str, fits[:6]))}")
    if cfg["max_steps"] < cfg["warmup_steps"] and not cfg["eval_only"]:
        return [f"max_steps={cfg['max_steps']} < warmup_steps={cfg['warmup_steps']}: the learning rate never "
                f"reaches max_lr (lower --warmup_steps)"]
    return []


def micro_batches(total_batch_size, T, world_size):
    """The micro-batch sizes B that keep total_batch_size whole with this T and number of processes, largest
    first."""
    rows = total_batch_size // (T * world_size)  # rows of T tokens per process and step
    return [b for b in range(rows, 0, -1) if rows % b == 0]


def memory_estimate(s, rt, config, B):
    """accounting.py's training memory per process in bytes at micro-batch B, for this run's dtype and
    wrapping (FSDP shards over the ranks)."""
    return training_memory(config, B, s.T, rt.dtype, rt.world_size if s.fsdp else 1)["total"]


def fit_memory(s, given, config, rt):
    """(settings, notes): B checked against the GPU's memory by accounting.py's estimate, before minutes of
    compiling. A B that does not fit is lowered to the largest that does and keeps total_batch_size whole
    (more accumulation steps), unless B was given on the command line: then a NOTE warns."""
    if rt.memory is None:  # not a CUDA GPU
        return s, []
    budget = 0.9 * rt.memory  # the rest: CUDA context, NCCL buffers, allocator slack
    need = {b: memory_estimate(s, rt, config, b)
            for b in micro_batches(s.total_batch_size, s.T, rt.world_size)}
    if need[s.B] <= budget:
        return s, []
    fits = next((b for b in need if b < s.B and need[b] <= budget), None)
    said = (f"B={s.B} needs an estimated {need[s.B] / 2**30:.1f} GiB per process of the GPU's "
            f"{rt.memory / 2**30:.1f} GiB")
    if fits is None:
        return s, [f"{said}, and no smaller B fits: expect to run out of memory (try --grad_checkpoint=True, "
                   f"or --fsdp=True over more GPUs)"]
    if "B" in given:
        return s, [f"{said}: it may run out of memory; --B={fits} fits the estimate"]
    return dataclasses.replace(s, B=fits), [f"{said}: using B={fits}, the largest that fits (set --B to "
                                            f"choose)"]


def one_validation_pass(s, loader):
    """(settings, notes): val_tokens at most the validation split's rows of T tokens, so no row counts
    twice."""
    if s.val_tokens // s.T <= loader.rows_total:
        return s, []
    return dataclasses.replace(s, val_tokens=loader.rows_total * s.T), [
        f"val_tokens={s.val_tokens:,} but the validation split holds {loader.rows_total:,} rows of {s.T} "
        f"tokens: evaluating on those, once each"]


# ------------------------------------------------------------------------------------------------------------
# model, data, optimizers: each decided once, at start-up

def build_model(s, resume):
    """The GPT to train or evaluate: the resumed run's shape, init_from's weights (an OpenAI name, an HF
    folder or a checkpoint file; the optimizer starts fresh), or new weights of the settings' shape."""
    if resume is not None:
        return GPT(GPTConfig(**{**resume.model_config, "grad_checkpoint": s.grad_checkpoint}))
    if s.init_from == "scratch":
        shape = ("block_size", "vocab_size", "n_layer", "n_head", "n_kv_head", "n_embd") + GPTConfig.MODERN
        return GPT(GPTConfig(**{k: getattr(s, k) for k in shape}, grad_checkpoint=s.grad_checkpoint))
    model = load_model(s.init_from)
    model.config = dataclasses.replace(model.config, grad_checkpoint=s.grad_checkpoint)
    return model


def load_data(s, rt):
    """(train loader, val loader, HellaSwag's batches or None) for this rank. HellaSwag is tokenized and
    packed here, once for every evaluation of the run, in batches of rows of <= 336 tokens that hold about a
    micro-batch of tokens."""
    args = (s.B, s.T, rt.rank, rt.world_size)
    train = DataLoaderLite(*args, "train", s.data_root, s.shuffle, s.seed)
    val = DataLoaderLite(*args, "val", s.data_root)
    examples = None
    if s.hellaswag > 0:
        examples = Prepared(load_examples(s.hellaswag_data or None, s.hellaswag, option="--hellaswag_data"),
                            rt, max(1, (s.eval_B or s.B) * s.T // 384))
    return train, val, examples


def wrap_model(raw_model, s, rt):
    """(train_model, eval_model, grad_sync), decided once: how this rank runs the model.

    DDP: every rank holds the whole model; gradients are all-reduced in buckets during backward. It goes
    inside torch.compile, so the graph is split at the buckets and each all-reduce overlaps the backward.
    Evaluation runs each rank's own batches through the model without DDP. grad_sync(last) is the context a
    micro-step runs in: gradients cross ranks only on the last one.
    FSDP2: each Block, then the root (wte = lm_head, wpe, ln_f: the tying survives) is sharded over the
    ranks, so each keeps 1/world of the parameters, gradients and AdamW states; every rank must then run every
    forward, evaluation included. Gradients are reduce-scattered at every micro-step: accumulating them
    unsharded would hold a whole fp32 copy of them on every rank (1558M: 6.2 GB) to save communication that
    overlaps the backward anyway. torch.compile goes region by region (GPT.compile_regions)."""
    if s.fsdp:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        # in bf16 or fp16 runs the blocks' parameters are gathered in that dtype (half the bytes; autocast
        # would cast them anyway) and their gradients reduced in fp32. The root stays fp32, and so does the
        # residual stream between the blocks (cast_forward_inputs=False), as under DDP.
        low = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(rt.dtype)
        mixed = MixedPrecisionPolicy(param_dtype=low, reduce_dtype=torch.float32 if low else None,
                                     cast_forward_inputs=False)
        for block in raw_model.transformer.h:
            fully_shard(block, mp_policy=mixed)
        fully_shard(raw_model)  # in place: raw_model is now the sharded model
        if s.compile:
            raw_model.compile_regions()
        return raw_model, raw_model, lambda last: contextlib.nullcontext()
    maybe_compile = torch.compile if s.compile else (lambda m: m)
    if rt.distributed:
        ddp_model = DDP(raw_model, device_ids=[rt.local_rank] if rt.kind == "cuda" else None)
        # DDP's forward opens a profiler record_function, which Dynamo drops with a warning in every log
        # unless it may trace it (a recent setting: where a torch lacks it, the warning stays)
        if hasattr(torch._dynamo.config, "capture_profiler_record_function"):
            torch._dynamo.config.capture_profiler_record_function = True
        return (maybe_compile(ddp_model), maybe_compile(raw_model),
                lambda last: contextlib.nullcontext() if last else ddp_model.no_sync())
    model = maybe_compile(raw_model)
    return model, model, lambda last: contextlib.nullcontext()


def role_peaks(s, n_embd):
    """{role: peak learning rate} of every parameter role (optimizers.ROLES). embed_lr and head_lr (if not
    0) are given for a 768-wide model and scaled by sqrt(768 / n_embd), as nanochat does: the same step
    relative to a narrower model's weights."""
    width = (768 / n_embd) ** 0.5
    return {"muon": s.muon_lr, "decay": s.max_lr, "no_decay": s.max_lr,
            "embedding": s.embed_lr * width or s.max_lr, "head": s.head_lr * width or s.max_lr}


def schedule_change(s, resume):
    """A note when a resume moves the learning rate off the run's schedule (max_steps, warmup_steps,
    min_lr_ratio or max_lr changed): what the next step's is on each."""
    saved = {k: resume.meta["config"].get(k, CONFIG[k])
             for k in ("max_lr", "min_lr_ratio", "warmup_steps", "max_steps")}
    changed = {k: v for k, v in saved.items() if v != getattr(s, k)}
    if not changed:
        return None
    was, now = (get_lr(resume.step, settings.max_lr, settings) for settings in
                (dataclasses.replace(s, **changed), s))
    if math.isclose(was, now, rel_tol=0.01):
        return None
    return (f"the learning rate of step {resume.step + 1} is {now:.2e} on the new schedule, {was:.2e} on the "
            f"run's ({', '.join(f'{k} {v} -> {getattr(s, k)}' for k, v in changed.items())}): "
            + ("it jumps up, then decays to the new end" if now > was else "it drops"))


def get_lr(step, peak, s):
    """Linear warmup to the peak, then a cosine to peak * min_lr_ratio at max_steps."""
    min_lr = peak * s.min_lr_ratio
    if step < s.warmup_steps:
        return peak * (step + 1) / s.warmup_steps
    if step >= s.max_steps:
        return min_lr
    ratio = (step - s.warmup_steps) / max(1, s.max_steps - s.warmup_steps)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (peak - min_lr)


def make_train_step(train_model, raw_model, optimizers, scaler, grad_sync, rt, grad_clip, chunked):
    """The training step: step(batches) runs forward and backward on each micro-batch (x, y) of the list
    (gradients cross ranks on the last only), averages the loss over the ranks, unscales (fp16) and clips the
    gradients, and updates the weights, unless the loss or the gradient norm is not finite (a diverged run;
    under fp16 an overflow, which the scaler skips). Returns (loss, gradient norm, skipped) as floats: one
    CPU-GPU sync point. chunked: the loss from the hidden states by model.ChunkedHeadLoss (a CPU's eager
    training). bench.py times this same step."""
    params = list(raw_model.parameters())

    def step(batches):
        for opt in optimizers:
            opt.zero_grad(set_to_none=True)
        loss_accum = torch.zeros((), device=rt.device)
        for i, (x, y) in enumerate(batches):
            x, y = x.to(rt.device, non_blocking=True), y.to(rt.device, non_blocking=True)
            with grad_sync(i == len(batches) - 1):
                with autocast(rt.device, rt.dtype):
                    _, loss = train_model(x, y, chunked=chunked)
                loss = loss / len(batches)  # the mean over the whole batch, not a sum of means
                loss_accum += loss.detach()
                scaler.scale(loss).backward()  # fp16: scaled up so small gradients do not underflow
        if rt.distributed:
            dist.all_reduce(loss_accum)
            loss_accum /= rt.world_size
        with torch.profiler.record_function("optimizer"):  # a label for bench.py's profile
            for opt in optimizers:
                scaler.unscale_(opt)  # fp16: clip the true gradients, not the scaled ones
            norm = torch.nn.utils.clip_grad_norm_(params, grad_clip)  # FSDP: every rank
            norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm  # FSDP: a replicated DTensor
            loss, norm = loss_accum.item(), norm.item()  # CPU-GPU sync point
            # fp16: gradients that overflowed under the loss scale are the scaler's (it skips the update and
            # lowers the scale); otherwise a non-finite loss or norm is a diverged run: no update at all
            finite = math.isfinite(loss) and math.isfinite(norm)
            skipped = scaler.is_enabled() and math.isfinite(loss) and not finite
            if finite:
                for opt in optimizers:
                    scaler.step(opt)
            if finite or skipped:
                scaler.update()  # fp16: lowers the scale after an overflow
        return loss, norm, skipped
    return step


# ------------------------------------------------------------------------------------------------------------
# what every rank must agree on after a step (runlog.RunLog writes the log)

def agree(stop, error, rt):
    """(stop, error), the same on every rank: the stop signal any rank received, and rank 0's failure to log
    the step. One small all-reduce a step; the error travels only when there is one."""
    if rt.distributed:
        flags = torch.tensor([stop, error is not None], device=rt.device)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        stop, failed = (int(v) for v in flags.tolist())
        error = runtime.broadcast_object(error) if failed else None
    return stop, error


def log_start(s, rt, step, model, loader, optimizers, notes, grad_accum_steps, run_log):
    """Print what this run is and write its first record: the settings, the model, the environment. An
    evaluation's log starts afresh."""
    if s.eval_only and rt.master and os.path.exists(run_log.path):
        os.remove(run_log.path)  # an earlier evaluation's (a training run's has checkpoints: refused earlier)
    config = dataclasses.asdict(s)
    differs = {k: v for k, v in config.items() if v != CONFIG[k]}
    print0(f"config (what differs from the settings block; the log keeps all): {json.dumps(differs)}")
    print0(f"model: {model.num_params():,} parameters, {model.config}")
    if s.eval_only:  # nothing trained: what one evaluation reads
        print0(f"eval: {s.val_tokens // s.T * s.T:,} validation tokens from {s.data_root}, {s.hellaswag:,} "
               f"HellaSwag examples; device {rt.device}")
    else:
        print0(f"data: {s.data_root}, {loader.tokens_total:,} train tokens, "
               f"{1 - loader.tokens_per_epoch / loader.tokens_total:.2%} skipped per epoch (shard tails)")
        mem = memory_estimate(s, rt, model.config, s.B)
        sharded = (f" (parameters, gradients and AdamW states sharded {rt.world_size} ways"
                   + (f"; blocks gathered in {rt.dtype}, gradients reduced in fp32" if rt.dtype != "fp32"
                      else "") + ")") if s.fsdp else ""
        print0(f"batch: {s.total_batch_size:,} tokens = {s.B} x {s.T} x {rt.world_size} processes x "
               f"{grad_accum_steps} accumulation steps; device {rt.device}; estimated training memory per "
               f"process {mem / 2**30:.1f} GiB{sharded}")
    start = {"event": "start", "step": step, "config": config, "differs": differs,
             "model_config": dataclasses.asdict(model.config), "world_size": rt.world_size,
             "fallbacks": notes, "time": time.time(), "run": runtime.run_info(rt, s.compile, optimizers)}
    run_log.log([start])
    run_log.open_trackers(s.tracker, s.log_dir, start)


@contextlib.contextmanager
def catch_stop_signals():
    """While it lasts, a one-item list that SIGTERM, SIGINT (Ctrl-C) or SIGUSR1 (Slurm's warning before the
    time limit, --signal=USR1@SECONDS) set to their number, said at once: the step in progress finishes, a
    checkpoint is written (no evaluation first), and the run exits with 128 + signal. A second signal stops
    the process at once, without a checkpoint. The handlers before are restored after."""
    received = [0]

    def handler(signum, frame):
        name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
        if received[0]:
            os._exit(128 + signum)  # now: no checkpoint, nothing flushed
        received[0] = signum
        if runtime.is_rank0():  # os.write: safe inside a signal handler, unlike print
            said = f"{name}: stopping after this step with a checkpoint; {name} again stops now without one"
            os.write(sys.stdout.fileno(), f"\n{said}\n".encode())
    # SIGUSR1 does not exist on Windows
    stops = [signal.SIGTERM, signal.SIGINT] + ([signal.SIGUSR1] if hasattr(signal, "SIGUSR1") else [])
    before = {sig: signal.signal(sig, handler) for sig in stops}
    try:
        yield received
    finally:
        for sig, previous in before.items():
            signal.signal(sig, previous)


@contextlib.contextmanager
def out_of_memory_hint(s, rt, config):
    """The GPU running out of memory in a step or an evaluation (also inside compiled code) is a UserError
    naming the B to try; other errors pass through."""
    try:
        yield
    except Exception as e:
        if not runtime.is_out_of_memory(e):
            raise
        est = memory_estimate(s, rt, config, s.B) / 2**30
        smaller = [b for b in micro_batches(s.total_batch_size, s.T, rt.world_size) if b < s.B]
        of = f" of the GPU's {rt.memory / 2**30:.1f} GiB" if rt.memory else ""
        fix = (f"try --B={smaller[0]} (gradient accumulation keeps total_batch_size)" if smaller else
               "B=1 already: try --grad_checkpoint=True, or --fsdp=True over more GPUs")
        raise UserError(f"out of memory at B={s.B}, T={s.T} (estimated {est:.1f} GiB per process{of}): "
                        f"{fix}") from None


@contextlib.contextmanager
def peer_timeout_hint(s, where):
    """A collective that waited collective_timeout for another process (one that failed, hangs or was
    stopped) is a UserError naming the step and the newest checkpoint (where(): both, now); other errors pass
    through."""
    try:
        yield
    except Exception as e:
        if not runtime.timed_out(e):
            raise
        step, checkpoint = where()
        raise UserError(f"no answer from another process for {s.collective_timeout} s (--collective_timeout) "
                        f"at step {step + 1}: it failed, hangs or was stopped. The newest checkpoint is "
                        f"{checkpoint}; the same command resumes from it (torchrun --max-restarts does by "
                        "itself)") from None


# ------------------------------------------------------------------------------------------------------------
# evaluation: every rank runs every forward (under FSDP each one is collective)

@torch.no_grad()
def validation_loss(model, loader, rows, B, rt):
    """(val loss in nats per token, val bits per byte) of the validation split's first `rows` rows of T
    tokens: the same tokens, and the same value up to summation order, whatever B and the number of processes.
    Each rank reads a contiguous share in micro-batches of B, and every rank runs the same number of forwards
    (under FSDP each is collective): a batch short of rows is padded to B (fixed shapes, no recompiling) with
    rows that count zero. Bits per byte leave out <|endoftext|> (no text) and compare across tokenizers."""
    text_bytes = torch.tensor(token_bytes(get_encoding(), model.config.vocab_size), device=rt.device)  # (V,)
    share = -(-rows // rt.world_size)  # rows per rank (the last may have fewer, or none)
    first = rt.rank * share
    mine = max(0, min(rows - first, share))
    nats = torch.zeros(2, device=rt.device)  # all targets' losses; those of the targets that are text
    counts = torch.zeros(2, dtype=torch.long, device=rt.device)  # targets; their UTF-8 bytes
    for start in range(0, share, B):
        n = max(0, min(B, mine - start))  # rows of this rank's share in this batch; the rest is padding
        x, y = loader.read_rows([first + start + i if i < n else 0 for i in range(B)])
        y = y.to(rt.device).view(-1)  # (B*T,)
        with autocast(rt.device, rt.dtype):
            _, losses = model(x.to(rt.device), y, reduction="none")  # (B*T,)
        keep = (torch.arange(B, device=rt.device) < n).repeat_interleave(loader.T)  # (B*T,) not padding
        losses, nbytes = torch.where(keep, losses, 0.0), text_bytes[y] * keep
        nats += torch.stack([losses.sum(), (losses * (nbytes > 0)).sum()]).float()  # a mask: no sync
        counts[0] += keep.sum()
        counts[1] += nbytes.sum()
    if rt.distributed:
        dist.all_reduce(nats)
        dist.all_reduce(counts)
    return (nats[0] / counts[0]).item(), (nats[1] / (math.log(2) * counts[1])).item()


def evaluate(step, eval_model, raw_model, val_loader, examples, s, rt, run_log):
    """Validation loss and bits per byte, HellaSwag (given examples) and samples: printed, and logged
    together when all are done."""
    eval_model.eval()
    at = os.path.basename(s.init_from) if s.eval_only else f"step {step}"  # eval_only: no steps
    val_loss, val_bpb = validation_loss(eval_model, val_loader, s.val_tokens // s.T, s.eval_B or s.B, rt)
    print0(f"{at}: val loss {val_loss:.4f} | val bpb {val_bpb:.4f}")
    records = [{"step": step, "val_loss": val_loss, "val_bpb": val_bpb}]
    if examples is not None:  # through the compiled model: fixed batch shapes, few lengths
        hs = hellaswag_eval(eval_model, examples, rt)
        print0(f"{at}: hellaswag acc_norm {hs['acc_norm']:.4f} ({hs['n']} examples)")
        records.append({"step": step, "hellaswag": hs["acc_norm"], "hellaswag_acc": hs["acc"],
                        "hellaswag_n": hs["n"]})
    # every rank samples the same tokens (a seeded generator of its own: training's RNG is untouched)
    samples, _, _ = sample(raw_model, SAMPLE_PROMPT, 4, 24, 1.0, 50, s.seed, rt)
    for text in samples:
        print0(f"sample: {text!r}")
    run_log.log(records + [{"step": step, "samples": samples}])
    eval_model.train()


def evaluate_or_stop(step, eval_model, raw_model, val_loader, examples, s, rt, run_log, checkpoint, save):
    """evaluate(), and if it fails, nothing lost: the step's state is on disk before the run stops (save()
    writes it where `checkpoint`, the name of the step's checkpoint, is None), unless another process hangs.
    Running out of memory is then a UserError naming eval_B; any other error keeps its traceback after a line
    naming the checkpoint."""
    try:
        evaluate(step, eval_model, raw_model, val_loader, examples, s, rt, run_log)
    except Exception as e:
        if runtime.timed_out(e):  # another process hangs: no checkpoint can be agreed on (peer_timeout_hint)
            raise
        checkpoint = checkpoint or save()
        if runtime.is_out_of_memory(e):
            raise UserError(f"out of memory evaluating step {step} at eval_B={s.eval_B or s.B}: the step is "
                            f"in {checkpoint}; lower --eval_B (or --hellaswag) and rerun the same command, "
                            f"which evaluates step {step} first") from None
        print0(f"error: evaluating step {step} failed (the traceback follows); the step is in {checkpoint}")
        raise


# ------------------------------------------------------------------------------------------------------------

def main(argv):
    """Train (or with eval_only, evaluate) as the settings and argv say; returns the process's exit status."""
    given = parse_overrides(argv)  # a misspelt name or a value of the wrong type stops here

    # ------------------------------------------------------------------------- processes, device, settings
    asked = {**CONFIG, **given}
    check_range("--collective_timeout", asked["collective_timeout"], *RANGES["collective_timeout"])
    # the process group, this rank's GPU, TF32, the dtype
    rt = runtime.setup(asked["device"], asked["dtype"], asked["collective_timeout"])
    s, given, notes = resolve(given, rt)
    notes = rt.notes + notes
    for note in notes:
        print0(f"NOTE: {note}")
    hold_log_dir(s.log_dir, rt)  # one run at a time per log_dir
    metrics = os.path.join(s.log_dir, "metrics.jsonl")
    s, resume = find_resume(s, given, rt, metrics)  # None, or the run in log_dir to continue
    if resume is not None and resume.finished:  # and evaluated
        return 0
    if resume is None and s.init_from != "scratch":  # the weights decide the shape; T within their positions
        s = weights_shape(s, given, model_config(s.init_from), s.init_from)
    if resume is not None and (note := schedule_change(s, resume)):
        print0(f"NOTE: {note}")

    # --------------------------------------------------------------------------------- model, data, optimizer
    torch.manual_seed(s.seed)  # the same initial weights on every rank
    raw_model = build_model(s, resume).to(rt.device)
    s, memory_notes = fit_memory(s, given, raw_model.config, rt)  # a B the GPU holds, found before compiling
    memory_notes += [] if s.eval_only else space_note(s.log_dir, raw_model.num_params())
    train_loader, val_loader, examples = load_data(s, rt)
    s, val_notes = one_validation_pass(s, val_loader)
    for note in memory_notes + val_notes:
        print0(f"NOTE: {note}")
    notes += memory_notes + val_notes
    grad_accum_steps = s.total_batch_size // (s.B * s.T * rt.world_size)  # micro-steps a step
    train_model, eval_model, grad_sync = wrap_model(raw_model, s, rt)
    peaks = role_peaks(s, raw_model.config.n_embd)
    optimizers = make_optimizers(raw_model, s.optimizer, s.weight_decay, peaks, fused=rt.kind == "cuda")
    # fp16 overflows where bf16 does not: the loss is scaled up before backward and the gradients unscaled
    # before clipping; a step whose gradients overflowed is skipped and the scale lowered. Otherwise a no-op.
    scaler = torch.amp.GradScaler(rt.kind, init_scale=s.loss_scale, enabled=rt.dtype == "fp16")
    step = resume.restore(raw_model, optimizers, scaler, train_loader, rt) if resume else 0
    hold_log_dir(s.log_dir, rt, create=True)  # only now: a refused run leaves no empty log_dir behind
    run_log = RunLog(metrics, rt)
    log_start(s, rt, step, raw_model, train_loader, optimizers, notes, grad_accum_steps, run_log)
    if s.eval_only:  # init_from's model, evaluated and logged; no training, no checkpoint
        with run_log:
            evaluate(step, eval_model, raw_model, val_loader, examples, s, rt, run_log)
        return 0
    if resume is not None and resume.unevaluated:  # its checkpoint was written, its evaluation failed
        evaluate_or_stop(step, eval_model, raw_model, val_loader, examples, s, rt, run_log,
                         f"{os.path.basename(resume.path)} (step {step})", None)
    # a CPU trains eagerly through ChunkedHeadLoss (no logits: see there); compiled code takes the plain path
    train_step = make_train_step(train_model, raw_model, optimizers, scaler, grad_sync, rt, s.grad_clip,
                                 chunked=rt.kind == "cpu" and not s.compile)

    # ---------------------------------------------------------------------------------------- training loop
    peak = peak_flops(torch.cuda.get_device_name(rt.device), rt.dtype) if rt.kind == "cuda" else None
    last_checkpoint = f"{os.path.basename(resume.path)} (step {step})" if resume else "none yet"
    clock = Clock(resume.meta.get("elapsed", 0.0) if resume else 0.0, window=s.eval_interval)  # for the ETA
    train_model.train()
    with run_log, catch_stop_signals() as stop_signal, out_of_memory_hint(s, rt, raw_model.config), \
            peer_timeout_hint(s, lambda: (step, last_checkpoint)):
        while step < s.max_steps:
            t0 = time.time()
            for opt in optimizers:  # each parameter group from its own role's peak
                for group in opt.param_groups:
                    group["lr"] = get_lr(step, peaks[group["role"]], s)
            scale = scaler.get_scale() if scaler.is_enabled() else None  # fp16: the scale this step uses
            loss, norm, skipped = train_step([train_loader.next_batch() for _ in range(grad_accum_steps)])
            if not skipped and not (math.isfinite(loss) and math.isfinite(norm)):  # stopped before its update
                print0(f"error: non-finite loss {loss} or gradient norm {norm} at step {step + 1}: stopped "
                       f"before its update. The newest checkpoint is {last_checkpoint}; lower max_lr or "
                       f"check the data, then rerun to resume from the newest checkpoint that verifies")
                run_log.append([{"step": step + 1, "event": "non-finite", "loss": loss, "grad_norm": norm}])
                return 1
            synchronize(rt.device)  # wait for the GPU before reading the clock
            dt = time.time() - t0
            step += 1
            lr = get_lr(step - 1, s.max_lr, s)
            tok_s = s.total_batch_size / dt
            util = mfu(raw_model.config, tok_s / rt.world_size, peak, s.T)
            elapsed, eta = clock.elapsed(), clock.eta(step, s.max_steps)
            print0(f"step {step:5d}/{s.max_steps} | loss {loss:.6f} | lr {lr:.4e} | norm {norm:.4f} "
                   f"| {dt * 1000:.2f} ms | {tok_s:,.0f} tok/s"
                   + ("" if util is None else f" | MFU {util:.1%}")  # no peak known (CPU, an unlisted GPU)
                   + f" | {duration(elapsed)} elapsed, eta {duration(eta)}"
                   + (f" | skipped: fp16 gradients overflowed at loss scale {scale:g}" if skipped else ""))
            record = {"step": step, "loss": loss, "lr": lr, "grad_norm": norm, "ms": dt * 1000,
                      "tok_s": tok_s, "mfu": util, "elapsed": elapsed, "eta": eta}
            record |= {"loss_scale": scale, "skipped": skipped} if scale else {}
            error = run_log.append([record])
            stop, error = agree(stop_signal[0], error, rt)  # every rank stops at the same step
            if error:
                raise UserError(error)
            last = step == s.max_steps
            saved = step % s.checkpoint_interval == 0 or last or stop
            if saved:  # before the evaluation: an evaluation that fails loses no training
                last_checkpoint = save_run(s, rt, step, raw_model, optimizers, scaler, train_loader,
                                           clock.elapsed())
            if (step % s.eval_interval == 0 or last) and not stop:  # a stop does not wait for an evaluation
                evaluate_or_stop(step, eval_model, raw_model, val_loader, examples, s, rt, run_log,
                                 last_checkpoint if saved else None,
                                 lambda: save_run(s, rt, step, raw_model, optimizers, scaler, train_loader,
                                                  clock.elapsed()))
            clock.lap(step)  # the pace behind the ETA counts evaluations and checkpoints too
            if stop:  # not a finish: scripts and schedulers see 128 + signal (143 TERM, 130 INT, 138 USR1)
                print0(f"stopped by {signal.Signals(stop).name} after step {step}; rerun the same command to "
                       f"resume")
                return 128 + stop
    if rt.master:  # finished: what ran and what it reached, from the log alone
        print0(f"report: {write_report(metrics)} (python plot.py --report --log={metrics} makes it again)")
    return 0


if __name__ == "__main__":
    try:
        status = main(sys.argv[1:])
    except UserError as e:  # an expected mistake, the same on every rank: said once per node, not per rank
        if os.environ.get("LOCAL_RANK", "0") == "0":
            print(f"error: {e}", file=sys.stderr)
        runtime.exit_process(1, wait=False)
    runtime.exit_process(status)  # every rank returns at the same step
