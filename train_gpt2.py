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
import importlib
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
from accounting import mfu, peak_flops, training_memory
from checkpoint import find_resume, hold_log_dir, load_model, save_run
from dataloader import DataLoaderLite
from hellaswag import evaluate as hellaswag_eval, load_examples
from model import GPT, GPT2_SIZES, GPTConfig
from optimizers import make_optimizers
from runtime import autocast, one_line_errors, print0, synchronize
from tokenizer import get_encoding, token_bytes

# ------------------------------------------------------------------------------------------------------------
# settings: the GPT-2 124M recipe (edit here, or override any name on the command line as --name=value)
data_root = "edu_fineweb10B"  # token shards from fineweb.py, or a text file such as input.txt
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
val_steps = 20  # micro-batches of validation loss per rank and eval
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
seed = 1337  # initial weights, data order (shuffle) and samples
# ------------------------------------------------------------------------------------------------------------
CONFIG = {k: v for k, v in dict(globals()).items()
          if not k.startswith("_") and type(v) in (int, float, str, bool)}

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
    total_batch_size=4096, B=8, T=256, max_steps=300, warmup_steps=30, eval_interval=100,
    checkpoint_interval=300)
CPU_CONFIG = dict(  # without a GPU: a model and schedule that train on 2 cores in a few minutes
    total_batch_size=2048, B=8, T=128, n_layer=4, n_head=4, n_kv_head=4, n_embd=64, max_lr=3e-3,
    warmup_steps=20, max_steps=150, eval_interval=50, val_steps=8, hellaswag=0, checkpoint_interval=50,
    compile=False)


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


def parse_overrides(argv, defaults):
    """--name=value (or --name value) pairs, each checked against the settings' names and converted to its
    type; --help prints the settings and exits."""
    overrides, argv = {}, list(argv)
    while argv:
        arg = argv.pop(0)
        if arg in ("-h", "--help"):
            print(settings_help())
            raise SystemExit(0)
        if not arg.startswith("--") or arg == "--":
            raise SystemExit(f"error: expected --name=value, got {arg!r} (python train_gpt2.py --help lists "
                             f"the settings)")
        key, eq, value = arg[2:].partition("=")
        if not eq:  # --name value
            if not argv or argv[0].startswith("--"):
                raise SystemExit(f"error: --{key} needs a value: --{key}=VALUE")
            value = argv.pop(0)
        if key not in defaults:
            close = difflib.get_close_matches(key, defaults, n=1)
            hint = f"; did you mean --{close[0]}?" if close else " (python train_gpt2.py --help lists them)"
            raise SystemExit(f"error: unknown setting {key!r}{hint}")
        kind = type(defaults[key])
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
            raise SystemExit(f"error: --{key}={value!r} is not {KINDS[kind]} "
                             f"(default: {defaults[key]!r})") from None
    return overrides


def apply_presets(cfg, overrides):
    """(cfg, overrides) with the size preset's and then the recipe's settings, except those given on the
    command line. A preset chosen on the command line counts as its settings given there (the CPU fallback
    keeps them)."""
    if cfg["size"] and cfg["size"] not in SIZES:
        raise SystemExit(f"error: --size={cfg['size']!r}: use one of {', '.join(SIZES)}, or \"\" for the "
                         f"settings n_layer, n_head, n_kv_head, n_embd and max_lr as they are")
    if cfg["recipe"] not in RECIPES:
        raise SystemExit(f"error: --recipe={cfg['recipe']!r}: use gpt2 (GPT-2's) or modern")
    for name, presets in (("size", SIZES), ("recipe", RECIPES)):
        preset = {k: v for k, v in presets.get(cfg[name], {}).items() if k not in overrides}
        cfg, overrides = {**cfg, **preset}, ({**overrides, **preset} if name in overrides else overrides)
    return cfg, overrides


