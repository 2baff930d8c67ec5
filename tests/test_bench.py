"""bench.py: the report of a CPU run through its command line, and the pieces a CPU cannot reach in it (GPU
kernel names, running out of GPU memory). gpu_check's parts that run on a CPU."""
import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import types

import pytest

from conftest import ROOT
from gptlib.errors import UserError
from gptlib.runtime import Runtime

STANDIN = os.path.join(ROOT, "tests", "workers", "peer_standin.py")  # llm.c's reference as bench.py runs it


def test_the_profiled_steps_go_to_a_trace_without_the_profilers_chatter(tmp_path, capfd):
    """--trace: the profiled steps of the last rung as a Chrome trace, and nothing of Kineto's "STAGE:" and
    "USDT:" lines on stderr (the report test runs the whole ladder and its breakdown as a command)."""
    import bench
    from gptlib.runtime import Runtime
    every = {k: v for _, switch in bench.rungs({"compile"}) for k, v in switch.items()}
    step = bench.training_step(dict(n_layer=1, n_head=2, n_embd=32, block_size=64), {**bench.BASE, **every}, 2,
                               32, Runtime())
    lines = bench.breakdown(step, "cpu", 0.01, steps=1, trace=str(tmp_path / "trace.json"))
    err = capfd.readouterr().err
    assert "USDT:" not in err and "STAGE:" not in err, err[-3000:]
    events = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    assert "aten::mm" in {e.get("name") for e in events}
    assert any(line.startswith("| matmuls (linear layers, lm_head) |") for line in lines)


def ladder_checks(report):
    """The whole ladder but torch.compile (minutes to compile on 2 cores; the training tests cover it) and
    where its last rung's time goes, as bench.py --only training writes them on a CPU."""
    rows = re.findall(r"^\| (\+ [^|]+|fp32, eager) \| ([\d.]+) \| [\d.]+-[\d.]+ \| ([\d,]+) \| n/a \| n/a "
                      r"\| ([\d.]*x?) \|$", report, re.M)
    assert [name for name, *_ in rows] == ["fp32, eager", "+ TF32 matmuls", "+ bf16 autocast",
                                           "+ fused attention (SDPA)",
                                           "+ vocab 50304", "+ fused AdamW"]
    for name, ms, tok_s, speedup in rows:
        assert float(ms) > 0 and int(tok_s.replace(",", "")) > 0 and (speedup or name == "fp32, eager")
    # which CPU
    assert re.search(r"^.+ \(\d+ cores, (with|no|unknown) AVX-512-BF16/AMX\), torch ", report, re.M)
    parts = dict(re.findall(r"^\| ([a-z][^|]+?) \| ([\d.]+) \| \d+% \|$", report, re.M))
    assert list(parts) == ["cross-entropy over the logits", "attention", "optimizer (clipping, AdamW)",
                           "matmuls (linear layers, lm_head)",
                           "other (LayerNorm, GELU, adds, embedding, copies)",
                           "idle (launch gaps, CPU overhead)"]
    for part in ("cross-entropy over the logits", "attention", "optimizer (clipping, AdamW)",
                 "matmuls (linear layers, lm_head)"):  # each of them runs on every step
        assert float(parts[part]) > 0, part
    assert re.search(r"^largest: aten::", report, re.M)


def test_presets_table():
    """Per GPT-2 size: memory per GPU under DDP and FSDP x8 and the largest B that fits an 80, 40 and 24 GB
    card, by accounting.py's estimate of the compiled step (train_gpt2.py's default)."""
    import bench
    from gptlib.accounting import training_memory
    from model import GPT2_SIZES, GPTConfig
    lines = bench.presets(1024)
    row = re.compile(r"^\| (\d+M) \| [\d,]+ \| ([\d.]+) GiB \| ([\d.]+) GiB "
                     r"\| (\d+) / (\d+) \| (\d+) / (\d+) \| (\d+) / (\d+) \|$")
    rows = [m for m in map(row.match, lines) if m]
    assert [m.group(1) for m in rows] == list(GPT2_SIZES)
    for m in rows:
        config = GPTConfig(**GPT2_SIZES[m.group(1)], vocab_size=50304)
        assert float(m.group(3)) < float(m.group(2))  # sharding saves memory
        for (ddp, fsdp), cap in (((m.group(4), m.group(5)), 80e9), ((m.group(6), m.group(7)), 40e9),
                                 ((m.group(8), m.group(9)), 24e9)):
            assert int(fsdp) >= int(ddp)
            for B, shards in ((int(ddp), 1), (int(fsdp), 8)):  # B fits in 90% of the card, B + 1 does not
                assert B == 0 or training_memory(config, B, 1024, "bf16", shards, True)["total"] <= 0.9 * cap
                assert training_memory(config, B + 1, 1024, "bf16", shards, True)["total"] > 0.9 * cap
    assert rows[-1].group(8) == "0" and int(rows[-1].group(9)) > 0  # GPT-2 XL on a 24 GB card: FSDP only


def test_bench_bad_rung(monkeypatch, capsys):
    import bench
    monkeypatch.setattr(sys, "argv", ["bench.py", "--device", "cpu", "--skip", "warp"])
    with pytest.raises(UserError, match="rungs are fp32, tf32, bf16, flash, compile, vocab, fused"):
        bench.main()


