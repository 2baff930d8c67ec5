"""What training a GPT costs, from its config: parameters (of the model built on the meta device), FLOPs per
token and MFU, and memory per GPU.

train_gpt2.py logs MFU and its memory estimate; bench.py compares both with what it measures.
"""
import dataclasses
import functools
import re

import torch

from model import GPT, GPTConfig


def count_params(config, non_embedding=False):
    """GPT(config).num_params(), counted once per config on a model built on the meta device (no memory);
    non_embedding=True leaves out the lookups (no FLOPs): the position embeddings, and wte when lm_head is
    its own matrix (tied, it is the biggest matmul)."""
    return built_params(tuple(dataclasses.asdict(config).items()), non_embedding)


@functools.lru_cache(maxsize=None)  # tens of ms a build: once, not at every step's MFU
def built_params(fields, non_embedding):
    with torch.device("meta"):
        model = GPT(GPTConfig(**dict(fields)))
    lookups = sum(m.weight.numel() for name, m in model.transformer.items()
                  if name == "wpe" or (name == "wte" and model.config.untied_head))
    return model.num_params() - (lookups if non_embedding else 0)


def flops_per_token(config, T=None):
    """Training FLOPs per token, forward + backward (PaLM appendix B, as in nanoGPT's MFU):
        6·N             every weight does a multiply-add (2 FLOPs) forward and twice that backward,
                        N = parameters without the lookups (position embeddings; wte if untied);
        + 12·L·H·Q·T    attention scores and weighted values: 2 matmuls of 2·Q·T FLOPs per head and
                        layer, times 3 for forward + backward (L layers, H query heads of size Q, context T).
    The causal mask halves the useful attention work; like everyone's MFU, we count the full square.
    GPT-2 124M (vocab 50304, T=1024): 6·123,689,472 + 12·12·12·64·1024 = 855.4 MFLOP a token."""
    T = config.block_size if T is None else T
    L, H, Q = config.n_layer, config.n_head, config.head_dim
    return 6 * count_params(config, non_embedding=True) + 12 * L * H * Q * T


# Each GPU's dense tensor-core peaks (no sparsity) from the vendors' datasheets, TFLOP/s for bf16 and fp16
# (None where bf16 is only emulated), and its memory bandwidth in TB/s (None where the name does not say
# which memory it has). GeForce cards: the rate with fp32 accumulation, which PyTorch's matmuls use (half the
# advertised fp16-accumulate rate). A name matches torch.cuda.get_device_name() as whole words; the most
# specific comes first.
GPUS = {
    "H100 PCIe": (756, 756, 2.0), "H100 NVL": (835, 835, 3.9), "H100": (989, 989, 3.35),  # "H100 80GB HBM3"
    "H200 NVL": (835, 835, 4.8), "H200": (989, 989, 4.8), "GH200": (989, 989, None),
    "A100-SXM4-80GB": (312, 312, 2.039), "A100-SXM4-40GB": (312, 312, 1.555),
    "A100 80GB PCIe": (312, 312, 1.935), "A100": (312, 312, None),
    "L40S": (362, 362, 0.864), "L40": (181, 181, 0.864), "L4": (121, 121, 0.3), "A10": (125, 125, 0.6),
    "RTX 4090": (165, 165, 1.008), "RTX 4060 Ti": (44, 44, 0.288), "RTX 3090": (71, 71, 0.936),  # GeForce
    "V100-PCIE": (None, 112, 0.9), "V100": (None, 125, 0.9), "T4": (None, 65, 0.32),  # fp16 only
}


def gpu_spec(device_name):
    """(bf16 TFLOP/s, fp16 TFLOP/s, memory TB/s) of a CUDA device by torch.cuda.get_device_name(), or None."""
    return next((spec for key, spec in GPUS.items()
                 if re.search(rf"(?<!\w){re.escape(key)}(?!\w)", device_name)), None)


def peak_flops(device_name, dtype="bf16"):
    """Dense peak FLOP/s of a CUDA device for the compute dtype, bf16 or fp16; None for an unknown device,
    bf16 where it is emulated, and fp32 (TF32 peaks are not tabled)."""
    spec = gpu_spec(device_name)
    if dtype not in ("bf16", "fp16") or spec is None or spec[dtype == "fp16"] is None:
        return None
    return spec[dtype == "fp16"] * 1e12


def memory_bandwidth(device_name):
    """Memory bandwidth of a CUDA device in bytes/s, or None where GPUS does not know it."""
    spec = gpu_spec(device_name)
    return None if spec is None or spec[2] is None else spec[2] * 1e12


def mfu(config, tokens_per_sec, peak, T=None):
    """Model FLOPs utilisation: achieved training FLOP/s over the hardware peak (FLOP/s), None without one."""
    return None if peak is None else flops_per_token(config, T) * tokens_per_sec / peak


