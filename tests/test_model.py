import ctypes
import datetime
import math
import os
import shutil
import subprocess
import sys
import types

import pytest
import safetensors.torch
import torch

from conftest import MODERN as MODERN_OPTIONS, ROOT, assert_one_line_error, build, script, tiny, trained_modern
from gptlib import hf_gpt2
from gptlib.accounting import count_params, flops_per_token, memory_estimate, mfu, peak_flops, training_memory
from gptlib.engine import Engine
from gptlib.errors import UserError
from gptlib.optimizers import make_optimizers, role_peaks
from model import GPT, GPT2_VOCAB, GPTConfig, Packing


# ---------------------------------------------------------------------------------------------- architecture

def test_shapes_and_loss():
    m = build(tiny(vocab_size=50304))
    x = torch.randint(0, GPT2_VOCAB, (3, 17))
    logits, loss = m(x)
    assert logits.shape == (3, 17, 50304) and loss is None
    logits, loss = m(x, x)  # the loss alone: no logits kept when they are not asked for
    assert logits is None and loss.shape == () and torch.isfinite(loss)


def test_weight_tying_and_init():
    c = tiny(n_layer=6)
    m = build(c)
    assert m.lm_head.weight is m.transformer.wte.weight
    # c_proj weights are scaled down by (2 * n_layer)^-0.5, everything else std 0.02, biases zero
    assert abs(m.transformer.h[0].mlp.c_fc.weight.std().item() - 0.02) < 0.002
    assert abs(m.transformer.h[0].attn.c_proj.weight.std().item() - 0.02 / math.sqrt(12)) < 0.001
    assert torch.all(m.transformer.h[0].attn.c_attn.bias == 0)


def groups_by_role(opt):
    return {g["role"]: g for g in opt.param_groups}


def test_gpt2_124m_parameter_count_and_optimizer_roles():
    """AdamW's groups are named by role, every parameter in exactly one: wte (= lm_head) the embedding's,
    the other matrices decayed, biases and LayerNorm gains not. Muon takes the blocks' 48 weight matrices."""
    with torch.device("meta"):
        m = GPT(GPTConfig())
        assert m.num_params() == 124_439_808 == count_params(GPTConfig())
        m = GPT(GPTConfig(vocab_size=50304))
    peaks = {"muon": 0.02, "decay": 6e-4, "no_decay": 6e-4, "embedding": 6e-4, "head": 6e-4}
    opt, = make_optimizers(m, "adamw", 0.1, peaks, fused=False)
    g = groups_by_role(opt)
    assert list(g) == ["decay", "no_decay", "embedding"]  # tied: no head of its own
    size = {role: (len(group["params"]), sum(p.numel() for p in group["params"]))
            for role, group in g.items()}
    assert size["embedding"] == (1, 50304 * 768) and size["no_decay"] == (98, 121_344)
    assert size["decay"][1] + size["embedding"][1] == 124_354_560  # the 48 block matrices, wpe and wte
    assert g["decay"]["weight_decay"] == g["embedding"]["weight_decay"] == 0.1
    assert g["no_decay"]["weight_decay"] == 0
    assert opt.defaults["betas"] == (0.9, 0.95) and opt.defaults["eps"] == 1e-8 and not opt.defaults["fused"]
    muon_opt, adamw_opt = make_optimizers(m, "muon", 0.1, peaks, fused=False)
    (matrices,) = [g["params"] for g in muon_opt.param_groups]
    names = {id(p): n for n, p in m.named_parameters()}
    assert len(matrices) == 48 and all(p.dim() == 2 and names[id(p)].startswith("transformer.h.")
                                       for p in matrices)
    g = groups_by_role(adamw_opt)
    assert [names[id(p)] for p in g["decay"]["params"]] == ["transformer.wpe.weight"]
    grouped = [id(p) for opt in (muon_opt, adamw_opt) for group in opt.param_groups for p in group["params"]]
    assert sorted(grouped) == sorted(names)  # every parameter in exactly one group
    assert muon_opt.param_groups[0]["lr"] == 0.02 and muon_opt.param_groups[0]["role"] == "muon"


@pytest.mark.parametrize("untied", [True, False])
def test_parameter_groups_do_not_depend_on_the_learning_rates(untied):
    """The groups are the same whatever the peaks are (they were keyed by their peak: an embed_lr that,
    scaled, equals max_lr merged two groups, and a resume that changed max_lr could not fit the saved
    state); each group takes its role's peak. role_peaks scales embed_lr and head_lr by sqrt(768 / n_embd)
    (nanochat's rule); a tied lm_head is wte: the embedding's."""
    import train_gpt2
    m = GPT(tiny(untied_head=untied, n_embd=48))
    s = train_gpt2.Settings(optimizer="muon", max_lr=6e-3, embed_lr=0.2, head_lr=0.004)
    peaks = role_peaks(s, 48)
    assert peaks["embedding"] == pytest.approx(0.2 * 4) and peaks["head"] == pytest.approx(0.004 * 4)
    assert role_peaks(train_gpt2.Settings(max_lr=6e-3), 48)["embedding"] == 6e-3  # 0: max_lr
    structures = []
    for peak in ({**peaks, "embedding": 6e-3}, peaks, dict.fromkeys(peaks, 6e-3)):  # equal peaks: no merging
        opts = make_optimizers(m, "muon", 0.1, peak, fused=False)
        structures.append([[(g["role"], len(g["params"])) for g in opt.param_groups] for opt in opts])
        lr = {id(p): g["lr"] for opt in opts for g in opt.param_groups for p in g["params"]}
        assert lr[id(m.lm_head.weight)] == peak["head" if untied else "embedding"]
        assert lr[id(m.transformer.h[0].attn.c_attn.bias)] == peak["no_decay"]
    assert structures[0] == structures[1] == structures[2]
    assert structures[0][1][-1][0] == ("head" if untied else "embedding")


