"""What we claim on an NVIDIA GPU, checked there: SDPA runs a fused attention kernel (flash, cuDNN or
memory-efficient, not the math fallback), the Triton softmax is compiled and correct, the compiled and graphed
decoder gives recomputation's greedy tokens and never waits on the host, and a compiled train_gpt2.py run
under torchrun (NCCL) with evaluations recompiles nothing at later evaluations and uses fused AdamW and TF32.
tests/test_gpu.py asserts them (`python bench.py --report DIR` runs it and keeps its output); on a CPU the
attention check, the decoder's logic and the training run work too (the tests use them).
"""
import json
import os
import re
import subprocess
import sys

import torch

from gptlib.engine import Engine
from gptlib.runlog import metrics_path, read_log
from gptlib.runtime import autocast, synchronize
from model import GPT, GPTConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repo: gptlib/..
CHECK_MODEL = ["--n_layer=2", "--n_head=4", "--n_kv_head=4", "--n_embd=128"]


# SDPA's fused backends by the aten op each runs (forward and backward). Which one SDPA picks depends on the
# GPU and the versions: since torch 2.9 an H100 or B200 gets cuDNN's attention, most others flash attention.
FUSED_ATTENTION = {"_scaled_dot_product_flash_attention": "flash",
                   "_scaled_dot_product_cudnn_attention": "cuDNN",
                   "_scaled_dot_product_efficient_attention": "memory-efficient",
                   "_scaled_dot_product_fused_attention_overrideable": "the device's fused"}


def attention_backends(ops):
    """(ok, names): the SDPA backends that aten op names show ran; ok when all are fused kernels, none the
    math fallback (it writes each head's T x T score matrix to memory)."""
    names = sorted({name for op in ops for key, name in FUSED_ATTENTION.items() if key in op})
    math = any("_scaled_dot_product_attention_math" in op for op in ops)
    return bool(names) and not math, names + (["math"] if math else [])


