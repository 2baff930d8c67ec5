"""Checkpoints: written atomically with a checksum inside, verified before use, and the resume of a run from
them (checkpoint.py at the top level is their command: verify one, export it for transformers).

train_gpt2.py writes log_dir/model_NNNNNN.pt = {"model", "model_config", "optimizer", "step", "config",
"flags", "world_size", "dataloader", "scaler", "elapsed", "rng", "checksum"} ("config": the settings that ran;
"flags": the --NAME=VALUE flags the run's commands named, which a resume replays; "elapsed": the training
time so far); sample.py, hellaswag.py and core_eval.py read the same file (load_model). checksum is the
sha256 of everything else in it, tensors byte for byte, so a truncated or altered file is detected before any
of it is used. Model and optimizer states are full (unsharded) and keyed by parameter name, whether the run
used DDP or FSDP, so a checkpoint of either resumes under the other.
"""
import dataclasses
import errno
import glob
import hashlib
import math
import os
import re
import shutil

import torch

from gptlib import hf_gpt2
from gptlib.errors import UserError, find_cause, first_line
from gptlib.optimizers import get_lr
from gptlib.runlog import evaluated, log_lines, metrics_path, nearest_existing
from gptlib.runtime import broadcast_object, print0, sharded, together
from model import GPT, GPTConfig

# the settings that a model's weights decide
MODEL = ("block_size", "vocab_size", "n_layer", "n_head", "n_kv_head", "n_embd") + GPTConfig.MODERN
# What a resume cannot change: the model's shape, the data stream (B and the number of processes may change:
# the loader continues at the same row) and the optimizer. Every other setting may (learning rates and weight
# decay too: the parameter groups are named by role, whatever their values). Each with the value that
# checkpoints written before the setting existed ran with (None: every checkpoint holds it).
FIXED = {**dict.fromkeys(("n_layer", "n_head", "n_kv_head", "n_embd", "block_size", "vocab_size")),
         "recipe": "gpt2", **{name: False for name in GPTConfig.MODERN},
         **dict.fromkeys(("T", "total_batch_size", "data_root", "shuffle", "seed", "optimizer"))}
PATHS = ("data_root", "hellaswag_data", "core_bundle", "init_from")  # settings naming files, from the cwd
# GPTConfig fields that checkpoints of earlier versions hold and this one has not: how a run trained, not what
# the model computes (chunked_loss: removed after one H100's A/B, 2026-11-26, measured it 0.923x)
RETIRED = ("chunked_loss",)


class CheckpointError(UserError):
    """A checkpoint that is missing, damaged or not a train_gpt2.py checkpoint; the message is one line."""


def checksum(obj):
    """sha256 (hex) of a checkpoint's contents: nested dicts / lists of tensors and plain values."""
    h = hashlib.sha256()

    def walk(x):
        if isinstance(x, torch.Tensor):
            t = x.detach().cpu().contiguous().reshape(-1)
            h.update(f"tensor {x.dtype} {tuple(x.shape)}:".encode())
            h.update(t.view(torch.uint8).numpy().data if t.numel() else b"")
        elif isinstance(x, dict):
            h.update(f"dict {len(x)}:".encode())
            for k in sorted(x, key=repr):
                h.update(repr(k).encode())
                walk(x[k])
        elif isinstance(x, (list, tuple)):
            h.update(f"{type(x).__name__} {len(x)}:".encode())
            for v in x:
                walk(v)
        else:
            h.update(f"{type(x).__name__} {x!r};".encode())
    walk(obj)
    return h.hexdigest()


def checkpoints(log_dir):
    """The checkpoint files in log_dir, oldest first by step, not by name (model_1000000.pt is newer than
    model_999999.pt); written as .tmp and renamed when whole."""
    steps = {p: re.fullmatch(r"model_(\d+)\.pt", os.path.basename(p))
             for p in glob.glob(os.path.join(log_dir, "model_*.pt"))}
    return sorted((p for p, m in steps.items() if m), key=lambda p: int(steps[p].group(1)))


