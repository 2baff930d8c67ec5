"""A training run's settings, resolved once at start-up, before any model is built: the settings block at the
top of train_gpt2.py (where users edit them), then the command line (--name=value; a resume: the run's own
flags, then this command's), the size and recipe presets, the fallbacks without data or a GPU, the checks
(resolve); once the run to continue is known (checkpoint.continue_run), the micro-batch that fits the GPU and
what a resume changes (fit). The result is one frozen Settings, holding the device and dtype that run (no
"auto" left), which the log records as it ran. Nothing here starts a process group or locks a folder:
train_gpt2.py's main() does, in plain sight.

The rule: what the user edited in the settings block or named on a command line is what runs. The presets
and the fallbacks fill in only the settings left at the shipped recipe's value (SHIPPED); a resume runs as if
the run's own command were typed again with this command's flags after it.

A setting that cannot work is a UserError naming it and the fix; one that works but is likely a mistake, or
that a fallback changed, is a NOTE printed as it is decided.
"""
import ast
import dataclasses
import difflib
import os
from typing import NamedTuple

import torch

from dataloader import missing_data_root, split_rows
from gptlib import runtime
from gptlib.accounting import count_params, training_memory
from gptlib.checkpoint import (MODEL, PATHS, block_of, recorded_flags, refuse_fixed, resume_changes,
                               same_path, space_note)
from gptlib.errors import UserError, check_range, valid_range
from gptlib.runtime import broadcast_object, print0
from gptlib.trackers import TRACKERS
from model import GPT2_SIZES, GPT2_VOCAB, GPTConfig

# --recipe=modern: the changes nanochat and modded-nanogpt make to GPT-2, each overridable (--rotary=False);
# nanochat's head learning rate (its embedding's 0.2 is for embeddings of std 1: ours start at 0.02)
RECIPES = {"gpt2": {**{name: False for name in GPTConfig.MODERN}, "optimizer": "adamw", "embed_lr": 0.0,
                    "head_lr": 0.0},
           "modern": {**{name: True for name in GPTConfig.MODERN}, "optimizer": "muon", "max_lr": 6e-3,
                      "embed_lr": 0.004, "head_lr": 0.004}}
PEAK_LR = {"124M": 6e-4, "350M": 3e-4, "774M": 2.5e-4, "1558M": 2e-4}  # GPT-3's table, for those model sizes
SIZES = {name: {**shape, "n_kv_head": shape["n_head"], "max_lr": PEAK_LR[name]}
         for name, shape in GPT2_SIZES.items()}
FINEWEB_DIR = "edu_fineweb10B"  # the shipped data_root: only this one falls back to input.txt when missing
# The shipped recipe (GPT-2 124M on FineWeb-Edu with a GPU) of every setting a preset or a fallback sets: one
# left at this value in the settings block and on the command line is untouched, theirs to fill in. The
# block is where users edit them; a test checks that it ships these values.
SHIPPED = {**SIZES["124M"], **RECIPES["gpt2"], "size": "", "recipe": "gpt2", "data_root": FINEWEB_DIR,
           "total_batch_size": 2**19, "B": 64, "T": 1024, "max_steps": 19073, "warmup_steps": 715,
           "eval_interval": 250, "val_tokens": 20 * 2**19, "hellaswag": 10042, "checkpoint_interval": 5000,
           "compile": True}
SHAKESPEARE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                           "input.txt")
SHAKESPEARE_CONFIG = dict(  # input.txt is ~300k tokens: small steps (its 10% val split must hold one)
    data_root=SHAKESPEARE, total_batch_size=4096, B=8, T=256, max_steps=300, warmup_steps=30,
    eval_interval=100, val_tokens=32768, checkpoint_interval=300)