def test_the_step_runs_at_the_B_given(monkeypatch, capsys):
    """One flag, --B, for every part's micro-batch: --only step --B 2 runs the step at B=2 (it took --step_B's
    64, or a CPU's 8, whatever --B said), and --help says so."""
    import bench
    monkeypatch.setattr(sys, "argv", ["bench.py", "--device", "cpu", "--only", "step", "--B", "2",
                                      "--T", "16", "--steps", "1", "--warmup", "0", "--skip", "compile"])
    bench.main()
    out = capsys.readouterr().out
    assert re.search(r"^\| every rung, B=2 \| [\d.]+ \|", out, re.M) and "step B=2, T=16" in out, out
    monkeypatch.setattr(sys, "argv", ["bench.py", "--help"])
    with pytest.raises(SystemExit):
        bench.main()
    assert "the step's, the levers' and the peer's 64" in " ".join(capsys.readouterr().out.split())


def test_the_lever_rows_on_a_cuda_runtime(monkeypatch, capsys):
    """bench.levers on a CUDA runtime (faked: its hardware queries, and a stand-in for the step): a lever with
    a compile limit compiles apart in a child given the device as runtime.setup takes it, cuda (029eb9d gave
    rt.device, cuda:0, which setup refuses: the row always read "its compile failed apart"), the child's
    runner run here on the faked hardware; then its row is timed, as the lever without a limit's is."""
    import torch

    import bench
    from gptlib import gpu_report
    for name, fake in [("is_available", lambda: True), ("device_count", lambda: 1),
                       ("set_device", lambda device: None), ("get_device_capability", lambda device=None: (9, 0)),
                       ("empty_cache", lambda: None), ("reset_peak_memory_stats", lambda device=None: None),
                       ("synchronize", lambda device=None: None), ("memory_allocated", lambda device=None: 2**30),
                       ("max_memory_allocated", lambda device=None: 2**31)]:
        monkeypatch.setattr(torch.cuda, name, fake)
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch, "set_float32_matmul_precision", lambda precision: None)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device: types.SimpleNamespace(total_memory=80 * 2**30))
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the runner puts the project first
    built = []
    monkeypatch.setattr(bench, "training_step", lambda size, s, B, T, rt, lever=None:
                        built.append((rt.kind, rt.device, rt.dtype, lever)) or (lambda: None))

    def child(argv, log_path, deadline, cache, session=True):  # the lever's process, `python -c RUNNER ARGS`
        monkeypatch.setattr(sys, "argv", ["-c", *argv[3:]])
        try:
            exec(argv[2], {})
        except UserError as e:
            print(e)
            return 1
        return 0
    monkeypatch.setattr(gpu_report, "run_section", child)
    fake = Runtime(kind="cuda", device="cuda:0", dtype="bf16")
    size, s = dict(n_layer=1, n_head=2, n_embd=16, block_size=32), {**bench.BASE, "compile": True, "bf16": True}
    lines = bench.levers(size, s, 2, 16, fake, 2, 1, ("coordinate", "autotune"))
    assert ("cuda", "cuda:0", "bf16", "autotune") in built, capsys.readouterr().out  # the child's runtime
    rows = {line.split(" | ")[0][2:]: line for line in lines if line.startswith("| ") and "---" not in line}
    for label in ("Inductor's coordinate_descent_tuning (llm.c's reference sets it)",
                  "mode=max-autotune-no-cudagraphs"):
        assert re.match(r"\| [^|]+ \| [\d.]+ \| [\d.]+ \([\d.]+-[\d.]+\) \| [\d,]+ \| [\d.]+x \| ", rows[label]), \
            rows[label]
    assert re.search(r"\| \d+ s apart \+ [\d.]+ s \| 1.00 GiB / 1.00 GiB \|", rows["mode=max-autotune-no-cudagraphs"])


def test_own_copy_keeps_the_methods_defaults():
    """engine.own_copy: the bound method with a code object of its own (Dynamo's recompile limit counts a code
    object's graphs) and the method's defaults, positional and keyword-only: the compiled lever step calls
    GPT.forward's copy with idx alone (before 3b7b52e it failed there, and no CPU test compiled it)."""
    import torch

    from gptlib.engine import own_copy
    from model import GPT, GPTConfig
    model = GPT(GPTConfig(block_size=8, vocab_size=64, n_layer=1, n_head=2, n_embd=16)).eval()
    forward, idx = own_copy(model.forward), torch.randint(0, 64, (1, 8))
    assert forward.__func__.__code__ is not GPT.forward.__code__ and forward.__self__ is model
    assert torch.equal(forward(idx)[0], model(idx)[0])

    class Keywords:
        def f(self, a, b=2, *, c=3):
            return self, a, b, c
    it = Keywords()
    assert own_copy(it.f)(1) == (it, 1, 2, 3)


