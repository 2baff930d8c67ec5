"""What a run runs, decided once at start-up in one pass (resolve), before any model is built, into one frozen
Settings; where each setting came from is recorded as it is decided. checkpoint.py reads the run's files.

The rule (docs/training.md, "What runs"): a first start runs the block, the presets that apply, the flags
(first_start); a resume its checkpoint's settings, the block's lines edited since, the flags, refusing first
what it cannot change (continued); then the checks (validate) and the fits to this machine (fit), each a NOTE.
"""
import dataclasses
import difflib
import glob
import math
import os

import torch

from dataloader import split_rows
from gptlib import runtime
from gptlib.accounting import memory_estimate, micro_batches
from gptlib.checkpoint import checkpoints, model_config, read_newest
from gptlib.errors import UserError, block_help, check_range, plural
from gptlib.optimizers import get_lr
from gptlib.runtime import broadcast_object, print0
from gptlib.trackers import TRACKERS
from model import GPT2_SIZES, GPT2_VOCAB, GPTConfig

# --recipe=modern: the changes nanochat and modded-nanogpt make to GPT-2 (the block ships GPT-2's own), each
# overridable (--rotary=False); nanochat's head learning rate (its embedding's 0.2 is for embeddings of std 1)
RECIPES = {"gpt2": {}, "modern": dict(rotary=True, qk_norm=True, relu2=True, untied_head=True, zero_init=True,
                                      rmsnorm=True, embed_norm=True, optimizer="muon", max_lr=6e-3,
                                      embed_lr=0.004, head_lr=0.004)}
SIZES = {name: {**shape, "n_kv_head": shape["n_head"], "max_lr": lr}  # GPT-3's peak rates for those sizes
         for (name, shape), lr in zip(GPT2_SIZES.items(), (6e-4, 3e-4, 2.5e-4, 2e-4))}
SHAPE = ("n_layer", "n_head", "n_kv_head", "n_embd")  # named on the command line, the presets' go whole
FINEWEB_DIR = "edu_fineweb10B"  # the shipped data_root: only this one falls back to input.txt when missing
SHAKESPEARE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "input.txt")
SHAKESPEARE_CONFIG = dict(  # input.txt is ~300k tokens: small steps (its 10% val split must hold one)
    total_batch_size=4096, B=8, T=256, max_steps=300, warmup_steps=30, eval_interval=100, val_tokens=32768,
    checkpoint_interval=300)
LAPTOP = dict(  # without a CUDA GPU: the best held-out bpb in less than nanoGPT's laptop time on 2 cores
    # (dev/cpu_sweep.py), validated once, at the end, on the whole of input.txt's validation split
    recipe="modern", total_batch_size=2048, B=16, T=128, n_layer=4, n_head=4, n_kv_head=4, n_embd=64,
    warmup_steps=20, max_steps=150, eval_interval=150, val_tokens=32768, hellaswag=0, checkpoint_interval=150,
    compile=False, log_interval=1, max_lr=3e-3)  # max_lr: --recipe=gpt2's (the modern recipe's comes after)
# What a resume cannot change, with the model's fields (model_fields): the presets and weights that chose
# them, the optimizer, the data stream (B and the processes may change: the loader goes on at its row)
FIXED = ("size", "recipe", "init_from", "optimizer", "data_root", "T", "total_batch_size", "shuffle", "seed")
TRAINING = ("grad_checkpoint",)  # GPTConfig fields of how the model trains, not what it computes
PATHS = ("data_root", "hellaswag_data", "core_bundle", "init_from")  # settings naming files, from the cwd
RUNTIME = ("device", "dtype", "collective_timeout")  # this machine's, decided first: never the run's
# the valid values of the numeric settings where a bad one is plausible, as check_range's (low, high, above)
RANGES = {**{k: (1, None, None) for k in ("total_batch_size", "B", "T", "block_size", "n_layer", "n_head",
                                          "n_kv_head", "n_embd", "max_steps", "eval_interval", "log_interval",
                                          "val_tokens", "checkpoint_interval", "keep_checkpoints",
                                          "collective_timeout")},
          **{k: (0, None, None) for k in ("warmup_steps", "hellaswag", "embed_lr", "head_lr", "weight_decay",
                                          "seed", "eval_B", "core")},
          **{k: (None, None, 0) for k in ("max_lr", "muon_lr", "grad_clip", "loss_scale")},
          "vocab_size": (GPT2_VOCAB, None, None), "min_lr_ratio": (0, 1, None)}  # vocab: GPT-2's tokens fit