@pytest.mark.slow
def test_muon_is_torchs_muon_with_q_k_v_as_three_matrices():
    """optimizers.Muon against torch.optim.Muon(adjust_lr_fn="original") as the reference, over 3 steps: a
    plain matrix gets torch's update bit for bit; the fused c_attn (Q, K, V rows, here with 2 K/V heads of
    4) gets what torch's Muon gives three separate matrices holding those rows."""
    from gptlib.optimizers import Muon
    torch.manual_seed(0)
    C, kv = 32, 16
    fused = torch.nn.Parameter(torch.randn(C + 2 * kv, C))
    mlp = torch.nn.Parameter(torch.randn(4 * C, C))  # tall: its step is scaled by sqrt(4)
    parts = [torch.nn.Parameter(t.detach().clone()) for t in fused.split([C, kv, kv])]
    mlp_ref = torch.nn.Parameter(mlp.detach().clone())
    ours = Muon([{"params": [fused, mlp], "lr": 0.02, "weight_decay": 0.1}], splits={id(fused): [C, kv, kv]})
    ref = torch.optim.Muon(parts + [mlp_ref], lr=0.02, weight_decay=0.1, adjust_lr_fn="original")
    for _ in range(3):
        g_fused, g_mlp = torch.randn_like(fused), torch.randn_like(mlp)
        fused.grad, mlp.grad, mlp_ref.grad = g_fused, g_mlp, g_mlp.clone()
        for p, g in zip(parts, g_fused.split([C, kv, kv])):
            p.grad = g.clone()
        ours.step()
        ref.step()
    assert torch.equal(mlp, mlp_ref)
    assert torch.equal(fused.detach(), torch.cat([p.detach() for p in parts]))


def test_muon_gives_q_k_and_v_each_a_whole_orthogonal_step():
    """With c_attn orthogonalized as one matrix, Q's and K's parts of the update had singular values of
    ~0.07 x lr (V took most of the step); as three matrices each part's are ~lr, like attn.c_proj's."""
    from gptlib.optimizers import Muon, qkv_splits
    torch.manual_seed(0)
    m = GPT(tiny(n_embd=64, n_head=4))
    x = torch.randint(0, 512, (4, 32))
    m(x, x.roll(-1, 1))[1].backward()
    attn = m.transformer.h[0].attn
    before = {n: p.detach().clone() for n, p in (("qkv", attn.c_attn.weight), ("proj", attn.c_proj.weight))}
    Muon([{"params": [attn.c_attn.weight, attn.c_proj.weight], "lr": 1.0}], splits=qkv_splits(m)).step()
    update = {n: before[n] - p.detach()
              for n, p in (("qkv", attn.c_attn.weight), ("proj", attn.c_proj.weight))}
    median = {name: torch.linalg.svdvals(u.float()).median().item()
              for name, u in zip("qkv", update["qkv"].split(64))}
    median["proj"] = torch.linalg.svdvals(update["proj"]).median().item()
    assert all(0.5 < v < 1.5 for v in median.values()), median


MODERN = dict.fromkeys(MODERN_OPTIONS, True)


@pytest.mark.parametrize("kw", [{}, {"n_kv_head": 1}, {"n_kv_head": 2}, {"vocab_size": 1000, "n_layer": 3},
                                MODERN, {"untied_head": True}, {"rotary": True}, {"rmsnorm": True}])
def test_count_params_matches_module(kw):
    c = tiny(**kw)
    m = build(c)
    assert m.num_params() == count_params(c) == sum(p.numel() for p in set(m.parameters()))
    lookups = (0 if c.rotary else 32 * 32) + (512 * 32 if c.untied_head else 0)  # wpe; wte when untied
    assert count_params(c, non_embedding=True) == m.num_params() - lookups