CPU_CONFIG = dict(  # without a CUDA GPU (a CPU, an Apple GPU): the modern recipe, 4 x 64, 150 steps: the
    # best held-out bpb that ran in less than nanoGPT's laptop recipe's time on 2 cores (dev/cpu_sweep.py);
    # validated once, at the end, on the whole of input.txt's validation split (256 rows of 128)
    recipe="modern", **{k: v for k, v in RECIPES["modern"].items() if k != "max_lr"}, total_batch_size=2048,
    B=16, T=128, n_layer=4, n_head=4, n_kv_head=4, n_embd=64, warmup_steps=20, max_steps=150,
    eval_interval=150, val_tokens=32768, hellaswag=0, checkpoint_interval=150, compile=False)
CPU_MAX_LR = {"modern": 6e-3, "gpt2": 3e-3}  # the laptop's peak learning rate of each recipe (laptop())
# the valid values of every numeric setting, as check_range's (low, high, above) bounds
RANGES = {**{k: (1, None, None) for k in ("total_batch_size", "B", "T", "block_size", "n_layer", "n_head",
                                          "n_kv_head", "n_embd", "max_steps", "eval_interval", "val_tokens",
                                          "checkpoint_interval", "keep_checkpoints", "collective_timeout")},
          **{k: (0, None, None) for k in ("warmup_steps", "hellaswag", "embed_lr", "head_lr", "weight_decay",
                                          "seed", "eval_B", "core")},
          **{k: (None, None, 0) for k in ("max_lr", "muon_lr", "grad_clip", "loss_scale")},
          "vocab_size": (GPT2_VOCAB, None, None), "min_lr_ratio": (0, 1, None)}  # vocab: GPT-2's tokens fit
KINDS = {bool: "True or False", int: "a whole number", float: "a number", str: "text"}


def settings_type(block):
    """The frozen dataclass of a settings block ({name: default}): s.B, s.max_lr, ..., read-only."""
    return dataclasses.make_dataclass("Settings", [(k, type(v), v) for k, v in block.items()], frozen=True)


# ------------------------------------------------------------------------------------------------------------
# the whole resolution, in order

class Recorded(NamedTuple):
    """What a resume replays of the run in log_dir (run_flags): its commands' flags, the settings it ran with
    (its files among them), and NOTEs about them."""
    flags: dict = {}  # the --NAME=VALUE flags of its commands (the first command's, then each resume's)
    config: dict = {}  # the settings it ran with: {} without a run
    notes: list = []


def run_flags(Settings, given):
    """Recorded: what the run in log_dir replays before this command's flags (given), from its newest
    checkpoint; nothing for a command that starts afresh or only evaluates (refused later, in its own
    words)."""
    if given.get("init_from") == "scratch" or given.get("eval_only"):
        return Recorded()
    block = block_of(Settings)
    recorded, config, path = recorded_flags(given.get("log_dir", block["log_dir"]))
    if recorded is None:  # written before the flags were recorded
        return Recorded({}, config, [f"{path} predates recorded command lines: this resume runs with this "
                                     f"command's flags alone, so repeat every --NAME=VALUE the run's first "
                                     f"command named"])
    takes = {k: {type(v), int} if type(v) is float else {type(v)} for k, v in block.items()}  # 1 for 1.0
    unknown = [k for k, v in recorded.items() if type(v) not in takes.get(k, ())]
    if unknown:
        raise UserError(f"{path} was started with --{unknown[0]}={recorded[unknown[0]]!r}, which this "
                        f"train_gpt2.py does not take: continue it with the code that wrote it, or start "
                        f"afresh with --log_dir=NEW")
    return Recorded(recorded, config)


def runtime_options(Settings, recorded, given):
    """runtime.setup's arguments from the settings block and the flags (the run's recorded, then this
    command's): the device, the dtype and the collective timeout, which setting up the processes needs before
    anything else."""
    asked = {**block_of(Settings), **recorded.flags, **given}
    check_range("--collective_timeout", asked["collective_timeout"], *RANGES["collective_timeout"])
    return dict(device=asked["device"], dtype=asked["dtype"], timeout=asked["collective_timeout"])