def settings_type(block):
    """The frozen dataclass of a settings block ({name: default}): s.B, s.max_lr, ..., read-only."""
    return dataclasses.make_dataclass("Settings", [(k, type(v), v) for k, v in block.items()], frozen=True)


def block_of(s):
    """{name: default} of settings s, or of their class: the settings block they come from."""
    return {f.name: f.default for f in dataclasses.fields(s)}


def model_fields(block):
    """The settings that are the model's: GPTConfig's fields with a setting of the same name."""
    return [f.name for f in dataclasses.fields(GPTConfig) if f.name in block and f.name not in TRAINING]


def model_shape(s):
    """The GPTConfig of settings s (or a dict of them): a resume's or fine-tune's has its weights' fields."""
    values = s if isinstance(s, dict) else vars(s)
    return GPTConfig(**{f.name: values[f.name] for f in dataclasses.fields(GPTConfig) if f.name in values})


# ------------------------------------------------------------------------------------------------------------
# the whole decision, in order

def resolve(Settings, given, rt):
    """(settings, resume: the run in log_dir to continue or None, origin: the NOTEs, each printed, where each
    setting came from ({name: where}, the block's left out) and the block that ran, for the log)."""
    block = block_of(Settings)
    log_dir = given.get("log_dir", block["log_dir"])
    # a run's checkpoints, or only damaged ones (read_newest refuses those: not a fresh start over the run)
    found = checkpoints(log_dir) or glob.glob(os.path.join(log_dir, "model_*.pt.damaged"))
    found = broadcast_object(found, rt.patient) if rt.distributed else found  # rank 0's run decides
    if given.get("eval_only", block["eval_only"]):
        validate_eval_only(found, given.get("init_from", block["init_from"]), log_dir)
    resume = read_newest(log_dir, rt) if found else None
    cfg, source, notes = (first_start(block, given, rt) if resume is None else
                          continued(block, resume.meta, given, log_dir))
    notes = rt.notes + notes
    validate(cfg, rt)
    if resume is None and cfg["init_from"] != "scratch":  # the weights decide the shape
        weights_shape(cfg, source, given, model_fields(block))
    asked = dict(cfg)  # what a resume runs: the fits below are this machine's, made again at each start
    notes += fit(cfg, source, given, rt)
    s = Settings(**{**cfg, "device": rt.kind, "dtype": rt.dtype})
    notes += [] if resume is None else changes(resume, s, source, rt)
    for note in notes:
        print0(f"NOTE: {note}")
    return s, resume, {"notes": notes, "source": source, "block": block, "settings": asked}


