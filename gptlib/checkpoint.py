"""Checkpoints: written atomically with a checksum inside, verified before use, and read back to resume a run
(settings.py decides whether and how; checkpoint.py at the top level verifies one and exports it).

train_gpt2.py writes log_dir/model_NNNNNN.pt = {"model", "model_config", "optimizer", "step", "config",
"settings", "block", "world_size", "dataloader", "scaler", "elapsed", "rng", "checksum"} ("config": the
settings that ran; "settings": them before this machine's fits, which a resume runs; "block": the settings
block of the command that wrote it, so a resume knows the lines edited since; "elapsed": the training time
so far); sample.py, hellaswag.py and core_eval.py read the same file (load_model). checksum is the
sha256 of everything else in it, tensors byte for byte, so a truncated or altered file is detected before any
of it is used. Model and optimizer states are full (unsharded) and keyed by parameter name, whether the run
used DDP or FSDP, so a checkpoint of either resumes under the other.
"""
import dataclasses
import errno
import glob
import hashlib
import os
import re
import shutil

import torch

from gptlib import hf_gpt2
from gptlib.errors import UserError, find_cause, first_line
from gptlib.runlog import evaluated, metrics_path, nearest_existing
from gptlib.runtime import broadcast_object, print0, sharded, together
from model import GPT, GPTConfig

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


def newest(log_dir):
    """The newest checkpoint in log_dir (a path from the folder you run in), or a CheckpointError naming the
    folder looked in and the fix."""
    found = checkpoints(log_dir)
    if not found:
        where = os.path.abspath(log_dir) + ("" if os.path.isdir(log_dir) else ", no such folder")
        raise CheckpointError(f"no checkpoint in {where}: give a training run's log_dir as a path from the "
                              "folder you run in, or its full path")
    return found[-1]


def remove_stale_writes(log_dir, rt):
    """Rank 0, holding log_dir's lock: a checkpoint write that a second signal or Slurm's SIGKILL cut short
    left its model_*.pt.tmp (hundreds of MB each); no live run writes them now. Each removal is said."""
    for path in sorted(glob.glob(os.path.join(log_dir, "model_*.pt.tmp"))) if rt.master else []:
        os.remove(path)
        print0(f"NOTE: removed {os.path.basename(path)}, a checkpoint an earlier attempt did not finish "
               "writing")


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


def room_note(log_dir, n_params):
    """A NOTE when the disk of log_dir (made by then: one that cannot be was refused) holds less than two
    checkpoints (weights and AdamW's two moments, fp32): one that does not fit stops the run."""
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
        raise CheckpointError(f"checkpoint {path} is damaged: it cannot be read ({short(e)})"
                              + next_step(path, option)) from None
    if not isinstance(ckpt, dict) or not {"model", "model_config", "checksum"} <= set(ckpt):
        raise CheckpointError(f"{path} is not a train_gpt2.py checkpoint (no 'model', 'model_config' or "
                              f"'checksum' entries)")
    if checksum({k: v for k, v in ckpt.items() if k != "checksum"}) != ckpt["checksum"]:
        raise CheckpointError(f"checkpoint {path} is damaged: its contents do not match its checksum"
                              + next_step(path, option))
    ckpt["model_config"] = current(ckpt["model_config"], path)
    return ckpt


def short(e):
    """An unreadable file's error in a few words: torch's own runs to hundreds of characters."""
    line = first_line(e)
    return line if len(line) <= 80 else f"{type(e).__name__}: {line[:60].rstrip()}..."


def missing(path, option):
    """The CheckpointError of a checkpoint path that does not exist, naming the newest checkpoint in its
    folder (a run keeps its newest few: a resume deletes the one a command or script names) and option to pick
    it."""
    found = checkpoints(os.path.dirname(path) or ".")
    if not found:
        return CheckpointError(f"checkpoint {path} does not exist (a training run writes its model_NNNNNN.pt "
                               "in its log_dir)")
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


def current(config, path="the checkpoint"):
    """A checkpoint's model_config (a dict) without the RETIRED fields: GPTConfig(**current(config)). A field
    this model.py lacks (a model option added in another copy of it) is a UserError."""
    unknown = set(config) - {f.name for f in dataclasses.fields(GPTConfig)} - set(RETIRED)
    if unknown:
        raise UserError(f"{path} holds a model with {', '.join(sorted(unknown))}, which this model.py's "
                        "GPTConfig lacks: use the code that wrote it")  # not damaged: not moved aside
    return {k: v for k, v in config.items() if k not in RETIRED}