def check_attention(rt):
    """(ok, detail): the attention a training step under the runtime's autocast really runs, by the profiler:
    a fused SDPA backend (flash, cuDNN or memory-efficient), not the math fallback; named in the detail."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=256, vocab_size=50304, n_layer=2, n_head=4, n_embd=256)).to(rt.device)
    x = torch.randint(0, 50257, (4, 256), device=rt.device)
    cuda = rt.kind == "cuda"
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        with autocast(rt.device, rt.dtype):
            _, loss = model(x, x)
        loss.backward()
        synchronize(rt.device)
    events = prof.events()
    ops = sorted({e.name for e in events if e.name.startswith("aten::_scaled_dot_product")})
    on_gpu = [e.name for e in events if e.device_type == DeviceType.CUDA]
    attention = [name for name in on_gpu if re.search(r"flash|fmha|attention|sdpa", name, re.I)]
    kernels = sorted({re.split(r"[<(]", name.removeprefix("void "))[0] for name in attention})
    ok, backends = attention_backends(ops)
    ok = ok and (not cuda or bool(kernels))
    detail = f"SDPA ran {' and '.join(backends) or 'no'} attention ({', '.join(ops) or 'no SDPA op'})"
    return ok, detail + (f"; kernels: {', '.join(kernels) or 'none'}" if cuda else "")


def check_softmax():
    """(ok, detail): fused_softmax.softmax compiled by Triton for the GPU (its kernel runs there, seen by the
    profiler; not Triton's interpreter) and equal to torch.softmax on short and long rows, fp32 and bf16."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    if os.environ.get("TRITON_INTERPRET") == "1":
        return False, "TRITON_INTERPRET=1 is set, so Triton would interpret the kernel: unset it"
    from gptlib import fused_softmax
    errors, ran = [], False
    for rows, cols, dtype, tol in ((4096, 1024, torch.float32, 1e-6), (256, 50304, torch.float32, 1e-6),
                                   (4096, 1024, torch.bfloat16, 1e-2)):
        x = torch.randn(rows, cols, device="cuda", dtype=dtype) * 4
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            y = fused_softmax.softmax(x)
            synchronize("cuda")
        ran = ran or any(e.device_type == DeviceType.CUDA and "_softmax_rows" in e.name
                         for e in prof.events())
        err = (y.float() - torch.softmax(x.float(), -1)).abs().max().item()
        errors.append((f"{rows}x{cols} {str(dtype).removeprefix('torch.')}", err, tol))
    ok = ran and all(err <= tol for _, err, tol in errors)
    found = ", ".join(f"{name} {err:.1e} (limit {tol:g})" for name, err, tol in errors)
    return ok, (f"kernel {'ran on the GPU' if ran else 'not seen on the GPU'}; max |difference| from "
                f"torch.softmax: {found}")


def recompiles(output, marker):
    """(before, after): the 'Recompiling function' lines TORCH_LOGS=recompiles wrote before and after the
    first line of output holding marker (after: everything if the marker never shows)."""
    lines = output.splitlines()
    cut = next((i for i, line in enumerate(lines) if marker in line), 0)
    return tuple(sum("Recompiling function" in line for line in part) for part in (lines[:cut], lines[cut:]))


MIN_COMPARED = 0.75  # of all decode steps: a check that compared fewer says too little to pass


def cuda_syncs(fn):
    """The host syncs CUDA's sync debug mode reports while fn() runs."""
    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    return sum("synchroniz" in str(w.message) for w in caught)


def greedy_agreement(fast, full, gaps, prompt_len, tie=1e-4):
    """(compared, same): how many decode steps of all rows were compared, and whether the fast tokens equal
    the recomputed ones there. A row is compared up to its first step whose top-2 logit gap (over the
    sampled vocabulary) is tie or less: rounding may flip such a near-tie and the sequences part there."""
    clear = [next((t for t, g in enumerate(row) if g <= tie), len(row)) for row in gaps]
    return sum(clear), all(f[prompt_len:prompt_len + n] == r[prompt_len:prompt_len + n]
                           for f, r, n in zip(fast, full, clear))


def generation_verdict(agreements, syncs, control):
    """(ok, detail) of check_generation from what it measured: agreements {prompts: (compared, total, same)};
    syncs (at 4 new tokens, at 32); control, the syncs counted around a deliberate one (the counter must
    see it, or its zeros mean nothing)."""
    ok, parts = True, []
    for name, (compared, total, same) in agreements.items():
        enough = compared >= MIN_COMPARED * total
        ok = ok and same and enough
        parts.append(f"{name}: {'the same tokens as' if same else 'OTHER tokens than'} recomputing over "
                     f"{compared} of {total} steps with a clear top-2 gap"
                     + ("" if enough else f" (too few: at least {MIN_COMPARED:.0%} must be compared)"))
    flat, seen = syncs[0] == syncs[1], control > syncs[0]
    ok = ok and flat and seen
    parts.append(f"bf16 decoding: {syncs[0]} / {syncs[1]} host syncs at 4 / 32 new tokens"
                 + ("" if flat else " (syncs grow with the tokens)")
                 + (f", {control} with a deliberate one more" if seen else
                    f", and {control} with a deliberate one more: the counter missed it"))
    return ok, "; ".join(parts)


def check_generation(rt, compile=True, count_syncs=cuda_syncs, steps=64):
    """(ok, detail): cached decoding (compile: the decode step compiled and, on CUDA, replayed as a CUDA
    graph) gives recomputation's greedy tokens in fp32 with TF32 off, for 3 different prompts and for 3
    samples of one prompt (the shared prefill), over at least MIN_COMPARED of the steps (each row up to its
    first near-tie), `steps` new tokens a row; and under bf16 autocast its decode loop makes no host sync:
    count_syncs (CUDA's sync debug mode) counts the same syncs at 4 and 32 new tokens, and does count a
    deliberate one."""
    from model import GPT2_VOCAB
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=256, vocab_size=50304, n_layer=2, n_head=4, n_embd=256)).to(rt.device)
    model.eval()
    engine = Engine(model, compile)  # keeps its compiled decoders from call to call
    one = torch.randint(0, 50257, (1, 8), device=rt.device)
    prompts = {"3 prompts": torch.randint(0, 50257, (3, 8), device=rt.device),
               "3 samples of one prompt": one.expand(3, 8)}
    tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    agreements = {}
    try:
        for name, idx in prompts.items():
            fast = engine.generate(idx, steps, top_k=1).tolist()
            full = engine.generate(idx, steps, top_k=1, use_cache=False)
            top2 = model(full[:, :-1])[0][:, 7:, :GPT2_VOCAB].float().topk(2, dim=-1).values
            compared, same = greedy_agreement(fast, full.tolist(), (top2[..., 0] - top2[..., 1]).tolist(), 8)
            agreements[name] = (compared, idx.size(0) * steps, same)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
    idx = prompts["3 prompts"]

    def decoding(new, then=lambda out: None):
        with autocast(rt.device, "bf16"):
            then(engine.generate(idx, new, top_k=50))
    decoding(2)  # compiles and captures the bf16 step
    count_syncs(lambda: decoding(4))  # uncounted: a first replay syncs once more (seen on an H100)
    syncs = count_syncs(lambda: decoding(4)), count_syncs(lambda: decoding(32))
    control = count_syncs(lambda: decoding(4, then=lambda out: out[0, -1].item()))  # one sync more
    return generation_verdict(agreements, syncs, control)