def test_the_decode_breakdown_times_the_step_generate_ran(monkeypatch):
    """bench.decode_breakdown profiles the decode step generate() ran: the engine's own decoder for the batch
    (029eb9d timed a fresh one where compile is off) under no_grad, as generate() runs it (029eb9d ran it
    outside: an eager step built an autograd graph through the KV cache, its logits with a grad_fn)."""
    import torch

    import bench
    from gptlib import engine
    model = bench.build(dict(n_layer=1, n_head=2, n_embd=16, block_size=16), {"vocab_size": 50304, "flash": True},
                        "cpu").eval()
    gen, ran, step = engine.Engine(model), [], engine.Decoder.step
    monkeypatch.setattr(engine.Decoder, "step", lambda self, tok, pos: ran.append((self, step(self, tok, pos)))
                        or ran[-1][1])
    gen.generate(torch.zeros(2, 4, dtype=torch.long), 3, top_k=1)
    generated = ran[0][0]
    assert all(decoder is generated for decoder, _ in ran)
    ran.clear()
    bench.decode_breakdown(gen, model, 2, 4, Runtime(), None, steps=1)
    assert ran and all(decoder is generated for decoder, _ in ran)
    assert all(logits.grad_fn is None and not logits.requires_grad for _, logits in ran)


def test_the_plan_on_the_page_is_the_reports():
    """docs/speed.md's plan is the one gpu_report.sections() runs: its estimate's table names the sections in
    their order, each call's total is its sections' sum and within the first line's --budget; the first line
    says as many calls, each with the table's total and sections' seconds; the sections that decide run in
    the first two calls (029eb9d's first line said two calls, its table needed three, the levers in the third)."""
    from gptlib import gpu_report
    with open(os.path.join(ROOT, "docs", "speed.md")) as f:
        page = f.read()
    first = page.splitlines()[2]
    rows = re.findall(r"^\| (\d) \| (\w+) \| .* \| (\d+) s \|$", page, re.M)
    assert [name for _, name, _ in rows] == [name for name, *_ in gpu_report.sections("R", True, "cuda", "h", "P")]
    calls = {}
    for call, name, seconds in rows:
        calls.setdefault(int(call), {})[name] = int(seconds)
    plan = [(sum(call.values()), list(call.values())) for _, call in sorted(calls.items())]
    totals = re.findall(r"^\| \| \*\*\w+ call\*\* \| \| \| \*\*(\d+) s\*\* \|$", page, re.M)
    assert [int(t) for t in totals] == [total for total, _ in plan]
    assert first.split()[:2] == [["One", "Two", "Three", "Four"][len(plan) - 1], "calls,"], first
    said = [(int(total), [int(x) for x in re.findall(r"(\d+) s\b", those)])
            for total, those in re.findall(r"~(\d+) s \(([^)]*)\)", first)]
    assert said == plan, (said, plan)
    assert max(total for total, _ in plan) <= int(re.search(r"--budget (\d+)", first).group(1))
    assert {"checks", "step", "peer", "generation", "levers", "tuning", "autotune"} <= {*calls[1], *calls[2]}


@pytest.mark.slow
def test_peer_from_another_folder_by_a_relative_path(tmp_path, monkeypatch, capsys):
    """--only peer --peer PATH, PATH relative to the user's folder (not the project's, not the peer's own
    run's: FileNotFoundError at 0bcff65), against the stand-in (tests/workers/peer_standin.py): its steps
    counted after the warm-up --warmup says and timed over --steps, their warm-up in the process's compiling
    line, no peak memory off CUDA ("0 MiB" was the peer's), the real B in the title, the vocabularies beside
    the ratio; our runs stop at their last step (no checkpoint, evaluation, samples or report after it). A
    missing file is one line before anything runs."""
    import bench
    monkeypatch.chdir(tmp_path)
    shards = tmp_path / "shards"
    shards.mkdir()
    monkeypatch.setattr(tempfile, "TemporaryDirectory", lambda: contextlib.nullcontext(str(shards)))  # kept
    monkeypatch.setattr(bench, "WARMING", [0.0])
    peer = os.path.relpath(STANDIN, tmp_path)
    assert not os.path.isabs(peer) and os.path.isfile(tmp_path / peer)
    monkeypatch.setattr(sys, "argv", ["bench.py", "--device", "cpu", "--only", "peer", "--peer", peer,
                                      "--B", "2", "--T", "32", "--steps", "1", "--warmup", "1"])
    bench.main()
    out = capsys.readouterr().out
    assert (f"train_gpt2.py against llm.c's PyTorch reference ({STANDIN}), ours 2 layers 64 wide against "
            "its d12 (GPT-2 124M): a smoke test, the figures mean nothing, B=2, T=32, fp32; 2 rounds in "
            "turns, each run's median of 1 steps after 1 warm-up:") in out, out
    rows = dict(re.findall(r"^\| (train_gpt2.py|llm.c's train_gpt2.py) \| ([\d,]+) \| [\d.]+ "
                           r"\([\d.]+, [\d.]+\) \| [\d,]+ \| n/a \|$", out, re.M))
    assert rows == {"train_gpt2.py": "50,304", "llm.c's train_gpt2.py": "50,257"}, out
    assert re.search(r"^train_gpt2.py is [\d.]+x the reference's speed, its vocabulary padded to 50,304 "
                     r"where llm.c's d12 uses 50,257: the ratio includes that padding$", out, re.M)
    # each of the stand-in's two runs: a first step 0.5 s, the others 20 ms
    warm = float(re.search(r"^compiling and warm-up: ([\d.]+) s$", out, re.M).group(1))
    assert 0.9 <= warm, out
    for r in (0, 1):
        log = shards / f"ours{r}"
        records = [json.loads(line) for line in (log / "metrics.jsonl").read_text().splitlines()]
        assert [x["step"] for x in records if "ms" in x] == [1, 2]
        assert not [x for x in records if "val_loss" in x or "samples" in x], records
        assert not list(log.glob("model_*")) and not (log / "report.md").exists()
    monkeypatch.setattr(sys, "argv", ["bench.py", "--device", "cpu", "--only", "peer", "--peer",
                                      "no/such.py"])
    with pytest.raises(UserError, match=r"^--peer no/such.py: no such file; give the path of llm.c's"):
        bench.main()
    monkeypatch.setattr(sys, "argv", ["bench.py", "--device", "cpu", "--only", "step", "--peer", peer])
    with pytest.raises(UserError, match="--peer PATH is for --only peer or --report"):
        bench.main()


