"""Train GPT-2 (124M) from scratch: one GPU, eight, several nodes, or a laptop CPU.

    python train_gpt2.py                                    # 1 process (on a CPU: a small model on input.txt)
    torchrun --standalone --nproc_per_node=8 train_gpt2.py  # 8 GPUs, one node
    python train_gpt2.py --max_steps=300 --log_dir=log_300  # any setting below, as --name=value
    torchrun --nnodes=2 --nproc_per_node=8 --rdzv_backend=c10d --rdzv_endpoint=HOST:29500 train_gpt2.py
                                                            # on each of 2 nodes (HOST: the first one)

Prepare the data first with `python fineweb.py` (FineWeb-Edu, ~10B tokens). Without it a plain `python` run
trains on input.txt and says so; under torchrun it stops in one line naming the folder it looked in.

What runs: the settings block, then a preset where one applies (a size, a recipe, input.txt's, the laptop's
without a GPU), then the command line. A rerun with the same log_dir resumes the run with its own settings and
what this command changes; --log_dir=NEW starts a fresh experiment (docs/training.md, "What runs").
"""
import contextlib
import dataclasses
import json
import math
import os
import signal
import sys
import time
from typing import NamedTuple

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import core_eval
from dataloader import DataLoaderLite
from gptlib import runtime, settings
from gptlib.accounting import memory_estimate, memory_said, mfu, micro_batches, peak_flops
from gptlib.checkpoint import load_model, remove_stale_writes, room_note, save_run
from gptlib.engine import Engine
from gptlib.errors import PeerFailed, RankError, UserError, main_guard, plural, say
from gptlib.optimizers import make_optimizers, role_peaks, set_lr
from gptlib.runlog import Clock, RunLog, duration, hold_log_dir, metrics_path
from gptlib.runtime import Runtime, autocast, catch_stop_signals, print0, sharded, synchronize, together
from gptlib.tokenizer import get_encoding, token_bytes
from hellaswag import evaluate as hellaswag_eval, load_examples, prepare as hellaswag_prepare
from model import GPT
from plot import write_report
from sample import sample

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
max_steps = 19073  # 19,073 x 524,288 = 10.0B tokens: edu_fineweb10B once (18,722 steps), then 351 more
weight_decay = 0.1  # AdamW's, on matrices only (not biases, LayerNorms)
optimizer = "adamw"  # adamw (GPT-2's recipe) or muon: Muon for the blocks' matrices, AdamW for the rest
muon_lr = 0.02  # optimizer=muon: the Muon matrices' peak learning rate, nanochat's (max_lr: the AdamW part's)
embed_lr = 0.0  # wte's own peak learning rate (AdamW) for a 768-wide model, x sqrt(768/n_embd); 0: max_lr
head_lr = 0.0  # the same for an untied lm_head
grad_clip = 1.0  # global gradient-norm clipping
shuffle = False  # shuffle shard and window order (seeded, the same on every rank, new each epoch)
eval_interval = 250  # steps between validation loss, HellaSwag and samples (and always after the last step)
log_interval = 10  # steps between console lines (and the first and last); metrics.jsonl holds every step
val_tokens = 20 * 524288  # validation tokens per eval: the split's first, whatever B or the number of GPUs
eval_B = 0  # micro-batch of evaluation (validation rows, HellaSwag's ~B*T tokens a forward); 0: B
hellaswag = 10042  # HellaSwag examples per eval (the validation split has 10,042; 0 = skip)
hellaswag_data = ""  # hellaswag_val.jsonl or a save_to_disk folder; "" = download once into hellaswag_data/
core = 0  # CORE examples per task per eval (22 tasks; nanochat: 500; 0 = skip), its score in metrics.jsonl
core_bundle = ""  # CORE's eval bundle folder (core.yaml, eval_meta_data.csv, eval_data/); "" = download once
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
CONFIG = {k: v for k, v in dict(globals()).items()  # the settings block: {name: default}
          if k not in _IMPORTED and not k.startswith("_") and type(v) in (int, float, str, bool)}