def resolve(Settings, recorded, given, rt):
    """(settings, chosen, notes): the settings block, then what the run in log_dir recorded (Recorded) and
    this command's flags (given), the presets, the fallbacks and every check (combine), for this runtime;
    chosen: {name: where the user chose it}. Each NOTE (the runtime's, then the recorded run's, then
    combine's) is printed and returned for the log. Under torchrun the recorded run is rank 0's: a node that
    does not see log_dir reads none (its device, dtype and collective_timeout came from its flags already:
    name those again if the run's first command did)."""
    if rt.distributed:
        recorded = Recorded(*broadcast_object(tuple(recorded), rt.patient))
    s, chosen, own = combine(Settings, recorded, given, rt)
    notes = rt.notes + recorded.notes + own
    for note in notes:
        print0(f"NOTE: {note}")
    return s, chosen, notes


def fit(s, chosen, rt, resume):
    """(settings, notes) once the run to continue (resume, or None) and the weights' shape are known: the
    micro-batch that fits the GPU, the disk's room for checkpoints and the validation split's size, then
    what a resume changes from its saved settings (after the fits: a setting start-up lowers again, B or
    val_tokens, is no change; chosen says where a change came from) and a warm-up that outlasts the run. Each
    NOTE is printed and returned for the log."""
    s, notes = fit_memory(s, chosen, rt)  # a B the GPU holds, found before minutes of compiling
    if not s.eval_only:
        notes += space_note(s.log_dir, count_params(model_shape(s)))
    s, val_notes = one_validation_pass(s)
    notes += val_notes
    if resume is not None:  # what it cannot take was refused in combine (refuse_fixed)
        notes += resume_changes(resume, s, chosen, rt.world_size, first_start(resume.meta["config"]))
    if not s.eval_only and s.warmup_steps >= s.max_steps:
        notes.append(f"warmup_steps={s.warmup_steps} >= max_steps={s.max_steps}: the learning rate climbs "
                     f"for the whole run and never reaches max_lr={s.max_lr:g} (lower --warmup_steps)")
    for note in notes:
        print0(f"NOTE: {note}")
    return s, notes


def model_shape(s):
    """The GPTConfig of settings s: the model a run from scratch builds (a resume or fine-tune has its
    weights' shape in s by then, so this is theirs too)."""
    return GPTConfig(**{k: getattr(s, k) for k in MODEL}, **how_it_trains(s))


def how_it_trains(s):
    """The GPTConfig fields that change how the model trains, not what it computes: a run's own, whatever
    the weights it starts from."""
    return {"grad_checkpoint": s.grad_checkpoint}


# ------------------------------------------------------------------------------------------------------------
# the command line, and --help from the settings block

def settings_help(Settings, script):
    """--help: the script's docstring, then each setting with its default and the comments beside or above it,
    read from the settings block of the script (so it cannot drift from it)."""
    with open(script, encoding="utf-8") as f:
        source = f.read()
    block = source.split("# settings:", 1)[1].split("\n# ---", 1)[0].splitlines()[1:]
    lines, above, block_defaults = [], [], block_of(Settings)
    for line in block:
        code, _, comment = line.partition("  # ") if not line.startswith("#") else ("", "", line[2:])
        if not code:
            above.append(comment)
            continue
        name = code.split(" = ")[0]
        valid = f" ({valid_range(*RANGES[name])})" if name in RANGES else ""
        lines.append(f"  --{name}={block_defaults[name]!r}".ljust(34) + " ".join(above + [comment]).strip()
                     + valid)
        above = []
    name = os.path.basename(script)
    return (f"{ast.get_docstring(ast.parse(source)).strip()}\n\nSettings (--name=value or --name value; the "
            f"defaults are the settings block at the top of {name}):\n" + "\n".join(lines))


def parse_overrides(argv, Settings, script):
    """{name: value} of the command line's --name=value (or --name value) pairs, each checked against the
    settings' names and converted to its type; --help prints the settings and exits."""
    block, overrides, argv = block_of(Settings), {}, list(argv)
    while argv:
        arg = argv.pop(0)
        if arg in ("-h", "--help"):
            print(settings_help(Settings, script))
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
        kind = type(block[key])
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
            raise UserError(f"--{key}={value!r} is not {KINDS[kind]} (default: {block[key]!r})") from None
    return absolute(overrides)


