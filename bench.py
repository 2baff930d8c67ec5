"""The acceleration ladder: GPT-2 training throughput as each speed-up is switched on, measured; and every
GPU figure docs/speed.md quotes, in one command.

    python bench.py                      # CUDA: GPT-2 124M, B=16, T=1024; CPU: a small model (a smoke test)
    python bench.py --B 32 --out bench.md
    python bench.py --skip compile       # leave a rung's switch off in every later rung too
    python bench.py --trace trace.json   # also the profiled steps, for ui.perfetto.dev
    python bench.py --only generation    # generate(): KV-cache (compiled, CUDA graph) vs recomputing
    python bench.py --only core --hellaswag_data hellaswag_val.jsonl   # core_eval.py on 31,351 examples
    python bench.py --only step --B 32   # the training step as train_gpt2.py runs it (default B=64)
    python bench.py --only levers --levers flash,coordinate   # variants of that step, A/B'd in turns
    python bench.py --report gpu_report --hellaswag_data hellaswag_val.jsonl   # everything: report.md
    python bench.py --report gpu_report --peer ../llm.c/train_gpt2.py         # and llm.c's reference

Rungs are cumulative: fp32 eager -> +TF32 -> +bf16 autocast -> +fused attention (SDPA: flash, or cuDNN's on
an H100, instead of the explicit masked softmax) -> +torch.compile -> +vocab 50304 -> +fused AdamW. Each is
timed over train_gpt2.py's own training step (train_step: forward, backward, clip, AdamW) on fixed random
tokens, warm-up steps (and compiling) excluded, the GPU synchronised around each step, the median and the
range reported (a rung that runs out of memory says so). Then: where the last rung's step time goes
(torch.profiler: cross-entropy, attention, optimizer, matmuls, the rest, idle), KV-cache generation vs full
recomputation and where a decode step's time goes (sampling, attention, matmuls, copies, the rest, the
host's gaps) against the time its bytes take at the memory bandwidth, accounting.py's memory estimate vs
the peaks measured (eager and compiled), the micro-batch each card holds by it, and the fused softmax kernel
(fused_softmax.py) in GB/s against the memory bandwidth, at two row lengths. The last line says how long
the process spent compiling and warming up. --only levers: each of LEVERS (SDPA forced to a backend,
Inductor's coordinate descent, max-autotune) a variant of the step timed in turns against it; one wins at 3%
or more without more memory, and only then becomes a setting.

--report DIR runs gpu_report.sections(), each in its own process, keeping each one's raw output beside
DIR/report.md, which names the GPU, the versions, the date and the commit.
"""
import contextlib
import dataclasses
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import torch
from torch._inductor import config as inductor_config
from torch.nn.attention import SDPBackend, sdpa_kernel

from gptlib import gpu_check, runtime
from gptlib.accounting import count_params, memory_bandwidth, mfu, peak_flops, training_memory
from gptlib.engine import Engine, own_copy, pick
from gptlib.errors import UserError, check_range, command_line, main_guard
from gptlib.optimizers import ROLES, make_optimizers
from gptlib.runlog import metrics_path, read_log
from gptlib.runtime import TORCH_DTYPES, autocast, device_name, is_out_of_memory, synchronize
from model import GPT, GPT2_SIZES, GPTConfig
from train_gpt2 import CONFIG, Models, train_step

ROOT = os.path.dirname(os.path.abspath(__file__))
RUNGS = [  # (name, the switch it turns on); each rung keeps the switches of the rungs above it. Fused
    # attention comes before compile (the reproductions turn it on after): then only two rungs compile a graph
    # of their own (the fused AdamW rung's is the vocab rung's, a cache hit), ~45 s less on an H100
    ("fp32", {}), ("tf32", {"tf32": True}), ("bf16", {"bf16": True}), ("flash", {"flash": True}),
    ("compile", {"compile": True}), ("vocab", {"vocab_size": 50304}), ("fused", {"fused": True}),
]
BASE = {"tf32": False, "bf16": False, "compile": False, "flash": False, "vocab_size": 50257, "fused": False}
LABEL = {"fp32": "fp32, eager", "tf32": "+ TF32 matmuls", "bf16": "+ bf16 autocast",
         "flash": "+ fused attention (SDPA)", "compile": "+ torch.compile", "vocab": "+ vocab 50304",
         "fused": "+ fused AdamW"}


def fmt_bytes(n):
    return "n/a" if n is None else f"{n / 2**30:.2f} GiB"


def spread(times):
    """The range of step times, in ms."""
    return f"{min(times) * 1000:.1f}-{max(times) * 1000:.1f}"


def shown(lines):
    """lines, printed at once (a part's rows appear as each is measured)."""
    print("\n".join(lines), flush=True)
    return lines


def timed(fn, device="cpu"):
    """(fn(), its seconds), the device synchronised before and after (host work: the default)."""
    synchronize(device)
    t0 = time.perf_counter()
    out = fn()
    synchronize(device)
    return out, time.perf_counter() - t0


def build(size, s, device):
    torch.manual_seed(0)
    return GPT(GPTConfig(**size, vocab_size=s["vocab_size"], flash=s["flash"])).to(device)


def training_step(size, s, B, T, rt, lever=None):
    """A closure running train_gpt2.py's training step (one micro-step: forward, backward, clip, AdamW) with
    the rung's settings s, GPT-2's AdamW at 6e-4. Dynamo's caches are emptied first: each rung compiles
    afresh. lever: a name of LEVERS, the step a variant of s's; its compiled forward a code object of its own
    (Dynamo's caches are a code object's, and their guards miss what a lever changes: a second model would
    run the first one's graph), the caches kept (the default's graphs stay, for the A/B in turns)."""
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = s["tf32"]
    how = LEVERS[lever][1] if lever else {}
    if lever is None:
        torch._dynamo.reset()
    rung = dataclasses.replace(rt, dtype="bf16" if s["bf16"] else "fp32")
    model = build(size, s, rt.device)
    opts = make_optimizers(model, "adamw", 0.1, dict.fromkeys(ROLES, 6e-4), fused=s["fused"])
    no_scaling = torch.amp.GradScaler(rt.kind, enabled=False)
    compiled = model
    if s["compile"]:
        compiled = torch.compile(own_copy(model.forward) if lever else model,
                                 **{k: v for k, v in how.items() if k in ("mode", "options")})
    models = Models(model, compiled, compiled, s["compile"])
    batch = [tuple(torch.randint(0, 50257, (B, T), device=rt.device) for _ in "xy")]  # fixed random tokens
    def step():  # an SDPA backend is chosen when the graph is traced
        with sdpa_kernel(getattr(SDPBackend, how["sdpa"])) if "sdpa" in how else contextlib.nullcontext():
            return train_step(batch, models, opts, no_scaling, rung, 1.0)
    return step