Settings = settings.settings_type(CONFIG)  # a run's settings, resolved once (settings.resolve): s.B, ...
SAMPLE_PROMPT = "Hello, I'm a language model,"  # 8 tokens; each evaluation samples 4 x 24 more


def main(argv=None):
    """Train (or with eval_only, evaluate) as the settings block and argv (default: the command line) say;
    returns the process's exit status."""
    # -------------------------------------- start-up: the processes, what runs, the run's state, decided once
    given = settings.parse_overrides(sys.argv[1:] if argv is None else argv, Settings, __file__)
    rt = runtime.setup(**settings.runtime_options(Settings, given))  # processes, GPU, dtype
    hold_log_dir(given.get("log_dir", CONFIG["log_dir"]), rt)  # one run at a time per log_dir
    s, resume, origin = settings.resolve(Settings, given, rt)  # presets or the run's settings, checks, fits
    if resume is not None and resume.finished and not resume.unevaluated:
        print0(resume.said)
        return 0
    run = start_run(s, rt, resume, origin)  # model, data, optimizers, log
    if s.eval_only:  # init_from's model, evaluated and logged; no training, no checkpoint
        with run.log:
            evaluate(run)
        return 0
    peak = peak_flops(torch.cuda.get_device_name(rt.device), rt.dtype) if rt.kind == "cuda" else None

    # ---------------------------------------------------------------------------------------- training loop
    with run.log, catch_stop_signals() as stop_signal, failure_hints(run):
        if resume is not None and resume.unevaluated:  # its checkpoint was written, its evaluation failed
            evaluate_or_stop(run, run.last_checkpoint)
        while run.step < s.max_steps:
            t0 = time.time()
            run.doing = f"in step {run.step + 1}"
            if rt.kind == "cuda":  # this step's peak, not the run's (evaluations differ); a host-side counter
                torch.cuda.reset_peak_memory_stats(rt.device)
            lr = set_lr(run.optimizers, run.step, run.peaks, s)  # each parameter group from its role's peak
            scale = run.scaler.get_scale() if run.scaler.is_enabled() else None  # fp16: this step's scale
            batches = [run.train_loader.next_batch() for _ in range(run.accum_steps)]
            loss, norm, update = train_step(batches, run.models, run.optimizers, run.scaler, rt, s.grad_clip)
            if update == "diverged":  # stopped before its update
                return diverged(run, loss, norm)
            synchronize(rt.device)  # wait for the GPU before reading the clock
            dt = time.time() - t0
            run.step = step = run.step + 1
            tok_s = s.total_batch_size / dt
            util = peak and mfu(run.models.raw.config, tok_s / rt.world_size, peak, s.T)  # a known GPU's
            mem = torch.cuda.max_memory_allocated(rt.device) if rt.kind == "cuda" else None  # this rank's
            elapsed, eta, last = run.clock.elapsed(), run.clock.eta(step, s.max_steps), step == s.max_steps
            if step % s.log_interval == 0 or step == 1 or last:
                print0(f"step {step:5d}/{s.max_steps} | loss {loss:.6f} | lr {lr:.4e} | norm {norm:.4f} "
                       f"| {dt * 1000:.2f} ms | {tok_s:,.0f} tok/s"
                       + ("" if util is None else f" | MFU {util:.1%}")  # no peak known: CPU, an unlisted GPU
                       + ("" if mem is None else f" | peak memory {mem / 2**30:.2f} GiB")
                       + f" | {duration(elapsed)} elapsed, eta {duration(eta)}"
                       + (f" | skipped: fp16 gradients overflowed at loss scale {scale:g}"
                          if update == "skipped" else ""))
            record = {"step": step, "loss": loss, "lr": lr, "grad_norm": norm, "ms": dt * 1000,
                      "tok_s": tok_s, "mfu": util, "peak_memory": mem, "elapsed": elapsed, "eta": eta}
            record |= {"loss_scale": scale, "skipped": update == "skipped"} if scale else {}
            stop = runtime.agree(rt, run.log.append([record]), stop_signal[0])  # every rank at the same step
            saved = step % s.checkpoint_interval == 0 or last or stop
            if saved:  # before the evaluation: an evaluation that fails loses no training
                run.doing = f"writing step {step}'s checkpoint"
                run.last_checkpoint = save(run)
            if (step % s.eval_interval == 0 or last) and not stop:  # a stop does not wait for an evaluation
                evaluate_or_stop(run, run.last_checkpoint if saved else None)
            run.clock.lap(step)  # the pace behind the ETA counts evaluations and checkpoints too
            if stop:  # not a finish: scripts and schedulers see 128 + signal (143 TERM, 130 INT, 138 USR1)
                print0(f"stopped by {signal.Signals(stop).name} after step {step}; rerun the same command to "
                       "resume")
                return 128 + stop
    if rt.master:  # finished: what ran and what it reached, from the log alone
        print0(f"report: {write_report(run.log.path)} (python plot.py --report --log={run.log.path} makes it "
               "again)")
    return 0


