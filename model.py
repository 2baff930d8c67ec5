"""GPT-2 in one file: the model, multi-query / grouped-query attention (generation: engine.py).

Parameter names match Hugging Face's GPT2LMHeadModel (transformer.h.0.attn.c_attn.weight, ...), except
that we use nn.Linear where HF uses Conv1D (hf_gpt2.py transposes those weights on the way in and out).
"""
import dataclasses
import math
from typing import NamedTuple, Optional

import torch
import torch.nn as nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint

from gptlib.errors import UserError

# tokens the GPT-2 tokenizer can decode; rows beyond this (vocab padded to 50304) are never sampled
GPT2_VOCAB = 50257
GPT2_SIZES = {  # OpenAI's four GPT-2 shapes (parameters at vocab 50257; HF names gpt2, -medium, -large, -xl)
    "124M": dict(n_layer=12, n_head=12, n_embd=768),
    "350M": dict(n_layer=24, n_head=16, n_embd=1024),
    "774M": dict(n_layer=36, n_head=20, n_embd=1280),
    "1558M": dict(n_layer=48, n_head=25, n_embd=1600),
}


@dataclasses.dataclass
class GPTConfig:
    block_size: int = 1024  # max sequence length (learned position embeddings)
    vocab_size: int = 50257  # GPT-2's 50,257 tokens; pad to 50304 (a multiple of 128) for faster matmuls
    n_layer: int = 12
    n_head: int = 12  # query heads
    n_embd: int = 768
    # key/value heads: None = n_head (MHA), 1 = multi-query, between = grouped-query
    n_kv_head: Optional[int] = None
    grad_checkpoint: bool = False  # recompute each block in backward: activation memory for ~1/3 more compute
    # False: explicit masked-softmax attention (a T x T matrix per head), bench.py's baseline
    flash: bool = True
    # Beyond GPT-2 (train_gpt2.py --recipe=modern), all off for GPT-2 and its checkpoints:
    rotary: bool = False  # rotary position embeddings on queries and keys, instead of learned ones (no wpe)
    qk_norm: bool = False  # queries and keys RMS-normalized per head before attention
    relu2: bool = False  # MLP activation ReLU(x)^2 instead of GELU
    untied_head: bool = False  # lm_head its own matrix, not wte's
    zero_init: bool = False  # output projections (attention, MLP, an untied lm_head) start at zero
    rmsnorm: bool = False  # parameter-free RMSNorm instead of LayerNorm (gain and bias)
    embed_norm: bool = False  # the token embeddings RMS-normalized before the first block

    def __post_init__(self):
        if self.n_kv_head is None:
            self.n_kv_head = self.n_head
        for name in ("block_size", "vocab_size", "n_layer", "n_head", "n_embd", "n_kv_head"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise UserError(f"{name}={getattr(self, name)!r} must be a positive integer")
        if self.n_embd % self.n_head:
            raise UserError(f"n_embd={self.n_embd} must be divisible by n_head={self.n_head} "
                            f"(head size = n_embd / n_head)")
        if self.rotary and self.head_dim % 2:
            raise UserError(f"rotary=True needs an even head size: n_embd / n_head = {self.n_embd} / "
                            f"{self.n_head} = {self.head_dim} (rotary turns pairs of a head's dimensions)")
        if self.n_head % self.n_kv_head:
            raise UserError(f"n_head={self.n_head} must be divisible by n_kv_head={self.n_kv_head} (each K/V "
                            "head serves n_head / n_kv_head query heads)")

    @property
    def head_dim(self):
        return self.n_embd // self.n_head


class CausalSelfAttention(nn.Module):
    def __init__(self, config, layer):
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = config.n_head, config.n_kv_head, config.head_dim
        self.layer = layer
        self.flash, self.qk_norm = config.flash, config.qk_norm
        # queries for every head, keys and values for the (possibly fewer) K/V heads, in one matmul
        self.c_attn = nn.Linear(config.n_embd, config.n_embd + 2 * config.n_kv_head * config.head_dim)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)

    def forward(self, x, cache=None, attn_mask=None, rope=None):
        B, T, C = x.size()
        kv_dim = self.n_kv_head * self.head_dim
        q, k, v = self.c_attn(x).split([C, kv_dim, kv_dim], dim=2)
        q = q.view(B, T, self.n_head, self.head_dim).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)  # (B, n_kv, T, hs)
        v = v.view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)  # (B, n_kv, T, hs)
        if self.qk_norm:  # bounded attention logits whatever the weights grow to
            q, k = rms_norm(q), rms_norm(k)  # over each head's head_dim
        if rope is not None:  # before the cache: cached keys keep the rotation of their own position
            q, k = rotate(q, *rope), rotate(k, *rope)
        # not `T > 1`: under torch.compile with a dynamic T that bool would break the graph
        mask, causal = None, True
        if attn_mask is not None:  # packed sequences, or a cache: which keys each token sees
            mask, causal = attn_mask[:, None], False  # (B or 1, 1, T, S)
        if cache is not None:
            k, v = cache.update(self.layer, k, v)  # (B, n_kv, block_size, hs): the whole cache
        # flash attention on GPU; enable_gqa: each K/V head serves n_head / n_kv_head query heads
        attention = F.scaled_dot_product_attention if self.flash else textbook_attention
        y = attention(q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=self.n_kv_head != self.n_head)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # re-assemble all head outputs side by side
        return self.c_proj(y)


