"""Train GPT-2 (124M) from scratch: one GPU, eight, several nodes, or a laptop CPU.

    python train_gpt2.py                                        # 1 process (on a CPU: a small model on input.txt)
    torchrun --standalone --nproc_per_node=8 train_gpt2.py      # 8 GPUs, one node
    torchrun --nnodes=2 --nproc_per_node=8 --rdzv_backend=c10d --rdzv_endpoint=HOST:29500 train_gpt2.py  # each node
    python train_gpt2.py --max_steps=100 --B=32 --compile=False # any setting below, as --name=value

Prepare the data first with `python fineweb.py` (FineWeb-Edu, ~10B tokens). Without it the script trains
on input.txt and says so. A rerun with the same log_dir continues from its latest checkpoint.
"""
import collections
import contextlib
import dataclasses
import difflib
import json
import math
import os
import platform
import signal
import socket
import subprocess
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from checkpoint import CheckpointError, checkpoints, gather_state, load_state, newest_valid, save_checkpoint
from dataloader import DataLoaderLite
from hellaswag import evaluate as hellaswag_eval, load_examples
from model import (GPT, GPT2_SIZES, GPTConfig, autocast, device_name, load_model, mfu, peak_flops, pick_device,
                   resolve_dtype, synchronize, training_memory)
from tokenizer import get_encoding, token_bytes

# ------------------------------------------------------------------------------------------------------------
# configuration: the GPT-2 124M recipe (edit here, or override any name on the command line as --name=value)
data_root = "edu_fineweb10B"  # token shards from fineweb.py, or a text file such as input.txt
total_batch_size = 524288  # tokens per optimizer step, over all GPUs and micro-steps (2**19, ~0.5M as GPT-3 small)
B = 64  # micro-batch per GPU; lower it if memory runs out (gradient accumulation keeps total_batch_size)
T = 1024  # sequence length
block_size = 1024  # the model's maximum sequence length (position embeddings)
vocab_size = 50304  # GPT-2's 50,257 tokens padded to a multiple of 128: faster matmuls, never sampled
size = ""  # 124M, 350M, 774M or 1558M: sets n_layer, n_head, n_kv_head, n_embd and max_lr below (--name=value wins)
n_layer = 12
n_head = 12
n_kv_head = 12  # key/value heads: = n_head for GPT-2; 1 for multi-query, a divisor of n_head for grouped-query
n_embd = 768
max_lr = 6e-4  # peak learning rate (GPT-3 small's)
min_lr_ratio = 0.1  # the cosine decays to max_lr * min_lr_ratio
warmup_steps = 715  # linear warmup: 375M tokens, as GPT-3
max_steps = 19073  # 19,073 x 524,288 tokens = 10B tokens: one epoch of edu_fineweb10B
weight_decay = 0.1
optimizer = "adamw"  # adamw (GPT-2's recipe) or muon: torch.optim.Muon for the blocks' matrices, AdamW for the rest
muon_lr = 0.01  # optimizer=muon: the Muon matrices' peak learning rate (max_lr stays the AdamW parameters')
grad_clip = 1.0  # global gradient-norm clipping
shuffle = False  # shuffle shard and window order (seeded, the same on every rank, new each epoch)
eval_interval = 250  # steps between validation loss, HellaSwag and samples (and always after the last step)
val_steps = 20  # micro-batches of validation loss per rank and eval
hellaswag = 10042  # HellaSwag examples per eval (the validation split has 10,042; 0 = skip)
hellaswag_data = ""  # hellaswag_val.jsonl or a save_to_disk folder; "" = download once into hellaswag_data/
checkpoint_interval = 5000  # steps between checkpoints (and always after the last step, or on SIGTERM)
keep_checkpoints = 2  # the newest K checkpoints are kept
init_from = "scratch"  # scratch | resume (the default if log_dir has a checkpoint) | gpt2, gpt2-medium, gpt2-large,
# gpt2-xl (OpenAI's weights) | an HF GPT-2 folder | a model_*.pt: start from those weights, with a fresh optimizer
eval_only = False  # evaluate init_from's model (val loss and bpb, HellaSwag, samples) into log_dir; train nothing
compile = True  # torch.compile the model: ~2x faster steps after a minute of compiling
fsdp = False  # shard parameters, gradients and AdamW states over the ranks (FSDP2): models past one GPU's memory
grad_checkpoint = False  # recompute activations in backward: less memory, ~1/3 more compute
device = "auto"  # auto (cuda, then mps, then cpu), cuda, mps or cpu
dtype = "auto"  # auto: bf16 where the GPU has it, else fp16 with loss scaling on CUDA, else fp32; or bf16/fp16/fp32
loss_scale = 65536.0  # fp16 only: the first loss scale (lowered after an overflow, raised after 2000 clean steps)
log_dir = "log"
seed = 1337
# ------------------------------------------------------------------------------------------------------------
CONFIG = {k: v for k, v in dict(globals()).items() if not k.startswith("_") and type(v) in (int, float, str, bool)}