def test_modern_options():
    """Each option is what it says: no wpe with rotary, lm_head apart from wte, zero output projections, no
    norm parameters, ReLU^2, embeddings whose scale does not matter; the loss at init is uniform's (zero-init
    head); and Hugging Face GPT-2 cannot express the model, so save_pretrained refuses it in one line."""
    m = build(tiny(**MODERN))
    names = {n for n, _ in m.named_parameters()}
    assert "transformer.wpe.weight" not in names and not any(".ln_" in n for n in names)
    assert m.lm_head.weight is not m.transformer.wte.weight and not m.lm_head.weight.any()
    assert all(not p.any() for n, p in m.named_parameters() if n.endswith("c_proj.weight"))
    x = torch.randint(0, 512, (2, 16))
    _, loss = m(x, x)
    assert abs(loss.item() - math.log(512)) < 1e-5
    h = torch.randn(5)
    assert torch.equal(m.transformer.h[0].mlp.act(h), torch.relu(h) ** 2)
    with pytest.raises(UserError, match="rotary=True, qk_norm=True, relu2=True, untied_head=True, "
                       "rmsnorm=True, embed_norm=True: Hugging Face GPT-2 has no such option"):
        hf_gpt2.save_pretrained(m, "/nonexistent")
    # embed_norm: what enters the first block does not depend on the embeddings' scale
    m = trained_modern()
    logits, _ = m.eval()(x)
    with torch.no_grad():
        m.transformer.wte.weight.mul_(3.0)
    torch.testing.assert_close(m(x)[0], logits)
    m.config.embed_norm = False
    assert not torch.allclose(m(x)[0], logits, atol=1e-3)


@pytest.mark.slow
def test_modern_gradient_checkpointing_and_positions():
    """grad_checkpoint gives the same loss and gradients; rotary positions are relative: a sequence scores
    the same starting at position 0 or 7 (explicit pos), where learned positions would not."""
    x = torch.randint(0, 512, (2, 16))
    results = []
    for flag in (False, True):
        m = trained_modern()
        m.config.grad_checkpoint = flag
        _, loss = m.train()(x, x.roll(-1, 1))
        loss.backward()
        results.append((loss.detach(), {n: p.grad for n, p in m.named_parameters()}))
    (l0, g0), (l1, g1) = results
    assert torch.equal(l0, l1) and all(torch.allclose(g0[n], g1[n], rtol=0, atol=1e-7) for n in g0)
    m.eval()
    logits, _ = m(x)
    shifted, _ = m(x, packing=Packing(pos=torch.arange(7, 23).expand(2, 16)))
    torch.testing.assert_close(logits, shifted, rtol=1e-4, atol=1e-4)


def test_loss_at_init_is_uniform():
    m = build(GPTConfig(block_size=64, n_layer=2, n_head=2, n_embd=64))
    x = torch.randint(0, GPT2_VOCAB, (4, 64))
    _, loss = m(x, torch.randint(0, GPT2_VOCAB, (4, 64)))
    assert abs(loss.item() - math.log(GPT2_VOCAB)) < 0.1


def test_ignore_index_targets():
    m = build(tiny())
    x = torch.randint(0, 512, (2, 8))
    y = x.clone()
    y[:, :4] = -1
    _, loss = m(x, y)
    ref = torch.nn.functional.cross_entropy(m(x)[0][:, 4:].reshape(-1, 512), y[:, 4:].reshape(-1))
    assert torch.allclose(loss, ref)


def test_a_cpu_training_step_runs_the_head_as_written():
    """An edit of the head (here lm_head's output scaled to zero: every token equally likely) reaches a CPU's
    training step, with gradients, as it reaches everything else: the loss is log(vocab_size)."""
    m = build(tiny()).train()
    m.lm_head.register_forward_hook(lambda module, args, out: out * 0)
    x = torch.randint(0, 512, (2, 16))
    _, loss = m(x, x.roll(-1, 1))
    loss.backward()
    assert math.isclose(loss.item(), math.log(512), rel_tol=1e-6)
    assert m.transformer.h[0].mlp.c_fc.weight.grad is not None


class MallInfo2(ctypes.Structure):
    """glibc's mallinfo2(): what malloc holds, in bytes."""
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                       "fsmblks", "uordblks", "fordblks", "keepcost")]