def remove_stale_writes(log_dir):
    """Rank 0, holding log_dir's lock: a checkpoint write that a second signal or Slurm's SIGKILL cut short
    left its model_*.pt.tmp (hundreds of MB each); no live run writes them now. Returns what was removed."""
    stale = sorted(glob.glob(os.path.join(log_dir, "model_*.pt.tmp")))
    for path in stale:
        os.remove(path)
    return [os.path.basename(p) for p in stale]


def save_checkpoint(state, path):
    """torch.save state plus its checksum to path, atomically: a crash mid-write leaves no file under path. A
    write that fails (a full disk, a folder gone read-only) removes the partial file and is a UserError naming
    the path, the error and, for a full disk, the room the checkpoint needs."""
    tmp = path + ".tmp"
    try:
        with open(tmp, "wb") as f:
            torch.save({**state, "checksum": checksum(state)}, f)
            f.flush()
            os.fsync(f.fileno())  # on disk before the name says "complete"
        os.replace(tmp, path)
    except Exception as e:
        cause = find_cause(e, lambda x: isinstance(x, OSError))  # inside torch's "unexpected pos"
        if cause is None:
            raise
        if os.path.exists(tmp):
            os.remove(tmp)
        need = (f"; it needs {size(nbytes(state))}, {size(free_space(path))} are free there"
                if cause.errno == errno.ENOSPC else "")
        raise UserError(f"could not write checkpoint {path} ({cause.strerror}{need}); the earlier "
                        "checkpoints are untouched: make room there (or make it writable) and rerun the same "
                        "command, which resumes from the newest one") from None