PEAK_LR = {"124M": 6e-4, "350M": 3e-4, "774M": 2.5e-4, "1558M": 2e-4}  # GPT-3's table, for models of those sizes
SIZES = {name: {**shape, "n_kv_head": shape["n_head"], "max_lr": PEAK_LR[name]} for name, shape in GPT2_SIZES.items()}
FINEWEB_DIR = "edu_fineweb10B"  # the shipped data_root: only this one falls back to input.txt when missing
SHAKESPEARE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "input.txt")
SHAKESPEARE_CONFIG = dict(  # input.txt is ~300k tokens: small steps (its 10% val split must hold one)
    B=8, T=256, max_steps=300, warmup_steps=30, eval_interval=100, checkpoint_interval=300)
CPU_CONFIG = dict(  # without a GPU: a model and schedule that train on 2 cores in a few minutes
    B=8, T=128, n_layer=4, n_head=4, n_kv_head=4, n_embd=64, max_lr=3e-3, warmup_steps=20, max_steps=150,
    eval_interval=50, val_steps=8, hellaswag=0, checkpoint_interval=50, compile=False)


def parse_overrides(argv, defaults):
    """--name=value pairs, each checked against the configuration's names and converted to its type."""
    overrides = {}
    for arg in argv:
        if not arg.startswith("--") or "=" not in arg:
            raise SystemExit(f"error: expected --name=value, got {arg!r}")
        key, value = arg[2:].split("=", 1)
        if key not in defaults:
            close = difflib.get_close_matches(key, defaults, n=1)
            raise SystemExit(f"error: unknown setting {key!r}" + (f"; did you mean --{close[0]}?" if close else ""))
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
            raise SystemExit(f"error: --{key}={value!r} is not a {kind.__name__} (default: {defaults[key]!r})") from None
    return overrides


def apply_size(cfg, overrides):
    """(cfg, overrides) with the size preset's settings, except those given on the command line. A preset
    chosen on the command line counts as its settings given there (the CPU fallback keeps them)."""
    if not cfg["size"]:
        return cfg, overrides
    if cfg["size"] not in SIZES:
        raise SystemExit(f"error: --size={cfg['size']!r}: use one of {', '.join(SIZES)}, or \"\" for the settings "
                         f"n_layer, n_head, n_kv_head, n_embd and max_lr as they are")
    preset = {k: v for k, v in SIZES[cfg["size"]].items() if k not in overrides}
    return {**cfg, **preset}, ({**overrides, **preset} if "size" in overrides else overrides)


def compile_probe(device):
    """None if torch.compile's default backend works on this device, else why not. Inductor needs triton on a
    GPU and a C++ compiler on a CPU; finding out costs a few seconds here, not minutes into a run."""
    try:
        probe = torch.compile(lambda x: (x * 2).sin().sum())
        probe(torch.ones(8, device=device)).item()
        return None
    except Exception as e:  # whatever the backend raises: no triton, no compiler, an unsupported GPU
        return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
    finally:
        torch._dynamo.reset()


def runtime(cfg, kind, local_rank):
    """The device-dependent choices, made once: (device, compile, notes). kind is pick_device's (cuda, mps or
    cpu), the compute dtype resolve_dtype's (fp16 brings loss scaling). device: cuda:<local rank> or kind;
    compile: cfg's, unless the device cannot (Apple GPUs: not
    supported; elsewhere: compile_probe). TF32 matmuls and fused AdamW follow from the device: CUDA only."""
    dev = f"cuda:{local_rank}" if kind == "cuda" else kind
    if kind == "cuda":
        torch.cuda.set_device(dev)
        torch.set_float32_matmul_precision("high")  # TF32 matmuls on Ampere and later
    notes, use_compile = [], cfg["compile"]
    if use_compile and kind == "mps":
        notes.append("compile=True: torch.compile is not used on Apple GPUs (mps); running eager")
        use_compile = False
    elif use_compile:
        why = compile_probe(dev)
        if why:
            notes.append(f"compile=True but torch.compile does not work here ({why}); running eager. Install "
                         f"triton (GPU) or a C++ compiler (CPU), or set --compile=False to skip this check")
            use_compile = False
    return dev, use_compile, notes