@pytest.mark.skipif(not hasattr(ctypes.CDLL(None), "mallinfo2"), reason="glibc 2.33 or later (mallinfo2)")
def test_a_cpu_run_keeps_freed_memory_for_reuse():
    """After runtime.setup on a CPU, a large tensor (a step's logits) gets no mapping of its own (hblkhd: the
    bytes of those), which would be unmapped when it is freed; and freeing a block at the heap's top, 2 GiB
    past all its free memory, does not shrink the heap (arena): the next micro-step reuses those pages instead
    of fresh ones the kernel zero-fills one by one. torch.empty reserves memory without touching it."""
    from gptlib import runtime
    runtime.setup("cpu")
    libc = ctypes.CDLL(None)
    libc.mallinfo2.restype = MallInfo2
    mapped = libc.mallinfo2().hblkhd
    logits = torch.empty(2**24)  # 64 MiB
    assert libc.mallinfo2().hblkhd == mapped and logits.data_ptr()
    big = torch.empty((libc.mallinfo2().fordblks + 2**31) // 4)  # more than is free: the heap grows
    grown = libc.mallinfo2().arena
    del big
    assert libc.mallinfo2().arena == grown  # nothing handed back


@pytest.mark.slow
def test_gradient_checkpointing_same_loss_and_grads():
    x = torch.randint(0, 512, (2, 32))
    results = []
    for flag in (False, True):
        m = build(tiny(grad_checkpoint=flag)).train()
        _, loss = m(x, x.roll(-1, 1))
        loss.backward()
        results.append((loss.detach(), {n: p.grad for n, p in m.named_parameters()}))
    (l0, g0), (l1, g1) = results
    assert torch.equal(l0, l1)
    for name in g0:
        assert torch.allclose(g0[name], g1[name], rtol=0, atol=1e-7), name


# ---------------------------------------------------------------------------------------- MQA / GQA, KV-cache

def test_mqa_gqa_share_kv_heads():
    C, L, hs = 32, 2, 8
    n = {kv: count_params(tiny(n_kv_head=kv)) for kv in (4, 2, 1)}
    # c_attn's K and V projections shrink from C to kv*hs outputs (weights + biases) in every layer
    for kv in (2, 1):
        assert n[4] - n[kv] == L * 2 * (C - kv * hs) * (C + 1)
    m = build(tiny(n_kv_head=1))
    assert m.transformer.h[0].attn.c_attn.weight.shape == (C + 2 * hs, C)


@pytest.mark.parametrize("n_kv_head", [4, 1])
def test_explicit_attention_matches_flash(n_kv_head):
    x = torch.randint(0, 512, (2, 20))
    flash, explicit = build(tiny(n_kv_head=n_kv_head)), build(tiny(n_kv_head=n_kv_head, flash=False))
    assert torch.allclose(flash(x)[0], explicit(x)[0], atol=1e-5)
    idx = x[:, :5]  # and through the KV-cache (prefill, then one token at a time)
    assert torch.equal(Engine(flash).generate(idx, 10, top_k=1), Engine(explicit).generate(idx, 10, top_k=1))


# ---------------------------------------------------------------------------------------- Hugging Face parity

@pytest.fixture
def transformers():
    """The independent reference, imported where a test asks for it (1 s, not at each worker's start)."""
    return pytest.importorskip("transformers")


def test_from_pretrained_local_dir_matches_hf(tmp_path, transformers):
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=2, n_head=4, n_embd=32, vocab_size=300, n_positions=64)).eval()
    hf.save_pretrained(tmp_path)
    m = hf_gpt2.from_pretrained(str(tmp_path)).eval()
    assert (m.config.vocab_size, m.config.block_size, m.config.n_layer) == (300, 64, 2)
    x = torch.randint(0, 300, (2, 64))
    with torch.no_grad():
        assert (m(x)[0] - hf(x).logits).abs().max() <= 1e-4


def test_save_pretrained_loads_in_hf_with_same_logits(tmp_path, transformers):
    m = build(tiny(block_size=64, vocab_size=50304))  # vocab padded
    hf_gpt2.save_pretrained(m, tmp_path)
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path).eval()
    assert hf.config.vocab_size == GPT2_VOCAB
    x = torch.randint(0, GPT2_VOCAB, (2, 64))
    with torch.no_grad():
        assert (m(x)[0][..., :GPT2_VOCAB] - hf(x).logits).abs().max() <= 1e-4
    back = hf_gpt2.from_pretrained(str(tmp_path)).eval()  # and round trip
    with torch.no_grad():
        assert (back(x)[0] - hf(x).logits).abs().max() <= 1e-4


def test_openai_name_downloads_hub_files(tmp_path, monkeypatch, transformers):
    """--model gpt2 fetches config.json + model.safetensors of openai-community/gpt2 through huggingface_hub.
    OpenAI's files hold a GPT2Model: keys without the "transformer." prefix, causal-mask buffers, no lm_head;
    older uploads have only pytorch_model.bin."""
    huggingface_hub = pytest.importorskip("huggingface_hub")
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=300,
                                                              n_positions=16)).eval()
    hf.transformer.save_pretrained(tmp_path / "openai")  # the bare GPT2Model, as OpenAI's upload
    sd = dict(safetensors.torch.load_file(tmp_path / "openai" / "model.safetensors"))
    assert "wte.weight" in sd and not any(k.startswith(("transformer.", "lm_head")) for k in sd)
    for i in range(2):  # the causal-mask buffers older transformers saved
        sd[f"h.{i}.attn.bias"] = torch.ones(1, 1, 16, 16).tril()
    safetensors.torch.save_file(sd, tmp_path / "openai" / "model.safetensors", metadata={"format": "pt"})
    calls = []

    def fake_download(repo, filename, local_files_only):
        calls.append((repo, filename, local_files_only))
        return str(tmp_path / "openai" / filename)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    monkeypatch.setattr(hf_gpt2, "hub_online", lambda: True)
    m = hf_gpt2.from_pretrained("gpt2").eval()
    assert calls == [("openai-community/gpt2", "config.json", False),
                     ("openai-community/gpt2", "model.safetensors", False)]
    x = torch.randint(0, 300, (2, 16))
    with torch.no_grad():
        assert (m(x)[0] - hf(x).logits).abs().max() <= 1e-4
    os.makedirs(tmp_path / "bin")  # pytorch_model.bin only
    torch.save(hf.state_dict(), tmp_path / "bin" / "pytorch_model.bin")
    shutil.copy(tmp_path / "openai" / "config.json", tmp_path / "bin")
    with torch.no_grad():
        ours = hf_gpt2.from_pretrained(str(tmp_path / "bin")).eval()
        assert (ours(x)[0] - hf(x).logits).abs().max() <= 1e-4