def first_start(block, given, rt):
    """(cfg, source, notes) of a run's first start: the settings block, then the presets that apply, then this
    command's flags. One NOTE names the presets and what they set."""
    asked = {**block, **given}
    if asked["init_from"] == "resume":
        raise UserError(f"--init_from=resume but {asked['log_dir']} holds no checkpoint (model_*.pt)")
    weights = asked["init_from"] != "scratch"  # they decide the model, and so its recipe
    doing, presets = "evaluating" if asked["eval_only"] else "training", []  # [(name, why, settings)]
    if "data_root" not in given and block["data_root"] == FINEWEB_DIR and not os.path.exists(FINEWEB_DIR):
        if rt.distributed:
            raise UserError(f"no shards in {os.path.abspath(FINEWEB_DIR)} (data_root is relative to the "
                            f"directory you run from): make them there with `python fineweb.py`, pass "
                            f"--data_root=PATH, or try it on Shakespeare with --data_root=input.txt")
        presets.append(("input.txt", f" (no shards in {FINEWEB_DIR}/, which `python fineweb.py` makes: "
                        f"{doing} on input.txt)", {"data_root": SHAKESPEARE, **SHAKESPEARE_CONFIG}))
    elif os.path.abspath(asked["data_root"]) == SHAKESPEARE:
        presets.append(("input.txt", "", SHAKESPEARE_CONFIG))
    if rt.kind != "cuda":  # a laptop's: an Apple GPU runs eager in fp32, sharing the laptop's memory
        where = "an Apple GPU (mps)" if rt.kind == "mps" else "the CPU"
        presets.append(("laptop", f" (no CUDA device: {doing} on {where})", LAPTOP))
    for name, table in (("recipe", RECIPES), ("size", SIZES)):
        chosen = given.get(name, {k: v for *_, d in presets for k, v in d.items()}.get(name, block[name]))
        if chosen and chosen not in table:
            raise UserError(f"--{name}={chosen!r}: use one of {', '.join(table)}"
                            + (', or "" for the shape in the settings block' if name == "size" else ""))
        if chosen and table[chosen] and (name in given or not weights):
            presets.append((f"--{name}={chosen}", "", table[chosen]))
    shaped = any(k in given for k in (*SHAPE, "size"))  # a shape named is that shape, whole
    held = (*model_fields(block), "recipe", *RECIPES["modern"]) if weights else ()
    preset, source = {}, {}
    for name, _, values in presets:
        for k, v in values.items():
            whole = shaped and k in SHAPE and values is not SIZES.get(asked["size"])  # the command's shape
            if k not in given and k not in held and not whole:
                preset[k], source[k] = v, f"the {name} preset"
    preset = {k: v for k, v in preset.items() if v != block[k]}
    source = {**{k: source[k] for k in preset}, **dict.fromkeys(given, "this command")}
    cfg = {**absolute(block), **preset, **given}
    left_out = (f" (the command's shape, whole: {', '.join(f'{k}={cfg[k]}' for k in SHAPE)}; theirs left out)"
                if shaped else "")
    notes = [f"presets {'; '.join(name + why for name, why, _ in presets)}{left_out}: " + ", ".join(
        f"{k}={v!r}" for k, v in preset.items()) + " (--name=value sets any)"] if preset else []
    return cfg, source, notes


def weights_shape(cfg, source, given, fields):
    """cfg (in place) with the model fields of the weights it starts from; one the command names that differs
    is a UserError, as are a T beyond their positions and a recipe that would set model fields."""
    if set(RECIPES.get(given.get("recipe"), {})) & set(fields):
        raise UserError(f"--recipe={given['recipe']} sets model options the weights decide (--init_from): "
                        "drop it, and name what else you want of it (--optimizer=muon, --max_lr=...)")
    config, origin = model_config(cfg["init_from"], "--init_from"), cfg["init_from"]
    differ = [k for k in fields if k in given and given[k] != config[k]]
    if differ:
        raise UserError(f"{', '.join(f'{k}={given[k]}' for k in differ)} (this command), but {origin} has "
                        f"{', '.join(f'{k}={config[k]}' for k in differ)}: the weights decide the model's "
                        f"shape; drop {'them' if len(differ) > 1 else 'it'}, or start from scratch")
    if cfg["T"] > config["block_size"]:
        raise UserError(f"T={cfg['T']}, but {origin} has {config['block_size']} positions (block_size): use "
                        f"--T={config['block_size']} or less")
    source.update(dict.fromkeys((k for k in fields if config[k] != cfg[k]), "the weights"))
    cfg.update({k: config[k] for k in fields})


def continued(block, meta, given, log_dir):
    """(cfg, source, notes) of a resume: its checkpoint's settings, the block's lines edited since and this
    command's flags; what it cannot change, one UserError listing each."""
    model = dataclasses.asdict(GPTConfig(**meta["model_config"]))  # a field added since: its default
    saved = {**block, **{k: model[k] for k in model_fields(block)},
             **absolute({k: v for k, v in meta.get("settings", meta["config"]).items() if k in block})}
    ran = meta.get("block", block)  # the block that wrote it (none: older); a line added since: vs the run's
    edited = {k: v for k, v in block.items() if (ran[k] if k in ran else saved[k]) != v or k in RUNTIME}
    cfg = {**saved, **absolute(edited), **given, "log_dir": log_dir}  # the run's folder, where it is now
    cfg["init_from"] = saved["init_from"] if cfg["init_from"] == "resume" else cfg["init_from"]  # its origin
    source = {**dict.fromkeys(edited, "the settings block"), **dict.fromkeys(given, "this command")}
    fixed = [k for k in (*model_fields(block), *FIXED) if cfg[k] != saved[k]]
    if fixed:
        raise UserError(f"the run in {log_dir} has "
                        + ", ".join(f"{k}={saved[k]!r} (now {cfg[k]!r}, {source[k]})" for k in fixed)
                        + f", which a resume cannot change: restore {'them' if len(fixed) > 1 else 'it'} ("
                        + " ".join(f"--{k}={saved[k]}" for k in fixed)
                        + ") to continue that run, or start a fresh experiment with --log_dir=NEW")
    return cfg, source, []