def test_hellaswag_cost_counts_its_cold_evaluation(monkeypatch):
    """HellaSwag's first evaluation in the process over its later ones is compiling and warming up (it never
    counted: the report's column said 0 s)."""
    import bench
    import hellaswag
    waits = iter([0.4, 0.05, 0.05])

    def evaluate(model, prepared, rt):
        time.sleep(next(waits))
        return {"acc_norm": 0.25}
    monkeypatch.setattr(hellaswag, "evaluate", evaluate)
    monkeypatch.setattr(bench, "WARMING", [0.0])
    bench.hellaswag_cost(dict(n_layer=1, n_head=2, n_embd=16, block_size=128), Runtime(), None, 8, n=8)
    assert 0.3 < bench.WARMING[0] < 0.5, bench.WARMING


def test_breakdown_parts():
    """The names breakdown() sorts: CUDA kernels of eager and compiled steps, and CPU ops with their
    callers."""
    from bench import OTHER, part_of
    ce, attn, opt, mm = "cross-entropy over the logits", "attention", "optimizer (clipping, AdamW)", \
        "matmuls (linear layers, lm_head)"
    cases = {
        "void at::native::(anonymous namespace)::cunn_SoftMaxForward<8, float, float, float, "
        "at::native::(anonymous namespace)::LogSoftMaxForwardEpilogue>(float*, float const*, int)": ce,
        "void at::native::(anonymous namespace)::nll_loss_forward_reduce_cuda_kernel_2d<float, float, "
        "long>": ce,
        "triton_red_fused__log_softmax_nll_loss_forward_3": ce,
        "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 64, 4, false, false, "
        "cutlass::bfloat16_t>, false, true, false>(pytorch_flash::Flash_fwd_params)": attn,
        "fmha_cutlassB_bf16_aligned_64x64_k64_sm80(PyTorchMemEffAttention::AttentionBackwardKernel)": attn,
        "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, "
        # the explicit attention's softmax
        "at::native::(anonymous namespace)::SoftMaxForwardEpilogue>": attn,
        "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous "
        "namespace)::FusedOptimizerTensorListMetadata<4>, at::native::(anonymous "
        "namespace)::FusedAdamMathFunctor<float, 4>>": opt,
        "void at::native::lpnorm_cleanup<float, (at::native::NormType)1, float, float>(float const*)": opt,
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_"
        "execute_segment_k_off_kernel__5x_cublas": mm,
        "nvjet_hsh_256x128_64x4_2x1_v_bz_coopA_NNN": mm,
        "triton_tem_fused_mm_0": mm,  # a matmul template (max-autotune)
        "triton_poi_fused_addmm_gelu_3": OTHER,  # the bias and GELU after a cuBLAS matmul, named after addmm
        "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>": OTHER,
        "triton_poi_fused_add_gelu_native_layer_norm_7": OTHER,
        "void at::native::embedding_backward_feature_kernel<float, float, long>": OTHER,
    }
    for name, part in cases.items():
        assert part_of([name]) == part, name
    assert part_of(["aten::fill_", "aten::zero_", "aten::nll_loss_backward",
                    "aten::cross_entropy_loss"]) == ce
    # clipping's mul_, under bench.py's record_function label
    assert part_of(["aten::mul_", "optimizer"]) == opt
    assert part_of(["aten::addmm", "aten::linear"]) == mm and part_of(["aten::mm", "MmBackward0"]) == mm
    assert part_of(["aten::native_layer_norm", "aten::layer_norm"]) == OTHER


def test_breakdown_follows_callers():
    """On CPU an op that no pattern names (the fill_ that zeroes the logits' gradient inside
    nll_loss_backward) is counted in its caller's part: a cross-entropy step is all cross-entropy."""
    import torch
    from torch.nn import functional as F
    from bench import breakdown
    logits = torch.randn(256, 50304, requires_grad=True)
    targets = torch.randint(0, 50304, (256,))

    def step():
        logits.grad = None
        F.cross_entropy(logits, targets).backward()
    lines = breakdown(step, "cpu", step_time=10.0, steps=2)
    found = re.findall(r"^\| ([a-z][^|]+?) \| ([\d.]+) \|", "\n".join(lines), re.M)
    ms = {part: float(v) for part, v in found}
    assert ms["cross-entropy over the logits"] > 0
    assert ms["other (LayerNorm, GELU, adds, embedding, "
              "copies)"] < 0.02 * ms["cross-entropy over the logits"], ms


