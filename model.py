"""GPT-2 in one file: the model, multi-query / grouped-query attention, KV-cache decoding.

Parameter names match Hugging Face's GPT2LMHeadModel (transformer.h.0.attn.c_attn.weight, ...), except
that we use nn.Linear where HF uses Conv1D (hf_gpt2.py transposes those weights on the way in and out).
"""
import copy
import dataclasses
import itertools
import math
from typing import Optional

import torch
import torch.nn as nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint

from errors import UserError

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

    MODERN = ("rotary", "qk_norm", "relu2", "untied_head", "zero_init", "rmsnorm", "embed_norm")

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
            raise UserError(f"n_head={self.n_head} must be divisible by "
                            f"n_kv_head={self.n_kv_head} (each K/V head serves n_head / n_kv_head query "
                            "heads)")

    @property
    def head_dim(self):
        return self.n_embd // self.n_head


class KVCache:
    """Keys and values for decoding, allocated once at their full length: for each layer k[layer] and
    v[layer] (B, n_kv_head, block_size, head_dim), in the dtype attention computes in (bf16 under autocast).
    A forward with a cache writes its tokens' keys and values at their positions (GPT.forward's pos, a
    device tensor) and attends over the whole cache with a mask, so every decode step has the same shapes:
    one compiled graph, one CUDA graph, one attention plan, and no position read back to the host. A tensor
    a layer, not one for all: compiled, each write then goes into its input in place (into one shared tensor,
    Inductor's code copied every layer's slice and wrote the whole cache back, every step)."""

    def __init__(self, config, batch_size, dtype=torch.float32, device="cpu"):
        shape = (batch_size, config.n_kv_head, config.block_size, config.head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.n_layer)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.n_layer)]

    def update(self, layer, k, v, pos):
        """Store k, v (B, n_kv_head, T, hs) at positions pos (T,); return the layer's whole cache, (B,
        n_kv_head, block_size, hs) each."""
        self.k[layer][:, :, pos] = k  # index_put_: compiled, it writes into the cache in place
        self.v[layer][:, :, pos] = v
        return self.k[layer], self.v[layer]

    def first_rows(self, n):
        """A cache over the first n rows of this one (views: writing one writes the other)."""
        rows = copy.copy(self)
        rows.k, rows.v = [k[:n] for k in self.k], [v[:n] for v in self.v]
        return rows