def absolute(values):
    """values with each path setting that names an existing file or folder made absolute: a path is relative
    to the folder the command runs from, and a resume may run from another (its flags and settings record
    the file itself)."""
    return {k: os.path.abspath(v) if k in PATHS and v not in ("", "scratch", "resume") and os.path.exists(v)
            else v for k, v in values.items()}


# ------------------------------------------------------------------------------------------------------------
# presets, fallbacks, checks

def combine(Settings, recorded, given, rt):
    """(settings, chosen, notes): the settings block, then the run's recorded files and flags and this
    command's (given), the size and recipe presets, the fallbacks without data or a GPU, what a resume cannot
    change, the checks, and whether torch.compile works here, in that order, with the device kind and dtype rt
    runs. chosen: {name: where} of each setting the user chose, which the presets and fallbacks keep: edited
    in the block (off SHIPPED), named by a command, or set by a preset that was. The run's files (PATHS) as
    its first start resolved them are the run's, wherever this command runs from, unless it names others. A
    setting that cannot work is a UserError."""
    block, saved = block_of(Settings), recorded.config
    files = {k: saved[k] for k in PATHS if k in saved}
    chosen = {**{k: "the settings block" for k, v in SHIPPED.items() if block[k] != v},
              **dict.fromkeys(recorded.flags, "the run's command"), **dict.fromkeys(given, "this command")}
    asked = {**absolute(block), **files, **recorded.flags, **given}
    if asked["init_from"] == "resume" and files.get("init_from", "scratch") not in ("scratch", "resume"):
        asked["init_from"] = files["init_from"]  # the run, a fine-tune: its weights decide the model
    cfg, chosen = apply_presets(asked, chosen)
    cfg, notes = apply_fallbacks(cfg, chosen, rt)
    if saved:  # before the checks, which would blame a flag the run's own command named
        refuse_fixed(saved, cfg, chosen, block, first_start(saved))
    validate(cfg, rt)
    if cfg["compile"] and rt.kind == "mps":
        notes.append("compile=True: torch.compile is not used on Apple GPUs (mps); running eager")
        cfg["compile"] = False
    elif cfg["compile"] and (why := runtime.compile_blocker(rt)):
        notes.append(f"compile=True but {runtime.eager_note(why)}")
        cfg["compile"] = False
    return Settings(**{**cfg, "device": rt.kind, "dtype": rt.dtype}), chosen, notes


def first_start(saved):
    """{name: what set it when the run started} of the settings the run's first start filled in by what it
    recorded: a fallback's value where that fallback ran (a device without CUDA; the data_root input.txt),
    else a fit for B and val_tokens; a resume that sets one otherwise says so (checkpoint.source)."""
    ran = {"no-CUDA": laptop(saved.get("recipe", "gpt2")) if saved.get("device") in ("cpu", "mps") else {},
           "no-shards": SHAKESPEARE_CONFIG if same_path(saved.get("data_root", ""), SHAKESPEARE) else {}}
    started = {}
    for k, v in saved.items():
        fell = [name for name, small in ran.items() if k in small and small[k] == v]
        if fell or k in ("B", "val_tokens"):
            started[k] = f"the {fell[0]} fallback" if fell else "a fit to that machine"
    return started


def laptop(recipe):
    """The no-CUDA fallback's settings (CPU_CONFIG) with the peak learning rate of recipe."""
    return {**CPU_CONFIG, "max_lr": CPU_MAX_LR[recipe]}


def apply_presets(cfg, chosen):
    """(cfg, chosen) with the size preset's and then the recipe's settings where the user chose none. A
    preset the user chose counts as choosing its settings (the fallbacks keep them)."""
    if cfg["size"] and cfg["size"] not in SIZES:
        raise UserError(f"--size={cfg['size']!r}: use one of {', '.join(SIZES)}, or \"\" for the settings "
                        f"n_layer, n_head, n_kv_head, n_embd and max_lr as they are")
    if cfg["recipe"] not in RECIPES:
        raise UserError(f"--recipe={cfg['recipe']!r}: use gpt2 (GPT-2's) or modern")
    for name, presets in (("size", SIZES), ("recipe", RECIPES)):
        preset = {k: v for k, v in presets.get(cfg[name], {}).items() if k not in chosen}
        cfg = {**cfg, **preset}
        if name in chosen:
            chosen = {**chosen, **{k: f"--{name}={cfg[name]}" for k in preset}}
    return cfg, chosen