def nbytes(obj):
    """The bytes of the tensors in a nested dict / list: about a checkpoint's size on disk."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(nbytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(nbytes(v) for v in obj)
    return 0


def space_note(log_dir, n_params):
    """A NOTE when the disk of log_dir holds less than two checkpoints (weights and AdamW's two moments,
    fp32): one that does not fit stops the run, but better known at the start."""
    need, free = 12 * n_params, free_space(log_dir)
    if free >= 2 * need:
        return []
    return [f"{size(free)} free on the disk of {log_dir}, less than two checkpoints of about {size(need)}: "
            "make room, or choose another --log_dir"]


def size(n):
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def free_space(path):
    """Free bytes on the disk that holds path (or, while it does not exist, its nearest existing parent)."""
    return shutil.disk_usage(nearest_existing(path)).free


def load_checkpoint(path, option=None):
    """The verified contents of a checkpoint (on the CPU), or CheckpointError saying what is wrong with it.
    option: how the command names a checkpoint (--model, --init_from): a damaged one's line then says which
    earlier checkpoint in its folder verifies and how to pick it (next_step)."""
    if not os.path.isfile(path):
        raise missing(path, option)
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # a truncated zip, garbage in the pickle, a file of another kind
        raise CheckpointError(f"checkpoint {path} is damaged: it cannot be read ({first_line(e)})"
                              + next_step(path, option)) from None
    if not isinstance(ckpt, dict) or not {"model", "model_config", "checksum"} <= set(ckpt):
        raise CheckpointError(f"{path} is not a train_gpt2.py checkpoint (no 'model', 'model_config' or "
                              f"'checksum' entries)")
    if checksum({k: v for k, v in ckpt.items() if k != "checksum"}) != ckpt["checksum"]:
        raise CheckpointError(f"checkpoint {path} is damaged: its contents do not match its checksum"
                              + next_step(path, option))
    ckpt["model_config"] = current(ckpt["model_config"])
    return ckpt


def missing(path, option):
    """The CheckpointError of a checkpoint path that does not exist, naming the newest checkpoint in its
    folder (a run keeps its newest few: a resume deletes the one a command or script names) and option to pick
    it."""
    found = checkpoints(os.path.dirname(path) or ".")
    if not found:
        return CheckpointError(f"checkpoint {path} does not exist")
    return CheckpointError(f"checkpoint {path} does not exist; the newest in its folder is {found[-1]}"
                           + (f": {option} {found[-1]} picks it" if option else ""))


def next_step(path, option):
    """The end of a damaged checkpoint's line: the newest earlier checkpoint in its folder that verifies and
    option to pick it, or that none does; "" without option (a resume's own NOTE says what it does)."""
    if option is None:
        return ""
    folder = os.path.dirname(path) or "."
    found = checkpoints(folder)
    where = [os.path.abspath(p) for p in found]
    ours = os.path.abspath(path) in where  # a model_N.pt: only those before it; another name: any beside it
    for candidate in reversed(found[:where.index(os.path.abspath(path))] if ours else found):
        try:
            load_checkpoint(candidate)
        except CheckpointError:
            continue
        return (f"; {candidate}, {'an earlier one' if ours else 'another'} beside it, verifies: {option} "
                f"{candidate} picks it")
    return f"; no earlier checkpoint in {folder} verifies: restore this one from a copy, or train it again"


def current(config):
    """A checkpoint's model_config (a dict) without the RETIRED fields: GPTConfig(**current(config))."""
    return {k: v for k, v in config.items() if k not in RETIRED}


def newest_valid(log_dir, note=print):
    """(path, contents) of the newest checkpoint in log_dir that verifies. The damaged ones newer than it are
    named through note() in one line each and renamed to *.damaged (kept for a person to inspect, no longer
    counted among the checkpoints the run keeps); CheckpointError if none verifies (nothing renamed)."""
    found, damaged = checkpoints(log_dir), []
    for path in reversed(found):
        try:
            ckpt = load_checkpoint(path)
        except CheckpointError as e:
            note(f"NOTE: {e}: skipped")
            damaged.append(path)
            continue
        for bad in damaged:
            os.replace(bad, bad + ".damaged")
            note(f"NOTE: moved {bad} aside to {os.path.basename(bad)}.damaged")
        return path, ckpt
    raise CheckpointError(f"none of the {len(found)} checkpoints in {log_dir} verifies (see above): restore "
                          "one, or start afresh with --log_dir=NEW")


def load_model(spec, option=None):
    """A GPT from a train_gpt2.py checkpoint (.pt, verified against its checksum), an HF GPT-2 folder, or an
    OpenAI GPT-2 name (gpt2, gpt2-medium, ...). option: the setting that named spec, for a damaged
    checkpoint's line (load_checkpoint)."""
    if spec.endswith(".pt"):
        ckpt = load_checkpoint(spec, option)
        model = GPT(GPTConfig(**ckpt["model_config"]))
        model.load_state_dict(ckpt["model"])
        return model
    refuse_log_dir(spec, option)
    return hf_gpt2.from_pretrained(spec)


def refuse_log_dir(spec, option):
    """A UserError where spec, which should name weights, is a run's log_dir (checkpoints, no config.json):
    naming its newest checkpoint."""
    found = [] if os.path.exists(os.path.join(spec, "config.json")) else checkpoints(spec)
    if found:
        pick = f"{option}={found[-1]}" if option else found[-1]
        raise UserError(f"{spec} is a training run's log_dir, not an HF GPT-2 folder: give one of its "
                        f"checkpoints, such as its newest: {pick}")


def recorded_flags(log_dir):
    """(flags, config, path) of the run in log_dir, as its newest checkpoint that opens records them: the
    --NAME=VALUE flags it was started and resumed with ({name: value}, merged in order, the latest winning;
    None if written before they were recorded), the settings it ran with ({} if none) and that checkpoint's
    path; ({}, {}, None) without a checkpoint. Read by every process before the process group exists,
    memory-mapped and not verified: read_newest verifies the checkpoint the run resumes from."""
    for path in reversed(checkpoints(log_dir)):
        try:
            ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except Exception:  # damaged: read_newest names it and moves it aside
            continue
        return ckpt.get("flags"), ckpt.get("config", {}), path
    return {}, {}, None


def model_config(spec, option=None):
    """The GPTConfig (a dict) of load_model(spec), read without loading or verifying the weights: a
    checkpoint's recorded config, an HF folder's config.json, an OpenAI name's known shape. option: as
    load_checkpoint's."""
    if not spec.endswith(".pt"):
        refuse_log_dir(spec, option)
        return dataclasses.asdict(hf_gpt2.pretrained_config(spec))
    if not os.path.isfile(spec):
        raise missing(spec, option)
    try:  # memory-mapped: only the config is read
        config = torch.load(spec, map_location="cpu", weights_only=True, mmap=True)["model_config"]
    except Exception as e:  # a truncated zip, a file of another kind, no model_config
        raise CheckpointError(f"{spec} is not a readable train_gpt2.py checkpoint ({first_line(e)})"
                              + next_step(spec, option)) from None
    return dataclasses.asdict(GPTConfig(**current(config)))


# ---------------------------------------------------------------------------------------------- training runs

def gather_state(model, optimizers):
    """(model state, optimizer state): full, on the CPU, on rank 0 ({} on the others); the optimizer's state
    keyed by parameter name (one dict for a list of optimizers). Under FSDP every rank must call it (it
    all-gathers the shards)."""
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                         get_optimizer_state_dict)
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_state = get_model_state_dict(model, options=options)
    # gathered, the tied matrix comes back twice: store it once, as unsharded (an untied lm_head is its own)
    if "lm_head.weight" in model_state and not model.config.untied_head:
        model_state["lm_head.weight"] = model_state["transformer.wte.weight"]
    return model_state, get_optimizer_state_dict(model, optimizers, options=options)