def wrap_model(raw_model, cfg, distributed, device_ids):
    """(train_model, eval_model, grad_sync), decided once: how this rank runs the model.

    One process: the model itself. DDP: every rank holds the whole model and its optimizer; gradients are
    all-reduced in buckets during backward. FSDP2 (fsdp=True): each Block, then the root (wte = lm_head, wpe,
    ln_f: the weight tying survives), is sharded over the ranks; parameters are all-gathered for each forward
    and backward, gradients reduce-scattered, so each rank keeps 1/world of the parameters, gradients and AdamW
    states. Every rank must then run every forward, evaluation included.
    compile: DDP goes inside torch.compile (PyTorch's advice): the graph is split at DDP's gradient buckets, so
    each bucket's all-reduce overlaps the rest of the backward pass. Evaluation runs on each rank's own
    batches, through the model without DDP.
    grad_sync(last) is the context a micro-step runs in: gradients cross ranks only on the last one."""
    maybe_compile = torch.compile if cfg["compile"] else (lambda m: m)
    if cfg["fsdp"]:
        from torch.distributed.fsdp import fully_shard
        for block in raw_model.transformer.h:
            fully_shard(block)
        fully_shard(raw_model)  # in place: raw_model is now the sharded model

        def grad_sync(last):
            raw_model.set_requires_gradient_sync(last)
            return contextlib.nullcontext()
        model = maybe_compile(raw_model)
        return model, model, grad_sync
    if distributed:
        ddp_model = DDP(raw_model, device_ids=device_ids)
        return (maybe_compile(ddp_model), maybe_compile(raw_model),
                lambda last: contextlib.nullcontext() if last else ddp_model.no_sync())
    return maybe_compile(raw_model), maybe_compile(raw_model), lambda last: contextlib.nullcontext()


def make_optimizers(raw_model, cfg, kind):
    """[(optimizer, its peak learning rate)], decided once. adamw: one AdamW (fused on CUDA). muon: Muon for the
    blocks' weight matrices at muon_lr, AdamW for embeddings, biases and LayerNorm at max_lr; both follow the
    same warmup and cosine. Every optimizer is stepped, unscaled (fp16) and checkpointed alike."""
    if cfg["optimizer"] == "adamw":
        return [(raw_model.configure_optimizers(cfg["weight_decay"], cfg["max_lr"], kind), cfg["max_lr"])]
    muon, adamw = raw_model.configure_muon(cfg["weight_decay"], cfg["max_lr"], cfg["muon_lr"], kind)
    return [(muon, cfg["muon_lr"]), (adamw, cfg["max_lr"])]


def apply_fallbacks(cfg, overrides, use_cuda, world_size):
    """(cfg, notes): without shards at the shipped data_root, train on input.txt; without a GPU, a small model.
    Both with settings to match, except those given on the command line; one step is then 2 micro-batches."""
    small, notes = {}, []
    if cfg["data_root"] == FINEWEB_DIR and not os.path.exists(FINEWEB_DIR):
        notes.append(f"no shards in {FINEWEB_DIR}/ (run `python fineweb.py` to make them): training on input.txt")
        small.update(SHAKESPEARE_CONFIG, data_root=SHAKESPEARE)
    elif not os.path.exists(cfg["data_root"]):
        raise SystemExit(f"error: data_root {cfg['data_root']} does not exist: make shards with `python fineweb.py "
                         f"--out_dir {cfg['data_root']}` or point --data_root at a text file")
    if not use_cuda:
        notes.append("no CUDA device: training a small model with a small batch on the CPU (settings given on the "
                     "command line are kept)")
        small.update(CPU_CONFIG)
    cfg = {**cfg, **{k: v for k, v in small.items() if k not in overrides}}
    if small and "total_batch_size" not in overrides:
        cfg["total_batch_size"] = cfg["B"] * cfg["T"] * world_size * 2
    return cfg, notes


def get_lr(step, cfg, peak=None):
    """Linear warmup to the peak (max_lr unless given), then a cosine down to peak * min_lr_ratio at max_steps."""
    max_lr = cfg["max_lr"] if peak is None else peak
    min_lr = max_lr * cfg["min_lr_ratio"]
    if step < cfg["warmup_steps"]:
        return max_lr * (step + 1) / cfg["warmup_steps"]
    if step >= cfg["max_steps"]:
        return min_lr
    ratio = (step - cfg["warmup_steps"]) / max(1, cfg["max_steps"] - cfg["warmup_steps"])
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (max_lr - min_lr)