def synthetic_hellaswag(path, n):
    """n HellaSwag-format examples cut from input.txt (the check needs the shapes, not the answers)."""
    with open(os.path.join(ROOT, "input.txt"), encoding="utf-8") as f:
        lines = [line.strip() for line in f if len(line.strip()) > 20]
    with open(path, "w", encoding="utf-8") as f:
        for i in range(n):
            f.write(json.dumps({"ctx": lines[5 * i], "endings": lines[5 * i + 1:5 * i + 5],
                                "label": i % 4}) + "\n")
    return path


def check_training_run(device, work_dir, hellaswag_data=None, timeout=900):
    """[(check, ok, detail)] for a 2-layer train_gpt2.py run under torchrun (1 process; NCCL on a GPU) with
    torch.compile, 2 micro-steps per step, and val loss, HellaSwag and samples every 5 of 20 steps, its output
    and the recompiles logged by TORCH_LOGS=recompiles in one stream, in order."""
    log_dir = os.path.join(work_dir, "run")
    data = hellaswag_data or synthetic_hellaswag(os.path.join(work_dir, "hellaswag.jsonl"), 40)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1",
           os.path.join(ROOT, "train_gpt2.py"), f"--device={device}",
           f"--data_root={os.path.join(ROOT, 'input.txt')}",
           *CHECK_MODEL, "--B=8", "--T=256", "--total_batch_size=4096", "--max_steps=20", "--warmup_steps=5",
           "--eval_interval=5", "--val_tokens=7680", "--hellaswag=40", f"--hellaswag_data={data}",
           "--compile=True", "--checkpoint_interval=20", f"--log_dir={log_dir}"]
    env = {**os.environ, "TORCH_LOGS": "recompiles", "PYTHONUNBUFFERED": "1"}
    try:
        r = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=timeout)
        out, rc = r.stdout, r.returncode
    except subprocess.TimeoutExpired as e:
        out, rc = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or ""), "timeout"
    if rc != 0:
        tail = " | ".join(line for line in out.splitlines()[-6:])
        return [("2-layer train_gpt2.py run", False, f"exit status {rc}: {tail[-600:]}")]
    recs = read_log(metrics_path(log_dir))
    info = next(r for r in recs if r.get("event") == "start")["run"]
    evals = {key: [r["step"] for r in recs if key in r] for key in ("val_loss", "hellaswag", "samples")}
    # printed when the first evaluation's compiled part ends
    before, after = recompiles(out, "step 5: hellaswag")
    limit = re.search(r".*(recompile_limit|cache_size_limit).*", out)
    cuda = device == "cuda"
    results = [
        ("2-layer train_gpt2.py run", True,
         f"finished: {' '.join(cmd[3:5])} ... train_gpt2.py --compile=True (2 micro-steps a step, 20 steps)"),
        ("process group", info["backend"] == ("nccl" if cuda else "gloo"), f"backend {info['backend']}"),
        ("torch.compile", info["compile"] is True, f"compile {info['compile']}, dtype {info['dtype']}"),
        ("evaluations", all(v == [5, 10, 15, 20] for v in evals.values()),
         "; ".join(f"{k} at steps {v}" for k, v in evals.items())),
        ("no recompiling at every evaluation", after == 0 and limit is None,
         f"{before} recompiles up to the end of the first evaluation's HellaSwag, {after} after it"
         + (f"; {limit.group(0).strip()[:200]}" if limit else "")),
    ]
    if cuda:
        results += [("fused AdamW", info["fused_adamw"] is True,
                     f"the run's AdamW fused={info['fused_adamw']}"),
                    ("TF32 matmuls", info["tf32"] is True,
                     f"torch.backends.cuda.matmul.allow_tf32={info['tf32']}")]
    return results