def apply_fallbacks(cfg, chosen, rt):
    """(cfg, notes): without shards at the shipped data_root, train on input.txt (a plain `python` run only:
    under torchrun that is a mistake); without a GPU, a small model (unless the run starts from weights:
    theirs). Both with settings to match, where the user chose none (chosen); one NOTE names what they
    changed and what they kept. Their batch is a fixed number of tokens, whatever the number of processes (so
    a resume may change it, as B): B is lowered where needed to keep it whole, with its own NOTE."""
    small, why, notes = {}, [], []
    doing = "evaluating" if cfg["eval_only"] else "training"
    no_shards = ("data_root" not in chosen and cfg["data_root"] == FINEWEB_DIR
                 and not os.path.exists(FINEWEB_DIR))
    if no_shards:
        if rt.distributed:
            raise UserError(f"no shards in {os.path.abspath(FINEWEB_DIR)} (data_root is relative to the "
                            f"directory you run from): make them there with `python fineweb.py`, pass "
                            f"--data_root=PATH, or try it on Shakespeare with --data_root=input.txt")
        notes.append(f"no shards in {FINEWEB_DIR}/ (run `python fineweb.py` to make them): {doing} on "
                     "input.txt")
    # the fallback's input.txt, or a resume's of a run it gave input.txt
    if no_shards or "data_root" not in chosen and same_path(cfg["data_root"], SHAKESPEARE):
        small.update(SHAKESPEARE_CONFIG)
        why.append("input.txt")
    if rt.kind != "cuda":  # a laptop's: an Apple GPU runs eager in fp32, sharing the laptop's memory
        where = "an Apple GPU (mps)" if rt.kind == "mps" else "the CPU"
        notes.append(f"no CUDA device: {doing} on {where}")
        small.update(laptop(cfg["recipe"] if "recipe" in chosen else "modern"))
        why.append(where)
    if cfg["init_from"] not in ("scratch", "resume"):  # weights: the model, and so its recipe, are theirs
        small = {k: v for k, v in small.items() if k not in MODEL + ("recipe",) + tuple(RECIPES["modern"])}
    changed = {k: v for k, v in small.items() if k not in chosen and cfg[k] != v}
    kept = {}  # {where: ["name=value", ...]} of the settings these would set that the user chose
    for k in (k for k in small if k in chosen):
        kept.setdefault(chosen[k], []).append(f"{k}={cfg[k]!r}")
    if changed:
        notes.append(f"settings for {' and '.join(why)}: "
                     + ", ".join(f"{k}={v!r}" for k, v in changed.items())
                     + "".join(f"; kept from {where}: {', '.join(names)}" for where, names in kept.items()))
    cfg = {**cfg, **changed}
    fits = micro_batches(cfg["total_batch_size"], cfg["T"], rt.world_size)
    if "B" not in chosen and fits and cfg["total_batch_size"] % (cfg["B"] * cfg["T"] * rt.world_size):
        b = next((b for b in fits if b <= cfg["B"]), cfg["B"])  # the largest B that keeps the batch whole
        notes.append(f"B={b}: B={cfg['B']} does not divide total_batch_size={cfg['total_batch_size']:,} "
                     f"into whole micro-steps of {cfg['T']} tokens x {rt.world_size} processes (set --B to "
                     "choose)")
        cfg["B"] = b
    return cfg, notes