@pytest.mark.slow
def test_import_export_need_no_transformers(tmp_path):
    """With transformers unimportable: save_pretrained, then from_pretrained of what it wrote, same logits."""
    block = tmp_path / "block" / "transformers"
    block.mkdir(parents=True)
    (block / "__init__.py").write_text("raise ImportError('transformers is blocked in this test')\n")
    code = ("import torch; from gptlib import hf_gpt2; from model import GPT, GPTConfig; torch.manual_seed(0)\nm = "
            "GPT(GPTConfig(block_size=16, vocab_size=50304, n_layer=2, n_head=2, "
            f"n_embd=32)).eval()\nhf_gpt2.save_pretrained(m, {str(tmp_path / 'out')!r}); b = "
            f"hf_gpt2.from_pretrained({str(tmp_path / 'out')!r})\nx = torch.randint(0, 50257, (1, 16))\n"
            "assert "
            "torch.equal(m(x)[0][..., :50257], b.eval()(x)[0]) and b.config.vocab_size == 50257\nimport sys; "
            "assert 'transformers' not in sys.modules; print('ok')")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(tmp_path / "block")})
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]


@pytest.mark.slow
def test_offline_name_is_one_line(tmp_path):
    """Offline, --model gpt2 ends in one line saying a local folder works instead, never a traceback."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}  # an empty cache
    r = script("sample.py", "--model", "gpt2", "--device", "cpu", env=env)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.strip().count("\n") == 0, r.stderr
    assert "could not download GPT-2 weights 'gpt2'" in r.stderr and "pass a local folder" in r.stderr
    # not told, but the Hub cannot be reached (HF_ENDPOINT at a closed port): one attempt, then the cache
    env = {k: v for k, v in env.items() if k.lower() not in ("hf_hub_offline", "https_proxy", "all_proxy")}
    r = script("sample.py", "--model", "gpt2", "--device", "cpu",
               env={**env, "HF_ENDPOINT": "http://127.0.0.1:9"})
    assert_one_line_error(r, "could not download GPT-2 weights 'gpt2'", "the Hub cannot be reached and "
                          "they are not in its local cache", "pass a local folder")


def test_hf_errors(tmp_path, transformers):
    with pytest.raises(UserError, match="gpt2, gpt2-medium, gpt2-large, gpt2-xl"):
        hf_gpt2.from_pretrained("gpt3")
    with pytest.raises(UserError, match="config.json does not exist"):
        hf_gpt2.from_pretrained(str(tmp_path))
    hf_gpt2.save_pretrained(build(tiny()), tmp_path / "ok")
    path = tmp_path / "ok" / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(UserError, match="model.safetensors is damaged"):
        hf_gpt2.from_pretrained(str(tmp_path / "ok"))
    with pytest.raises(UserError, match="^n_kv_head=1: Hugging Face GPT-2 has no such option"):
        hf_gpt2.save_pretrained(build(tiny(n_kv_head=1)), tmp_path)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=1, n_head=2, n_embd=16, vocab_size=50, n_positions=8, activation_function="relu"))
    hf.save_pretrained(tmp_path / "relu")
    with pytest.raises(UserError, match="activation_function='relu'"):
        hf_gpt2.from_pretrained(str(tmp_path / "relu"))


# ---------------------------------------------------------------------------------------------- accounting

def test_flops_and_mfu():
    c = GPTConfig(vocab_size=50304)
    assert flops_per_token(c) == 6 * 123_689_472 + 12 * 12 * 12 * 64 * 1024
    assert flops_per_token(c, T=512) == 6 * 123_689_472 + 12 * 12 * 12 * 64 * 512
    # names as torch.cuda.get_device_name() returns them: (bf16, fp16) TFLOP/s
    for name, want in [("NVIDIA H100 80GB HBM3", (989, 989)), ("NVIDIA H100 PCIe", (756, 756)),
                       ("NVIDIA H100 NVL", (835, 835)), ("NVIDIA H200", (989, 989)),
                       ("NVIDIA GH200 480GB", (989, 989)), ("NVIDIA A100-SXM4-80GB", (312, 312)),
                       ("NVIDIA A100 80GB PCIe", (312, 312)), ("NVIDIA L40S", (362, 362)),
                       ("NVIDIA L40", (181, 181)), ("NVIDIA L4", (121, 121)), ("NVIDIA A10", (125, 125)),
                       ("NVIDIA GeForce RTX 4090", (165, 165)), ("NVIDIA GeForce RTX 4060 Ti", (44, 44)),
                       ("NVIDIA GeForce RTX 3090", (71, 71)), ("Tesla V100-SXM2-16GB", (None, 125)),
                       ("Tesla V100-PCIE-32GB", (None, 112)), ("Tesla T4", (None, 65)),
                       ("NVIDIA A10G", (None, None)), ("NVIDIA GeForce RTX 4060", (None, None)),
                       ("NVIDIA GeForce GTX 1080", (None, None))]:
        got = tuple(peak_flops(name, dtype) for dtype in ("bf16", "fp16"))
        assert got == tuple(None if t is None else t * 1e12 for t in want), name
    assert peak_flops("NVIDIA H100 80GB HBM3", "fp32") is None
    assert abs(mfu(c, 578_000, 989e12) - 0.4999) < 1e-3  # the 50% MFU target on one H100
    assert mfu(c, 578_000, None) is None


def test_memory_estimate_by_part():
    c = GPTConfig(vocab_size=50304)
    N = 124_475_904
    m = training_memory(c, B=16, T=1024)
    assert (m["params"], m["grads"], m["adamw"]) == (4 * N, 4 * N, 8 * N)
    assert m["weight_copies"] == 2 * (N - 1024 * 768 - (4 * 12 + 2) * 768)
    assert m["total"] == sum(v for k, v in m.items() if k != "total")
    assert training_memory(c, 16, 1024, "fp32")["weight_copies"] == 0 and m["gathered"] == 0
    f = training_memory(c, B=16, T=1024, shards=8)  # FSDP over 8 ranks
    assert (f["params"], f["grads"], f["adamw"]) == (N / 2, N / 2, N)
    block, root = 7_087_872, 50304 * 768 + 1024 * 768 + 2 * 768  # one Block; wte, wpe, ln_f
    assert N == root + 12 * block and f["gathered"] == 2 * 4 * (root + 2 * block)
    assert f["activations"] == m["activations"]  # not sharded
    # under FSDP the blocks' parameters are gathered in bf16: autocast copies only lm_head (= wte)
    assert f["weight_copies"] == 2 * 50304 * 768
    assert training_memory(c, 16, 1024, "fp32", shards=8)["weight_copies"] == 0
    assert training_memory(c, 16, 1024, "fp16") == m  # 2 bytes too
    with pytest.raises(ValueError, match="dtype='fp8'"):
        training_memory(c, 1, 1, "fp8")


def _saved_bytes(model, x, y, dtype):
    """Bytes autograd keeps for backward after one forward (unique storages, parameters excluded), through
    the head and cross-entropy."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen = {}

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in params:
            seen[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bf16"):
            logits, _ = model(x)
            torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1), ignore_index=-1)
    return sum(seen.values())


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("n_kv_head", [4, 1])
@pytest.mark.slow
def test_activation_memory_estimate_matches_autograd(monkeypatch, dtype, n_kv_head):
    c = GPTConfig(block_size=64, vocab_size=256, n_layer=3, n_head=4, n_embd=64, n_kv_head=n_kv_head)
    m = build(c).train()
    x, y = torch.randint(0, 256, (4, 64)), torch.randint(0, 256, (4, 64))
    est = training_memory(c, 4, 64, dtype)
    # autocast's cached bf16 weights show up among the saved tensors
    assert abs(_saved_bytes(m, x, y, dtype) / (est["activations"] + est["weight_copies"]) - 1) < 0.01


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_compiled_memory_estimate_matches_what_inductor_saves(dtype):
    """What a compiled step holds beyond the model's states (parameters, gradients, AdamW's moments) is what
    Inductor's partition of the joint graph saves for backward: every forward graph's extra outputs, traced
    as Inductor traces them (its decompositions, the min-cut partitioner; the same on every device), less
    the parameters themselves. training_memory(compiled=True) is within 10% of it at two sizes, one whose
    head outweighs its blocks (a large vocabulary: the fused cross-entropy keeps the logits in the compute
    dtype, not the eager step's fp32 log-probabilities, and no logits alive beside them: the eager estimate is
    0.6 of what it saves in bf16) and one whose blocks outweigh the head."""
    from torch._functorch.aot_autograd import aot_module_simplified
    from torch._functorch.partitioners import min_cut_rematerialization_partition
    from torch._inductor.decomposition import select_decomp_table
    from functorch.compile import make_boxed_func

    for c, B in ((GPTConfig(block_size=64, vocab_size=8192, n_layer=1, n_head=2, n_embd=64), 4),
                 (GPTConfig(block_size=128, vocab_size=256, n_layer=4, n_head=4, n_embd=128), 4)):
        saved = []

        def forward_graph(gm, inputs):
            outputs = next(n for n in gm.graph.nodes if n.op == "output").args[0]
            saved.append(sum(o.meta["val"].numel() * o.meta["val"].element_size() for o in outputs[1:]
                             if o.op != "placeholder" and isinstance(o.meta.get("val"), torch.Tensor)))
            return make_boxed_func(gm)

        def backend(gm, inputs):
            return aot_module_simplified(gm, inputs, fw_compiler=forward_graph, bw_compiler=make_boxed_func,
                                         decompositions=select_decomp_table(),
                                         partition_fn=min_cut_rematerialization_partition)
        torch._dynamo.reset()
        step = torch.compile(build(c).train(), backend=backend)
        x = torch.randint(0, c.vocab_size, (B, c.block_size))
        with torch.autocast("cpu", torch.bfloat16, enabled=dtype == "bf16"):
            step(x, x)
        est = training_memory(c, B, c.block_size, dtype, compiled=True)
        beyond_states = est["total"] - est["params"] - est["grads"] - est["adamw"]
        assert abs(sum(saved) / beyond_states - 1) < 0.1, (c, saved, est)