def load_state(model, optimizers, ckpt, distributed):
    """Load a checkpoint's model and optimizer states into this rank's (possibly sharded) model and optimizer.
    The optimizers keep their own hyperparameters (this run's settings and kernel choice: a CPU run's
    checkpoint must not make a GPU's AdamW unfused); the checkpoint gives their state. Distributed, only rank
    0 passes ckpt (the others pass None) and every rank must call it: rank 0 broadcasts."""
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, set_model_state_dict,
                                                         set_optimizer_state_dict)
    model_state, optim_state = (ckpt["model"], ckpt["optimizer"]) if ckpt is not None else ({}, {})
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=distributed)
    set_model_state_dict(model, model_state, options=options)
    mine = [[{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups] for opt in optimizers]
    set_optimizer_state_dict(model, optimizers, optim_state, options=options)
    for opt, groups in zip(optimizers, mine):
        for group, own in zip(opt.param_groups, groups):
            group.update(own)
            for p in group["params"] if own.get("fused") or own.get("capturable") else []:  # where read
                state = opt.state.get(p, {})
                if torch.is_tensor(state.get("step")):
                    state["step"] = state["step"].to(p.device, torch.float32)


def save_run(log_dir, model, optimizers, meta, rt, keep):
    """Every rank: write a training run's state after step meta["step"] as log_dir/model_<step>.pt (rank 0
    writes; under FSDP all ranks gather) and delete all but the newest `keep`. It holds the weights, the
    optimizer states and the RNG, with meta: what else the run needs to continue (train_gpt2.py's
    save(): settings, loader position, loss scale, clock). Returns its name for messages. A failure on any
    rank (a write that fails, a gather that runs out of memory) stops every rank here (together), but for a
    failure inside FSDP's gathers, which are collective and cannot be agreed on (runtime.together)."""
    name = f"model_{meta['step']:06d}.pt"
    # FSDP's gathers are collectives: a rank that fails inside one cannot agree, so they come first, unguarded
    state = gather_state(model, optimizers) if sharded(model) else None
    with together(rt, rt.patient):  # the others wait here for the write; any rank's failure is agreed
        model_state, optimizer_state = state or gather_state(model, optimizers)  # DDP's: each rank's own
        if rt.master:
            path = os.path.join(log_dir, name)
            cuda_rng = torch.cuda.get_rng_state(rt.device) if rt.kind == "cuda" else None
            save_checkpoint({"model": model_state, "model_config": dataclasses.asdict(model.config),
                             "optimizer": optimizer_state, **meta,
                             "rng": {"cpu": torch.get_rng_state(), "cuda": cuda_rng}}, path)
            for old in checkpoints(log_dir)[:-keep]:
                os.remove(old)
            print0(f"checkpoint: {path}")
    return f"{name} (step {meta['step']})"


# ------------------------------------------------------------------------------------------------ resume

class Resume:
    """The run in log_dir to continue (continue_run decides whether and how). meta: what every rank
    needs of its newest checkpoint that verifies (read_newest); the weights and optimizer states stay on
    rank 0 (ckpt) until restore() broadcasts them. finished: nothing left to train or evaluate; unevaluated:
    its checkpoint was written, its evaluation failed."""

    def __init__(self, meta, ckpt, finished=False, unevaluated=False):
        self.meta, self.ckpt, self.finished, self.unevaluated = meta, ckpt, finished, unevaluated
        self.step, self.path, self.model_config = meta["step"], meta["path"], meta["model_config"]

    def restore(self, model, optimizers, scaler, loader, rt):
        """Every rank: the checkpoint's weights, optimizer and loss-scaler states, RNG and loader position."""
        first = ", evaluating that step first: its evaluation is not in the log" if self.unevaluated else ""
        print0(f"resuming from {self.path} (step {self.step}; --log_dir=NEW starts afresh){first}")
        roles = [g.get("role") for opt in optimizers for g in opt.param_groups]
        if self.meta["roles"] != roles:  # the same verdict on every rank: meta is rank 0's
            raise UserError(f"{self.path} holds optimizer state in another layout (parameter groups "
                            f"{self.meta['roles']}, this code's {roles}): continue it with the code that "
                            f"wrote it, or start from its weights with a fresh optimizer: "
                            f"--init_from={self.path} --log_dir=NEW")
        load_state(model, optimizers, self.ckpt, rt.distributed)
        if scaler.is_enabled() and self.meta["scaler"]:  # fp16: continue with the loss scale it had reached
            scaler.load_state_dict(self.meta["scaler"])
        elif scaler.is_enabled():  # a bf16 or fp32 run resumed in fp16 (another GPU): no scale to continue
            print0(f"NOTE: {os.path.basename(self.path)} was written by a run without fp16 loss scaling: "
                   f"the loss scale starts at {scaler.get_scale():g} (--loss_scale)")
        torch.set_rng_state(self.meta["rng"]["cpu"])
        if rt.kind == "cuda" and self.meta["rng"]["cuda"] is not None:
            torch.cuda.set_rng_state(self.meta["rng"]["cuda"])
        loader.load_state_dict(self.meta["dataloader"])  # a UserError if the shards changed since
        self.ckpt = None  # its tensors are copied into the model and optimizer
        return self.step


def continue_run(s, chosen, rt):
    """(settings, Resume or None): whether this run continues the one in log_dir, decided before any model is
    built, and the shape of the weights it starts from. A log_dir with checkpoints is continued (the same
    command again continues it, a fine-tune too): unless this command names --init_from=scratch, or
    init_from names other weights than those the run started from (both refused: they would start a second
    run whose checkpoints rotation mixes with the first's; what else it cannot change was refused in
    settings.combine: refuse_fixed). The settings keep the run's origin in init_from. Rank 0 reads the newest
    checkpoint that verifies and shares the verdict; a finished run ends here. A run from weights (a
    fine-tune, a resume of one) has their shape; a shape the user chose (chosen: {name: where}) that differs
    is refused."""
    existing = checkpoints(s.log_dir)
    if s.eval_only and existing:
        raise UserError(f"{s.log_dir} holds a training run's checkpoints: give --eval_only=True a log_dir of "
                        "its own (--log_dir=NEW)")
    if s.init_from == "scratch" and existing and chosen.get("init_from") == "this command":
        raise UserError(f"{s.log_dir} holds checkpoints of an earlier run; --init_from=resume continues it, "
                        "or choose another --log_dir")
    if not existing:
        if s.init_from == "resume":
            raise UserError(f"--init_from=resume but {s.log_dir} holds no checkpoint (model_*.pt)")
        if s.init_from != "scratch":  # the weights decide the shape; T within their positions
            s = weights_shape(s, chosen, model_config(s.init_from, "--init_from"), s.init_from)
        return s, None
    meta, ckpt = read_newest(s.log_dir, rt)
    origin = meta["config"].get("init_from", "scratch")  # "resume": written before origins were kept
    if s.init_from not in ("scratch", "resume") and origin != "resume" and not same_path(s.init_from, origin):
        raise UserError(f"{s.log_dir} holds a run started from {origin}, not {s.init_from}: the same command "
                        f"(--init_from={origin}) continues it; start from {s.init_from} with --log_dir=NEW")
    s = dataclasses.replace(s, init_from=s.init_from if origin == "resume" else origin)
    if s.init_from not in ("scratch", "resume"):  # a fine-tune: its shape is its weights', as when it started
        s = weights_shape(s, chosen, meta["model_config"], s.init_from)
    finished = meta["step"] >= s.max_steps
    # the checkpoint of a step is written before its evaluation: an evaluation that failed is done first
    unevaluated = (meta["step"] % s.eval_interval == 0 or finished) and not meta["evaluated"]
    if finished and not unevaluated:
        print0(finished_line(s, meta["step"]))
        return s, Resume(meta, None, finished=True)
    return s, Resume(meta, ckpt, unevaluated=unevaluated)


def finished_line(s, step):
    """What a run finished at `step` says. Where a newer checkpoint was damaged (newest_valid moved it aside),
    so were the flags of the command that wrote it (a resume replays the newest readable checkpoint's): then
    the flags that command's start record in metrics.jsonl names and this run lacks, to give again."""
    line = (f"the run in {s.log_dir} is already finished at step {step} (max_steps={s.max_steps}): nothing "
            "to do")
    damaged = sorted(os.path.basename(p)[:-len(".damaged")]
                     for p in glob.glob(os.path.join(s.log_dir, "model_*.pt.damaged"))
                     if int(re.search(r"model_(\d+)", os.path.basename(p)).group(1)) > step)
    if not damaged:
        return line + ". Raise --max_steps to train further, or --log_dir=NEW"
    starts = [r for _, r in log_lines(metrics_path(s.log_dir)) if r and r.get("event") == "start"]
    later = (starts[-1].get("flags") or {}) if starts else {}
    now = same_paths(later, dataclasses.asdict(s))
    flags = " ".join(f"--{k}={v}" for k, v in later.items() if now.get(k) != v)
    return (f"{line}. The newer {', '.join(damaged)} was damaged, and with it the flags of the command that "
            "wrote it (a resume replays the newest readable checkpoint's): "
            + (f"{metrics_path(s.log_dir)} records them; rerun with {flags} to train on from step {step}"
               if flags else f"name them again (a higher --max_steps) to train on from step {step}"))


def refuse_fixed(saved, cfg, chosen, block, started):
    """A UserError if settings cfg (a dict, before any check) change what the run saved with settings `saved`
    cannot change (FIXED; a run from weights has their shape, which weights_shape checks), listing every
    difference, where the new value came from (source) and the two ways out; before anything is checked,
    fitted, read or built."""
    now = same_paths(saved, cfg)
    was = {k: saved.get(k, before) for k, before in FIXED.items()}
    from_weights = cfg["init_from"] not in ("scratch", "resume")  # the run's origin (combine put it there)
    fixed = [k for k in FIXED if was[k] != now[k] and not (from_weights and k in MODEL)]
    if fixed:
        raise UserError(f"the run in {cfg['log_dir']} has "
                        + ", ".join(f"{k}={was[k]!r} (now {now[k]!r}, "
                                    f"{source(k, now, block, chosen, started)})" for k in fixed)
                        + f", which a resume cannot change: restore {'them' if len(fixed) > 1 else 'it'} ("
                        + " ".join(f"--{k}={was[k]}" for k in fixed)
                        + ") to continue that run, or start a new one with --log_dir=NEW")


def resume_changes(resume, s, chosen, world_size, started):
    """Notes of what this start-up changes in the run it resumes (what it cannot change: refuse_fixed), its
    saved settings compared with s once, after every preset, fallback and fit (a setting lowered again is no
    change), each change with where it came from (source). The log_dir is the run's wherever it is named
    from; a device or dtype saved as "auto" (before they were resolved) is no change."""
    saved = resume.meta["config"]
    now = same_paths(saved, dataclasses.asdict(s))
    changed = [f"{k} {saved[k]!r} -> {v!r} ({source(k, now, block_of(s), chosen, started)})"
               for k, v in now.items() if k not in FIXED and k not in ("init_from", "log_dir") and k in saved
               and saved[k] not in (v, "auto")]
    notes = [f"changed since the checkpoint: {', '.join(changed)}"] if changed else []
    if resume.meta["world_size"] != world_size:
        notes.append(f"processes changed since the checkpoint: {resume.meta['world_size']} -> {world_size}")
    if note := schedule_change(s, resume):
        notes.append(note)
    return notes


def source(k, now, block, chosen, started):
    """Where setting k's value now (settings as a dict) came from, for messages: chosen[k] (this command, the
    run's command, a preset, the settings block edited), else this machine where the block holds another
    value (a fit, the device, a fallback), else the block: its default where started[k] (a fallback or a fit
    where the run started) had set the run's, or an edit since (a path it names, found from this folder)."""
    in_block = now[k] == block[k] or k in PATHS and bool(block[k]) and same_path(block[k], now[k])
    if k in chosen or not in_block:
        return chosen.get(k, "this machine")
    if k in started:
        return f"the settings block's default; the run's came from {started[k]} where it started"
    return "the settings block"


def block_of(s):
    """{name: default} of settings s, or of their class: the settings block they come from."""
    return {f.name: f.default for f in dataclasses.fields(s)}


def same_paths(saved, now):
    """now (settings as a dict) with each path setting that names the file or folder its saved spelling
    does spelt as saved (./x is x; a run written before paths were kept absolute), so neither is a change."""
    return {k: saved[k] if k in PATHS and k in saved and v and saved[k] and same_path(saved[k], v) else v
            for k, v in now.items()}


def same_path(a, b):
    """Whether two spellings of a path name the same file or folder (./x and x; a link and its target)."""
    return os.path.normpath(a) == os.path.normpath(b) or os.path.realpath(a) == os.path.realpath(b)


def weights_shape(s, chosen, config, origin):
    """Settings with the shape of the weights the run starts from (config: their GPTConfig as a dict) in
    place of the settings block's: what ran is what the log records. A shape setting the user chose (chosen:
    {name: where}) that differs is a UserError, as is a T beyond the weights' positions; both before any model
    is built."""
    differ = [k for k in MODEL if k in chosen and getattr(s, k) != config[k]]
    if differ:
        why = f" ({', '.join(sorted({chosen[k] for k in differ}))})"
        raise UserError(f"{', '.join(f'{k}={getattr(s, k)}' for k in differ)}{why}, but {origin} has "
                        f"{', '.join(f'{k}={config[k]}' for k in differ)}: the weights decide the model's "
                        f"shape; drop {'them' if len(differ) > 1 else 'it'}, or start from scratch")
    if s.T > config["block_size"]:
        raise UserError(f"T={s.T}, but {origin} has {config['block_size']} positions (block_size): use "
                        f"--T={config['block_size']} or less")
    return dataclasses.replace(s, **{k: config[k] for k in MODEL})


def schedule_change(s, resume):
    """A note when a resume moves the learning rate off the run's schedule (max_steps, warmup_steps,
    min_lr_ratio or max_lr changed): what the next step's is on each."""
    block = block_of(s)  # for a setting the checkpoint predates
    saved = {k: resume.meta["config"].get(k, block[k]) for k in ("max_lr", "min_lr_ratio", "warmup_steps",
                                                                  "max_steps")}
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


def read_newest(log_dir, rt):
    """(meta, ckpt) of the newest checkpoint in log_dir that verifies. Rank 0 reads and verifies it; meta,
    what every rank needs to decide the resume (all but the weights and optimizer state, with its path, its
    parameter groups' roles and whether metrics.jsonl holds its evaluation), is broadcast; ckpt, the whole
    contents, stays on rank 0 (None on the others) until Resume.restore broadcasts the weights. None of them
    verifies: a UserError on every rank."""
    ckpt, meta = None, None
    if rt.master:  # rank 0 reads and verifies; the others get the verdict, and the weights in restore()
        try:
            path, ckpt = newest_valid(log_dir, print0)
            meta = {k: v for k, v in ckpt.items() if k not in ("model", "optimizer")} | {"path": path}
            meta["roles"] = [g.get("role") for g in ckpt.get("optimizer", {}).get("param_groups", [])]
            meta["evaluated"] = evaluated(metrics_path(log_dir), meta["step"])
        except CheckpointError as e:
            meta = {"error": str(e)}
    if rt.distributed:  # the others wait while rank 0 reads and verifies
        meta = broadcast_object(meta, rt.patient)
    if "error" in meta:
        raise UserError(meta["error"])
    return meta, ckpt