def broadcast_object(obj):
    """Rank 0's obj on every rank (a small picklable object)."""
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def git_state():
    """(commit, dirty) of the code that runs: HEAD, and whether tracked files differ from it; (None, None)
    outside a git checkout."""
    def git(*args):
        return subprocess.run(["git", *args], cwd=os.path.dirname(os.path.abspath(__file__)), capture_output=True,
                              text=True, timeout=10, check=True).stdout.strip()
    try:
        return git("rev-parse", "HEAD"), bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return None, None


def run_info(dev, dtype, cfg, optimizers, distributed):
    """What ran this run, for the first record of its log (two logs can be compared later: plot.py --baseline):
    versions, the devices of all ranks, the code's commit, and the choices made at start-up. Every rank must
    call it (it gathers the device names)."""
    me = [(socket.gethostname(), device_name(dev))]
    if distributed:
        everyone = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, me[0])
        me = everyone
    commit, dirty = git_state()
    return {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version(), "devices": dict(collections.Counter(name for _, name in me)),
            "hosts": len({host for host, _ in me}), "git_commit": commit, "git_dirty": dirty,
            "backend": dist.get_backend() if distributed else None, "dtype": dtype, "compile": cfg["compile"],
            "tf32": dev.startswith("cuda") and torch.backends.cuda.matmul.allow_tf32,
            "fused_adamw": any(isinstance(o, torch.optim.AdamW) and bool(o.defaults["fused"]) for o in optimizers)}


# A resume continues the run in log_dir. These settings cannot change under it: the model's shape, and the
# data stream (B and the number of processes may change: the loader continues at the same row).
SHAPE = ("n_layer", "n_head", "n_kv_head", "n_embd", "block_size", "vocab_size")
STREAM = ("T", "total_batch_size", "data_root", "shuffle", "seed")
FIXED = SHAPE + STREAM + ("optimizer",)  # and the optimizer: its saved state is another optimizer's


def resume_settings(saved, cfg, saved_world, world_size, log_dir):
    """(cfg, notes) for continuing a run saved with settings `saved` by saved_world processes. A change of
    model shape or data stream ends here with one message listing every difference and the two ways out;
    other changes are applied and noted."""
    saved = {"optimizer": "adamw", **saved}  # checkpoints from before the setting are AdamW's
    fixed = [k for k in FIXED if saved.get(k, cfg[k]) != cfg[k]]
    if fixed:
        raise SystemExit(f"error: the run in {log_dir} has "
                         + ", ".join(f"{k}={saved[k]!r} (now {cfg[k]!r})" for k in fixed)
                         + f", which a resume cannot change: restore {'them' if len(fixed) > 1 else 'it'} ("
                         + " ".join(f"--{k}={saved[k]}" for k in fixed) + ") to continue that run, or start a new "
                         "one with --log_dir=NEW")
    cfg, notes = dict(cfg), []
    rows, saved_rows = cfg["B"] * world_size, saved["B"] * saved_world  # rows of T tokens per micro-step
    if rows != saved_rows and cfg["val_steps"] == saved["val_steps"] and saved["val_steps"] * saved_rows % rows == 0:
        cfg["val_steps"] = saved["val_steps"] * saved_rows // rows  # validate on the same rows as before
    for k in cfg:
        if k not in ("init_from",) and k in saved and saved[k] != cfg[k]:
            notes.append(f"{k} changed since the checkpoint: {saved[k]!r} -> {cfg[k]!r}")
    if saved_world != world_size:
        notes.append(f"processes changed since the checkpoint: {saved_world} -> {world_size}")
    return cfg, notes


def truncate_log(path, step):
    """Drop the records after `step` from a metrics.jsonl (those of an attempt that died before its next
    checkpoint), and a half-written last line, so the log holds one record per step: the resumed run's."""
    if not os.path.exists(path):
        return 0
    keep, dropped = [], 0
    with open(path) as f:
        for line in f:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                dropped += 1
                continue
            if record.get("step", 0) > step:
                dropped += 1
            else:
                keep.append(line if line.endswith("\n") else line + "\n")
    if dropped:
        with open(path + ".tmp", "w") as f:
            f.writelines(keep)
        os.replace(path + ".tmp", path)
    return dropped