def apply_fallbacks(cfg, overrides, rt):
    """(cfg, notes): without shards at the shipped data_root, train on input.txt (a plain `python` run only:
    under torchrun that is a mistake); without a GPU, a small model. Both with settings to match, except those
    given on the command line. Their batch is a fixed number of tokens, whatever the number of processes (so
    a resume may change it, as B): B is lowered where needed to keep it whole."""
    small, notes = {}, []
    if cfg["data_root"] == FINEWEB_DIR and not os.path.exists(FINEWEB_DIR):
        if rt.distributed:
            raise SystemExit(f"error: no shards in {os.path.abspath(FINEWEB_DIR)} (data_root is relative to "
                             f"the directory you run from): make them there with `python fineweb.py`, or "
                             f"pass --data_root=PATH")
        notes.append(f"no shards in {FINEWEB_DIR}/ (run `python fineweb.py` to make them): "
                     + ("evaluating" if cfg["eval_only"] else "training") + " on input.txt")
        small.update(SHAKESPEARE_CONFIG, data_root=SHAKESPEARE)
    if rt.kind != "cuda":
        notes.append("no CUDA device: " + ("evaluating" if cfg["eval_only"] else "training a small model")
                     + " with a small batch on the CPU (settings given on the command line are kept)")
        small.update(CPU_CONFIG)
    cfg = {**cfg, **{k: v for k, v in small.items() if k not in overrides}}
    if small and "B" not in overrides:  # the largest B <= the fallback's that keeps the batch whole
        cfg["B"] = next((b for b in micro_batches(cfg, rt) if b <= cfg["B"]), cfg["B"])
    return cfg, notes


def validate(cfg, rt):
    """Stop at the first setting that cannot work, in one line naming the fix, before any process group, model
    or log_dir exists. Returns NOTEs on settings that work but are likely mistakes."""
    if cfg["optimizer"] not in ("adamw", "muon"):
        raise SystemExit(f"error: --optimizer={cfg['optimizer']!r}: use adamw or muon")
    if cfg["optimizer"] == "muon" and not hasattr(torch.optim, "Muon"):
        raise SystemExit(f"error: --optimizer=muon needs torch >= 2.9 (torch.optim.Muon), this is "
                         f"{torch.__version__}: upgrade torch or use --optimizer=adamw")
    if cfg["fsdp"] and not hasattr(importlib.import_module("torch.distributed.fsdp"), "fully_shard"):
        raise SystemExit(f"error: --fsdp=True needs torch >= 2.6 (FSDP2's fully_shard), this is "
                         f"{torch.__version__}: upgrade torch or drop --fsdp (DDP)")
    if cfg["optimizer"] == "muon" and cfg["fsdp"]:
        raise SystemExit("error: --optimizer=muon does not work with --fsdp=True: Muon orthogonalizes each "
                         "whole weight matrix and FSDP2 gives each rank a shard of it; drop --fsdp (DDP) or "
                         "use --optimizer=adamw")
    if cfg["eval_only"] and cfg["init_from"] in ("scratch", "resume"):
        raise SystemExit("error: --eval_only=True evaluates given weights: set --init_from to gpt2 (or "
                         "gpt2-medium, gpt2-large, gpt2-xl), an HF GPT-2 folder or a model_*.pt checkpoint")
    if cfg["fsdp"] and not rt.distributed:
        raise SystemExit("error: --fsdp=True shards the model over the processes torchrun starts: run it as "
                         "`torchrun --nproc_per_node=N train_gpt2.py --fsdp=True`")
    if os.path.exists(cfg["log_dir"]) and not os.path.isdir(cfg["log_dir"]):
        raise SystemExit(f"error: --log_dir={cfg['log_dir']} is a file, not a directory: choose another "
                         f"--log_dir")
    if not os.path.exists(cfg["data_root"]):
        raise SystemExit(f"error: data_root {cfg['data_root']} does not exist: make shards with `python "
                         f"fineweb.py --out_dir {cfg['data_root']}` or point --data_root at a text file")
    for key in ("B", "T", "total_batch_size", "max_steps", "eval_interval", "val_steps",
                "checkpoint_interval", "keep_checkpoints"):
        if cfg[key] < 1:
            raise SystemExit(f"error: --{key}={cfg[key]} must be at least 1")
    if cfg["T"] > cfg["block_size"]:
        raise SystemExit(f"error: T={cfg['T']} exceeds block_size={cfg['block_size']}: lower T or raise "
                         f"block_size")
    tokens_per_micro_step = cfg["B"] * cfg["T"] * rt.world_size
    if cfg["total_batch_size"] % tokens_per_micro_step:
        raise SystemExit(f"error: total_batch_size={cfg['total_batch_size']} is not a multiple of "
                         f"B*T*world_size = {cfg['B']}*{cfg['T']}*{rt.world_size} = {tokens_per_micro_step}: "
                         f"change B, T or total_batch_size")
    if cfg["max_steps"] < cfg["warmup_steps"] and not cfg["eval_only"]:
        return [f"max_steps={cfg['max_steps']} < warmup_steps={cfg['warmup_steps']}: the learning rate never "
                f"reaches max_lr (lower --warmup_steps)"]
    return []