@pytest.mark.parametrize("gb, compiled, B", [(80, True, 64), (40, True, 64), (24, True, 32), (40, False, 32),
                                             (24, False, 16)])
def test_the_micro_batch_fits_the_step_that_runs(gb, compiled, B):
    """settings.fit plans B with the estimate of the step that runs: GPT-2 124M's compiled step (28.8 GiB
    at B=64; one H100 measured 26.55 and 28.95 GiB) keeps B=64 on a 40 GB card (an A100) and takes 32, the
    largest that fits, on a 24 GB one; compile=False's eager step (53.4 GiB) takes 32 and 16 there."""
    from gptlib import runtime, settings
    import train_gpt2
    s = dict(train_gpt2.CONFIG, compile=compiled)
    rt = runtime.Runtime(kind="cuda", dtype="bf16", device="cuda:0", memory=gb * 10**9)
    fitted, source, config = dict(s), {}, settings.model_shape(s)
    notes = settings.fit_memory(fitted, source, {}, rt, config)
    assert fitted["B"] == B and len(notes) == (B != 64), notes
    if notes:
        assert notes[0].endswith(f"using B={B}, the largest that fits (set --B to choose)")
        assert source == {"B": "a fit to the GPU's memory"}
        kept = dict(s)
        said = settings.fit_memory(kept, {}, {"B": 64}, rt, config)  # given: kept, with a warning
        assert kept["B"] == 64 and said[0].endswith(f"it may run out of memory; --B={B} fits the estimate")
    est = memory_estimate(config, s, rt, 64) / 2**30
    if compiled:  # the compiled step's peak, measured on one H100 (docs/gpu/): within 15%
        assert all(abs(est / measured - 1) < 0.15 for measured in (26.55, 28.95)), est