WARMING = [0.0]  # seconds this process spent compiling and warming up: its first calls' time over the rest


def settled(times, warmup):
    """The median of times after the first `warmup`; what those first took over as many settled ones (the
    compiling and warming up) goes to WARMING."""
    median = statistics.median(times[warmup:])
    WARMING[0] += max(0.0, sum(times[:warmup]) - warmup * median)
    return median


def time_steps(step, device, steps, warmup):
    """(median seconds per call of step() after warm-up, the peak memory (CUDA), the seconds of each call
    after warm-up). The warm-up's time over as many steady calls goes to WARMING."""
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    times = [timed(step, device)[1] for _ in range(warmup + steps)]
    peak = torch.cuda.max_memory_allocated() if device == "cuda" else None
    return settled(times, warmup), peak, times[warmup:]


def rungs(skip):
    """The ladder's rows, (label, switch) of each rung but skip's, whose switch stays off in later rungs."""
    return [(LABEL[name], switch) for name, switch in RUNGS if name not in skip]


def ladder(size, B, T, rt, steps, warmup, rows):
    """The table of rows (label, switch), each measured at B x T with its switch and every one above it on."""
    device = rt.kind
    peak = peak_flops(torch.cuda.get_device_name()) if device == "cuda" else None
    s, prev = dict(BASE), None
    lines = shown(["| rung | ms/step | range | tok/s | MFU | peak memory | speed-up |",
                   "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"])
    for label, switch in rows:
        s.update(switch)
        try:
            step = training_step(size, s, B, T, rt)
            dt, mem, times = time_steps(step, device, steps, warmup)
        except Exception as e:  # early rungs need the most memory (fp32, a T x T matrix per head)
            if not is_out_of_memory(e):
                raise
            step = dt = mem = prev = None
            lines += shown([f"| {label} | out of memory at B={B} | | | | | |"])
            continue
        tok_s = B * T / dt
        util = mfu(GPTConfig(**size, vocab_size=s["vocab_size"]), tok_s, peak, T)
        lines += shown([f"| {label} | {dt * 1000:.1f} | {spread(times)} | {tok_s:,.0f} | "
                        f"{'n/a' if util is None else f'{util:.1%}'} | {fmt_bytes(mem)} | "
                        f"{'' if prev is None else f'{prev / dt:.2f}x'} |"])
        prev = dt
    return lines, s, mem, step, dt  # the table; the last rung's settings, peak memory, step and its time


LEVERS = {  # name: (label, how the compiled step changes). Variants measured here, never settings of
    # train_gpt2.py: one becomes a setting or the default only after a GPU's A/B shows it wins by WINS or more
    # without more memory. limit: seconds of compiling, apart (compile_apart), before the lever is given up
    "flash": ("SDPA forced to flash", {"sdpa": "FLASH_ATTENTION"}),
    "cudnn": ("SDPA forced to cuDNN", {"sdpa": "CUDNN_ATTENTION"}),
    "efficient": ("SDPA forced to memory-efficient", {"sdpa": "EFFICIENT_ATTENTION"}),
    "coordinate": ("Inductor's coordinate_descent_tuning (llm.c's reference sets it)",
                   {"options": {"coordinate_descent_tuning": True}}),
    # modded-nanogpt measured ~2% for it and rejected it for its compile time
    "autotune": ("mode=max-autotune-no-cudagraphs", {"mode": "max-autotune-no-cudagraphs", "limit": 180}),
}
WINS = 1.03  # the speed-up a lever must show, without more memory, to become a setting
ROUNDS = 2  # a lever's A/B: turns of each side's steps


def unavailable(lever, s, rt, size, B, T):
    """(why the lever cannot be timed here or None, seconds it compiled apart or None): a compile setting
    with compile off, an SDPA backend this device has not (an eager attention call of the model's head
    size under it fails), a compile with a limit that did not finish in it (compile_apart)."""
    how = LEVERS[lever][1]
    if "sdpa" in how:
        q = torch.randn(1, 1, 8, size["n_embd"] // size["n_head"], device=rt.device,
                        dtype=torch.bfloat16 if s["bf16"] else torch.float32)
        try:
            with sdpa_kernel(getattr(SDPBackend, how["sdpa"])):
                torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
        except RuntimeError as e:  # "No available kernel" (its reasons are warnings before it)
            return f"not on this device ({str(e).split('.')[0]})", None
    elif not s["compile"]:
        return "torch.compile is off", None
    if "limit" not in how or not s["compile"]:
        return None, None
    rc, apart = compile_apart(lever, size, s, B, T, rt.kind, how["limit"])
    if rc is None:
        return f"stopped at {how['limit']} s of compiling, unfinished: not timed", None
    return (f"its compile failed apart (exit status {rc}: its output is above)" if rc else None), apart


def attention_ran(step):
    """The SDPA backends one call of step() ran, by the aten ops the profiler saw (gpu_check's names)."""
    from torch.profiler import ProfilerActivity, profile
    with without_profiler_chatter(), profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    return " and ".join(gpu_check.attention_backends([e.name for e in prof.events()])[1]) or "none seen"


# a lever's step compiled and run once in a process of its own, which compile_apart stops at its limit
LEVER_RUNNER = ("import json, sys\n"
                "sys.path.insert(0, sys.argv[1])\n"
                "import bench\n"
                "from gptlib import runtime\n"
                "lever, size, s, B, T, device = json.loads(sys.argv[2])\n"
                "bench.training_step(size, s, B, T, runtime.setup(device), lever)()\n")