def micro_batches(cfg, rt):
    """The micro-batch sizes B that keep total_batch_size whole with this T and number of processes, largest
    first."""
    rows = cfg["total_batch_size"] // (cfg["T"] * rt.world_size)  # rows of T tokens per process and step
    return [b for b in range(rows, 0, -1) if rows % b == 0]


def memory_estimate(cfg, rt, config, B):
    """accounting.py's training memory per process in bytes at micro-batch B, for this run's dtype and
    wrapping (FSDP shards over the ranks)."""
    return training_memory(config, B, cfg["T"], rt.dtype, rt.world_size if cfg["fsdp"] else 1)["total"]


def fit_memory(cfg, overrides, config, rt):
    """(cfg, notes): B checked against the GPU's memory by accounting.py's estimate, before minutes of
    compiling. A B that does not fit is lowered to the largest that does and keeps total_batch_size whole
    (more accumulation steps), unless B was given on the command line: then a NOTE warns."""
    if rt.memory is None:  # not a CUDA GPU
        return cfg, []
    budget = 0.9 * rt.memory  # the rest: CUDA context, NCCL buffers, allocator slack
    need = {b: memory_estimate(cfg, rt, config, b) for b in micro_batches(cfg, rt)}
    if need[cfg["B"]] <= budget:
        return cfg, []
    fits = next((b for b in need if b < cfg["B"] and need[b] <= budget), None)
    said = (f"B={cfg['B']} needs an estimated {need[cfg['B']] / 2**30:.1f} GiB per process of the GPU's "
            f"{rt.memory / 2**30:.1f} GiB")
    if fits is None:
        return cfg, [f"{said}, and no smaller B fits: expect to run out of memory (try "
                     f"--grad_checkpoint=True, or --fsdp=True over more GPUs)"]
    if "B" in overrides:
        return cfg, [f"{said}: it may run out of memory; --B={fits} fits the estimate"]
    return {**cfg, "B": fits}, [f"{said}: using B={fits}, the largest that fits (set --B to choose)"]


@contextlib.contextmanager
def out_of_memory_hint(cfg, rt, config):
    """The GPU running out of memory in a step or an evaluation (also inside compiled code) ends the run in
    one line naming the B to try, printed once; other errors pass through."""
    try:
        yield
    except Exception as e:
        chain = [e]
        while (chain[-1].__cause__ or chain[-1].__context__) and len(chain) < 16:  # compiled code wraps it
            chain.append(chain[-1].__cause__ or chain[-1].__context__)
        if not any(isinstance(x, torch.OutOfMemoryError) for x in chain):
            raise
        est = memory_estimate(cfg, rt, config, cfg["B"]) / 2**30
        smaller = [b for b in micro_batches(cfg, rt) if b < cfg["B"]]
        of = f" of the GPU's {rt.memory / 2**30:.1f} GiB" if rt.memory else ""
        fix = (f"try --B={smaller[0]} (gradient accumulation keeps total_batch_size)" if smaller else
               "B=1 already: try --grad_checkpoint=True, or --fsdp=True over more GPUs")
        raise SystemExit(f"error: out of memory at B={cfg['B']}, T={cfg['T']} (estimated {est:.1f} GiB per "
                         f"process{of}): {fix}" if rt.master else 1) from None


def build_model(cfg, resume):
    """The GPT to train or evaluate: the resumed run's shape, init_from's weights (an OpenAI name, an HF
    folder or a checkpoint file; the optimizer starts fresh), or new weights of the settings' shape."""
    with one_line_errors():  # a bad model name, folder or shape
        if resume is not None:
            return GPT(GPTConfig(**{**resume.model_config, "grad_checkpoint": cfg["grad_checkpoint"]}))
        if cfg["init_from"] == "scratch":
            shape = ("block_size", "vocab_size", "n_layer", "n_head", "n_kv_head", "n_embd")
            return GPT(GPTConfig(**{k: cfg[k] for k in shape + GPTConfig.MODERN},
                                 grad_checkpoint=cfg["grad_checkpoint"]))
        model = load_model(cfg["init_from"])
        model.config = dataclasses.replace(model.config, grad_checkpoint=cfg["grad_checkpoint"])
        return model