@pytest.mark.slow
def test_activation_memory_estimate_with_checkpointing(monkeypatch):
    c = GPTConfig(block_size=64, vocab_size=256, n_layer=3, n_head=4, n_embd=64, grad_checkpoint=True)
    m = build(c).train()
    x, y = torch.randint(0, 256, (4, 64)), torch.randint(0, 256, (4, 64))
    no_ckpt = [training_memory(GPTConfig(**{**c.__dict__, "grad_checkpoint": False, "n_layer": n}), 4, 64,
                               "fp32")
               for n in (1, 2)]
    one_layer = no_ckpt[1]["activations"] - no_ckpt[0]["activations"]
    # forward keeps only block inputs; the estimate adds the one block recomputed at a time in backward
    est = training_memory(c, 4, 64, "fp32")["activations"] - one_layer
    assert abs(_saved_bytes(m, x, y, "fp32") / est - 1) < 0.01
    assert training_memory(c, 4, 64, "fp32")["activations"] < no_ckpt[0]["activations"] * 3


# ---------------------------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("kw, match", [
    (dict(n_embd=30, n_head=4), "n_embd=30 must be divisible by n_head=4"),
    (dict(n_head=4, n_kv_head=3), "n_head=4 must be divisible by n_kv_head=3"),
    (dict(n_layer=0), "n_layer=0 must be a positive integer"),
    (dict(block_size=-1), "block_size=-1"),
    (dict(vocab_size=1.5), "vocab_size=1.5"),
])
def test_config_errors(kw, match):
    with pytest.raises(UserError, match=match):
        tiny(**kw)


def test_sequence_too_long():
    m = build(tiny())
    with pytest.raises(ValueError, match="sequence length 33 exceeds block_size=32"):
        m(torch.zeros(1, 33, dtype=torch.long))


# ----------------------------------------------------------------------------------------- devices, precision

def test_pick_device_and_dtype(monkeypatch):
    from gptlib.runtime import autocast, pick_device, resolve_dtype
    gpus = {"cuda": False, "mps": False}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus["cuda"])
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: gpus["mps"])
    assert pick_device() == "cpu" and resolve_dtype("auto", "cpu") == "fp32"
    with pytest.raises(UserError, match="--device=mps but torch sees no mps device"):
        pick_device("mps")
    gpus["mps"] = True  # an Apple GPU: picked when there is no CUDA, fp32 unless asked otherwise
    assert pick_device() == "mps" and pick_device("mps") == "mps" and resolve_dtype("auto", "mps") == "fp32"
    gpus["cuda"] = True
    assert pick_device() == "cuda"
    # torch.cuda.is_bf16_supported() says yes on a T4 (emulation counts): the capability decides
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    monkeypatch.setattr(torch.version, "hip", None)
    for capability, want in (((9, 0), "bf16"), ((8, 6), "bf16"), ((8, 0), "bf16"), ((7, 5), "fp16"),
                             ((7, 0), "fp16"), ((6, 1), "fp16")):  # H100, RTX 30xx, A100; T4, V100, P100
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
        assert resolve_dtype("auto", "cuda:0") == want, capability
    assert resolve_dtype("fp32", "cuda") == "fp32" and resolve_dtype("bf16", "cpu") == "bf16"
    with pytest.raises(UserError, match="--device='tpu'"):
        pick_device("tpu")
    with pytest.raises(UserError, match="--dtype='half'"):
        resolve_dtype("half", "cpu")
    with autocast("cpu", "fp16"):
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float16
    from gptlib import runtime  # fp16 on a CPU runs, slower than fp32: a NOTE says so (bf16 and fp32 need none)
    assert [n for n in runtime.setup("cpu", "fp16").notes if n.startswith("dtype=fp16 on a CPU")]
    assert not [n for n in runtime.setup("cpu", "fp32").notes if n.startswith("dtype")]
    with autocast("cpu", "bf16"):
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16
    with autocast("cpu", "fp32"):
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32