def aside(path):
    """Where a damaged checkpoint goes: path.damaged, or path.damaged.N where an earlier one is kept."""
    n, dest = 1, path + ".damaged"
    while os.path.exists(dest):
        dest, n = f"{path}.damaged.{n}", n + 1
    return dest


def newest_valid(log_dir, note=print):
    """(path, contents) of the newest checkpoint in log_dir that verifies. The damaged ones newer than it are
    named through note() in one line each and renamed to *.damaged (kept for a person to inspect, no longer
    counted among the checkpoints the run keeps); CheckpointError if none verifies (all renamed as well, now
    or by an earlier attempt: a rerun must not start afresh over the run)."""
    found = checkpoints(log_dir)
    if not found:  # only *.damaged ones (read_newest's caller found checkpoints or those)
        raise CheckpointError(f"{log_dir} holds only damaged checkpoints (*.damaged): restore one from a "
                              "copy under its model_NNNNNN.pt name to resume, or start afresh with "
                              "--log_dir=NEW")
    for path in reversed(found):
        try:
            ckpt = load_checkpoint(path)
        except CheckpointError as e:
            dest = aside(path)
            note(f"NOTE: {e}: moved aside to {os.path.basename(dest)}")
            os.replace(path, dest)
            continue
        return path, ckpt
    raise CheckpointError(f"none of the {len(found)} checkpoints in {log_dir} verifies (see above; each "
                          "moved aside as *.damaged): restore one from a copy, or start afresh with "
                          "--log_dir=NEW")


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
        raise CheckpointError(f"{spec} is not a readable train_gpt2.py checkpoint ({short(e)})"
                              + next_step(spec, option)) from None
    return dataclasses.asdict(GPTConfig(**current(config, spec)))


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
    """The run in log_dir to continue (settings.resolve decides whether and how). meta: what every rank needs
    of its newest checkpoint that verifies (read_newest); the weights and optimizer states stay on rank 0
    (ckpt) until restore() broadcasts them. finished: nothing left to train; unevaluated: its checkpoint was
    written, its evaluation failed (both set by settings.resolve)."""

    def __init__(self, meta, ckpt):
        self.meta, self.ckpt, self.finished, self.unevaluated = meta, ckpt, False, False
        self.step, self.path = meta["step"], meta["path"]

    def restore(self, model, optimizers, scaler, loader, log, rt):
        """Every rank: the checkpoint's weights, optimizer and loss-scaler states, RNG and loader position;
        the log's records after its step dropped. Returns (its step, its name for messages)."""
        first = ", evaluating that step first: its evaluation is not in the log" if self.unevaluated else ""
        print0(f"resuming from {self.path} (step {self.step}; --log_dir=NEW starts a fresh experiment)"
               f"{first}")
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
        log.drop_after(self.step)
        return self.step, f"{os.path.basename(self.path)} (step {self.step})"


def read_newest(log_dir, rt):
    """The Resume of the newest checkpoint in log_dir that verifies. Rank 0 reads and verifies it; meta, what
    every rank needs to decide the resume (all but the weights and optimizer state, with its path, its
    parameter groups' roles and whether metrics.jsonl holds its evaluation), is broadcast; the whole contents
    stay on rank 0 until Resume.restore broadcasts the weights. None of them verifies: a UserError on every
    rank."""
    ckpt, meta = None, None
    if rt.master:  # rank 0 reads and verifies; the others get the verdict, and the weights in restore()
        try:
            path, ckpt = newest_valid(log_dir, print0)
            meta = {k: v for k, v in ckpt.items() if k not in ("model", "optimizer")} | {"path": path}
            meta["roles"] = [g.get("role") for g in ckpt.get("optimizer", {}).get("param_groups", [])]
            meta["evaluated"] = evaluated(metrics_path(log_dir), meta["step"])
        except UserError as e:  # none verifies, or written by another model.py: every rank stops
            meta = {"error": str(e)}
    if rt.distributed:  # the others wait while rank 0 reads and verifies
        meta = broadcast_object(meta, rt.patient)
    if "error" in meta:
        raise UserError(meta["error"])
    return Resume(meta, ckpt)