class CausalSelfAttention(nn.Module):
    def __init__(self, config, layer):
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = config.n_head, config.n_kv_head, config.head_dim
        self.layer = layer
        self.flash, self.qk_norm = config.flash, config.qk_norm
        # queries for every head, keys and values for the (possibly fewer) K/V heads, in one matmul
        self.c_attn = nn.Linear(config.n_embd, config.n_embd + 2 * config.n_kv_head * config.head_dim)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)

    def forward(self, x, cache=None, attn_mask=None, rope=None, pos=None):
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
            k, v = cache.update(self.layer, k, v, pos)  # (B, n_kv, block_size, hs): the whole cache
        # flash attention on GPU; enable_gqa: each K/V head serves n_head / n_kv_head query heads
        if self.flash:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                               enable_gqa=self.n_kv_head != self.n_head)  # (B, nh, T, hs)
        else:  # the textbook way: the whole (T, S) score matrix is written to and read back from memory
            if self.n_kv_head != self.n_head:
                k = k.repeat_interleave(self.n_head // self.n_kv_head, dim=1)  # (B, nh, S, hs)
                v = v.repeat_interleave(self.n_head // self.n_kv_head, dim=1)
            att = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)  # (B, nh, T, S)
            S = k.size(2)
            if causal:
                mask = torch.ones(T, S, dtype=torch.bool, device=x.device).tril(diagonal=S - T)
            if mask is not None:
                att = att.masked_fill(~mask, float("-inf"))
            y = F.softmax(att, dim=-1) @ v  # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # re-assemble all head outputs side by side
        return self.c_proj(y)


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

    def forward(self, x, cache=None, recompute=False, attn_mask=None, rope=None, pos=None):
        if recompute:  # keep only x; run the block again in backward: activation memory for ~1/3 more compute
            return checkpoint(self.residual, x, None, attn_mask, rope, use_reentrant=False)
        return self.residual(x, cache, attn_mask, rope, pos)

    def residual(self, x, cache=None, attn_mask=None, rope=None, pos=None):
        # pre-LayerNorm: the residual stream itself is never normalised
        x = x + self.attn(self.ln_1(x), cache, attn_mask, rope, pos)
        return x + self.mlp(self.ln_2(x))


class ChunkedHeadLoss(torch.autograd.Function):
    """lm_head and the mean cross-entropy (targets of -1 ignored) with the gradients computed in the forward,
    CHUNK rows at a time in one scratch tensor that stays allocated from step to step: x (N, C), weight
    (vocab_size, C), targets (N,), scratch (>= CHUNK, vocab_size) -> the loss. The plain way allocates four
    (N, vocab_size) tensors every micro-step (206 MB each at B=8, T=128); on a CPU each is a fresh mmap that
    the kernel zero-fills page by page, half of a step's time. GPUs keep freed memory in PyTorch's caching
    allocator and take the plain way, which torch.compile fuses (this Function does not compile)."""
    CHUNK = 1024  # rows: large matmuls, and a 206 MB scratch whatever B and T are

    @staticmethod
    def forward(ctx, x, weight, targets, scratch):
        count = (targets != -1).sum().clamp(min=1)  # the mean is over the counted tokens
        loss = torch.zeros((), device=x.device)
        grad_x, grad_w = torch.empty_like(x), torch.zeros_like(weight)
        with torch.autocast(x.device.type, enabled=False):  # fp32 throughout (--dtype=bf16 on a CPU too)
            x, w = x.float(), weight.float()
            for i in range(0, x.size(0), ChunkedHeadLoss.CHUNK):
                xc, tc = x[i:i + ChunkedHeadLoss.CHUNK], targets[i:i + ChunkedHeadLoss.CHUNK]
                logits = torch.mm(xc, w.t(), out=scratch[:len(xc)])  # (rows, vocab_size)
                counted = (tc != -1).float()
                tc = tc.clamp(min=0)
                lse = torch.logsumexp(logits, dim=1)
                loss += ((lse - logits.gather(1, tc[:, None]).squeeze(1)) * counted).sum()
                probs = logits.sub_(lse[:, None]).exp_()  # softmax, in place
                # d(token's loss)/d(logits) = softmax - one-hot
                probs[torch.arange(len(tc), device=tc.device), tc] -= 1
                probs.mul_(counted[:, None] / count)
                grad_x[i:i + ChunkedHeadLoss.CHUNK] = probs @ w
                grad_w.addmm_(probs.t(), xc)
        ctx.save_for_backward(grad_x, grad_w)
        return loss / count

    @staticmethod
    def backward(ctx, grad):
        grad_x, grad_w = ctx.saved_tensors
        return grad_x * grad, grad_w * grad, None, None


def pick(logits, temperature, top_k, generator=None):
    """The next token of each row from logits (B, >= 50257), on the device, no host sync: (B,). top_k=1 is
    greedy (argmax). Otherwise softmax(logits / temperature) over the top_k likeliest, drawn by the
    exponential race: argmax(p / E) with E ~ Exp(1) is i with probability p_i, as multinomial would be,
    without its host-side checks."""
    logits = logits[:, :GPT2_VOCAB].float()  # (B, V): padded ids never drawn
    if top_k == 1:
        return logits.argmax(-1)
    logits = logits / temperature
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = F.softmax(logits, dim=-1)
    return (probs / torch.empty_like(probs).exponential_(generator=generator)).argmax(-1)


def last_positions(B, T, device):
    """(B,) the flat positions (b * T + T - 1) of each row's last token: forward's select, the head there."""
    return torch.arange(B, device=device) * T + T - 1


def weight_storage(model):
    """Where each parameter and buffer lives: a CUDA graph replays reads of these addresses, so weights
    replaced rather than updated in place (load_state_dict(assign=True), .to(), .half()) need a new one."""
    return [t.data_ptr() for t in itertools.chain(model.parameters(), model.buffers())]


class Decoder:
    """Cached decoding of one batch size: its KVCache, and the decode step's input token and position as
    device tensors that each step overwrites. compile: the step (GPT.decode) through torch.compile with
    fixed shapes (compiled once: nothing about a step changes its graph) and, on CUDA, captured once as a
    CUDA graph and replayed: one launch instead of ~200, each step's input copied into the graph's own."""

    def __init__(self, model, batch, dtype, device, compile):
        self.model, self.graph = model, None
        self.cache = KVCache(model.config, batch, dtype, device)
        self.tok = torch.zeros(batch, 1, dtype=torch.long, device=device)  # (B, 1)
        self.pos = torch.zeros(1, dtype=torch.long, device=device)  # (1,)
        self.fn = torch.compile(model.decode, fullgraph=True, dynamic=False) if compile else model.decode
        self.graphed = compile and torch.device(device).type == "cuda"
        self.storage = weight_storage(model)  # what a captured graph reads: it must not move (GPT.decoder)

    def prefill(self, idx):
        """Run the prompt idx (B, T) into the cache: the logits of the token after it, (B, vocab_size).
        Rows that are all the same prompt run once and their keys and values are copied to every row."""
        B, T = idx.size()
        same = B > 1 and torch.equal(idx, idx[:1].expand_as(idx))  # one host sync, before any decoding
        rows = 1 if same else B
        pos = torch.arange(T, device=idx.device)
        logits, _ = self.model(idx[:rows], cache=self.cache.first_rows(rows), pos=pos,
                               select=last_positions(rows, T, idx.device))
        if same:
            for buf in self.cache.k + self.cache.v:  # (B, n_kv, block_size, hs) each
                buf[1:, :, :T] = buf[:1, :, :T]
            logits = logits.expand(B, -1)
        return logits

    def step(self, tok, pos):
        """The logits (B, vocab_size) of the token after tok (B, 1) at position pos (an int: a fill on the
        device, not a copy from the host)."""
        self.tok.copy_(tok)
        self.pos.fill_(pos)
        if not self.graphed:
            return self.fn(self.tok, self.pos, self.cache)
        if self.graph is None:  # compile (the warm-up calls, on a side stream as capture needs), then capture
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):  # they write this step's keys and values, which the replay rewrites
                    self.fn(self.tok, self.pos, self.cache)
            torch.cuda.current_stream().wait_stream(stream)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.logits = self.fn(self.tok, self.pos, self.cache)  # its output: rewritten by each replay
        self.graph.replay()
        return self.logits


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

    def num_params(self, non_embedding=False):
        """Parameters, the tied wte/lm_head counted once; non_embedding=True leaves out the lookups (no
        FLOPs): the position embeddings, and wte when lm_head is its own matrix (tied, it is the biggest
        matmul)."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= sum(m.weight.numel() for name, m in self.transformer.items()
                     if name == "wpe" or (name == "wte" and self.config.untied_head))
        return n

    def forward(self, idx, targets=None, cache=None, reduction="mean", pos=None, attn_mask=None,
                select=None, chunked=False):
        """idx (B, T) token ids -> (logits (B, T, vocab_size), None), or given targets (B, T) (None, the mean
        cross-entropy) (targets of -1 are ignored; no logits are kept: the step never uses them, and under
        torch.compile a returned (B*T, vocab_size) tensor would live through backward), or with
        reduction="none" (None, each token's, (B*T,)).
        With a KVCache, idx holds the tokens at positions pos (T,) (a device tensor): their keys and values
        are written there and each token attends to the cached positions up to its own (see KVCache).
        Several sequences packed in each row (hellaswag.py: a context once, then its 4 endings) pass pos
        (B, T), each token's position, and attn_mask (B, T, T), which tokens each token attends to. select
        (N,) keeps only those flat positions (b * T + t) for the head: logits (N, vocab_size), targets
        (N,). chunked=True (with targets): the mean loss by ChunkedHeadLoss, which also computes its
        gradients in the forward. train_gpt2.py trains that way on a CPU."""
        B, T = idx.size()
        if T > self.config.block_size and (pos is None or pos.dim() == 1):  # packed rows: their positions
            raise ValueError(f"sequence length {T} exceeds block_size={self.config.block_size}: crop "
                             f"the input to the last {self.config.block_size} tokens or use a larger "
                             "block_size")
        if cache is not None:  # query t sees the cached keys at positions <= pos[t]
            assert pos is not None and pos.dim() == 1, "a forward with a KVCache takes pos (T,)"
            keys = torch.arange(self.config.block_size, device=idx.device)
            attn_mask = (keys <= pos[:, None])[None]  # (1, T, block_size)
        if pos is None:
            pos = torch.arange(T, dtype=torch.long, device=idx.device)  # (T,)
        x = self.embed(idx, pos)  # (B, T, C)
        rope = self.rotary(pos) if self.config.rotary else None
        recompute = self.config.grad_checkpoint and self.training and torch.is_grad_enabled()
        for block in self.transformer.h:
            x = block(x, cache, recompute, attn_mask, rope, pos)
        return self.head(x, targets, reduction, select, chunked)

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

    def head(self, x, targets=None, reduction="mean", select=None, chunked=False):
        """The final LayerNorm, the logits (B, T, vocab_size), or (N, vocab_size) at the flat positions
        select, and, given targets, the cross-entropy (chunked: see forward)."""
        if select is not None:
            x = x.reshape(-1, x.size(-1))[select]  # (N, C): the positions whose next token is scored
        x = self.transformer.ln_f(x)
        if chunked:
            assert targets is not None and reduction == "mean", "chunked: the mean loss over targets"
            if getattr(self, "scratch", None) is None or self.scratch.device != x.device:  # kept: see there
                self.scratch = torch.empty(ChunkedHeadLoss.CHUNK, self.config.vocab_size, device=x.device)
            return None, ChunkedHeadLoss.apply(x.reshape(-1, x.size(-1)), self.lm_head.weight,
                                               targets.view(-1), self.scratch)
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

    # ----------------------------------------------------------------------------------------------------
    # sampling

    def decode(self, idx, pos, cache):
        """One step of cached decoding: the logits (B, vocab_size) of the token after idx (B, 1) at position
        pos (1,). The same shapes at every step: compiled once, replayed as a CUDA graph (Decoder)."""
        return self(idx, cache=cache, pos=pos)[0][:, -1]

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, use_cache=True, generator=None,
                 compile=False):
        """Append max_new_tokens sampled tokens to idx (B, T) and return it (B, T + max_new_tokens).

        With use_cache the prompt runs once (once for all rows when they are the same prompt, as for N
        samples of one), the head at its last position only, and each new token is one decode step over the
        preallocated KVCache; otherwise every token recomputes the whole sequence. Sampling stays on the
        device: no host sync until the caller reads the result (top_k=1 is argmax; otherwise a draw from
        softmax(logits / temperature) over the top_k, by the exponential race, which multinomial is but for
        its checks). Past block_size the context is cropped to the last block_size tokens (as in nanoGPT) and
        each further token costs a full forward either way (learned positions cannot shift). Ids >= 50257
        (vocab padding) are never sampled, so every output decodes with the GPT-2 tokenizer.
        compile: the decode step through torch.compile, compiled once per batch size and kept (a Decoder on
        the model), and on CUDA captured as a CUDA graph and replayed: ~200 kernel launches a token become
        one. It costs a compile (tens of seconds) the first time: for many tokens, not for a few."""
        if temperature <= 0:
            raise ValueError(f"temperature={temperature} must be > 0 (use top_k=1 for greedy decoding)")
        if top_k is not None and top_k < 1:
            raise ValueError(f"top_k={top_k} must be >= 1 or None")
        B, T = idx.size()
        if T == 0:
            raise ValueError("generate needs a prompt of at least one token a row (to start a new document, "
                             "<|endoftext|>: 50256)")
        block_size = self.config.block_size
        out = torch.empty(B, T + max_new_tokens, dtype=torch.long, device=idx.device)
        out[:, :T] = idx
        decoder = self.decoder(B, idx.device, compile) if use_cache and T <= block_size else None
        for t in range(T, T + max_new_tokens):  # t: the length so far, the position of the token drawn
            if decoder is not None and t == T:  # the prompt
                logits = decoder.prefill(idx)
            elif decoder is not None and t <= block_size:  # one token at position t - 1
                logits = decoder.step(out[:, t - 1:t], t - 1)
            else:  # recompute, the context cropped to block_size
                x = out[:, max(0, t - block_size):t]
                logits, _ = self(x, select=last_positions(B, x.size(1), x.device))  # (B, vocab_size)
            out[:, t] = pick(logits, temperature, top_k, generator)
        return out

    def decoder(self, batch, device, compile):
        """The Decoder for this batch size, device and compute dtype (autocast's, else the weights'); with
        compile, made at its first use and kept: a compiled step and its CUDA graph are made once."""
        kind = torch.device(device).type
        dtype = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else \
            self.lm_head.weight.dtype
        if not compile:  # nothing to keep but memory: made anew each time
            return Decoder(self, batch, dtype, device, compile)
        decoders = self.__dict__.setdefault("decoders", {})  # not a module attribute: no state_dict entry
        key = (batch, str(device), dtype)
        if key not in decoders or decoders[key].storage != weight_storage(self):  # weights moved: made anew
            decoders[key] = Decoder(self, batch, dtype, device, compile)
        return decoders[key]