def changes(resume, s, source, rt):
    """The NOTEs of what this start changes in the run it resumes, with where each came from; whether it is
    finished or its checkpoint's evaluation missing (resume, in place)."""
    resume.finished = resume.step >= s.max_steps
    # a step's checkpoint is written before its evaluation: an evaluation that failed is done first
    at_eval = resume.step % s.eval_interval == 0 or resume.finished
    resume.unevaluated = at_eval and not resume.meta["evaluated"]
    if resume.finished and not resume.unevaluated:  # said after the NOTEs
        resume.said = (f"the run in {s.log_dir} is already finished at step {resume.step} (max_steps="
                       f"{s.max_steps}): nothing to do. Raise --max_steps to train further, or start afresh "
                       "with --log_dir=NEW")
    saved, now = resume.meta["config"], dataclasses.asdict(s)
    changed = [f"{k} {saved[k]!r} -> {v!r} ({source.get(k, 'this machine')})" for k, v in now.items()
               if k in saved and saved[k] not in (v, "auto") and k != "log_dir"]
    notes = [f"changed since the checkpoint: {', '.join(changed)}"] if changed else []
    if (before := resume.meta["world_size"]) != rt.world_size:
        notes.append(f"processes changed since the checkpoint: {before} -> {rt.world_size}")
    moved = {k: saved[k] for k in now if k in saved and saved[k] != now[k]}  # any knob get_lr reads
    lr = lambda x: get_lr(resume.step, x.max_lr, x)  # noqa: E731  (the step's rate at max_lr's peak)
    was, new = lr(dataclasses.replace(s, **moved)), lr(s)
    if not math.isclose(was, new, rel_tol=0.01):
        schedule = ", ".join(f"{k} {v} -> {now[k]}" for k, v in moved.items()
                             if not math.isclose(lr(dataclasses.replace(s, **{k: v})), new))
        notes.append(f"the learning rate of step {resume.step + 1} is {new:.2e} on the new schedule, "
                     f"{was:.2e} on the run's ({schedule}): "
                     + ("it jumps up, then decays to the new end" if new > was else "it drops"))
    return notes


# ------------------------------------------------------------------------------------------------------------
# the checks, and the fits to this machine

def validate(cfg, rt):
    """The first setting that cannot work: a UserError naming the fix, before any model or log_dir exists."""
    if cfg["optimizer"] not in ("adamw", "muon"):
        raise UserError(f"--optimizer={cfg['optimizer']!r}: use adamw or muon")
    if set(filter(None, cfg["tracker"].split(","))) - set(TRACKERS):
        raise UserError(f"--tracker={cfg['tracker']!r}: use tensorboard or wandb, both as tensorboard,wandb, "
                        "or \"\" for none")
    if cfg["fsdp"]:
        validate_fsdp(cfg, rt)
    for key, bounds in RANGES.items():
        check_range(f"--{key}", cfg[key], *bounds)
    if cfg["T"] > cfg["block_size"] and cfg["init_from"] == "scratch":  # weights: weights_shape
        raise UserError(f"T={cfg['T']} exceeds block_size={cfg['block_size']}: lower T or raise block_size")
    row = cfg["T"] * rt.world_size  # tokens of one row on every process
    if cfg["total_batch_size"] % row:
        raise UserError(f"total_batch_size={cfg['total_batch_size']:,} is not a multiple of T*world_size = "
                        f"{cfg['T']}*{rt.world_size} = {row:,}: use a multiple of it, such as "
                        f"{max(1, round(cfg['total_batch_size'] / row)) * row:,}, or change T")