def test_ladder_goes_on_after_out_of_memory(monkeypatch):
    """A rung that runs out of GPU memory (fp32 with the T x T attention matrices, say) is reported as such
    and the ladder continues, without a speed-up against the missing rung."""
    import torch
    import bench
    real, calls = bench.time_steps, []

    def first_runs_out(step, device, steps, warmup):
        calls.append(1)
        if len(calls) == 1:
            try:  # as compiled code raises it: wrapped
                raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
            except torch.cuda.OutOfMemoryError as e:
                raise RuntimeError("backend compiler failed") from e
        return real(step, device, steps, warmup)
    monkeypatch.setattr(bench, "time_steps", first_runs_out)
    size = dict(n_layer=1, n_head=2, n_embd=16, block_size=32)
    skip = {"bf16", "compile", "flash", "vocab", "fused"}
    lines, _, _, step, dt = bench.ladder(size, 2, 16, Runtime(), 1, 0, bench.rungs(skip))
    assert lines[2] == "| fp32, eager | out of memory at B=2 | | | | | |"
    assert lines[3].startswith("| + TF32 matmuls | ") and lines[3].endswith("|  |")  # no speed-up column
    assert step is not None and dt > 0 and len(lines) == 4


def test_gpu_check_parts_that_run_on_a_cpu():
    """gpu_check's attention check reads the ops SDPA really ran from the profiler (on a CPU: its flash op
    too) and accepts any fused backend, as the ops of an H100 (cuDNN) or an older GPU show them, never the
    math fallback; the recompile count splits TORCH_LOGS output at a marker line."""
    from gptlib.gpu_check import attention_backends, check_attention, recompiles
    ok, detail = check_attention(Runtime())
    assert ok and "SDPA ran flash attention (aten::_scaled_dot_product_flash_attention_for_cpu" in detail, \
        detail
    op = "aten::_scaled_dot_product_{}"
    for ops, want in [(["cudnn_attention", "cudnn_attention_backward"], (True, ["cuDNN"])),
                      (["flash_attention", "flash_attention_backward"], (True, ["flash"])),
                      (["efficient_attention", "efficient_attention_backward"], (True, ["memory-efficient"])),
                      (["attention_math", "flash_attention_for_cpu"], (False, ["flash", "math"])),
                      (["attention_math"], (False, ["math"])), ([], (False, []))]:
        assert attention_backends([op.format(o) for o in ops]) == want, ops
    out = "\n".join(["V [0/1] [__recompiles] Recompiling function forward", "step 5: hellaswag acc_norm 0.25",
                     "V [0/2] [__recompiles] Recompiling function forward", "x Recompiling function f"])
    assert recompiles(out, "step 5: hellaswag") == (1, 2) and recompiles(out, "never") == (0, 3)


def test_the_eta_counts_evaluations_at_the_recent_pace(monkeypatch):
    """Steps of 1 s with an evaluation of 4 s every 2 steps: over a window of 2 steps the pace is 3 s a step,
    so 10 steps before the end the ETA is 30 s; the elapsed time goes on from a resumed run's."""
    from gptlib import runlog
    now = [1000.0]
    monkeypatch.setattr(runlog.time, "time", lambda: now[0])
    clock = runlog.Clock(elapsed=50.0, window=2)
    assert clock.elapsed() == 50.0 and clock.eta(1, 20) is None  # no pace yet
    for step in range(1, 11):
        now[0] += 1.0  # the step
        if step > 1:
            eta = clock.eta(step, 20)
        now[0] += 4.0 if step % 2 == 0 else 0.0  # its evaluation
        clock.lap(step)
    assert eta == (20 - 10) * 3.0 and clock.elapsed() == 50.0 + 10 + 5 * 4
    assert [runlog.duration(x) for x in (None, 13, 123, 3723)] == ["?", "13s", "2m03s", "1h02m03s"]


def item_calls(fn):
    """A CPU stand-in for CUDA's sync debug mode: the Tensor.item calls fn() makes (each a host sync on a
    GPU)."""
    import torch
    calls, item = [0], torch.Tensor.item

    def counted(self):
        calls[0] += 1
        return item(self)
    torch.Tensor.item = counted
    try:
        fn()
    finally:
        torch.Tensor.item = item
    return calls[0]