def training_memory(config, B, T, dtype="bf16", shards=1, compiled=False):
    """Estimated training memory in bytes per process, by part, for micro-batch B x T with AdamW and fp32
    master weights; shards > 1: FSDP over that many ranks; compiled: the step through torch.compile.

    dtype is the compute dtype: "bf16" or "fp16" (autocast, as train_gpt2.py runs on GPU) or "fp32".
    params, grads: 4 bytes a parameter each; adamw: exp_avg + exp_avg_sq, 8 bytes a parameter;
    weight_copies: under autocast the bf16 casts of the matmul weights are cached for the step, 2 bytes each.
    activations: what autograd keeps for backward, per token and layer:
        the two LayerNorm inputs (the fp32 residual stream), 2 x 4·C bytes, and their mean/rstd;
        in the compute dtype: c_attn input C, q/k/v C + 2·kv, attention output C (SDPA returns it laid out
        as (B, T, nh, hs), so re-assembling the heads copies nothing), c_fc input C, GELU input 4·C, c_proj
        input 4·C (12·C + 2·kv), and the attention's log-sum-exp per head (flash attention keeps no T x T);
    then ln_f's and lm_head's inputs and the loss's fp32 log-probabilities (V each a token: the logits
    themselves are not kept, GPT.forward returns none with a loss), and the int64 inputs and targets.
    With grad_checkpoint a block keeps only its fp32 input and one block's activations are live at a time in
    backward.
    logits: not kept for backward, but the logits and, under autocast, their fp32 copy exist at once while
    the loss is computed: an eager step's peak.
    compiled: Inductor fuses the cross-entropy into one kernel over the logits, which it keeps for backward in
    the compute dtype (a·V a token) in place of the fp32 log-probabilities, and the fp32 copy never exists:
    no "logits" part (docs/model.md: the estimate against the peaks an H100 measured).
    FSDP (shards ranks, as train_gpt2.py runs it) keeps 1/shards of params, grads and adamw on each rank
    (gradients are reduce-scattered every micro-step), and adds "gathered": the unsharded parameters and
    gradients of the units being computed, 8 bytes a parameter (the fp32 root, wte = lm_head with wpe and
    ln_f, stays gathered from forward to backward; two blocks at a time, one of them prefetched; under
    autocast a block's parameters and gradients are gathered in the compute dtype and the gradients cast to
    fp32 for the reduction: 2 + 2 + 4 bytes). Then the only autocast weight copy is lm_head's.
    Not included: DDP's gradient buckets, gradients in flight during backward, allocator slack, what the
    modern recipe's options change in the activations (a few percent), Muon's smaller state."""
    if dtype not in ("bf16", "fp16", "fp32"):
        raise ValueError(f"dtype={dtype!r}: use 'bf16' or 'fp16' (autocast) or 'fp32'")
    a = 4 if dtype == "fp32" else 2  # bytes per activation in the compute dtype
    C, L, V, kv = config.n_embd, config.n_layer, config.vocab_size, config.n_kv_head * config.head_dim
    N = count_params(config)
    layer = 2 * 4 * C + 2 * 2 * 4 + a * (12 * C + 2 * kv) + 4 * config.n_head  # bytes a token
    # ln_f, lm_head input, log-probs, idx/targets
    head = 4 * C + 2 * 4 + a * C + (a if compiled else 4) * V + 2 * 8
    blocks = L * 4 * C + layer if config.grad_checkpoint else L * layer
    one, two = (count_params(dataclasses.replace(config, n_layer=n)) for n in (1, 2))
    block = two - one  # parameters of one Block
    root = N - L * block  # wte (= lm_head), wpe, ln_f
    # what autocast casts: all but the lookups (wpe; wte when lm_head is its own) and LayerNorms
    matrices = count_params(config, non_embedding=True) - (0 if config.rmsnorm else (4 * L + 2) * C)
    parts = {
        "params": 4 * N / shards,
        "grads": 4 * N / shards,
        "adamw": 8 * N / shards,
        "gathered": 0 if shards == 1 else 2 * 4 * (root + 2 * block),
        "weight_copies": 0 if dtype == "fp32" else 2 * (V * C if shards > 1 else matrices),
        "activations": B * T * (blocks + head),
        # not kept, but alive together while an eager loss is computed: the logits, (autocast) their fp32 copy
        "logits": 0 if compiled else B * T * V * (a + (0 if a == 4 else 4)),
    }
    parts["total"] = sum(parts.values())
    return parts


def memory_estimate(config, s, rt, B):
    """accounting.py's training memory per process in bytes at micro-batch B, for model config and settings s
    (a dict): the dtype, FSDP's shards and whether the step is compiled."""
    return training_memory(config, B, s["T"], rt.dtype, rt.world_size if s["fsdp"] else 1,
                           compiled=s["compile"])["total"]


def memory_said(need, fsdp, rt):
    """A memory_estimate (need, bytes) in words, for train_gpt2.py's batch line: under FSDP what is sharded,
    and in which dtypes it gathers and reduces."""
    sharded = (f" (parameters, gradients and AdamW states sharded {rt.world_size} ways"
               + (f"; blocks gathered in {rt.dtype}, gradients reduced in fp32" if rt.dtype != "fp32" else "")
               + ")" if fsdp else "")
    return f"estimated training memory per process {need / 2**30:.1f} GiB{sharded}"


def micro_batches(total_batch_size, T, world_size):
    """The micro-batches B, largest first, that keep total_batch_size whole with this T and world_size."""
    rows = total_batch_size // (T * world_size)  # rows of T tokens per process and step
    return [b for b in range(rows, 0, -1) if rows % b == 0]