def validate_eval_only(found, init_from, log_dir):
    """resolve()'s checks of --eval_only=True, before any checkpoint is read: weights to evaluate, and a
    log_dir without a training run's checkpoints (found)."""
    if found:
        raise UserError(f"{log_dir} holds a training run's checkpoints: give --eval_only=True a log_dir of "
                        "its own (--log_dir=NEW)")
    if init_from in ("scratch", "resume"):
        raise UserError("--eval_only=True evaluates given weights: set --init_from to gpt2 (or gpt2-medium, "
                        "gpt2-large, gpt2-xl), an HF GPT-2 folder or a model_*.pt checkpoint")


def validate_fsdp(cfg, rt):
    """validate()'s checks of --fsdp=True."""
    if runtime.torch_older_than(runtime.MIN_TORCH):  # FSDP2 changed most before 2.9
        raise UserError(f"--fsdp=True needs torch >= 2.9 (on the CPU 2.6's FSDP2 fails and 2.7's and 2.8's "
                        f"sum the ranks' gradients instead of averaging them), this is {torch.__version__}: "
                        f"upgrade torch or drop --fsdp (DDP)")
    if cfg["optimizer"] == "muon":
        raise UserError("--optimizer=muon does not work with --fsdp=True: Muon orthogonalizes each whole "
                        "weight matrix and FSDP2 gives each rank a shard of it; drop --fsdp (DDP) or use "
                        "--optimizer=adamw (--recipe=modern's, and so a run's without a CUDA GPU, is muon)")
    if not rt.distributed:
        raise UserError("--fsdp=True shards the model over the processes torchrun starts: run it as "
                        "`torchrun --nproc_per_node=N train_gpt2.py --fsdp=True`")


def fit(cfg, source, given, rt):
    """The NOTEs of fitting cfg (in place) to this machine: B to the processes and the GPU's memory,
    compile to what works here, val_tokens to the validation split; and of a likely mistake."""
    if cfg["val_tokens"] < cfg["T"]:  # no whole row: the loss would be the mean of nothing
        raise UserError(f"--val_tokens={cfg['val_tokens']} is less than one row of T={cfg['T']} tokens: "
                        f"give at least {cfg['T']}")
    rows = split_rows(cfg["data_root"], "val", cfg["T"])  # a data_root not there: one line naming the fix
    if rows == 0:  # nothing to evaluate on: stop before saying what would be evaluated
        raise UserError(f"the validation split of {cfg['data_root']} holds no row of T+1 = {cfg['T'] + 1} "
                        "tokens: lower T, or give it more text")
    notes = []
    if cfg["total_batch_size"] % (cfg["B"] * cfg["T"] * rt.world_size):
        notes += fit_batch(cfg, source, given, rt)
    if rt.memory is not None:  # a CUDA GPU: a B it holds, found before minutes of compiling
        notes += fit_memory(cfg, source, given, rt, model_shape(cfg))
    if cfg["compile"]:
        notes += fit_compile(cfg, source, rt)
    if cfg["val_tokens"] // cfg["T"] > rows:
        notes.append(f"val_tokens={cfg['val_tokens']:,} but the validation split holds {plural(rows, 'row')} "
                     f"of {cfg['T']} tokens: evaluating on those, once each")
        cfg["val_tokens"], source["val_tokens"] = rows * cfg["T"], "the validation split"
    if cfg["warmup_steps"] >= cfg["max_steps"] and not cfg["eval_only"]:
        notes.append(f"warmup_steps={cfg['warmup_steps']} >= max_steps={cfg['max_steps']}: the learning "
                     f"rate climbs for the whole run, to max_lr={cfg['max_lr']:g} at most, and never decays "
                     "(lower --warmup_steps)")
    return notes


def fit_batch(cfg, source, given, rt):
    """fit()'s B that does not divide the batch: the largest that does (this command's: a UserError)."""
    fits = micro_batches(cfg["total_batch_size"], cfg["T"], rt.world_size)
    where = plural(rt.world_size, "process", "processes")
    whole = (f"total_batch_size={cfg['total_batch_size']:,} into whole micro-steps of {cfg['T']} tokens x "
             f"{where}")
    if "B" in given:
        raise UserError(f"--B={cfg['B']} does not divide {whole}: use one of {', '.join(map(str, fits[:6]))}")
    b = next(b for b in fits if b <= cfg["B"])  # the largest B that keeps the batch whole
    note = f"B={b}: B={cfg['B']} does not divide {whole} (set --B to choose)"
    cfg["B"], source["B"] = b, f"a fit to {where}"
    return [note]