def validate(cfg, rt):
    """The first setting that cannot work is a UserError naming the fix, raised before any model or log_dir
    exists (settings that work but are likely mistakes get their NOTE in fit)."""
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
                        "--optimizer=adamw (--recipe=modern's, and so a run's without a CUDA GPU, is muon)")
    if cfg["eval_only"] and cfg["init_from"] in ("scratch", "resume"):
        raise UserError("--eval_only=True evaluates given weights: set --init_from to gpt2 (or gpt2-medium, "
                        "gpt2-large, gpt2-xl), an HF GPT-2 folder or a model_*.pt checkpoint")
    if cfg["fsdp"] and not rt.distributed:
        raise UserError("--fsdp=True shards the model over the processes torchrun starts: run it as "
                        "`torchrun --nproc_per_node=N train_gpt2.py --fsdp=True`")
    if os.path.exists(cfg["log_dir"]) and not os.path.isdir(cfg["log_dir"]):
        raise UserError(f"--log_dir={cfg['log_dir']} is a file, not a directory: choose another --log_dir")
    if not os.path.exists(cfg["data_root"]):
        raise UserError(missing_data_root(cfg["data_root"]))
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


def micro_batches(total_batch_size, T, world_size):
    """The micro-batch sizes B that keep total_batch_size whole with this T and number of processes, largest
    first."""
    rows = total_batch_size // (T * world_size)  # rows of T tokens per process and step
    return [b for b in range(rows, 0, -1) if rows % b == 0]


# ------------------------------------------------------------------------------------------------------------
# what the hardware and the data hold

def memory_estimate(s, rt, B):
    """accounting.py's training memory per process in bytes at micro-batch B, for the settings' model, dtype,
    wrapping (FSDP shards over the ranks) and step (compiled or eager: what torch.compile keeps differs)."""
    return training_memory(model_shape(s), B, s.T, s.dtype, rt.world_size if s.fsdp else 1,
                           compiled=s.compile)["total"]


def fit_memory(s, chosen, rt):
    """(settings, notes): B checked against the GPU's memory by accounting.py's estimate of the step that
    runs (compiled or eager), before minutes of compiling. A B that does not fit is lowered to the largest
    that does and keeps total_batch_size whole (more accumulation steps), unless B was given on the command
    line or edited in the block (chosen): then a NOTE warns."""
    if rt.memory is None:  # not a CUDA GPU
        return s, []
    budget = 0.9 * rt.memory  # the rest: CUDA context, NCCL buffers, allocator slack
    need = {b: memory_estimate(s, rt, b) for b in micro_batches(s.total_batch_size, s.T, rt.world_size)}
    if need[s.B] <= budget:
        return s, []
    fits = next((b for b in need if b < s.B and need[b] <= budget), None)
    said = (f"B={s.B} needs an estimated {need[s.B] / 2**30:.1f} GiB per process of the GPU's "
            f"{rt.memory / 2**30:.1f} GiB")
    if fits is None:
        return s, [f"{said}, and no smaller B fits: expect to run out of memory (try --grad_checkpoint=True, "
                   f"or --fsdp=True over more GPUs)"]
    if "B" in chosen:
        return s, [f"{said}: it may run out of memory; --B={fits} fits the estimate"]
    return dataclasses.replace(s, B=fits), [f"{said}: using B={fits}, the largest that fits (set --B to "
                                            f"choose)"]


def one_validation_pass(s):
    """(settings, notes): val_tokens at most the validation split's rows of T tokens, so no row counts
    twice."""
    if s.val_tokens < s.T:  # no whole row: the loss would be the mean of nothing
        raise UserError(f"--val_tokens={s.val_tokens} is less than one row of T={s.T} tokens: give at least "
                        f"{s.T}")
    rows = split_rows(s.data_root, "val", s.T)
    if rows == 0:  # nothing to evaluate on: stop before saying what would be evaluated
        raise UserError(f"the validation split of {s.data_root} holds no row of T+1 = {s.T + 1} tokens: "
                        "lower T, or give it more text")
    if s.val_tokens // s.T <= rows:
        return s, []
    return dataclasses.replace(s, val_tokens=rows * s.T), [
        f"val_tokens={s.val_tokens:,} but the validation split holds {rows:,} rows of {s.T} tokens: "
        f"evaluating on those, once each"]