def compile_apart(lever, size, s, B, T, device, limit):
    """(exit status, seconds) of the lever's step compiled and run once on `device` (a kind: cuda, as
    runtime.setup takes it) in a process group of its own, into this process's Inductor cache (the compile
    here is then a cache hit); the status None when it was stopped at `limit` seconds: torch.compile cannot
    be interrupted inside a process, a process group (its compile workers too) can."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir
    from gptlib.gpu_report import run_section
    argv = [sys.executable, "-c", LEVER_RUNNER, ROOT, json.dumps([lever, size, s, B, T, device])]
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        rc = run_section(argv, os.path.join(tmp, "lever.log"), t0 + limit, cache_dir(), session=False)
    return rc, time.time() - t0


def levers(size, s, B, T, rt, steps, warmup, names=tuple(LEVERS)):
    """Each of LEVERS named A/B'd against the default step (s: every rung on) at B x T: both built and warmed
    up (the lever's compiling: its warm-up over as many settled steps), then timed in turns, ROUNDS of
    steps / ROUNDS each; each side's median and range, the ratio of the medians, its peak memory over what
    was held before its steps (both sides' weights and optimizer states stay), the attention it ran."""
    default = training_step(size, s, B, T, rt)
    before = WARMING[0]
    time_steps(default, rt.kind, 1, warmup)
    how, per = "compiled" if s["compile"] else "eager", max(1, steps // ROUNDS)
    lines = shown([f"the levers, each a variant of the step at B={B}, T={T} ({how}; the default's "
                   f"compiling {WARMING[0] - before:.1f} s, its attention {attention_ran(default)}), A/B in "
                   f"turns against it, {ROUNDS} rounds, medians of {ROUNDS * per} steps after {warmup} "
                   f"warm-up; a lever wins at {WINS:.2f}x or more without more memory:", "",
                   "| lever | default ms/step | lever ms/step (range) | tok/s | lever / default | compiling "
                   "| peak over what was held, default / lever | attention | wins |",
                   "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |"])
    for lever in names:
        label = LEVERS[lever][0]
        why, apart = unavailable(lever, s, rt, size, B, T)
        if why:
            lines += shown([f"| {label} | n/a: {why} | | | | | | | |"])
            continue
        step, before = training_step(size, s, B, T, rt, lever), WARMING[0]
        # Inductor's caches key on the graph before SDPA's backend is chosen: they would give the default's
        with (inductor_config.patch(force_disable_caches=True) if "sdpa" in LEVERS[lever][1]
              else contextlib.nullcontext()):
            time_steps(step, rt.kind, 1, warmup)
        here = WARMING[0] - before
        times, peaks = {default: [], step: []}, {default: 0, step: 0}
        for _ in range(ROUNDS):
            for side in times:
                held = torch.cuda.memory_allocated() if rt.kind == "cuda" else 0
                _, peak, seconds = time_steps(side, rt.kind, per, 1)
                times[side] += seconds
                peaks[side] = None if peak is None else max(peaks[side], peak - held)
        a, b = (statistics.median(times[side]) for side in (default, step))
        more = peaks[step] is not None and peaks[step] > peaks[default]
        lines += shown([f"| {label} | {a * 1000:.1f} | {b * 1000:.1f} ({spread(times[step])}) | "
                        f"{B * T / b:,.0f} | {a / b:.3f}x | "
                        + ("" if apart is None else f"{apart:.0f} s apart + ")
                        + f"{here:.1f} s | {fmt_bytes(peaks[default])} / {fmt_bytes(peaks[step])} | "
                        f"{attention_ran(step)} | {'yes' if a / b >= WINS and not more else 'no'} |"])
        del step, times, peaks  # the lever's model and optimizer: the next one's memory
    return lines + [""]


# Inductor's pointwise and reduction kernels are never matmuls (triton_poi_fused_addmm_gelu: bias + GELU)
MATMULS = (r"^(?!triton_(poi|per|red)_).*"
           r"(gemm|nvjet|xmma|cutlass|cublas|(\b|_)mm(\b|_)|addmm|bmm|matmul|linear)")
PARTS = [  # (part of a step, regex on a lower-cased kernel or op name); the first part that matches wins
    ("cross-entropy over the logits", r"log_?softmax|nll_?loss|cross_?entropy"),
    ("attention", r"flash|fmha|sdpa|scaled_?dot_?product|attention|softmax"),
    ("optimizer (clipping, AdamW)", r"optimizer|adam|multi_tensor|foreach|lpnorm|vector_norm"),
    ("matmuls (linear layers, lm_head)", MATMULS),
]
OTHER = "other (LayerNorm, GELU, adds, embedding, copies)"
DECODE_PARTS = [  # a decode step's parts, as PARTS: a token through the KV-cache, and its pick
    ("sampling (the logits to a token: argmax)", r"argmax|topk|exponential|multinomial|(\b|_)pick(\b|_)"),
    ("attention", PARTS[1][1]),
    ("matmuls (linear layers, lm_head)", MATMULS),
    ("copies (the cache's writes, the step's inputs)", r"copy|index_put|fill|memcpy|memset|(\b|_)cat(\b|_)"),
]
DECODE_OTHER = "other (LayerNorm, GELU, adds, embedding)"


def part_of(names, parts=PARTS, other=OTHER):
    """The part of parts for a kernel or op, given its name and then its callers' names (innermost first)."""
    for name in names:
        for part, pattern in parts:
            if re.search(pattern, name.lower()):
                return part
    return other


@contextlib.contextmanager
def without_profiler_chatter():
    """Kineto writes "STAGE:" and "USDT:" lines to stderr at every profiler start and stop, whatever
    KINETO_LOG_LEVEL says: stderr (fd 2) goes to a file meanwhile, and every other line is passed on."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            for line in held.read().decode(errors="replace").splitlines(keepends=True):
                if not re.match(r"(STAGE|USDT):[-\d]+ [:\d]+ \d+:\d+ \w+\.cpp:\d+\] ", line):
                    sys.stderr.write(line)


def breakdown(step, device, step_time, steps=3, trace=None, title="last rung", parts=PARTS, other=OTHER):
    """Where a step's time goes: torch.profiler over `steps` calls of step(), summed by parts, and the rest of
    the measured step time as idle (launch gaps, CPU overhead). On CUDA the time is the kernels' and the
    kernel name decides; on CPU it is each op's self time, and an op nothing matches (a fill_ inside
    nll_loss_backward, a mul_ inside clipping) belongs to its nearest caller that matches."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    cuda = device == "cuda"
    with without_profiler_chatter(), profile(activities=[ProfilerActivity.CPU]
                                             + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        for _ in range(steps):
            step()
        synchronize(device)
    if trace:
        prof.export_chrome_trace(trace)
    per_part, per_name = dict.fromkeys([part for part, _ in parts] + [other], 0.0), {}
    for e in prof.events():
        if cuda:  # kernels only: CPU ops just launch them, user annotations span kernels counted already
            if e.device_type != DeviceType.CUDA or getattr(e, "is_user_annotation", False):
                continue
            sec, names = e.time_range.elapsed_us(), [e.name]
        else:
            if e.device_type != DeviceType.CPU:
                continue
            sec, names, caller = e.self_cpu_time_total, [e.name], e.cpu_parent
            while caller is not None:
                names.append(caller.name)
                caller = caller.cpu_parent
        sec /= 1e6 * steps
        per_part[part_of(names, parts, other)] += sec
        per_name[e.name] = per_name.get(e.name, 0.0) + sec
    busy = sum(per_part.values())
    what = "kernel" if cuda else "op self"
    lines = [f"where the time goes ({title}, torch.profiler over {steps} steps; {what} time by name, idle "
             f"= the measured {step_time * 1000:.1f} ms/step minus {what} time):", "",
             "| part | ms/step | share |", "| --- | ---: | ---: |"]
    for part, sec in list(per_part.items()) + [("idle (launch gaps, CPU "
                                                "overhead)", max(0.0, step_time - busy))]:
        lines.append(f"| {part} | {sec * 1000:.2f} | {sec / step_time:.0%} |")
    top = sorted(per_name.items(), key=lambda kv: -kv[1])[:5]
    lines += ["", "largest: " + "; ".join(f"{re.split(r'[<(]', n.removeprefix('void '))[0][:60]} "
                                          f"{sec * 1000:.2f} ms" for n, sec in top)]
    return lines


def decode_bytes(model, batch):
    """The fewest bytes one cached decode step reads: every weight once (embeddings but the looked-up rows:
    wpe and wte's rows are gathered, lm_head = wte is read whole) and the whole preallocated KV-cache, which
    every step attends over with a mask (engine.KVCache)."""
    c = model.config
    weights = sum(p.numel() * p.element_size() for name, p in model.named_parameters() if "wpe" not in name)
    per_value = model.lm_head.weight.element_size()  # bytes: the cache is in the weights' dtype
    cache = 2 * c.n_layer * batch * c.n_kv_head * c.block_size * c.head_dim * per_value
    return weights + cache


def generation(size, rt, compile, runs=((1, 256), (8, 256)), prompt_len=8):
    """Greedy generate() at each (batch, new tokens) of runs: tokens/s with the KV-cache (compile: the decode
    step compiled and, on CUDA, a CUDA graph; the compiling and warm-up of each batch size timed apart,
    once), the time to the first token (the prompt's prefill and its pick), the memory bandwidth a decode
    step uses (decode_bytes over its time), against recomputing the whole sequence every token (eager, timed
    on its second run so that per-shape setup, cuDNN's attention plans, stays out), and the share of tokens
    both give (in bf16, rounding can flip a near-tie between two logits, and the sequences part there)."""
    device = rt.device
    # the weights in the compute dtype, as sample.py has them (inference keeps no fp32 master copy)
    model = build(size, {"vocab_size": 50304, "flash": True}, device).to(TORCH_DTYPES[rt.dtype]).eval()
    span = 256 if rt.kind == "cuda" else 16  # sample.py --span: attend over the filled cache, in steps of it
    # --span's A/B where the cache outweighs the weights (at batch 1 an H100 measured 1.00x)
    span_at = max(batch for batch, _ in runs)
    engine, spanned = Engine(model, compile), Engine(model, compile, span=span)
    bandwidth = memory_bandwidth(torch.cuda.get_device_name(device)) if rt.kind == "cuda" else None
    how = "compiled decode step, CUDA graph" if compile and rt.kind == "cuda" else \
        "compiled decode step" if compile else "eager"
    lines = shown([f"generation (greedy, prompt {prompt_len} tokens, {rt.dtype}; KV-cache: {how}; "
                   "bandwidth: the weights and the whole cache read once a decode step"
                   + ("" if bandwidth is None else f", of the GPU's {bandwidth / 1e9:,.0f} GB/s") + "):", "",
                   "| batch | new tokens | KV-cache tok/s | first token | bandwidth used | recomputing "
                   f"tok/s | cache / recompute | same tokens | compiling and warm-up | --span {span}: tok/s, "
                   f"A/B in turns (batch {span_at}) | same tokens |",
                   "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"])
    warmed = set()
    for batch, new in runs:
        idx = torch.randint(0, 50257, (batch, prompt_len), device=device)
        seconds, outs, warm = {}, {}, ""
        with autocast(device, rt.dtype):
            if batch not in warmed:  # a decode step per batch size: compiled and captured once
                warm = timed(lambda: engine.generate(idx, 2, top_k=1), device)[1]
                if batch == span_at:  # each span's graph, once
                    warm += timed(lambda: spanned.generate(idx, new, top_k=1), device)[1]
                WARMING[0] += warm
                warm = f"{warm:.1f} s"
                warmed.add(batch)
            _, first = timed(lambda: engine.generate(idx, 1, top_k=1), device)
            for use_cache in (True, False):
                # recomputing: the second run is timed, the first's extra (a plan per new length) is warm-up
                tries = [timed(lambda: engine.generate(idx, new, top_k=1, use_cache=use_cache), device)
                         for _ in range(1 if use_cache else 2)]
                outs[use_cache], seconds[use_cache] = tries[-1]
                settled([dt for _, dt in tries], len(tries) - 1)
            turns = {True: [seconds[True]], False: []}  # whole cache, then --span, in turns
            for _ in range(2 if batch == span_at else 0):
                for whole, e in ((False, spanned), (True, engine)):
                    outs[whole, "span"], dt = timed(lambda: e.generate(idx, new, top_k=1), device)
                    turns[whole].append(dt)
        spans = ""
        if turns[False]:
            ratio = statistics.median(turns[True]) / statistics.median(turns[False])
            same_span = (outs[False, "span"] == outs[True])[:, prompt_len:].float().mean().item()
            spans = f"{batch * new / statistics.median(turns[False]):,.0f} ({ratio:.2f}x) | {same_span:.0%}"
        rates = {k: batch * new / v for k, v in seconds.items()}
        per_step = max(seconds[True] - first, 1e-9) / max(new - 1, 1)
        gbs = decode_bytes(model, batch) / per_step / 1e9
        used = f"{gbs:,.0f} GB/s" + ("" if bandwidth is None else f" ({gbs * 1e9 / bandwidth:.0%})")
        same = (outs[True] == outs[False])[:, prompt_len:].float().mean().item()
        lines += shown([f"| {batch} | {new} | {rates[True]:,.0f} | {first * 1000:.1f} ms | {used} | "
                        f"{rates[False]:,.0f} | {rates[True] / rates[False]:.1f}x | {same:.0%} | {warm} | "
                        f"{spans or ' |'} |"])
    lines.append("")
    for batch, _ in runs:
        lines += decode_breakdown(engine, model, batch, prompt_len, rt, bandwidth,
                                  20 if rt.kind == "cuda" else 5)
    return lines


def decode_breakdown(engine, model, batch, pos, rt, bandwidth, steps=20):
    """Where a cached decode step's time goes at batch: the step generate() ran (its decoder, under no_grad)
    at position pos, and its pick, profiled by breakdown() over DECODE_PARTS; and the fewest bytes it reads
    (decode_bytes) against the time they take at the GPU's memory bandwidth."""
    tok = torch.zeros(batch, 1, dtype=torch.long, device=rt.device)
    with torch.no_grad(), autocast(rt.device, rt.dtype):
        decoder = engine.decoder(batch, rt.device)  # the one generate() warmed: autocast's dtype is its key

        def token():
            return pick(decoder.step(tok, pos), 1.0, 1)
        step_time = time_steps(token, rt.kind, steps, 2)[0]
        parts = breakdown(token, rt.kind, step_time, steps, title=f"a decode step at batch {batch}",
                          parts=DECODE_PARTS, other=DECODE_OTHER)
    read = decode_bytes(model, batch)
    at = "the GPU's bandwidth unknown" if bandwidth is None else \
        f"{read / bandwidth * 1e6:,.0f} us at the GPU's bandwidth, {read / bandwidth / step_time:.0%} of it"
    return shown([f"a decode step at batch {batch}: {step_time * 1000:.3f} ms; it reads at least "
                  f"{read / 1e6:,.0f} MB (the weights and the whole cache): {at}", ""] + parts + [""])


def memory(size, s, rt, measured):
    """accounting.py's estimate of each step measured against the peak it measured (CUDA): measured holds
    {(B, T, compiled): peak bytes} of the steps timed in this process (the ladder's last rung, the step) with
    the last rung's settings s; an eager step at the smallest of those B is measured here."""
    config = GPTConfig(**size, vocab_size=s["vocab_size"])
    if rt.kind == "cuda" and measured:
        B, T, _ = min(measured)
        try:
            measured[B, T, False] = time_steps(training_step(size, {**s, "compile": False}, B, T, rt), "cuda",
                                               1, 1)[1]
        except Exception as e:  # compile can save memory: the compiled rung may fit where eager does not
            if not is_out_of_memory(e):
                raise
    lines = ["memory of a training step, accounting.py's estimate against the peak measured "
             "(CUDA's max_memory_allocated):", "",
             "| step | B | T | estimate | measured peak | estimate / measured |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for (B, T, compiled), peak in sorted(measured.items()):
        est = training_memory(config, B, T, "bf16" if s["bf16"] else "fp32", compiled=compiled)["total"]
        lines.append(f"| {'compiled' if compiled else 'eager'} | {B} | {T} | {fmt_bytes(est)} | "
                     f"{fmt_bytes(peak)} | {'n/a' if peak is None else f'{est / peak:.2f}'} |")
    return lines + [""]


def presets(T, gpus=8, cards=(("80 GB", 80e9), ("40 GB", 40e9), ("24 GB", 24e9))):
    """accounting.py's memory estimate per GPU of the compiled step (train_gpt2.py's default) for each GPT-2
    size, under DDP and under FSDP over `gpus` GPUs, and the largest micro-batch that fits each card by that
    estimate (within 90% of it: the rest is for the CUDA context, allocator slack and DDP's buckets), as
    settings.fit chooses B."""
    head = (["size", "parameters", "DDP, B=1", f"FSDP x{gpus}, B=1"]
            + [f"B on {c} (DDP / FSDP)" for c, _ in cards])
    lines = [f"memory per GPU by accounting.py's estimate (compiled step, bf16 autocast, AdamW, T={T}) and "
             "the largest micro-batch B that fits in 90% of a card by it:", "",
             "| " + " | ".join(head) + " |",
             "| --- |" + " ---: |" * (len(head) - 1)]
    for name, shape in GPT2_SIZES.items():
        config = GPTConfig(**shape, vocab_size=50304, block_size=max(T, 1024))
        per = {}
        for mode, shards in (("DDP", 1), ("FSDP", gpus)):
            one, two = (training_memory(config, B, T, "bf16", shards, compiled=True)["total"] for B in (1, 2))
            per[mode] = (one, two - one)  # bytes at B=1, bytes per further sequence
        fits = [" / ".join(str(int((0.9 * cap - one) // step) + 1 if one <= 0.9 * cap else 0)
                           for one, step in per.values()) for _, cap in cards]
        lines.append(f"| {name} | {count_params(config):,} | {fmt_bytes(per['DDP'][0])} | "
                     f"{fmt_bytes(per['FSDP'][0])} | " + " | ".join(fits) + " |")
    return lines


def softmax_bandwidth(device, shapes=((262144, 1024), (5336, 50304)), reps=20):
    """The three softmaxes in GB/s (one read + one write of the fp32 tensor), on ~1 GB inputs so no cache
    holds them: rows as long as an attention row at T=1024, and as long as a row of logits (50304), where one
    program's row no longer fits in registers. The Triton result is checked against torch.softmax first."""
    from gptlib import fused_softmax
    bw = memory_bandwidth(torch.cuda.get_device_name()) if device == "cuda" else None
    out = [f"softmax, fp32 (GB/s = 2 x bytes / time; memory bandwidth "
           f"{'unknown' if bw is None else f'{bw / 1e9:,.0f} GB/s'}):"]
    for rows, cols in shapes:
        x = torch.randn(rows, cols, device=device)
        err = (fused_softmax.softmax(x) - torch.softmax(x, -1)).abs().max().item()
        out.append(f"  {rows} x {cols} (Triton vs torch.softmax: max |difference| {err:.1e})")
        for name, fn in (("naive PyTorch", fused_softmax.naive_softmax),
                         ("torch.softmax", lambda t: torch.softmax(t, -1)),
                         ("Triton fused", fused_softmax.softmax)):
            t0 = time.perf_counter()
            fn(x)  # a first call (the Triton kernel's compiles): timed for WARMING alone
            synchronize(device)
            first, t0 = time.perf_counter() - t0, time.perf_counter()
            for _ in range(reps):
                fn(x)
            synchronize(device)
            per_call = (time.perf_counter() - t0) / reps
            settled([first, per_call], 1)
            gbs = 2 * x.numel() * 4 / per_call / 1e9
            out.append(f"    {name}: "
                       f"{gbs:,.1f} GB/s" + ("" if bw is None else f" ({gbs * 1e9 / bw:.0%} of bandwidth)"))
        del x
    return out


def hellaswag_cost(size, rt, data, batch_size, repeat=3, n=64):
    """HellaSwag's cost on this device at the model size (random weights: the cost does not depend on them),
    as a training run's evaluation pays it: tokenizing and packing (once a run), the first evaluation in the
    process (cold: per-shape attention plans, kernels loaded), then each later one (warm)."""
    import hellaswag
    with tempfile.TemporaryDirectory() as tmp:
        path = data or gpu_check.synthetic_hellaswag(os.path.join(tmp, "hellaswag.jsonl"), n)
        examples = hellaswag.load_examples(path)
    model = build(size, {"vocab_size": 50304, "flash": True}, rt.device).eval()  # fp32 under autocast
    prepared, pack = timed(lambda: hellaswag.prepare(examples, rt, batch_size, model.config.block_size))
    runs = [timed(lambda: hellaswag.evaluate(model, prepared, rt), rt.device) for _ in range(repeat)]
    result, seconds = runs[-1][0], [dt for _, dt in runs]
    warm = settled(seconds, 1)  # the first evaluation in the process: attention plans, kernels loaded
    source = data or f"{n} examples cut from input.txt (no --hellaswag_data)"
    lines = [f"HellaSwag ({len(examples):,} examples of {source}; {rt.dtype}, {batch_size} examples a "
             f"forward, {len(prepared.batches)} batches, acc_norm {result['acc_norm']:.4f} of random "
             "weights):", "",
             "| tokenize and pack | first evaluation (cold) | later evaluations (warm) | examples/s (warm) |",
             "| ---: | ---: | ---: | ---: |",
             f"| {pack:.2f} s | {seconds[0]:.2f} s | {', '.join(f'{x:.2f} s' for x in seconds[1:])} | "
             f"{len(examples) / warm:,.0f} |", ""]
    return shown(lines)


def core_cost(size, rt, data, compile, batch_sizes):
    """CORE's cost on this device at the model size (random weights: the cost does not depend on them), as
    core_eval.py pays it, on the bundle dev/make_core_bundle.py makes from data (hellaswag_val.jsonl: its full
    size, 31,351 examples of CORE's shapes; none: at most 16 a task, the HellaSwag-like ones cut from
    input.txt): reading, then at each batch size tokenizing and packing, the first evaluation (cold:
    compiling, where compiled) and a second (warm)."""
    import core_eval
    with tempfile.TemporaryDirectory() as tmp:
        source = data or gpu_check.synthetic_hellaswag(os.path.join(tmp, "hellaswag.jsonl"), 16)
        bundle = os.path.join(tmp, "bundle")
        subprocess.run([sys.executable, os.path.join(ROOT, "dev", "make_core_bundle.py"), source, bundle]
                       + ([] if data else ["--n", "16"]), check=True, capture_output=True)
        tasks, read = timed(lambda: core_eval.load_tasks(bundle))
    model = build(size, {"vocab_size": 50304, "flash": True}, rt.device).eval()  # fp32 under autocast
    n = sum(len(t.examples) for t in tasks)
    counts = ", ".join(f"{t.label} {len(t.examples):,}" for t in tasks)
    lines = shown([f"CORE ({n:,} examples in {len(tasks)} tasks, {counts}, from {data or 'input.txt'}; "
                   f"{rt.dtype}, {'compiled' if compile else 'eager'}, {rt.cpus} threads tokenizing; reading "
                   f"the bundle {read:.2f} s):", "",
                   "| examples a forward | tokenize and pack | first evaluation (cold) | second (warm) "
                   "| examples/s (warm) | CORE |", "| ---: | ---: | ---: | ---: | ---: | ---: |"])
    for batch_size in batch_sizes:
        prepared, pack = timed(lambda: core_eval.Prepared(tasks, rt, batch_size, model.config.block_size))
        if compile:
            torch._dynamo.reset()  # each batch size compiles afresh, as a run of core_eval.py does
        run = torch.compile(model) if compile else model
        (_, cold), (result, warm) = (timed(lambda: core_eval.evaluate(run, prepared, rt), rt.device)
                                     for _ in range(2))
        settled([cold, warm], 1)
        lines += shown([f"| {batch_size} | {pack:.2f} s | {cold:.2f} s | {warm:.2f} s | {n / warm:,.0f} | "
                        f"{result['core']:.4f} |"])
    return lines + [""]


# llm.c's PyTorch reference run as published, but for its tokenizer: tiktoken's "gpt2", which it would
# download, is the vendored one (tokenizer.py), so a machine without internet runs it too
PEER_RUNNER = ("import runpy, sys, tiktoken\n"
               "sys.path.insert(0, sys.argv[1])\n"
               "from gptlib import tokenizer\n"
               "tiktoken.get_encoding = lambda name: tokenizer.get_encoding()\n"
               "sys.argv = sys.argv[2:]\n"
               "runpy.run_path(sys.argv[0], run_name='__main__')\n")


# train_gpt2.py as its command line runs it, up to its last step: what it does after that (a checkpoint, the
# validation loss, samples, report.md) no setting skips, and llm.c's run, its evaluations off, does none of it
OURS_RUNNER = ("import sys\n"
               "sys.path.insert(0, sys.argv[1])\n"
               "import train_gpt2\n"
               "from gptlib import errors, runtime\n"
               "train_gpt2.save = lambda run: 'not written (bench.py)'\n"
               "train_gpt2.evaluate_or_stop = lambda run, checkpoint: None\n"
               "train_gpt2.write_report = lambda path: 'not written (bench.py)'\n"
               "sys.argv = sys.argv[1:]\n"
               "errors.main_guard(train_gpt2.main, runtime.exit_process)\n")
PEER_VOCAB = 50257  # llm.c's d12: GPT-2's own vocabulary, unpadded
PEER_ROUNDS = 2  # runs of each script, in turns


def peer_cost(peer, rt, size, B, T, steps):
    """train_gpt2.py against llm.c's PyTorch reference (its train_gpt2.py at `peer`, an absolute path outside
    this project) at B x T, one micro-step a step, on the same random-token shards (llm.c's .bin layout is
    this project's), each run its own process, PEER_ROUNDS of each in turns (ours, peer, ours, peer: drift
    hits both), compiled on CUDA: each run's median ms/step over its timed steps after its warm-up (steps:
    (warm-up, timed); what the warm-up took over as many settled steps goes to WARMING), its peak memory
    (CUDA), and the ratio of the medians. Ours is the model of `size`
    (GPT-2 124M on CUDA, bench.py's small model on a CPU), the peer's its d12, GPT-2 124M, everywhere."""
    from dataloader import write_shard
    cuda, times, peaks = rt.kind == "cuda", {"ours": [], "peer": []}, {"ours": None, "peer": None}
    (warmup, steps), rounds = steps, PEER_ROUNDS
    dtype, n = "bf16" if cuda else "fp32", warmup + steps
    with tempfile.TemporaryDirectory() as tmp:
        gen = torch.Generator().manual_seed(0)
        for name in ("peer_val_000000.bin", "peer_train_000001.bin"):
            write_shard(os.path.join(tmp, name), torch.randint(0, 50257, (2 * B * T * n + 1,),
                                                               generator=gen).numpy())
        for r in range(rounds):
            log_dir = os.path.join(tmp, f"ours{r}")
            ours = [sys.executable, "-c", OURS_RUNNER, ROOT, f"--data_root={tmp}", f"--B={B}", f"--T={T}",
                    f"--total_batch_size={B * T}", f"--max_steps={n}", "--warmup_steps=10",
                    "--eval_interval=100000", f"--val_tokens={T}", "--checkpoint_interval=100000",
                    "--hellaswag=0", f"--compile={cuda}", f"--device={rt.kind}", f"--dtype={dtype}",
                    f"--log_dir={log_dir}", f"--n_layer={size['n_layer']}", f"--n_head={size['n_head']}",
                    f"--n_kv_head={size['n_head']}", f"--n_embd={size['n_embd']}", "--max_lr=6e-4"]
            p = subprocess.run(ours, capture_output=True, text=True, cwd=tmp)
            if p.returncode:
                raise RuntimeError(f"train_gpt2.py failed:\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
            logged = [record for record in read_log(metrics_path(log_dir)) if "ms" in record]
            times["ours"].append(1000 * settled([record["ms"] / 1000 for record in logged], warmup))
            if cuda:
                peaks["ours"] = max(record["peak_memory"] for record in logged) / 2**20
            theirs = [sys.executable, "-c", PEER_RUNNER, ROOT, peer, f"--input_bin={tmp}/peer_train_*.bin",
                      "--model=d12", f"--batch_size={B}", f"--sequence_length={T}",
                      f"--total_batch_size={B * T}", f"--num_iterations={n}", "--learning_rate=6e-4",
                      "--warmup_iters=10", "--weight_decay=0.1", "--overfit_single_batch=0",
                      "--write_tensors=0", "--val_loss_every=0", "--sample_every=0", f"--device={rt.kind}",
                      f"--compile={int(cuda)}", "--flash=1",
                      "--tensorcores=1", f"--dtype={'bfloat16' if cuda else 'float32'}"]
            p = subprocess.run(theirs, capture_output=True, text=True, cwd=tmp)
            ms = [float(m) / 1000 for m in re.findall(r"\| \((\d+\.\d+) ms \|", p.stdout)]
            if len(ms) < n:  # its last line (the peak CUDA memory) fails on a CPU: the steps count
                raise RuntimeError(f"{peer} failed (exit status {p.returncode}):\n{p.stdout[-2000:]}"
                                   f"{p.stderr[-2000:]}")
            times["peer"].append(1000 * settled(ms[:n], warmup))
            found = re.search(r"peak memory consumption: (\d+) MiB", p.stdout)
            if cuda and found:  # off CUDA it says 0 MiB: nothing was measured
                peaks["peer"] = int(found.group(1))
            print(f"round {r + 1}: train_gpt2.py {times['ours'][-1]:.2f} ms/step, llm.c's "
                  f"{times['peer'][-1]:.2f}", flush=True)
    ours, theirs = (statistics.median(times[k]) for k in ("ours", "peer"))
    mem = {k: "n/a" if v is None else f"{v:,.0f} MiB" for k, v in peaks.items()}
    model = "GPT-2 124M" if cuda else (f"ours {size['n_layer']} layers {size['n_embd']} wide against its d12 "
                                       "(GPT-2 124M): a smoke test, the figures mean nothing")
    vocab = CONFIG["vocab_size"]
    lines = [f"train_gpt2.py against llm.c's PyTorch reference ({peer}), {model}, B={B}, T={T}, {dtype}"
             f"{', compiled' if cuda else ''}; {rounds} rounds in turns, each run's median of {steps} steps "
             f"after {warmup} warm-up:", "",
             "| script | vocabulary | ms/step (rounds) | tok/s | peak memory |",
             "| --- | ---: | ---: | ---: | ---: |",
             f"| train_gpt2.py | {vocab:,} | {ours:.2f} ({', '.join(f'{t:.2f}' for t in times['ours'])}) | "
             f"{B * T / ours * 1000:,.0f} | {mem['ours']} |",
             f"| llm.c's train_gpt2.py | {PEER_VOCAB:,} | {theirs:.2f} "
             f"({', '.join(f'{t:.2f}' for t in times['peer'])}) | {B * T / theirs * 1000:,.0f} | "
             f"{mem['peer']} |",
             "", f"train_gpt2.py is {theirs / ours:.3f}x the reference's speed, its vocabulary padded to "
             f"{vocab:,} where llm.c's d12 uses {PEER_VOCAB:,}: the ratio includes that padding", ""]
    return shown(lines)


ONLY = ("training", "step", "levers", "generation", "hellaswag", "core", "memory", "softmax", "peer")
EVERYTHING = ("training", "generation", "memory", "softmax")  # bench.py without --only


def main():
    parser = command_line(__doc__)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--B", type=int, default=None,
                        help="micro-batch (default: the ladder's 16; the step's, the levers' and the peer's "
                        "64, train_gpt2.py's; on a CPU 4 and 8)")
    parser.add_argument("--T", type=int, default=None,
                        help="sequence length (default 1024 on CUDA, 64 on CPU)")
    parser.add_argument("--steps", type=int, default=None,
                        help="timed steps per rung, of the step and of each --peer run (default 10 / 3)")
    parser.add_argument("--warmup", type=int, default=None,
                        help="steps first, timed apart as the compiling and warm-up (default 3 / 1)")
    parser.add_argument("--skip", default="",
                        help=f"comma-separated rungs to leave off: {', '.join(n for n, _ in RUNGS)}")
    parser.add_argument("--out", default=None, help="also write the report to this markdown file")
    parser.add_argument("--trace", default=None,
                        help="write the profiled steps as a Chrome trace (JSON) here, "
                        "for chrome://tracing or ui.perfetto.dev")
    parser.add_argument("--only", default=None,
                        help=f"comma-separated parts to measure alone: {', '.join(ONLY)} (default: "
                        f"{', '.join(EVERYTHING)}; step: the last rung alone at --B)")
    parser.add_argument("--hellaswag_data", default=None,
                        help="hellaswag_val.jsonl for --only hellaswag, core and --report (default: "
                        "examples cut from input.txt)")
    parser.add_argument("--report", default=None, metavar="DIR",
                        help="every GPU figure: each of gpu_report.sections in its own process, its raw "
                        "output and DIR/report.md; a rerun continues where one stopped")
    parser.add_argument("--peer", default=None, metavar="PATH",
                        help="--only peer, --report: time llm.c's PyTorch reference (its train_gpt2.py, "
                        "which you name) against train_gpt2.py at the step's B, in turns, on the same "
                        "random-token shards, --warmup steps then --steps timed")
    parser.add_argument("--levers", default=",".join(LEVERS),
                        help=f"--only levers: comma-separated levers to A/B (default: all, "
                        f"{', '.join(LEVERS)})")
    parser.add_argument("--budget", type=float, default=None,
                        help="--report: stop the section still running after this many seconds (a rerun "
                        "continues from it)")
    parser.add_argument("--commit", default=None,
                        help="--report: the commit these files are, where they are not a git checkout")
    args = parser.parse_args()
    for option, low in (("B", 1), ("T", 1), ("steps", 1), ("warmup", 0)):
        check_range(f"--{option}", getattr(args, option), low)
    check_range("--budget", args.budget, above=0)
    if args.peer and not os.path.isfile(args.peer):
        raise UserError(f"--peer {args.peer}: no such file; give the path of llm.c's train_gpt2.py (its "
                        "PyTorch reference, github.com/karpathy/llm.c)")
    # the paths given are the user's, from where they are: --report's sections run from the project root and
    # the peer from a folder of its own
    for option in ("report", "hellaswag_data", "peer"):
        if getattr(args, option):
            setattr(args, option, os.path.abspath(getattr(args, option)))
    if args.report:
        from gptlib import gpu_report
        return gpu_report.run(args.report, args.device, args.hellaswag_data, args.budget, args.commit,
                              args.peer)
    only = EVERYTHING if args.only is None else tuple(x for x in args.only.split(",") if x)
    if not only or set(only) - set(ONLY):
        raise UserError(f"--only {args.only}: parts are {', '.join(ONLY)}")
    if "peer" in only and not args.peer:
        raise UserError("--only peer needs --peer PATH: llm.c's train_gpt2.py, its PyTorch reference")
    if args.peer and "peer" not in only:
        raise UserError("--peer PATH is for --only peer or --report: add one of them")
    rt = runtime.setup(args.device)
    cuda = rt.kind == "cuda"
    skip = {s for s in args.skip.split(",") if s}
    if skip - {n for n, _ in RUNGS}:
        raise UserError(f"--skip {args.skip}: rungs are {', '.join(n for n, _ in RUNGS)}")
    if len(skip) == len(RUNGS):
        raise UserError("--skip leaves no rung to measure")
    names = [x for x in args.levers.split(",") if x]
    if not names or set(names) - set(LEVERS):
        raise UserError(f"--levers {args.levers}: levers are {', '.join(LEVERS)}")
    compiles = "False" if "compile" in skip else "auto"  # generation's and CORE's --compile: on CUDA
    size = dict(n_layer=12, n_head=12, n_embd=768, block_size=1024) if cuda else \
        dict(n_layer=2, n_head=4, n_embd=64, block_size=256)  # GPT-2 124M, or a CPU smoke-test model
    B = args.B or (16 if cuda else 4)  # the ladder's
    step_B = args.B or (64 if cuda else 8)  # the step's and the peer's: train_gpt2.py's micro-batch
    T = args.T or (1024 if cuda else 64)
    check_range("--T", T, 1, size["block_size"])  # the model's positions
    steps = args.steps or (10 if cuda else 3)  # the spread is small (its range is printed): 10 will do
    warmup = args.warmup if args.warmup is not None else (3 if cuda else 1)
    name = device_name(rt.device)
    report = [f"# bench.py, {datetime.date.today()}", "",
              f"{name}, torch {torch.__version__}, {'GPT-2 124M' if cuda else 'small CPU model'} "
              f"({size['n_layer']} layers, {size['n_embd']} wide), "
              + "".join(f"{part} B={B if part == 'training' else step_B}, " for part in ONLY
                        if part in only and part in ("training", "step", "levers", "peer"))
              + f"T={T}, median of {steps} steps after {warmup} warm-up; `python {' '.join(sys.argv)}`", ""]
    shown(report)
    every = {k: v for _, switch in rungs(skip) for k, v in switch.items()}  # the step train_gpt2.py runs
    last_s, measured = {**BASE, **every}, {}  # measured: {(B, T, compiled): peak} for the memory part
    for part in [p for p in ONLY if p in only]:
        if part in ("training", "step"):
            rows = rungs(skip) if part == "training" else [(f"every rung, B={step_B}", every)]
            at = B if part == "training" else step_B
            lines, last_s, mem, last_step, last_dt = ladder(size, at, T, rt, steps, warmup, rows)
            if last_step is not None:
                measured[at, T, last_s["compile"]] = mem
            report += lines + [""]
            print()
            if part == "training" and last_step is not None:
                report += shown(breakdown(last_step, rt.kind, last_dt, trace=args.trace) + [""])
            del last_step  # frees the last rung's model before the memory measurements
        elif part == "levers":
            report += levers(size, {**BASE, **every}, step_B, T, rt, steps, warmup, names)
        elif part == "generation":
            compile, _ = runtime.compile_choice(compiles, rt)
            runs = ((1, 256), (8, 256)) if cuda else ((1, 32), (4, 32))
            report += generation(size, rt, compile, runs)
        elif part == "hellaswag":
            report += hellaswag_cost(size, rt, args.hellaswag_data, 64 if cuda else 8, n=64 if cuda else 16)
        elif part == "core":
            compile, _ = runtime.compile_choice(compiles, rt)
            report += core_cost(size, rt, args.hellaswag_data, compile, (16,) if cuda else (4,))  # 64: slower
        elif part == "memory":
            report += shown(memory(size, last_s, rt, measured) + presets(T if cuda else 1024) + [""])
        elif part == "peer":
            report += peer_cost(args.peer, rt, size, step_B, T, (warmup, steps))
        elif part == "softmax":
            report += shown(softmax_bandwidth(rt.kind) if cuda else ["softmax kernel GB/s: CUDA only"]) + [""]
    said = shown([f"compiling and warm-up: {WARMING[0]:.1f} s"])  # gpu_report.py reads this line
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(report + said) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main_guard(main)