# ------------------------------------------------------------------------------------------------------------
# the run's state: model, data, optimizers and log, each decided once at start-up

class Models(NamedTuple):
    """How this rank runs its model, decided once by wrap_model."""
    raw: GPT  # the weights: what checkpoints hold and samples come from
    train_model: torch.nn.Module  # the training step's: compiled, in DDP or sharded (FSDP)
    eval_model: torch.nn.Module  # evaluation's: compiled, never in DDP
    compiled: bool
    no_sync: object = contextlib.nullcontext  # a micro-step before the last: DDP's no_sync (ddp says why)


@dataclasses.dataclass
class Run:
    """A training run's state: what the loop, evaluate() and save() read."""
    s: Settings  # resolved once (settings.resolve)
    rt: Runtime
    models: Models
    optimizers: list
    scaler: torch.amp.GradScaler  # fp16's loss scaling; disabled (a no-op) otherwise
    peaks: dict  # {role: peak learning rate}
    train_loader: DataLoaderLite
    val_loader: DataLoaderLite
    examples: object  # HellaSwag's packing.Prepared batches (hellaswag=0: None)
    core: object  # CORE's core_eval.Prepared tasks (core=0: None)
    log: RunLog
    clock: Clock
    origin: dict  # settings.resolve's: the notes, where each setting came from, the block and the settings
    accum_steps: int  # micro-steps a step: total_batch_size over B rows of T tokens on every process
    step: int = 0  # optimizer steps done
    last_checkpoint: str = "none yet"  # the newest checkpoint's name, for messages
    doing: str = "starting"  # what the loop is doing, for messages: "in step 5", "evaluating step 4"


def start_run(s, rt, resume, origin):
    """The Run: the model, data, optimizers and log, each decided once; the resumed run's state restored; its
    first record written (origin: settings.resolve's)."""
    torch.manual_seed(s.seed)  # the same initial weights on every rank
    model = build_model(s, resume).to(rt.device)
    train_loader, val_loader, examples, core = load_data(s, rt)
    models = wrap_model(model, s, rt)
    peaks = role_peaks(s, model.config.n_embd)
    optimizers = make_optimizers(model, s.optimizer, s.weight_decay, peaks, fused=rt.kind == "cuda")
    # fp16 overflows where bf16 does not: the loss is scaled up before backward and the gradients unscaled
    # before clipping; a step whose gradients overflowed is skipped and the scale lowered. Otherwise a no-op.
    scaler = torch.amp.GradScaler(rt.kind, init_scale=s.loss_scale, enabled=rt.dtype == "fp16")
    clock = Clock(resume.meta.get("elapsed", 0.0) if resume else 0.0, window=s.eval_interval)  # for the ETA
    accum_steps = s.total_batch_size // (s.B * s.T * rt.world_size)  # settings.fit made it whole
    run = Run(s, rt, models, optimizers, scaler, peaks, train_loader, val_loader, examples, core,
              RunLog(metrics_path(s.log_dir), rt), clock, origin, accum_steps)
    if resume is not None:  # its weights, optimizer, loader position; its log after the checkpoint dropped
        run.step, run.last_checkpoint = resume.restore(model, optimizers, scaler, train_loader, run.log, rt)
    hold_log_dir(s.log_dir, rt, create=True)  # only now: a refused run leaves no empty log_dir behind
    remove_stale_writes(s.log_dir, rt)
    if resume is None:  # a fresh start: an earlier attempt's (or evaluation's) log is kept, not continued
        run.log.set_aside()
    for note in [] if s.eval_only else room_note(s.log_dir, model.num_params()):
        print0(f"NOTE: {note}")
        origin["notes"].append(note)
    log_start(run)
    return run


