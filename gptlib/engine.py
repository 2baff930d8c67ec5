"""Fast generation from a GPT: the KV-cache, sampling on the device, and the decode step compiled once and
replayed as a CUDA graph. model.py is the model; this file is how text comes out of it (sample.py, bench.py
and the training run's samples all go through Engine.generate).
"""
import copy
import itertools
import types

import torch
from torch.nn import functional as F

from model import GPT2_VOCAB, Packing


class KVCache:
    """Keys and values for decoding, allocated once at their full length: for each layer k[layer] and
    v[layer] (B, n_kv_head, block_size, head_dim), in the dtype attention computes in (bf16 under autocast),
    and pos (T,), the positions of the tokens the next forward writes (a device tensor). A step attends over
    the cache's first `span` positions with a mask: the whole cache by default, so every decode step has the
    same shapes (one compiled graph, one CUDA graph, one attention plan, no position read back to the host);
    with Decoder's span, the filled positions rounded up to a multiple of it (a graph each, at most 8). A
    tensor a layer, not one for all: compiled, each write then goes into its input in place (into one shared
    tensor, Inductor copied every layer's slice and wrote the whole cache back, every step)."""

    def __init__(self, config, batch_size, dtype=torch.float32, device="cpu"):
        shape = (batch_size, config.n_kv_head, config.block_size, config.head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.n_layer)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.n_layer)]
        self.pos = torch.zeros(1, dtype=torch.long, device=device)  # (T,)
        self.span = config.block_size  # the positions attended: all, or (Decoder's span) the filled ones

    def update(self, layer, k, v):
        """Store k, v (B, n_kv_head, T, hs) at positions pos; return the layer's cache of the first span
        positions, (B, n_kv_head, span, hs) each."""
        self.k[layer][:, :, self.pos] = k  # index_put_: compiled, it writes into the cache in place
        self.v[layer][:, :, self.pos] = v
        return self.k[layer][:, :, :self.span], self.v[layer][:, :, :self.span]

    def first_rows(self, n, pos):
        """A cache over the first n rows of this one (views: writing one writes the other), its pos pos."""
        rows = copy.copy(self)
        rows.k, rows.v, rows.pos = [k[:n] for k in self.k], [v[:n] for v in self.v], pos
        rows.span = self.k[0].size(2)  # a prompt attends over the whole cache
        return rows


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


def own_copy(method):
    """A bound method whose function has a code object of its own. Dynamo keeps at most recompile_limit (8)
    compiled versions of one code object, and each Decoder's fixed shapes are one: with one code object
    shared, an engine's 9th batch size would fail (fullgraph) instead of compiling."""
    f = method.__func__
    copy = types.FunctionType(f.__code__.replace(), f.__globals__, f.__name__,  # replace(): a new code object
                              f.__defaults__, f.__closure__)
    copy.__kwdefaults__ = f.__kwdefaults__
    return types.MethodType(copy, method.__self__)


def weight_storage(model):
    """Where each parameter and buffer lives: a CUDA graph replays reads of these addresses, so weights
    replaced rather than updated in place (load_state_dict(assign=True), .to(), .half()) need a new one."""
    return [t.data_ptr() for t in itertools.chain(model.parameters(), model.buffers())]