@pytest.mark.parametrize("capability", [(7, 5), (8, 9)])
def test_cuda_dtype_is_decided_on_the_ranks_own_gpu(monkeypatch, capability):
    """runtime.setup() under torchrun (local rank 1 of 2 here: cuda:1): the process group with the timeout
    given and the patient one with 30 minutes, then set_device, and only then dtype=auto from the capability
    of the rank's own GPU, never GPU 0's; the smallest GPU memory of the ranks. An explicit bf16 on a GPU
    without bf16 tensor cores runs as asked, with a NOTE naming --dtype=auto."""
    from gptlib import runtime
    calls, groups = [], []
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls.append(("set_device", str(d))))
    monkeypatch.setattr(torch.cuda, "get_device_capability",
                        lambda device=None: calls.append(("capability", str(device))) or capability)
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch, "set_float32_matmul_precision", lambda precision: calls.append(precision))
    for name, value in (("RANK", "1"), ("LOCAL_RANK", "1"), ("WORLD_SIZE", "2")):
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(runtime, "pick_device", lambda name: "cuda")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: calls.append(
        ("properties", str(device))) or types.SimpleNamespace(total_memory=80 * 2**30))
    monkeypatch.setattr(runtime.dist, "init_process_group", lambda *a, **k: groups.append((a, k)))
    monkeypatch.setattr(runtime.dist, "new_group", lambda **k: groups.append(((), k)) or "patient")
    monkeypatch.setattr(runtime.dist, "barrier", lambda group: groups.append(("barrier", group)))
    monkeypatch.setattr(runtime.dist, "get_world_size", lambda: 2)
    monkeypatch.setattr(runtime.dist, "all_gather_object",
                        lambda out, obj: out.__setitem__(slice(None), [obj, 40 * 2**30]))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)  # torchrun --nproc_per_node=2 on 1 GPU
    with pytest.raises(UserError, match=r"^2 processes on this node \(torchrun --nproc_per_node=2\) but "
                                        r"it has 1 GPU visible \(CUDA_VISIBLE_DEVICES=.*\): one process a "
                                        r"GPU, so use --nproc_per_node=1$"):
        runtime.setup("cuda", "auto", timeout=300)
    assert calls == [] and groups == []  # before any GPU or process group is touched
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    rt = runtime.setup("cuda", "auto", timeout=300)
    assert (rt.rank, rt.world_size, rt.device) == (1, 2, "cuda:1") and rt.memory == 40 * 2**30
    assert rt.dtype == ("fp16" if capability < (8, 0) else "bf16") and rt.notes == []
    assert calls[:2] == [("set_device", "cuda:1"), "high"]
    assert set(calls[2:]) == {("capability", "cuda:1"), ("properties", "cuda:1")}
    # the steps' collectives wait the timeout given; the patient group, for checkpoint files, 30 minutes (NCCL
    # would abort the ranks waiting for a checkpoint after its default 10 minutes); NCCL is told the rank's
    # GPU; then every rank waits for the others to be connected
    assert groups == [(("nccl",), {"timeout": datetime.timedelta(seconds=300),
                                   "device_id": torch.device("cuda:1")}),
                      ((), {"timeout": datetime.timedelta(minutes=30)}), ("barrier", "patient")]
    assert rt.patient == "patient"
    rt = runtime.setup("cuda", "bf16")
    assert rt.dtype == "bf16"
    if capability < (8, 0):
        assert len(rt.notes) == 1 and "compute capability 7.5" in rt.notes[0]
        assert "--dtype=auto" in rt.notes[0]
    else:
        assert rt.notes == []


def test_rotary_needs_an_even_head_size():
    """rotary turns pairs of a head's dimensions: an odd head size is refused when the model is configured
    (before a step), not after training at the first sample."""
    with pytest.raises(UserError, match=r"rotary=True needs an even head size: n_embd / n_head = 12 / 4 = 3"):
        GPTConfig(n_layer=1, n_head=4, n_embd=12, rotary=True)
    GPTConfig(n_layer=1, n_head=4, n_embd=12)  # learned positions: any head size



def test_exported_files_get_the_same_mode(tmp_path):
    """safetensors writes its file 0600; the export gives model.safetensors the mode the other files get (the
    umask's), so whoever may read config.json may read the weights (0600 at db9da80)."""
    import stat
    umask = os.umask(0o022)
    try:
        hf_gpt2.save_pretrained(GPT(GPTConfig(block_size=16, vocab_size=512, n_layer=1, n_head=2, n_embd=16)),
                                str(tmp_path))
    finally:
        os.umask(umask)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in tmp_path.iterdir()}
    assert set(modes.values()) == {0o644} and "model.safetensors" in modes, modes