@pytest.mark.slow
def test_generation_check_fails_on_planted_defects(monkeypatch):
    """gpu_check.check_generation's logic on a CPU (eager decoding, Tensor.item counted as the syncs): it
    passes the real decoder, and fails on a cache that loses values, a sync per token, a counter that never
    fires, and a comparison that covers too few steps."""
    from gptlib import engine
    from gptlib.gpu_check import check_generation, generation_verdict
    rt = Runtime()
    ok, detail = check_generation(rt, compile=False, count_syncs=item_calls, steps=16)
    assert ok, detail
    assert "3 samples of one prompt: the same tokens as recomputing over 48 of 48" in detail
    assert "0 / 0 host syncs at 4 / 32 new tokens, 1 with a deliberate one more" in detail

    with monkeypatch.context() as m:  # a broken cache: values are never written
        update = engine.KVCache.update
        m.setattr(engine.KVCache, "update", lambda self, layer, k, v: update(self, layer, k, v * 0))
        ok, detail = check_generation(rt, compile=False, count_syncs=item_calls, steps=16)
        assert not ok and "OTHER tokens than recomputing" in detail, detail
    with monkeypatch.context() as m:  # a host sync at every token
        pick = engine.pick
        m.setattr(engine, "pick", lambda logits, *a, **k: pick(logits, *a, **k) + 0 * int(logits[0, 0].item()))
        ok, detail = check_generation(rt, compile=False, count_syncs=item_calls, steps=16)
        assert not ok and "4 / 32 host syncs" in detail and "grow with the tokens" in detail, detail
    ok, detail = check_generation(rt, compile=False, count_syncs=lambda fn: fn() or 0, steps=16)  # a deaf counter
    assert not ok and "the counter missed it" in detail, detail
    ok, detail = generation_verdict({"3 prompts": (60, 192, True)}, (0, 0), 1)  # compared a third
    assert not ok and "too few" in detail, detail