def load_data(cfg, rt):
    """(train loader, val loader, HellaSwag examples or None) for this rank."""
    with one_line_errors():  # missing or damaged shards, a missing HellaSwag file, no network
        args = (cfg["B"], cfg["T"], rt.rank, rt.world_size)
        train = DataLoaderLite(*args, "train", cfg["data_root"], cfg["shuffle"], cfg["seed"])
        val = DataLoaderLite(*args, "val", cfg["data_root"])
        examples = None
        if cfg["hellaswag"] > 0:
            examples = load_examples(cfg["hellaswag_data"] or None, cfg["hellaswag"])
    return train, val, examples


def wrap_model(raw_model, cfg, rt):
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
    if cfg["fsdp"]:
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
        if rt.compile:
            raw_model.compile_regions()
        return raw_model, raw_model, lambda last: contextlib.nullcontext()
    maybe_compile = torch.compile if rt.compile else (lambda m: m)
    if rt.distributed:
        ddp_model = DDP(raw_model, device_ids=[rt.local_rank] if rt.kind == "cuda" else None)
        return (maybe_compile(ddp_model), maybe_compile(raw_model),
                lambda last: contextlib.nullcontext() if last else ddp_model.no_sync())
    model = maybe_compile(raw_model)
    return model, model, lambda last: contextlib.nullcontext()


def get_lr(step, cfg, peak=None):
    """Linear warmup to the peak (max_lr unless given), then a cosine to peak * min_lr_ratio at max_steps."""
    max_lr = cfg["max_lr"] if peak is None else peak
    min_lr = max_lr * cfg["min_lr_ratio"]
    if step < cfg["warmup_steps"]:
        return max_lr * (step + 1) / cfg["warmup_steps"]
    if step >= cfg["max_steps"]:
        return min_lr
    ratio = (step - cfg["warmup_steps"]) / max(1, cfg["max_steps"] - cfg["warmup_steps"])
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (max_lr - min_lr)


# ------------------------------------------------------------------------------------------------------------
# the run's log (metrics.jsonl: one JSON record per line, rank 0 writes) and what it prints

def log(path, record):
    if runtime.is_rank0():
        with open(path, "a") as f:  # appended: a resumed run continues the same log
            f.write(json.dumps(record) + "\n")


def log_start(cfg, rt, step, model, loader, optimizers, notes, grad_accum_steps, path):
    """Print what this run is and write its first record: the settings, the model, the environment."""
    hold_log_dir(cfg["log_dir"], rt, create=True)  # only now: a refused run leaves no empty log_dir behind
    if cfg["eval_only"] and rt.master and os.path.exists(path):
        os.remove(path)  # an earlier evaluation's log (a training run's has checkpoints: refused earlier)
    print0(f"config (what differs from the settings block; the log keeps all): "
           f"{json.dumps({k: v for k, v in cfg.items() if v != CONFIG[k]})}")
    print0(f"model: {model.num_params():,} parameters, {model.config}")
    if cfg["eval_only"]:  # nothing trained: what one evaluation reads
        print0(f"eval: {cfg['val_steps']} validation batches of {cfg['B']} x {cfg['T']} tokens x "
               f"{rt.world_size} processes from {cfg['data_root']}, {cfg['hellaswag']:,} HellaSwag examples; "
               f"device {rt.device}")
    else:
        print0(f"data: {cfg['data_root']}, {loader.tokens_total:,} train tokens, "
               f"{1 - loader.tokens_per_epoch / loader.tokens_total:.2%} skipped per epoch (shard tails)")
        mem = memory_estimate(cfg, rt, model.config, cfg["B"])
        sharded = (f" (parameters, gradients and AdamW states sharded {rt.world_size} ways"
                   + (f"; blocks gathered in {rt.dtype}, gradients reduced in fp32" if rt.dtype != "fp32"
                      else "") + ")") if cfg["fsdp"] else ""
        print0(f"batch: {cfg['total_batch_size']:,} tokens = {cfg['B']} x {cfg['T']} x {rt.world_size} "
               f"processes x {grad_accum_steps} accumulation steps; device {rt.device}; estimated training "
               f"memory per process {mem / 2**30:.1f} GiB{sharded}")
    log(path, {"event": "start", "step": step, "config": cfg,
               "model_config": dataclasses.asdict(model.config), "world_size": rt.world_size,
               "fallbacks": notes, "time": time.time(), "run": runtime.run_info(rt, optimizers)})