class Decoder:
    """Cached decoding of one batch size: its KVCache, and the decode step's input token and position as
    device tensors that each step overwrites. compile: the step through torch.compile with fixed shapes
    (compiled once per span: nothing else about a step changes its graph) and, on CUDA, captured once as a
    CUDA graph and replayed: one launch instead of ~200, each step's input copied into the graph's own. span:
    attend over the cache's filled positions only, rounded up to a multiple of span (a graph for each
    multiple, at most 8: Dynamo's recompile limit), not its whole block_size (sample.py --span: at batch 8 a
    decode step reads more cache than weights at block_size 1024; docs/model.md); 0: the whole cache."""

    def __init__(self, model, batch, dtype, device, compile, span=0):
        block_size = model.config.block_size
        self.model, self.graphs, self.logits = model, {}, {}
        self.span = max(span, -(-block_size // 8)) if span else block_size
        self.cache = KVCache(model.config, batch, dtype, device)  # its pos: the step's position, (1,)
        self.tok = torch.zeros(batch, 1, dtype=torch.long, device=device)  # (B, 1)
        self.fn = (torch.compile(own_copy(self.decode), fullgraph=True, dynamic=False) if compile
                   else self.decode)
        self.graphed = compile and torch.device(device).type == "cuda"
        self.storage = weight_storage(model)  # what a captured graph reads: it must not move (Engine.decoder)

    def decode(self, tok, cache):
        """One step: the logits (B, vocab_size) of the token after tok (B, 1) at position cache.pos (1,)."""
        return self.model(tok, cache=cache)[0]

    def prefill(self, idx):
        """Run the prompt idx (B, T) into the cache: the logits of the token after it, (B, vocab_size).
        Rows that are all the same prompt run once and their keys and values are copied to every row."""
        B, T = idx.size()
        same = B > 1 and torch.equal(idx, idx[:1].expand_as(idx))  # one host sync, before any decoding
        rows = 1 if same else B
        prompt = self.cache.first_rows(rows, torch.arange(T, device=idx.device))  # positions 0..T-1
        logits, _ = self.model(idx[:rows], cache=prompt)
        if same:
            for buf in self.cache.k + self.cache.v:  # (B, n_kv, block_size, hs) each
                buf[1:, :, :T] = buf[:1, :, :T]
            logits = logits.expand(B, -1)
        return logits

    def step(self, tok, pos):
        """The logits (B, vocab_size) of the token after tok (B, 1) at position pos (an int: a fill on the
        device, not a copy from the host)."""
        self.tok.copy_(tok)
        self.cache.pos.fill_(pos)
        span = self.cache.span = min(-(-(pos + 1) // self.span) * self.span, self.model.config.block_size)
        if not self.graphed:
            return self.fn(self.tok, self.cache)
        if span not in self.graphs:  # compile (the warm-up calls, on a side stream as capture needs), capture
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):  # they write this step's keys and values, which the replay rewrites
                    self.fn(self.tok, self.cache)
            torch.cuda.current_stream().wait_stream(stream)
            self.graphs[span] = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graphs[span]):
                self.logits[span] = self.fn(self.tok, self.cache)  # its output: rewritten by each replay
        self.graphs[span].replay()
        return self.logits[span]


class Engine:
    """Generation from one model, a Decoder kept for each batch size. compile: the decode step through
    torch.compile, compiled once per batch size, and on CUDA captured as a CUDA graph and replayed: ~200
    kernel launches a token become one. It costs a compile (tens of seconds) the first time: for many
    tokens, not for a few."""

    def __init__(self, model, compile=False, span=0):
        self.model, self.compile, self.span, self.decoders = model, compile, span, {}

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, generator=None, use_cache=True):
        """Append max_new_tokens sampled tokens to idx (B, T) and return it (B, T + max_new_tokens). With
        use_cache the prompt runs once (once for all rows when they are the same prompt) and each new token is
        one decode step over the KVCache; otherwise every token recomputes the whole sequence, the reference
        the tests compare with. top_k=1 is greedy. Past block_size the context is cropped to the last
        block_size tokens (as in nanoGPT) and each further token costs a full forward either way (learned
        positions cannot shift). Nothing is read back to the host until the caller reads the result."""
        if temperature <= 0:
            raise ValueError(f"temperature={temperature} must be > 0 (use top_k=1 for greedy decoding)")
        if top_k is not None and top_k < 1:
            raise ValueError(f"top_k={top_k} must be >= 1 or None")
        B, T = idx.size()
        if T == 0:
            raise ValueError("generate needs a prompt of at least one token a row (to start a new document, "
                             "<|endoftext|>: 50256)")
        block_size = self.model.config.block_size
        out = torch.empty(B, T + max_new_tokens, dtype=torch.long, device=idx.device)
        out[:, :T] = idx
        decoder = self.decoder(B, idx.device) if use_cache and T <= block_size else None
        for t in range(T, T + max_new_tokens):  # t: the length so far, the position of the token drawn
            if decoder is not None and t == T:  # the prompt
                logits = decoder.prefill(idx)
            elif decoder is not None and t <= block_size:  # one token at position t - 1
                logits = decoder.step(out[:, t - 1:t], t - 1)
            else:  # recompute, the context cropped to block_size; the head at each row's last token only
                x = out[:, max(0, t - block_size):t]
                last = torch.arange(B, device=x.device) * x.size(1) + x.size(1) - 1  # (B,) flat positions
                logits, _ = self.model(x, packing=Packing(select=last))
            out[:, t] = pick(logits, temperature, top_k, generator)
        return out

    def decoder(self, batch, device):
        """The Decoder for this batch size, device and compute dtype (autocast's, else the weights'), made at
        its first use and kept: a compiled step and its CUDA graph are made once, and bench.py times the step
        generate() ran."""
        kind = torch.device(device).type
        dtype = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else \
            self.model.lm_head.weight.dtype
        key = (batch, str(device), dtype)
        if key not in self.decoders or self.decoders[key].storage != weight_storage(self.model):  # moved
            self.decoders[key] = Decoder(self.model, batch, dtype, device, self.compile, self.span)
        return self.decoders[key]