def build_model(s, resume):
    """The GPT to train or evaluate, of the settings' shape: new weights, or init_from's (an OpenAI name, an
    HF folder or a checkpoint file; the optimizer starts fresh); a resume's come in restore()."""
    if resume is not None or s.init_from == "scratch":
        return GPT(settings.model_shape(s))
    model = load_model(s.init_from, "--init_from")
    model.config = settings.model_shape(s)  # the weights' fields, and how this run trains them
    return model


def load_data(s, rt):
    """(train loader, val loader, HellaSwag's batches, CORE's tasks; each None when off) for this rank: both
    evaluations tokenized and packed once for the run, in batches of about a micro-batch of tokens."""
    args = (s.B, s.T, rt.rank, rt.world_size)
    # eval_only reads no train split: a folder of validation shards alone will do (fineweb.py --speedrun_val)
    train = None if s.eval_only else DataLoaderLite(*args, "train", s.data_root, s.shuffle, s.seed)
    val = DataLoaderLite(*args, "val", s.data_root)
    examples = None
    if s.hellaswag > 0:
        examples = hellaswag_prepare(load_examples(s.hellaswag_data or None, s.hellaswag,
                                                   option="--hellaswag_data"),
                                     rt, max(1, (s.eval_B or s.B) * s.T // 384), s.block_size)
    core = None
    if s.core > 0:
        core = core_eval.Prepared(core_eval.load_tasks(s.core_bundle or None, s.core, option="--core_bundle"),
                                  rt, max(1, (s.eval_B or s.B) // 4), s.block_size)
    return train, val, examples, core


def wrap_model(raw_model, s, rt):
    """Models: how this rank runs the model: compiled (s.compile), in DDP under torchrun (ddp), or sharded
    (shard_model)."""
    if s.fsdp:
        return shard_model(raw_model, s, rt)
    compiled = torch.compile(raw_model) if s.compile else raw_model
    if rt.distributed:
        return ddp(raw_model, compiled, s, rt)
    return Models(raw_model, compiled, compiled, s.compile)


def ddp(raw_model, compiled, s, rt):
    """Models under DDP: the training step's model in DDP, inside torch.compile (each bucket's all-reduce
    overlaps the backward); evaluation's without it (compiled). The gradients cross ranks in the last
    micro-step's backward only (no_sync before it). FSDP reduce-scatters them every micro-step: accumulating
    them unsharded would hold a whole fp32 copy on every rank (1558M: 6.2 GB) to save communication that
    overlaps anyway."""
    # DDP's forward opens a profiler record_function, which Dynamo drops with a warning in every log unless it
    # may trace it (a recent setting: where a torch lacks it, the warning stays)
    if hasattr(torch._dynamo.config, "capture_profiler_record_function"):
        torch._dynamo.config.capture_profiler_record_function = True
    wrapped = DDP(raw_model, device_ids=[rt.local_rank] if rt.kind == "cuda" else None)
    return Models(raw_model, torch.compile(wrapped) if s.compile else wrapped, compiled, s.compile,
                  wrapped.no_sync)


def shard_model(raw_model, s, rt):
    """Models under FSDP2: each Block sharded, then the root (the tying survives); every rank must run every
    forward, and torch.compile goes region by region (GPT.compile_regions)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    # in bf16 or fp16 runs the blocks' parameters are gathered in that dtype (half the bytes; autocast would
    # cast them anyway) and their gradients reduced in fp32. The root stays fp32, and so does the residual
    # stream between the blocks (cast_forward_inputs=False), as under DDP.
    low = None if rt.dtype == "fp32" else runtime.TORCH_DTYPES[rt.dtype]
    mixed = MixedPrecisionPolicy(param_dtype=low, reduce_dtype=torch.float32 if low else None,
                                 cast_forward_inputs=False)
    for block in raw_model.transformer.h:
        fully_shard(block, mp_policy=mixed)
    fully_shard(raw_model)  # in place: raw_model is now the sharded model
    if s.compile:
        raw_model.compile_regions()
    return Models(raw_model, raw_model, raw_model, s.compile)


def log_start(run):
    """Print what this run is and write its first record: the settings, the model, the environment."""
    s, rt, model = run.s, run.rt, run.models.raw
    config = dataclasses.asdict(s)
    differs = {k: v for k, v in config.items() if v != CONFIG[k]}
    print0(f"config (what differs from the settings block; the log keeps all): {json.dumps(differs)}")
    print0(f"model: {model.num_params():,} parameters, {model.config}")
    print0(f"eval: {s.val_tokens // s.T * s.T:,} validation tokens from {s.data_root}, {s.hellaswag:,} "
           f"HellaSwag examples; device {rt.device}" if s.eval_only else data_lines(run))
    start = {"event": "start", "step": run.step, "config": config, "differs": differs,
             "model_config": dataclasses.asdict(model.config), "world_size": rt.world_size,
             "notes": run.origin["notes"], "source": run.origin["source"], "time": time.time(),
             "run": runtime.run_info(rt, run.models.compiled, run.optimizers)}
    run.log.log([start])
    if s.tracker:
        run.log.open_trackers(s.tracker, s.log_dir, start)


def data_lines(run):
    """log_start's lines of a training run: its data and its batch."""
    s, rt, loader = run.s, run.rt, run.train_loader
    lines = [f"data: {s.data_root}, {loader.tokens_total:,} train tokens, "
             f"{1 - loader.tokens_per_epoch / loader.tokens_total:.2%} skipped per epoch (shard tails)"]
    lines += [f"NOTE: {os.path.basename(name)} ({tokens:,} tokens) is shorter than a step "  # a corpus's tail
              f"({s.B * s.T * rt.world_size + 1:,} tokens): not trained on"
              for name, tokens in loader.skipped]
    # a GPU's memory, which settings.fit fits B to
    mem = "" if rt.memory is None else f"; {memory_said(memory(run), s.fsdp, rt)}"
    return "\n".join(lines + [f"batch: {s.total_batch_size:,} tokens = {s.B} x {s.T} x "
                              f"{plural(rt.world_size, 'process', 'processes')} x "
                              f"{plural(run.accum_steps, 'accumulation step')}; device {rt.device}{mem}"])


# ------------------------------------------------------------------------------------------------------------
# the training step (bench.py times this same step)

def train_step(batches, models, optimizers, scaler, rt, grad_clip):
    """One optimizer step over micro-batches [(x, y)] (the gradients cross ranks on the last): (loss averaged
    over the ranks, gradient norm, update), update "applied", "skipped" (fp16 gradients overflowed: the
    scaler lowers its scale) or "diverged" (a non-finite loss or norm: no update). One CPU-GPU sync point."""
    for opt in optimizers:
        opt.zero_grad(set_to_none=True)
    loss_accum = torch.zeros((), device=rt.device)
    for i, (x, y) in enumerate(batches):
        x, y = x.to(rt.device, non_blocking=True), y.to(rt.device, non_blocking=True)
        with models.no_sync() if i < len(batches) - 1 else contextlib.nullcontext():  # DDP: the last syncs
            with autocast(rt.device, rt.dtype):
                _, loss = models.train_model(x, y)
            loss = loss / len(batches)  # the mean over the whole batch, not a sum of means
            loss_accum += loss.detach()
            scaler.scale(loss).backward()  # fp16: scaled up so small gradients do not underflow
    if rt.distributed:
        dist.all_reduce(loss_accum)
        loss_accum /= rt.world_size
    with torch.profiler.record_function("optimizer"):  # a label for bench.py's profile
        for opt in optimizers:
            scaler.unscale_(opt)  # fp16: clip the true gradients, not the scaled ones
        norm = torch.nn.utils.clip_grad_norm_(models.raw.parameters(), grad_clip)  # FSDP: every rank
        norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm  # FSDP: a replicated DTensor
        loss, norm = loss_accum.item(), norm.item()  # CPU-GPU sync point
        if math.isfinite(loss) and math.isfinite(norm):
            update = "applied"
            for opt in optimizers:
                scaler.step(opt)
        elif scaler.is_enabled() and math.isfinite(loss):  # fp16: the scaler's overflow, not a divergence
            update = "skipped"
        else:
            return loss, norm, "diverged"
        scaler.update()  # fp16: lowers the scale after an overflow
    return loss, norm, update


def save(run):
    """Every rank: the run's state after run.step in log_dir (checkpoint.save_run); its name for messages.
    The loader's position is the same on every rank."""
    s, rt = run.s, run.rt
    meta = {"step": run.step, "config": dataclasses.asdict(s), "settings": run.origin["settings"],
            "block": run.origin["block"],
            "world_size": rt.world_size, "dataloader": run.train_loader.state_dict(),
            "scaler": run.scaler.state_dict(), "elapsed": run.clock.elapsed()}
    return save_run(s.log_dir, run.models.raw, run.optimizers, meta, rt, s.keep_checkpoints)


# ------------------------------------------------------------------------------------------------------------
# stopping: the failures that name their fix (what every rank agrees on after a step: runtime.agree)

def memory(run):
    """accounting.py's estimate of this run's training memory per process, in bytes."""
    return memory_estimate(run.models.raw.config, dataclasses.asdict(run.s), run.rt, run.s.B)


def resume_hint(run):
    """What the same command does next, for messages."""
    if run.last_checkpoint == "none yet":
        return "No checkpoint yet: the same command starts the run again"
    return (f"The newest checkpoint is {run.last_checkpoint}; the same command resumes from it (torchrun "
            "--max-restarts does by itself)")


def diverged(run, loss, norm):
    """A non-finite loss or gradient norm (the step was not applied): said, logged, exit status 1."""
    print0(f"error: non-finite loss {loss} or gradient norm {norm} at step {run.step + 1}: stopped before "
           f"its update. Lower --max_lr or check the data, then rerun: it " + (
               "starts afresh (no checkpoint yet)" if run.last_checkpoint == "none yet" else
               f"resumes from {run.last_checkpoint}"))
    run.log.append([{"step": run.step + 1, "event": "non-finite", "loss": loss, "grad_norm": norm}])
    return 1


@contextlib.contextmanager
def failure_hints(run):
    """A step's or a checkpoint's failures that name their fix and the newest checkpoint: out of memory (a
    GPU's or the CPU's, inside compiled code too), a RankError naming the B to try; a collective that lost
    another process (it hangs, or it ended), a UserError naming what this one was doing. Others pass
    through."""
    try:
        yield
    except Exception as e:
        if runtime.is_out_of_memory(e):
            raise RankError(out_of_memory(run)) from None
        if not runtime.peer_lost(e):
            raise
        why = (f"no answer from another process for {run.s.collective_timeout} s (--collective_timeout)"
               if runtime.timed_out(e) else "another process ended (its own line says why, if it could)")
        raise UserError(f"{why} while this one was {run.doing}. {resume_hint(run)}") from None


def out_of_memory(run):
    """The line of running out of GPU memory in a step or a checkpoint: the B to try."""
    s, rt = run.s, run.rt
    smaller = [b for b in micro_batches(s.total_batch_size, s.T, rt.world_size) if b < s.B]
    of = f" of the GPU's {rt.memory / 2**30:.1f} GiB" if rt.memory else ""
    fix = (f"try --B={smaller[0]} (gradient accumulation keeps total_batch_size)" if smaller else
           "B=1 already: try --grad_checkpoint=True, or --fsdp=True over more GPUs")
    return (f"out of memory {run.doing} at B={s.B}, T={s.T} (estimated {memory(run) / 2**30:.1f} GiB per "
            f"process{of}): {fix}. {resume_hint(run)}")


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
    with together(rt, guard=not sharded(model)):  # a rank that fails here stops every rank, before the sums
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


def evaluate(run):
    """Validation loss and bits per byte, HellaSwag (given examples) and samples of the model after run.step:
    printed, and logged together when all are done."""
    s, rt, models = run.s, run.rt, run.models
    models.eval_model.eval()
    at = os.path.basename(s.init_from) if s.eval_only else f"step {run.step}"  # eval_only: no steps
    val_loss, val_bpb = validation_loss(models.eval_model, run.val_loader, s.val_tokens // s.T,
                                        s.eval_B or s.B, rt)
    print0(f"{at}: val loss {val_loss:.4f} | val bpb {val_bpb:.4f}")
    records = [{"step": run.step, "val_loss": val_loss, "val_bpb": val_bpb}]
    if run.examples is not None:  # through the compiled model: fixed batch shapes, few lengths
        hs = hellaswag_eval(models.eval_model, run.examples, rt)
        print0(f"{at}: hellaswag acc_norm {hs['acc_norm']:.4f} ({hs['n']} examples)")
        records.append({"step": run.step, "hellaswag": hs["acc_norm"], "hellaswag_acc": hs["acc"],
                        "hellaswag_n": hs["n"]})
    if run.core is not None:  # the same: packed once, through the compiled model
        core = core_eval.evaluate(models.eval_model, run.core, rt)
        print0(f"{at}: CORE {core['core']:.4f} ({len(core['tasks'])} tasks, {s.core} examples each at most)")
        if note := core_eval.timing_note(s.core_bundle, "--core_bundle"):
            print0(f"NOTE: {note}")
        records.append({"step": run.step, "core": core["core"],
                        "core_tasks": {label: t["accuracy"] for label, t in core["tasks"].items()}})
    # every rank samples the same tokens (a seeded generator of its own: training's RNG is untouched)
    with together(rt, guard=not sharded(models.raw)):
        samples, _, _ = sample(Engine(models.raw), SAMPLE_PROMPT, 4, 24, 1.0, 50, s.seed, rt)
    for text in samples:
        print0(f"sample: {text!r}")
    run.log.log(records + [{"step": run.step, "samples": samples}])
    models.eval_model.train()


def evaluate_or_stop(run, checkpoint):
    """evaluate(); if it fails on any rank, every rank knows at the same point (runtime.together) and all
    write the step's state together before stopping (where `checkpoint`, its name, is None), unless no
    agreement was possible (a rank lost; a failure inside FSDP's forwards). The failing rank says why, once:
    out of memory names eval_B, another failure keeps its traceback after a line naming the checkpoint."""
    run.doing = f"evaluating step {run.step}"
    try:
        evaluate(run)
    except Exception as e:
        step, eval_B, rt = run.step, run.s.eval_B or run.s.B, run.rt
        if runtime.agreed(e, rt):  # every rank is here: they write the step's state together
            checkpoint = checkpoint or save(run)
        if isinstance(e, PeerFailed) or runtime.peer_lost(e):  # the failing rank or failure_hints says it
            raise
        where = (f"the step is in {checkpoint}; rerun the same command, which evaluates step {step} first"
                 if checkpoint else f"the newest checkpoint is {run.last_checkpoint}; rerun the same command")
        if runtime.is_out_of_memory(e):
            raise RankError(f"out of memory evaluating step {step} at eval_B={eval_B}: lower --eval_B (or "
                            f"--hellaswag, --core); {where}") from None
        if isinstance(e, UserError):  # its own line (a log that cannot be written)
            raise
        say(f"error{f' (rank {rt.rank})' if rt.rank else ''}: evaluating step {step} failed (the traceback "
            f"follows); {where}")
        raise


if __name__ == "__main__":
    main_guard(main, runtime.exit_process)  # every rank returns at the same step