def fit_compile(cfg, source, rt):
    """fit()'s compile=True where torch.compile cannot run: eager, with the NOTE saying why."""
    why = "mps" if rt.kind == "mps" else runtime.compile_blocker(rt)
    if not why:
        return []
    cfg["compile"], source["compile"] = False, "this machine"
    return ["compile=True: torch.compile is not used on Apple GPUs (mps); running eager" if why == "mps" else
            f"compile=True but {runtime.eager_note(why)}"]


def fit_memory(cfg, source, given, rt, config):
    """fit()'s B against the GPU's memory by accounting.py's estimate of the step that runs: one that does not
    fit is lowered to the largest that does (more accumulation steps), unless this command named it."""
    budget = 0.9 * rt.memory  # the rest: CUDA context, NCCL buffers, allocator slack
    sizes = micro_batches(cfg["total_batch_size"], cfg["T"], rt.world_size)
    need = {b: memory_estimate(config, cfg, rt, b) for b in sizes}
    if need[cfg["B"]] <= budget:
        return []
    fits = next((b for b in need if b < cfg["B"] and need[b] <= budget), None)
    said = (f"B={cfg['B']} needs an estimated {need[cfg['B']] / 2**30:.1f} GiB per process of the GPU's "
            f"{rt.memory / 2**30:.1f} GiB")
    if fits is None:
        return [f"{said}, and no smaller B fits: expect to run out of memory (try --grad_checkpoint=True, or "
                f"--fsdp=True over more GPUs)"]
    if "B" in given:
        return [f"{said}: it may run out of memory; --B={fits} fits the estimate"]
    cfg["B"], source["B"] = fits, "a fit to the GPU's memory"
    return [f"{said}: using B={fits}, the largest that fits (set --B to choose)"]


# ------------------------------------------------------------------------------------------------------------
# the command line, and --help from the settings block

def runtime_options(Settings, given):
    """runtime.setup's arguments, needed first: this machine's device, dtype and collective timeout."""
    asked = {**block_of(Settings), **given}
    check_range("--collective_timeout", asked["collective_timeout"], *RANGES["collective_timeout"])
    return dict(device=asked["device"], dtype=asked["dtype"], timeout=asked["collective_timeout"])


def parse_overrides(argv, Settings, script):
    """{name: value} of the command line's --name=value (or --name value) pairs, each a setting's name and of
    its type; --help prints the settings and exits."""
    block, overrides, argv = block_of(Settings), {}, list(argv)
    while argv:
        arg = argv.pop(0)
        if arg in ("-h", "--help"):
            print(block_help(script, block, RANGES))
            raise SystemExit(0)
        if not arg.startswith("--") or arg == "--":
            raise UserError(f"expected --name=value, got {arg!r} (python train_gpt2.py --help lists the "
                            f"settings)")
        key, eq, value = arg[2:].partition("=")
        if not eq:  # --name value
            if not argv or argv[0].startswith("--"):
                raise UserError(f"--{key} needs a value: --{key}=VALUE")
            value = argv.pop(0)
        if key not in block:
            close = difflib.get_close_matches(key, block, n=1) or [k for k in block if key in k.split("_")]
            hint = f"; did you mean --{close[0]}?" if close else " (python train_gpt2.py --help lists them)"
            raise UserError(f"unknown setting {key!r}{hint}")
        try:
            overrides[key] = convert(value, type(block[key]))
        except ValueError:
            kind = {bool: "True or False", int: "a whole number"}.get(type(block[key]), "a number")
            raise UserError(f"--{key}={value!r} is not {kind}") from None
    return absolute(overrides)


def convert(value, kind):
    """A flag's text as its setting's type (a bool: True/False/1/0; an int: a whole number, 1e8 too)."""
    if kind is bool:
        if value.lower() not in ("true", "false", "1", "0"):
            raise ValueError(value)
        return value.lower() in ("true", "1")
    if kind is int and not float(value).is_integer():
        raise ValueError(value)
    return int(float(value)) if kind is int else kind(value)


def absolute(values):
    """values with each path naming an existing file or folder made absolute (a resume may run elsewhere)."""
    return {k: os.path.abspath(v) if k in PATHS and v not in ("", "scratch", "resume")
            and (os.path.exists(v) or v.endswith(".pt")) else v for k, v in values.items()}  # .pt: gone since