def main(argv):
    overrides = parse_overrides(argv, CONFIG)
    cfg, overrides = apply_size({**CONFIG, **overrides}, overrides)

    # ---------------------------------------------------------------------------------------------- processes
    ddp = "RANK" in os.environ  # launched by torchrun
    rank, local_rank, world_size = (int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]),
                                    int(os.environ["WORLD_SIZE"])) if ddp else (0, 0, 1)
    master = rank == 0

    def print0(*args):
        if master:
            print(*args, flush=True)

    try:
        kind = pick_device(cfg["device"])
        dtype = resolve_dtype(cfg["dtype"], kind)  # a bad --device or --dtype fails here, before any process group
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    use_cuda = kind == "cuda"
    if cfg["optimizer"] not in ("adamw", "muon"):
        raise SystemExit(f"error: --optimizer={cfg['optimizer']!r}: use adamw or muon")
    if cfg["optimizer"] == "muon" and cfg["fsdp"]:
        raise SystemExit("error: --optimizer=muon does not work with --fsdp=True: Muon orthogonalizes each whole "
                         "weight matrix and FSDP2 gives each rank a shard of it; drop --fsdp (DDP) or use "
                         "--optimizer=adamw")
    if cfg["eval_only"] and cfg["init_from"] in ("scratch", "resume"):
        raise SystemExit("error: --eval_only=True evaluates given weights: set --init_from to gpt2 (or gpt2-medium, "
                         "gpt2-large, gpt2-xl), an HF GPT-2 folder or a model_*.pt checkpoint")
    if cfg["fsdp"] and not ddp:
        raise SystemExit("error: --fsdp=True shards the model over the processes torchrun starts: run it as "
                         "`torchrun --nproc_per_node=N train_gpt2.py --fsdp=True`")
    if ddp:  # NCCL between GPUs, gloo between CPU processes (and Apple GPUs)
        dist.init_process_group("nccl" if use_cuda else "gloo")

    cfg, fallbacks = apply_fallbacks(cfg, overrides, use_cuda, world_size)
    dev, cfg["compile"], notes = runtime(cfg, kind, local_rank)
    if ddp:  # every rank runs the same way: compiled only if it works everywhere
        everywhere = [None] * world_size
        dist.all_gather_object(everywhere, cfg["compile"])
        cfg["compile"] = all(everywhere)
    fallbacks += notes
    for f in fallbacks:
        print0(f"NOTE: {f}")

    # ---------------------------------------------------------------------------------------------- derived values
    for key in ("B", "T", "total_batch_size", "max_steps", "eval_interval", "val_steps", "checkpoint_interval",
                "keep_checkpoints"):
        if cfg[key] < 1:
            raise SystemExit(f"error: --{key}={cfg[key]} must be at least 1")
    B, T = cfg["B"], cfg["T"]
    if T > cfg["block_size"]:
        raise SystemExit(f"error: T={T} exceeds block_size={cfg['block_size']}: lower T or raise block_size")
    tokens_per_micro_step = B * T * world_size
    if cfg["total_batch_size"] % tokens_per_micro_step:
        raise SystemExit(f"error: total_batch_size={cfg['total_batch_size']} is not a multiple of B*T*world_size = "
                         f"{B}*{T}*{world_size} = {tokens_per_micro_step}: change B, T or total_batch_size")
    grad_accum_steps = cfg["total_batch_size"] // tokens_per_micro_step
    metrics_path = os.path.join(cfg["log_dir"], "metrics.jsonl")

    # ---------------------------------------------------------------------------------------------- resume
    existing = checkpoints(cfg["log_dir"])
    if cfg["eval_only"] and existing:
        raise SystemExit(f"error: {cfg['log_dir']} holds a training run's checkpoints: give --eval_only=True a log_dir "
                         f"of its own (--log_dir=NEW)")
    if cfg["init_from"] == "scratch" and existing:
        if "init_from" in overrides:
            raise SystemExit(f"error: {cfg['log_dir']} holds checkpoints of an earlier run; --init_from=resume "
                             f"continues it, or choose another --log_dir")
        cfg["init_from"] = "resume"
    ckpt, meta = None, None  # the checkpoint (rank 0 only: it broadcasts) and what every rank needs of it
    if cfg["init_from"] == "resume":
        if not existing:
            raise SystemExit(f"error: --init_from=resume but {cfg['log_dir']} holds no checkpoint (model_*.pt)")
        if master:  # rank 0 reads and verifies; the others get the verdict, and the weights in load_state()
            try:
                ckpt_path, ckpt = newest_valid(cfg["log_dir"], print0)
                meta = {k: v for k, v in ckpt.items() if k not in ("model", "optimizer")} | {"path": ckpt_path}
            except CheckpointError as e:
                meta = {"error": str(e)}
        if ddp:
            meta = broadcast_object(meta)
        if "error" in meta:
            raise SystemExit(f"error: {meta['error']}")
        cfg, changes = resume_settings(meta["config"], cfg, meta["world_size"], world_size, cfg["log_dir"])
        if meta["step"] >= cfg["max_steps"]:
            print0(f"the run in {cfg['log_dir']} is already finished at step {meta['step']} (max_steps="
                   f"{cfg['max_steps']}): nothing to do. Raise --max_steps to train further, or --log_dir=NEW")
            if ddp:
                dist.destroy_process_group()
            return
        print0(f"resuming from {meta['path']} (step {meta['step']}; --log_dir=NEW starts afresh)")
        if meta["checksum"] is None:
            print0(f"NOTE: {meta['path']} was written before checkpoints carried a checksum: loaded unverified")
        for c in changes:
            print0(f"NOTE: {c}")
        if master:
            dropped = truncate_log(metrics_path, meta["step"])
            if dropped:
                print0(f"NOTE: dropped {dropped} records after step {meta['step']} from {metrics_path} (the "
                       f"interrupted attempt's, redone now)")

    # ---------------------------------------------------------------------------------------------- model
    torch.manual_seed(cfg["seed"])  # the same initial weights on every rank
    try:  # expected mistakes (a bad model name or shape, missing data) end in one line
        if meta is not None:
            model_config = GPTConfig(**{**meta["model_config"], "grad_checkpoint": cfg["grad_checkpoint"]})
            raw_model = GPT(model_config)
        elif cfg["init_from"] == "scratch":
            model_config = GPTConfig(block_size=cfg["block_size"], vocab_size=cfg["vocab_size"],
                                     n_layer=cfg["n_layer"], n_head=cfg["n_head"], n_kv_head=cfg["n_kv_head"],
                                     n_embd=cfg["n_embd"], grad_checkpoint=cfg["grad_checkpoint"])
            raw_model = GPT(model_config)
        else:  # an OpenAI name, an HF folder or a checkpoint file: its weights, a fresh optimizer
            raw_model = load_model(cfg["init_from"])
            model_config = dataclasses.replace(raw_model.config, grad_checkpoint=cfg["grad_checkpoint"])
            raw_model.config = model_config
        train_loader = DataLoaderLite(B, T, rank, world_size, "train", cfg["data_root"], cfg["shuffle"], cfg["seed"])
        val_loader = DataLoaderLite(B, T, rank, world_size, "val", cfg["data_root"])
        if meta is not None:
            train_loader.load_state_dict(meta["dataloader"])
        examples = load_examples(cfg["hellaswag_data"] or None, cfg["hellaswag"]) if cfg["hellaswag"] > 0 else None
        enc = get_encoding()
    except (OSError, ValueError) as e:
        raise SystemExit(f"error: {e}") from None
    raw_model.to(dev)
    train_model, model, grad_sync = wrap_model(raw_model, cfg, ddp, [local_rank] if use_cuda else None)
    optimizers, peak_lrs = zip(*make_optimizers(raw_model, cfg, kind))
    # fp16 overflows where bf16 does not: the loss is scaled up before backward and the gradients unscaled
    # before clipping; a step whose gradients overflowed is skipped and the scale lowered. Otherwise a no-op.
    scaler = torch.amp.GradScaler(kind, init_scale=cfg["loss_scale"], enabled=dtype == "fp16")
    peak = peak_flops(torch.cuda.get_device_name(dev)) if use_cuda else None

    step = 0
    if meta is not None:
        groups = [group for opt in optimizers for group in opt.param_groups]
        decay = [group["weight_decay"] for group in groups]
        load_state(raw_model, optimizers, ckpt, ddp)  # rank 0's checkpoint into every rank's (shard of the) model
        for group, wd in zip(groups, decay):  # the saved groups bring the old weight decay
            group["weight_decay"] = wd
        if scaler.is_enabled() and meta.get("scaler"):  # fp16: continue with the loss scale it had reached
            scaler.load_state_dict(meta["scaler"])
        torch.set_rng_state(meta["rng"]["cpu"])
        if use_cuda and meta["rng"]["cuda"] is not None:
            torch.cuda.set_rng_state(meta["rng"]["cuda"])
        step = meta["step"]
        del ckpt  # its tensors are copied into the model and optimizer

    # ---------------------------------------------------------------------------------------------- logging
    os.makedirs(cfg["log_dir"], exist_ok=True)  # only now: a run refused above leaves no empty log_dir behind
    if cfg["eval_only"] and master and os.path.exists(metrics_path):
        os.remove(metrics_path)  # an earlier evaluation's log (a training run's has checkpoints: refused above)

    def log(record):
        if master:
            with open(metrics_path, "a") as f:  # appended: a resumed run continues the same log
                f.write(json.dumps(record) + "\n")

    shards = world_size if cfg["fsdp"] else 1
    mem = training_memory(model_config, B, T, dtype, shards)
    print0(f"config: {json.dumps(cfg)}")
    print0(f"model: {raw_model.num_params():,} parameters, {model_config}")
    print0(f"data: {cfg['data_root']}, {train_loader.tokens_total:,} train tokens, "
           f"{1 - train_loader.tokens_per_epoch / train_loader.tokens_total:.2%} skipped per epoch (shard tails)")
    print0(f"batch: {cfg['total_batch_size']:,} tokens = {B} x {T} x {world_size} processes x {grad_accum_steps} "
           f"accumulation steps; device {dev}; estimated training memory per process {mem['total'] / 2**30:.1f} GiB"
           + (f" (parameters, gradients and AdamW states sharded {shards} ways)" if cfg["fsdp"] else ""))
    log({"event": "start", "step": step, "config": cfg, "model_config": dataclasses.asdict(model_config),
         "world_size": world_size, "fallbacks": fallbacks, "time": time.time(),
         "run": run_info(dev, dtype, cfg, optimizers, ddp)})

    # ---------------------------------------------------------------------------------------------- faults
    stop_signal = [0]

    def request_stop(signum, frame):  # finish the current step, checkpoint, exit with 128 + signum
        stop_signal[0] = signum

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)

    def checkpoint():
        model_state, optimizer_state = gather_state(raw_model, optimizers)  # every rank: FSDP all-gathers
        if master:  # the loader's position is the same on every rank
            path = os.path.join(cfg["log_dir"], f"model_{step:06d}.pt")
            save_checkpoint({"model": model_state, "model_config": dataclasses.asdict(model_config),
                             "optimizer": optimizer_state, "step": step, "config": cfg,
                             "world_size": world_size, "dataloader": train_loader.state_dict(),
                             "scaler": scaler.state_dict(),
                             "rng": {"cpu": torch.get_rng_state(),
                                     "cuda": torch.cuda.get_rng_state(dev) if use_cuda else None}}, path)
            for old in checkpoints(cfg["log_dir"])[:-cfg["keep_checkpoints"]]:
                os.remove(old)
            print0(f"checkpoint: {path}")
        return f"model_{step:06d}.pt (step {step})"

    text_bytes = torch.tensor(token_bytes(enc, model_config.vocab_size), device=dev)  # (vocab,) bytes per token

    def evaluate():
        model.eval()
        with torch.no_grad():  # validation loss (nats per token) and bits per byte, summed over all ranks
            val_loader.reset()
            nats = torch.zeros(2, device=dev)  # all targets' losses; those of the targets that are text (bytes > 0)
            counts = torch.zeros(2, dtype=torch.long, device=dev)  # targets; their UTF-8 bytes
            for _ in range(cfg["val_steps"]):
                x, y = val_loader.next_batch()
                y = y.to(dev).view(-1)
                with autocast(dev, dtype):
                    _, losses = model(x.to(dev), y, reduction="none")  # (B*T,)
                nbytes = text_bytes[y]
                nats += torch.stack([losses.sum(), (losses * (nbytes > 0)).sum()]).float()  # a mask: no sync
                counts[0] += y.numel()
                counts[1] += nbytes.sum()
            if ddp:
                dist.all_reduce(nats)
                dist.all_reduce(counts)
            val_loss = (nats[0] / counts[0]).item()
            val_bpb = (nats[1] / (math.log(2) * counts[1])).item()  # byte-level: comparable across tokenizers
        print0(f"step {step}: val loss {val_loss:.4f} | val bpb {val_bpb:.4f}")
        log({"step": step, "val_loss": val_loss, "val_bpb": val_bpb})
        if examples is not None:  # through the compiled model: fixed batch shapes, few lengths
            per_forward = max(1, B * T // (4 * 192))  # 4 rows of <= 192 tokens an example: a micro-batch's tokens
            hs = hellaswag_eval(model, examples, dev, per_forward, rank, world_size, dtype=dtype)
            print0(f"step {step}: hellaswag acc_norm {hs['acc_norm']:.4f} ({hs['n']} examples)")
            log({"step": step, "hellaswag": hs["acc_norm"], "hellaswag_acc": hs["acc"], "hellaswag_n": hs["n"]})
        # every rank samples (under FSDP each forward is collective), the same tokens; rank 0 prints them.
        # Decoding changes shapes every token: the uncompiled module with its KV-cache
        gen = torch.Generator(dev).manual_seed(cfg["seed"])  # its own RNG: sampling leaves training's untouched
        prompt = torch.tensor([enc.encode("Hello, I'm a language model,")] * 4, device=dev)
        with autocast(dev, dtype):
            out = raw_model.generate(prompt, 32 - prompt.size(1), top_k=50, generator=gen)
        samples = [enc.decode(row.tolist()) for row in out]
        for s in samples:
            print0(f"sample: {s!r}")
        log({"step": step, "samples": samples})
        model.train()

    if cfg["eval_only"]:  # init_from's model, evaluated and logged; no training, no checkpoint
        evaluate()
        if ddp:
            dist.destroy_process_group()
        return

    # ---------------------------------------------------------------------------------------------- training loop
    model.train()
    last_checkpoint, stop = (f"{os.path.basename(meta['path'])} (step {step})" if meta else "none yet"), 0
    while step < cfg["max_steps"]:
        t0 = time.time()
        for opt in optimizers:
            opt.zero_grad(set_to_none=True)
        loss_accum = torch.zeros((), device=dev)
        for micro_step in range(grad_accum_steps):
            x, y = train_loader.next_batch()
            x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
            # gradients cross ranks only after the last micro-step; before it they just accumulate
            with grad_sync(micro_step == grad_accum_steps - 1):
                with autocast(dev, dtype):
                    _, loss = train_model(x, y)
                loss = loss / grad_accum_steps  # the mean over the whole batch, not a sum of means
                loss_accum += loss.detach()
                scaler.scale(loss).backward()
        stop = torch.tensor([float(stop_signal[0])], device=dev)
        if ddp:
            dist.all_reduce(loss_accum)
            loss_accum /= world_size
            dist.all_reduce(stop, op=dist.ReduceOp.MAX)  # every rank stops at the same step
        for opt in optimizers:
            scaler.unscale_(opt)  # fp16: clip the true gradients, not the scaled ones
        norm = torch.nn.utils.clip_grad_norm_(raw_model.parameters(), cfg["grad_clip"])  # FSDP: over all shards
        norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm  # FSDP: a replicated DTensor
        loss_v, norm_v, stop = loss_accum.item(), norm.item(), int(stop.item())  # CPU-GPU sync point
        # fp16: gradients that overflowed under the loss scale are the scaler's to handle (it skips the update
        # and lowers the scale), not a diverged run; a non-finite loss, or gradient norm without fp16, stops it
        skipped = scaler.is_enabled() and math.isfinite(loss_v) and not math.isfinite(norm_v)
        if not skipped and not (math.isfinite(loss_v) and math.isfinite(norm_v)):
            print0(f"error: non-finite loss {loss_v} or gradient norm {norm_v} at step {step + 1}: stopped before "
                   f"its update. The newest checkpoint is {last_checkpoint}; lower max_lr or check the data, then "
                   f"rerun to resume from the newest checkpoint that verifies")
            log({"step": step + 1, "event": "non-finite", "loss": loss_v, "grad_norm": norm_v})
            if ddp:
                dist.destroy_process_group()
            sys.exit(1)
        for opt, peak_lr in zip(optimizers, peak_lrs):
            for group in opt.param_groups:
                group["lr"] = get_lr(step, cfg, peak_lr)
        lr = get_lr(step, cfg)
        scale = scaler.get_scale() if scaler.is_enabled() else None
        if not skipped:  # fp16 overflow: no optimizer steps (the scaler alone would skip only the one it saw it in)
            for opt in optimizers:
                scaler.step(opt)  # opt.step(), unless fp16 gradients overflowed
        scaler.update()  # fp16: lowers the scale after an overflow
        synchronize(dev)  # wait for the GPU before reading the clock
        dt = time.time() - t0
        step += 1
        tok_s = cfg["total_batch_size"] / dt
        util = mfu(model_config, tok_s / world_size, peak, T)
        print0(f"step {step:5d}/{cfg['max_steps']} | loss {loss_v:.6f} | lr {lr:.4e} | norm "
               f"{norm_v:.4f} | {dt * 1000:.2f} ms | {tok_s:,.0f} tok/s | MFU "
               + ("n/a" if util is None else f"{util:.1%}")
               + (f" | skipped: fp16 gradients overflowed at loss scale {scale:g}" if skipped else ""))
        log({"step": step, "loss": loss_v, "lr": lr, "grad_norm": norm_v, "ms": dt * 1000,
             "tok_s": tok_s, "mfu": util} | ({"loss_scale": scale, "skipped": skipped} if scale else {}))
        last = step == cfg["max_steps"]
        if step % cfg["eval_interval"] == 0 or last:
            evaluate()
        if step % cfg["checkpoint_interval"] == 0 or last or stop:
            last_checkpoint = checkpoint()
        if stop:
            print0(f"stopped by signal {stop} after step {step}; rerun the same command to resume")
            break
    if ddp:
        dist.destroy_process_group()
    if stop:  # a stop is not a finish: shell scripts and schedulers see 128 + signal (143 SIGTERM, 130 SIGINT)
        sys.exit(128 + stop)


if __name__ == "__main__":
    main(sys.argv[1:])