def catch_stop_signals():
    """A one-item list that SIGTERM or SIGINT (Ctrl-C) set to their number, said at once: the step in progress
    finishes, a checkpoint is written (no evaluation first), and the run exits with 128 + signal. A second
    signal stops the process at once, without a checkpoint."""
    received = [0]

    def handler(signum, frame):
        name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
        if received[0]:
            os._exit(128 + signum)  # now: no checkpoint, nothing flushed
        received[0] = signum
        if runtime.is_rank0():  # os.write: safe inside a signal handler, unlike print
            said = f"{name}: stopping after this step with a checkpoint; {name} again stops now without one"
            os.write(sys.stdout.fileno(), f"\n{said}\n".encode())
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, handler)
    return received


def diverged(step, loss, norm, last_checkpoint, path):
    """A non-finite loss or gradient norm: said and logged; the run stops before the update (exit 1)."""
    print0(f"error: non-finite loss {loss} or gradient norm {norm} at step {step}: stopped before its "
           f"update. The newest checkpoint is {last_checkpoint}; lower max_lr or check the data, then rerun "
           f"to resume from the newest checkpoint that verifies")
    log(path, {"step": step, "event": "non-finite", "loss": loss, "grad_norm": norm})
    return 1


# ------------------------------------------------------------------------------------------------------------
# evaluation: every rank runs every forward (under FSDP each one is collective)

@torch.no_grad()
def validation_loss(model, loader, steps, rt):
    """(val loss in nats per token, val bits per byte) over `steps` batches of each rank, summed over ranks.
    Bits per byte leave out <|endoftext|> (no text) and are comparable across tokenizers."""
    text_bytes = torch.tensor(token_bytes(get_encoding(), model.config.vocab_size), device=rt.device)  # (V,)
    loader.reset()
    nats = torch.zeros(2, device=rt.device)  # all targets' losses; those of the targets that are text
    counts = torch.zeros(2, dtype=torch.long, device=rt.device)  # targets; their UTF-8 bytes
    for _ in range(steps):
        x, y = loader.next_batch()
        y = y.to(rt.device).view(-1)
        with autocast(rt.device, rt.dtype):
            _, losses = model(x.to(rt.device), y, reduction="none")  # (B*T,)
        nbytes = text_bytes[y]
        nats += torch.stack([losses.sum(), (losses * (nbytes > 0)).sum()]).float()  # a mask: no sync
        counts[0] += y.numel()
        counts[1] += nbytes.sum()
    if rt.distributed:
        dist.all_reduce(nats)
        dist.all_reduce(counts)
    return (nats[0] / counts[0]).item(), (nats[1] / (math.log(2) * counts[1])).item()


@torch.no_grad()
def sample_texts(model, seed, rt, n=4, length=32):
    """n continuations of the same prompt. Every rank samples the same tokens (its own seeded generator, so
    training's RNG is untouched). Decoding changes shapes every token: KV-cached and eager, also where the
    model's regions are compiled (FSDP)."""
    enc = get_encoding()
    gen = torch.Generator(rt.device).manual_seed(seed)
    prompt = torch.tensor([enc.encode("Hello, I'm a language model,")] * n, device=rt.device)
    with autocast(rt.device, rt.dtype), torch.compiler.set_stance("force_eager"):
        out = model.generate(prompt, length - prompt.size(1), top_k=50, generator=gen)
    return [enc.decode(row.tolist()) for row in out]


