"""Checkpoint files: one torch.save file each, written atomically, with a checksum inside, verified on load.

train_gpt2.py writes log_dir/model_NNNNNN.pt = {"model", "model_config", "optimizer", "step", "config",
"dataloader", "rng", ..., "checksum"}; sample.py, hellaswag.py and save_pretrained read the same file.
checksum is the sha256 of everything else in it (tensors byte for byte), so a file that is truncated, or has
bytes changed anywhere, is detected before any of it is used, not loaded with garbage weights.

The model and optimizer states are full (unsharded) and keyed by parameter name, whether the run used DDP
or FSDP, so a checkpoint of either resumes under the other: gather_state() / load_state().
"""
import glob
import hashlib
import os

import torch
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_optimizer_state_dict, set_model_state_dict,
                                                     set_optimizer_state_dict)


class CheckpointError(ValueError):
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
    """The checkpoint files in log_dir, oldest first (written as .tmp and renamed when whole)."""
    return sorted(glob.glob(os.path.join(log_dir, "model_*.pt")))


def save_checkpoint(state, path):
    """torch.save state plus its checksum to path, atomically: a crash mid-write leaves no file under path."""
    with open(path + ".tmp", "wb") as f:
        torch.save({**state, "checksum": checksum(state)}, f)
        f.flush()
        os.fsync(f.fileno())  # on disk before the name says "complete"
    os.replace(path + ".tmp", path)


def load_checkpoint(path):
    """The verified contents of a checkpoint (on the CPU), or CheckpointError saying what is wrong with it.
    Checkpoints written before checksums existed have checksum None and load unverified; their per-rank
    loader states become one (the first rank's) and world_size."""
    if not os.path.isfile(path):
        raise CheckpointError(f"checkpoint {path} does not exist")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # a truncated zip, garbage in the pickle, a file of another kind
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:120]
        raise CheckpointError(f"checkpoint {path} is damaged: it cannot be read ({reason})") from None
    if not isinstance(ckpt, dict) or "model" not in ckpt or "model_config" not in ckpt:
        raise CheckpointError(f"{path} is not a train_gpt2.py checkpoint (no 'model' / 'model_config' entries)")
    stored = ckpt.get("checksum")
    if stored is not None and checksum({k: v for k, v in ckpt.items() if k != "checksum"}) != stored:
        raise CheckpointError(f"checkpoint {path} is damaged: its contents do not match its checksum")
    ckpt.setdefault("checksum", None)
    if isinstance(ckpt.get("dataloader"), list):  # written before one loader state served every rank
        ckpt["world_size"], ckpt["dataloader"] = len(ckpt["dataloader"]), ckpt["dataloader"][0]
    return ckpt


def newest_valid(log_dir, note=print):
    """(path, contents) of the newest checkpoint in log_dir that verifies; each one skipped is named through
    note() in one line; CheckpointError if none verifies."""
    found = checkpoints(log_dir)
    for path in reversed(found):
        try:
            return path, load_checkpoint(path)
        except CheckpointError as e:
            note(f"NOTE: {e}: skipped")
    raise CheckpointError(f"none of the {len(found)} checkpoints in {log_dir} verifies (see above): restore one, "
                          f"or start afresh with --log_dir=NEW")


def gather_state(model, optimizers):
    """(model state, optimizer state): full, on the CPU, on rank 0 ({} on the others); the optimizer's state
    keyed by parameter name (one dict for a list of optimizers). Under FSDP every rank must call it (it
    all-gathers the shards)."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_state = get_model_state_dict(model, options=options)
    if "lm_head.weight" in model_state:  # gathered, the tied matrix comes back twice: store it once, as unsharded
        model_state["lm_head.weight"] = model_state["transformer.wte.weight"]
    return model_state, get_optimizer_state_dict(model, optimizers, options=options)


def load_state(model, optimizers, ckpt, distributed):
    """Load a checkpoint's model and optimizer states into this rank's (possibly sharded) model and optimizer.
    Distributed, only rank 0 passes ckpt (the others pass None) and every rank must call it: rank 0 broadcasts.
    Optimizer states saved before they were keyed by parameter name (by index) are converted."""
    model_state, optim_state = (ckpt["model"], ckpt["optimizer"]) if ckpt is not None else ({}, {})
    if optim_state and all(isinstance(k, int) for k in optim_state["state"]):
        names = {id(p): name for name, p in model.named_parameters()}
        groups = [g for opt in optimizers for g in opt.param_groups]
        order = [names[id(p)] for group in groups for p in group["params"]]  # index -> name
        optim_state = {"state": {order[i]: s for i, s in optim_state["state"].items()},
                       "param_groups": [{**g, "params": [order[i] for i in g["params"]]}
                                        for g in optim_state["param_groups"]]}
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=distributed)
    set_model_state_dict(model, model_state, options=options)
    set_optimizer_state_dict(model, optimizers, optim_state, options=options)