@pytest.mark.slow
def test_report_runs_every_section_and_continues(tmp_path, capsys):
    """bench.py --report on a CPU, at its tiny size, from a folder other than the project's, the report's and
    the peer's paths relative to it (each section runs from the project root, where --peer named no file at
    0bcff65): every section in its own process, in the order that decides (docs/speed.md's first two calls:
    the checks, the step, the peer, generation, the levers; then the rest), its raw output kept, report.md
    naming the commit and each command, and each section's compiling and warm-up from its own first and
    later iterations (HellaSwag's and the peer's were always 0); generation's decode breakdown; the levers'
    table (those a CPU cannot run say n/a in their row); a rerun runs nothing it holds; a budget stops the
    section running (exit 2) and the rerun runs only what is missing (those reruns call gpu_report.run, what
    the command runs)."""
    from gptlib import gpu_report
    out = tmp_path / "r"
    r = subprocess.run([sys.executable, os.path.join(ROOT, "bench.py"), "--report", "r", "--device", "cpu",
                        "--commit", "abc1234", "--peer", os.path.relpath(STANDIN, tmp_path)], cwd=tmp_path,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    names = ["checks", "step", "peer", "generation", "levers", "tuning", "autotune", "training", "script",
             "hellaswag", "core"]
    assert re.findall(r"^== (\w+): ", r.stdout, re.M) == names
    row = re.compile(r"^\| \[(\w+)\]\(#\w+\) \| `python ([^`]+)` \| (finished|FAILED[^|]*) \| \d+ s \| "
                     r"(n/a|[\d.]+ s) \|$", re.M)
    report = (out / "report.md").read_text()
    assert [(m.group(1), m.group(3)) for m in row.finditer(report)] == [(n, "finished") for n in names]
    warm = {m.group(1): m.group(4) for m in row.finditer(report)}  # compiling and warm-up, where it is known
    warming = {name: json.loads((out / f"{name}.json").read_text())["warming"] for name in names}
    # each section's own figure: bench.py's last line (the script's: from its records); the checks have none
    assert warming["checks"] is None and all(warming[n] >= 0 for n in names[1:]), warming
    assert warm == {n: "n/a" if n == "checks" else f"{warming[n]:.1f} s" for n in names}, (warm, warming)
    for n in set(names) - {"checks", "script"}:
        assert f"\ncompiling and warm-up: {warming[n]:.1f} s\n" in (out / f"{n}.log").read_text(), n
    cold, *later = map(float, re.search(r"^\| [\d.]+ s \| ([\d.]+) s \| ([\d.]+) s, ([\d.]+) s \| [\d,]+ \|$",
                                        report, re.M).groups())  # HellaSwag's evaluations
    hellaswag = max(0.0, cold - statistics.median(later))
    assert abs(warming["hellaswag"] - hellaswag) <= 0.06, (cold, later, warming)
    assert warming["peer"] >= 0.9, warming  # the stand-in's first step: 0.5 s over its others, in each run
    assert re.search(r"^11 sections, \d+ s in all", report, re.M)
    assert (out / "inductor_cache").is_dir()  # every section's compiles go there
    assert "commit abc1234" in report and "torch " in report
    for name in names:
        assert (out / f"{name}.log").stat().st_size > 0 and json.loads((out / f"{name}.json").read_text())["rc"] == 0
    assert "| test_graphed_generation_is_exact_and_never_waits | skipped | needs a CUDA GPU |" in report
    assert re.search(r"^median of steps \d+-4: [\d,.]+ ms/step, [\d,]+ tok/s$", report, re.M), report
    assert re.search(r"^\| every rung, B=8 \| [\d.]+ \| [\d.]+-[\d.]+ \|", report, re.M)
    assert not list((out / "script_log").glob("model_*"))  # the script's checkpoints are not kept
    generated = re.findall(r"^\| (\d+) \| (\d+) \| ([\d,]+) \| ([\d.]+) ms \| ([\d,]+) GB/s \| ([\d,]+) \| "
                           r"[\d.]+x \| (\d+)% \|", report, re.M)
    assert [(b, n) for b, n, *_ in generated] == [("1", "32"), ("4", "32")]
    assert all(same == "100" for *_, same in generated)  # fp32: the cache gives recomputation's tokens
    assert re.search(r"^\| eager \| 4 \| 64 \| [\d.]+ GiB \| n/a \| n/a \|$", report, re.M)  # the ladder's
    for batch in (1, 4):  # where a decode step's time goes
        decode = report[report.index(f"a decode step at batch {batch}: "):]
        assert re.match(r"a decode step at batch \d: [\d.]+ ms; it reads at least [\d,]+ MB \(the weights and "
                        r"the whole cache\): the GPU's bandwidth unknown$", decode.splitlines()[0])
        parts = dict(re.findall(r"^\| ([a-z][^|]+?) \| ([\d.]+) \| \d+% \|$", decode[:decode.index("largest:")],
                                re.M))
        assert list(parts) == ["sampling (the logits to a token: argmax)", "attention",
                               "matmuls (linear layers, lm_head)", "copies (the cache's writes, the step's inputs)",
                               "other (LayerNorm, GELU, adds, embedding)", "idle (launch gaps, CPU overhead)"]
        assert all(float(parts[p]) > 0 for p in ("sampling (the logits to a token: argmax)", "attention",
                                                 "matmuls (linear layers, lm_head)")), parts
    levers = "".join((out / f"{name}.md").read_text() for name in ("levers", "tuning", "autotune"))
    assert re.search(r"^the levers, each a variant of the step at B=8, T=64 \(eager; the default's compiling "
                     r"[\d.]+ s, its attention flash\), A/B in turns", levers, re.M), levers
    flash = re.search(r"^\| SDPA forced to flash \| ([\d.]+) \| ([\d.]+) \([\d.]+-[\d.]+\) \| [\d,]+ \| ([\d.]+)x "
                      r"\| [\d.]+ s \| n/a / n/a \| flash \| (yes|no) \|$", levers, re.M)
    assert flash, levers  # a CPU runs its flash attention: forced, it is what ran
    a, b, ratio, wins = flash.groups()
    assert abs(float(ratio) - float(a) / float(b)) < 0.01 and (wins == "yes") == (float(a) / float(b) >= 1.03)
    for label, why in [("SDPA forced to cuDNN", r"not on this device \(No viable backend"),
                       ("SDPA forced to memory-efficient", r"not on this device \(No viable backend"),
                       (r"Inductor's coordinate_descent_tuning \(llm.c's reference sets it\)",
                        "torch.compile is off"),
                       ("mode=max-autotune-no-cudagraphs", "torch.compile is off")]:
        assert re.search(f"^\\| {label} \\| n/a: {why}[^|]*\\|( \\|){{7}}$", levers, re.M), (label, levers)
    assert re.search(r"^\| 124M \| 124,475,904 \| [\d.]+ GiB \| [\d.]+ GiB \| \d+ / \d+ \| 75 / \d+ \| ",
                     report, re.M)
    assert re.search(r"^CORE \(80 examples in 5 tasks, .*, eager, \d+ threads tokenizing", report, re.M)
    assert re.search(r"^\| 4 \| [\d.]+ s \| [\d.]+ s \| [\d.]+ s \| [\d,]+ \| -?[\d.]+ \|$", report, re.M)
    assert "train_gpt2.py against llm.c's PyTorch reference at B=8, T=64, in turns, the same shards" in report
    assert re.search(r"^\| llm.c's train_gpt2.py \| 50,257 \| [\d.]+ \([\d.]+, [\d.]+\) \| [\d,]+ \| n/a \|$",
                     report, re.M), report
    ladder_checks((out / "training.md").read_text())

    capsys.readouterr()
    assert gpu_report.run(str(out), "cpu", commit="abc1234", peer=STANDIN) == 0
    assert "== " not in capsys.readouterr().out
    (out / "hellaswag.json").unlink()
    (out / "tuning.json").unlink()  # a lever's section, of the quickest (levers' took 3 times as long)
    assert gpu_report.run(str(out), "cpu", budget=0.01, commit="abc1234", peer=STANDIN) == 2
    said = capsys.readouterr().out
    assert "stopped at the budget during tuning" in said and re.findall(r"^== (\w+)", said, re.M) == ["tuning"]
    assert not (out / "tuning.json").exists()
    assert "| [tuning]" not in (out / "report.md").read_text()  # a stopped section is not shown
    assert gpu_report.run(str(out), "cpu", commit="abc1234", peer=STANDIN) == 0
    assert re.findall(r"^== (\w+)", capsys.readouterr().out, re.M) == ["tuning", "hellaswag"]  # what was missing
    assert [m.group(1) for m in row.finditer((out / "report.md").read_text())] == names
    # the script's: its first step over the later ones' median, never negative (an eager first step may be
    # the fastest: flaky at 1181ac5), and its first evaluation over the later ones' (the step after each less)
    with open(out / "script_log" / "metrics.jsonl", "w") as f:
        f.writelines(json.dumps(record) + "\n" for i, ms, elapsed in ((1, 90, 0.09), (2, 300, 2.39),
                                                                      (3, 200, 3.09), (4, 210, 3.9))
                     for record in ({"step": i, "loss": 1.0, "ms": ms, "elapsed": elapsed},
                                    {"step": i, "val_loss": 1.0}))
    assert gpu_report.warming("script", str(out)) == pytest.approx(2.0 - statistics.median([0.5, 0.6]))
    (tmp_path / "a_file").write_text("")
    with pytest.raises(UserError, match="a_file is not a folder that can be written: choose another folder"):
        gpu_report.run(str(tmp_path / "a_file" / "r"), "cpu")


def test_a_steps_peak_memory_is_logged_and_reported(tmp_path):
    """On CUDA each step's record holds the peak memory allocated since the step began (train_gpt2.py resets
    the counter first): report.md and the GPU report read it."""
    from gptlib import gpu_report
    import plot
    log = tmp_path / "metrics.jsonl"
    start = {"event": "start", "step": 0, "config": {"max_steps": 5, "total_batch_size": 8}}
    steps = [{"step": i, "loss": 5.0, "ms": 100.0 + i, "tok_s": 80.0, "mfu": 0.4, "elapsed": i,
              "peak_memory": (3 + (i == 5)) * 2**29} for i in range(1, 6)]
    log.write_text("\n".join(json.dumps(r) for r in [start] + steps) + "\n")
    records = plot.read_log(str(log))
    text = plot.report(str(log), records, plot.load_metrics(str(log), records))
    assert "a step's peak GPU memory 2.00 GiB (rank 0)" in text
    assert gpu_report.script_steps(str(log), skip=3) == [
        "median of steps 4-5: 104.5 ms/step, 80 tok/s, MFU 40.0%; a step's peak memory 2.00 GiB"]


@pytest.mark.slow
def test_a_section_that_prints_nothing_stops_at_its_deadline(tmp_path, monkeypatch):
    """--budget's deadline holds while a section is silent (the peer's rounds print nothing for minutes; the
    deadline was checked only when a line came), and the section's log keeps what it printed; what a section
    leaves running is stopped with it. A lever with a compile limit (max-autotune's 3 minutes) compiles and
    runs its step once in a process of its own, stopped at the limit with a line for its row."""
    import bench
    from gptlib import gpu_report
    size, s = dict(n_layer=1, n_head=2, n_embd=16, block_size=32), {**bench.BASE, "flash": True}
    rc, seconds = bench.compile_apart("flash", size, s, 2, 16, "cpu", 120)  # eager here: it runs in seconds
    assert rc == 0 and seconds < 120
    label, how = bench.LEVERS["autotune"]
    monkeypatch.setitem(bench.LEVERS, "autotune", (label, {**how, "limit": 0.5}))
    started = time.time()
    assert bench.unavailable("autotune", {**s, "compile": True}, Runtime(), size, 2, 16) == (
        "stopped at 0.5 s of compiling, unfinished: not timed", None)
    assert time.time() - started < 20
    started = time.time()
    status = gpu_report.run_section([sys.executable, "-c", "import time; print('start', flush=True); "
                                     "time.sleep(60); print('end')"], str(tmp_path / "s.log"),
                                    time.time() + 2, str(tmp_path))
    assert status is None and time.time() - started < 20
    assert (tmp_path / "s.log").read_text() == "start\n"
    started = time.time()  # a section that ends leaving a process of its own running (holding its output)
    status = gpu_report.run_section([sys.executable, "-c", "import subprocess, sys; subprocess.Popen(["
                                     "sys.executable, '-c', 'import time; time.sleep(60)']); print('left')"],
                                    str(tmp_path / "t.log"), None, str(tmp_path))
    assert status == 0 and time.time() - started < 20 and (tmp_path / "t.log").read_text() == "left\n"
    # a --budget stop while a lever compiles apart in a process group of its own (029eb9d left it running,
    # racing the next call): the deadline comes once the lever's process has said its pid
    log, wait = tmp_path / "u.log", subprocess.Popen.wait

    def at_the_deadline(self, timeout=None):  # run_section's wait for the section, until its deadline
        if timeout is None:
            return wait(self)
        while "lever" not in log.read_text() and self.poll() is None:
            time.sleep(0.1)
        raise subprocess.TimeoutExpired(self.args, timeout)
    section = ("import bench\n"
               "bench.LEVER_RUNNER = 'import os, time; print(\"lever\", os.getpid(), flush=True); time.sleep(60)'\n"
               "bench.compile_apart('autotune', {}, {}, 1, 1, 'cpu', 120)\n")
    with monkeypatch.context() as m:
        m.setattr(subprocess.Popen, "wait", at_the_deadline)
        assert gpu_report.run_section([sys.executable, "-c", section], str(log), time.time() + 600,
                                      str(tmp_path)) is None
    lever = int(re.search(r"^lever (\d+)$", log.read_text(), re.M).group(1))
    for _ in range(100):  # its SIGKILL's delivery
        if not running(lever):
            break
        time.sleep(0.1)
    assert not running(lever), log.read_text()


def running(pid):
    """Whether process pid runs (Linux's /proc): neither gone nor a zombie awaiting its parent's wait."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