def evaluate(step, eval_model, raw_model, val_loader, examples, cfg, rt, path):
    """Validation loss and bits per byte, HellaSwag (given examples) and samples: printed and logged."""
    eval_model.eval()
    at = os.path.basename(cfg["init_from"]) if cfg["eval_only"] else f"step {step}"  # eval_only: no steps
    val_loss, val_bpb = validation_loss(eval_model, val_loader, cfg["val_steps"], rt)
    print0(f"{at}: val loss {val_loss:.4f} | val bpb {val_bpb:.4f}")
    log(path, {"step": step, "val_loss": val_loss, "val_bpb": val_bpb})
    if examples is not None:  # through the compiled model: fixed batch shapes, few lengths
        per_forward = max(1, cfg["B"] * cfg["T"] // 384)  # rows of <= 336 tokens: about a micro-batch
        hs = hellaswag_eval(eval_model, examples, rt.device, per_forward, rt.rank, rt.world_size,
                            dtype=rt.dtype)
        print0(f"{at}: hellaswag acc_norm {hs['acc_norm']:.4f} ({hs['n']} examples)")
        log(path, {"step": step, "hellaswag": hs["acc_norm"], "hellaswag_acc": hs["acc"],
                   "hellaswag_n": hs["n"]})
    samples = sample_texts(raw_model, cfg["seed"], rt)
    for s in samples:
        print0(f"sample: {s!r}")
    log(path, {"step": step, "samples": samples})
    eval_model.train()


# ------------------------------------------------------------------------------------------------------------

def main(argv):
    """Train (or with eval_only, evaluate) as the settings and argv say; returns the process's exit status."""
    overrides = parse_overrides(argv, CONFIG)
    cfg, overrides = apply_presets({**CONFIG, **overrides}, overrides)

    # -------------------------------------------------------------------------------------- processes, device
    rt = runtime.processes(cfg["device"], cfg["dtype"])
    cfg, notes = apply_fallbacks(cfg, overrides, rt)
    notes += validate(cfg, rt)
    notes += runtime.start(rt, cfg["compile"])  # process group, this rank's GPU, TF32, whether compile works
    cfg["compile"] = rt.compile
    for note in notes:
        print0(f"NOTE: {note}")
    hold_log_dir(cfg["log_dir"], rt)  # one run at a time per log_dir
    metrics = os.path.join(cfg["log_dir"], "metrics.jsonl")
    cfg, resume = find_resume(cfg, overrides, rt, metrics)  # None, or the run in log_dir to continue
    if resume is not None and resume.finished:
        return 0

    # --------------------------------------------------------------------------------- model, data, optimizer
    torch.manual_seed(cfg["seed"])  # the same initial weights on every rank
    raw_model = build_model(cfg, resume).to(rt.device)
    cfg, more = fit_memory(cfg, overrides, raw_model.config, rt)  # a B the GPU holds, found before compiling
    for note in more:
        print0(f"NOTE: {note}")
    notes += more
    grad_accum_steps = cfg["total_batch_size"] // (cfg["B"] * cfg["T"] * rt.world_size)  # micro-steps a step
    train_loader, val_loader, examples = load_data(cfg, rt)
    train_model, eval_model, grad_sync = wrap_model(raw_model, cfg, rt)
    optimizers, peak_lrs = zip(*make_optimizers(raw_model, cfg, rt.kind))
    # fp16 overflows where bf16 does not: the loss is scaled up before backward and the gradients unscaled
    # before clipping; a step whose gradients overflowed is skipped and the scale lowered. Otherwise a no-op.
    scaler = torch.amp.GradScaler(rt.kind, init_scale=cfg["loss_scale"], enabled=rt.dtype == "fp16")
    step = resume.restore(raw_model, optimizers, scaler, train_loader, rt) if resume else 0
    log_start(cfg, rt, step, raw_model, train_loader, optimizers, notes, grad_accum_steps, metrics)
    if cfg["eval_only"]:  # init_from's model, evaluated and logged; no training, no checkpoint
        evaluate(step, eval_model, raw_model, val_loader, examples, cfg, rt, metrics)
        return 0

    # ---------------------------------------------------------------------------------------- training loop
    stop_signal = catch_stop_signals()
    peak = peak_flops(torch.cuda.get_device_name(rt.device), rt.dtype) if rt.kind == "cuda" else None
    last_checkpoint = f"{os.path.basename(resume.path)} (step {step})" if resume else "none yet"
    train_model.train()
    with out_of_memory_hint(cfg, rt, raw_model.config):  # one line naming a smaller B, no traceback per rank
        while step < cfg["max_steps"]:
            t0 = time.time()
            for opt in optimizers:
                opt.zero_grad(set_to_none=True)
            loss_accum = torch.zeros((), device=rt.device)
            for micro_step in range(grad_accum_steps):
                x, y = train_loader.next_batch()
                x, y = x.to(rt.device, non_blocking=True), y.to(rt.device, non_blocking=True)
                with grad_sync(micro_step == grad_accum_steps - 1):  # gradients cross ranks on the last only
                    with autocast(rt.device, rt.dtype):
                        _, loss = train_model(x, y)
                    loss = loss / grad_accum_steps  # the mean over the whole batch, not a sum of means
                    loss_accum += loss.detach()
                    scaler.scale(loss).backward()
            stop = torch.tensor([float(stop_signal[0])], device=rt.device)
            if rt.distributed:
                dist.all_reduce(loss_accum)
                loss_accum /= rt.world_size
                dist.all_reduce(stop, op=dist.ReduceOp.MAX)  # every rank stops at the same step
            for opt in optimizers:
                scaler.unscale_(opt)  # fp16: clip the true gradients, not the scaled ones
            norm = torch.nn.utils.clip_grad_norm_(raw_model.parameters(), cfg["grad_clip"])  # FSDP: all ranks
            norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm  # FSDP: a replicated DTensor
            loss_v, norm_v, stop = loss_accum.item(), norm.item(), int(stop.item())  # CPU-GPU sync point
            # fp16: gradients that overflowed under the loss scale are the scaler's to handle (it skips
            # the update and lowers the scale), not a diverged run; a non-finite loss (or norm without
            # fp16) stops it
            skipped = scaler.is_enabled() and math.isfinite(loss_v) and not math.isfinite(norm_v)
            if not skipped and not (math.isfinite(loss_v) and math.isfinite(norm_v)):
                return diverged(step + 1, loss_v, norm_v, last_checkpoint, metrics)
            lr = get_lr(step, cfg)
            for opt, peaks in zip(optimizers, peak_lrs):  # each parameter group from its own peak
                for group, group_peak in zip(opt.param_groups, peaks):
                    group["lr"] = get_lr(step, cfg, group_peak)
            scale = scaler.get_scale() if scaler.is_enabled() else None
            if not skipped:  # fp16 overflow: no optimizer steps (the scaler skips only the one that saw it)
                for opt in optimizers:
                    scaler.step(opt)
            scaler.update()  # fp16: lowers the scale after an overflow
            synchronize(rt.device)  # wait for the GPU before reading the clock
            dt = time.time() - t0
            step += 1
            tok_s = cfg["total_batch_size"] / dt
            util = mfu(raw_model.config, tok_s / rt.world_size, peak, cfg["T"])
            print0(f"step {step:5d}/{cfg['max_steps']} | loss {loss_v:.6f} | lr {lr:.4e} | norm {norm_v:.4f} "
                   f"| {dt * 1000:.2f} ms | {tok_s:,.0f} tok/s"
                   + ("" if util is None else f" | MFU {util:.1%}")  # no peak known (CPU, an unlisted GPU)
                   + (f" | skipped: fp16 gradients overflowed at loss scale {scale:g}" if skipped else ""))
            log(metrics, {"step": step, "loss": loss_v, "lr": lr, "grad_norm": norm_v, "ms": dt * 1000,
                          "tok_s": tok_s, "mfu": util}
                         | ({"loss_scale": scale, "skipped": skipped} if scale else {}))
            last = step == cfg["max_steps"]
            if (step % cfg["eval_interval"] == 0 and not stop) or last:  # a stop writes its checkpoint first
                evaluate(step, eval_model, raw_model, val_loader, examples, cfg, rt, metrics)
            if step % cfg["checkpoint_interval"] == 0 or last or stop:
                last_checkpoint = save_run(cfg, rt, step, raw_model, optimizers, scaler, train_loader)
            if stop:  # not a finish: scripts and schedulers see 128 + signal (143 SIGTERM, 130 SIGINT)
                print0(f"stopped by {signal.Signals(stop).name} after step {step}; rerun the same command to "
                       f"resume")
                return 128 + stop
    return 0


if __name__ == "__main__":
    try:
        status = main(sys.argv[1:])
    except SystemExit as e:  # an expected mistake, the same on every rank: said once per node, not per rank
        if not isinstance(e.code, str):  # --help
            raise
        if os.environ.get("LOCAL_RANK", "0") == "0":
            print(e.code, file=sys.stderr)
        runtime.exit_process(1, wait=False)
    runtime.exit_process(status)  # every rank returns at the same step