def textbook_attention(q, k, v, attn_mask=None, is_causal=False, enable_gqa=False):
    """SDPA the textbook way (flash=False, bench.py's baseline): the whole (T, S) score matrix is written to
    and read back from memory. q (B, nh, T, hs), k and v (B, n_kv, S, hs) -> (B, nh, T, hs)."""
    if enable_gqa:
        k = k.repeat_interleave(q.size(1) // k.size(1), dim=1)  # (B, nh, S, hs)
        v = v.repeat_interleave(q.size(1) // v.size(1), dim=1)
    att = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))  # (B, nh, T, S)
    T, S = q.size(2), k.size(2)
    if is_causal:
        attn_mask = torch.ones(T, S, dtype=torch.bool, device=q.device).tril(diagonal=S - T)
    if attn_mask is not None:
        att = att.masked_fill(~attn_mask, float("-inf"))
    return F.softmax(att, dim=-1) @ v  # (B, nh, T, hs)


def rotate(x, cos, sin):
    """Rotary position embedding: each pair (x1[i], x2[i]) of x (B, heads, T, hs) turned by its position's
    angle; cos and sin (B or 1, 1, T, hs/2) come from GPT.rotary."""
    x1, x2 = x.chunk(2, dim=-1)
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd)
        # GPT-2: GELU's tanh approximation; relu2: ReLU squared (modded-nanogpt, nanochat)
        self.act = ReLU2() if config.relu2 else nn.GELU(approximate="tanh")
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd)

    def forward(self, x):
        return self.c_proj(self.act(self.c_fc(x)))


class ReLU2(nn.Module):
    def forward(self, x):
        return F.relu(x).square()


def rms_norm(x):
    """Parameter-free RMSNorm over the last dimension: x / rms(x), no gain, no bias, in x's dtype (CUDA's
    autocast computes rms_norm in fp32 from torch 2.12: bf16 queries and keys would come back fp32, and a
    bf16 KV-cache refuses them)."""
    return F.rms_norm(x, (x.size(-1),)).to(x.dtype)


class RMSNorm(nn.Module):
    """rms_norm as a module, where a LayerNorm would be (ln_1, ln_2, ln_f)."""

    def forward(self, x):
        return rms_norm(x)


class LayerNorm(nn.LayerNorm):
    """nn.LayerNorm computing in its input's dtype: under FSDP's mixed precision a block's gain and bias are
    gathered in bf16 while the residual stream stays fp32. (CUDA's autocast runs LayerNorm in fp32 anyway;
    the CPU's does not, and its kernel refuses bf16 weights for an fp32 input.)"""

    def forward(self, x):
        dtype = x.dtype
        return F.layer_norm(x, self.normalized_shape, self.weight.to(dtype), self.bias.to(dtype), self.eps)


class Block(nn.Module):
    def __init__(self, config, layer):
        super().__init__()
        self.ln_1 = RMSNorm() if config.rmsnorm else LayerNorm(config.n_embd)
        self.attn = CausalSelfAttention(config, layer)
        self.ln_2 = RMSNorm() if config.rmsnorm else LayerNorm(config.n_embd)
        self.mlp = MLP(config)

    def forward(self, x, cache=None, recompute=False, attn_mask=None, rope=None):
        if recompute:  # keep only x; run the block again in backward: activation memory for ~1/3 more compute
            return checkpoint(self.residual, x, None, attn_mask, rope, use_reentrant=False)
        return self.residual(x, cache, attn_mask, rope)

    def residual(self, x, cache=None, attn_mask=None, rope=None):
        # pre-LayerNorm: the residual stream itself is never normalised
        x = x + self.attn(self.ln_1(x), cache, attn_mask, rope)
        return x + self.mlp(self.ln_2(x))


class Packing(NamedTuple):
    """How the tokens of a forward's idx (B, T) sit, where it is not one sequence a row from position 0:
    several sequences packed in each row (hellaswag.py: a context once, then its 4 endings) give each token's
    position pos (B, T) and which tokens each attends to, attn_mask (B, T, T); select (N,) keeps only those
    flat positions (b * T + t) for the head: logits (N, vocab_size), targets (N,)."""
    pos: Optional[torch.Tensor] = None  # None: 0..T-1
    attn_mask: Optional[torch.Tensor] = None  # None: causal
    select: Optional[torch.Tensor] = None  # None: every position


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            # rotary: positions enter the attention instead
            **({} if config.rotary else dict(wpe=nn.Embedding(config.block_size, config.n_embd))),
            h=nn.ModuleList([Block(config, i) for i in range(config.n_layer)]),
            ln_f=RMSNorm() if config.rmsnorm else LayerNorm(config.n_embd),
        ))
        if config.rotary:  # the rotation frequencies of each pair of a head's dimensions (not saved)
            half = config.head_dim // 2
            self.register_buffer("inv_freq", 10000.0 ** (-torch.arange(half, dtype=torch.float32) / half),
                                 persistent=False)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if not config.untied_head:  # weight tying: one matrix embeds and un-embeds tokens
            self.transformer.wte.weight = self.lm_head.weight
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if config.zero_init and (name.endswith("c_proj.weight") or name == "lm_head.weight"):
                nn.init.zeros_(p)  # blocks start as the identity; the untied head predicts uniform
            elif name.endswith("c_proj.weight"):  # residual projections: 2 a layer add to the variance
                nn.init.normal_(p, mean=0.0, std=0.02 * (2 * config.n_layer) ** -0.5)

    @staticmethod
    def _init_weights(module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def num_params(self):
        """Parameters, the tied wte/lm_head counted once (accounting.count_params: those with FLOPs)."""
        return sum(p.numel() for p in self.parameters())

    def forward(self, idx, targets=None, reduction="mean", cache=None, packing=None):
        """idx (B, T) token ids -> (logits (B, T, vocab_size), None); given targets (B, T), (None, the mean
        cross-entropy, -1 ignored), or with reduction="none" (None, each token's (B*T,)): no logits kept
        (under torch.compile they would live through backward). cache (engine.KVCache): idx is at positions
        cache.pos (T,), and the logits are each row's last token's, (B, vocab_size). packing: see Packing."""
        B, T = idx.size()
        pos, attn_mask, select = packing or Packing()
        if T > self.config.block_size and (pos is None or pos.dim() == 1):  # packed rows: their positions
            raise ValueError(f"sequence length {T} exceeds block_size={self.config.block_size}: crop the "
                             f"input to the last {self.config.block_size} tokens or use a larger block_size")
        if cache is not None:  # query t sees the cached keys at positions <= pos[t]
            pos, keys = cache.pos, torch.arange(cache.span, device=idx.device)  # span: block_size, or fewer
            attn_mask = (keys <= pos[:, None])[None]  # (1, T, span)
        if pos is None:
            pos = torch.arange(T, dtype=torch.long, device=idx.device)  # (T,)
        x = self.embed(idx, pos)  # (B, T, C)
        rope = self.rotary(pos) if self.config.rotary else None
        recompute = self.config.grad_checkpoint and self.training and torch.is_grad_enabled()
        for block in self.transformer.h:
            x = block(x, cache, recompute, attn_mask, rope)
        if cache is not None:
            x = x[:, -1]  # (B, C): decoding needs the next token's logits only
        return self.head(x, targets, reduction, select)

    def embed(self, idx, pos):
        """Token (normalized with embed_norm) plus position embeddings of idx (B, T) at positions pos, (T,) or
        (B, T): (B, T, C). Rotary: the token embeddings alone."""
        x = self.transformer.wte(idx)
        if self.config.embed_norm:  # every token enters at the same scale, whatever its embedding's size
            x = rms_norm(x)
        return x if self.config.rotary else x + self.transformer.wpe(pos)

    def rotary(self, pos):
        """(cos, sin) of each position's angles for rotate(): (1 or B, 1, T, head_dim / 2), from pos (T,) or
        (B, T)."""
        angles = pos[..., None].float() * self.inv_freq  # (T, hs/2) or (B, T, hs/2)
        angles = angles[None, None] if pos.dim() == 1 else angles[:, None]
        return angles.cos(), angles.sin()

    def head(self, x, targets=None, reduction="mean", select=None):
        """The final LayerNorm, the logits (B, T, vocab_size), or (N, vocab_size) at the flat positions
        select, and, given targets, the cross-entropy."""
        if select is not None:
            x = x.reshape(-1, x.size(-1))[select]  # (N, C): the positions whose next token is scored
        x = self.transformer.ln_f(x)
        logits = self.lm_head(x)  # (B, T, vocab_size)
        if targets is None:
            return logits, None
        return None, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1,
                                     reduction=reduction)

    def compile_regions(self):
        """torch.compile this model in place, region by region: the embeddings, each block (its activation
        checkpoint included) and the head with the loss. For FSDP: its hooks between the blocks break a
        whole-model graph apart, and what Dynamo then compiles would depend on how it falls back (with the
        head written inline in forward, the 50,304-way cross-entropy ran eager). The blocks share their
        code, so they share one compiled graph."""
        self.embed = torch.compile(self.embed)
        for block in self.transformer.h:
            block.forward = torch.compile(block.forward)
        self.head = torch.compile(self.head)
