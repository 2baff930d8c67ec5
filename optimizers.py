"""The optimizers: GPT-2's AdamW, or Muon for the blocks' weight matrices with AdamW for the rest.

train_gpt2.py steps, unscales (fp16) and checkpoints every optimizer of the list alike, each following the
same warmup and cosine from its own peak learning rate.
"""
import torch


def adamw(params, weight_decay, lr, device_type, fused=None, lrs=None):
    """AdamW with weight decay on matrices and embeddings (>= 2-D) only, not on biases and LayerNorm gains.
    lrs: {id(parameter): its own peak learning rate} (the embedding's, the head's), lr for the rest; each
    group's lr is its peak, which train_gpt2.py's schedule follows. fused=None uses the fused kernel on CUDA
    (bench.py turns it off to measure what it is worth)."""
    groups, lrs = {}, lrs or {}  # groups: (peak lr, weight decay) -> parameters
    for p in params:
        if p.requires_grad:
            key = (lrs.get(id(p), lr), weight_decay if p.dim() >= 2 else 0.0)
            groups.setdefault(key, []).append(p)
    groups = [{"params": ps, "lr": group_lr, "weight_decay": wd} for (group_lr, wd), ps in groups.items()]
    # the fused kernel does the whole update in a few launches instead of several per tensor
    fused = device_type == "cuda" if fused is None else fused
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8, fused=fused)


def muon(model, weight_decay, adamw_lr, muon_lr, device_type, lrs=None):
    """[Muon, AdamW]: torch.optim.Muon for the blocks' weight matrices (attention and MLP: each update is
    orthogonalized, so every direction of the matrix moves alike), AdamW for the rest (embeddings, lm_head,
    biases, LayerNorm), which Muon is not meant for. Muon's step is scaled as in nanochat and modded-nanogpt
    (torch's "original": muon_lr * sqrt(max(1, rows / columns)))."""
    matrices = [p for p in model.transformer.h.parameters() if p.dim() == 2]
    ids = {id(p) for p in matrices}
    return [torch.optim.Muon(matrices, lr=muon_lr, weight_decay=weight_decay, adjust_lr_fn="original"),
            adamw([p for p in model.parameters() if id(p) not in ids], weight_decay, adamw_lr, device_type,
                  lrs=lrs)]


def make_optimizers(model, cfg, device_type):
    """[(optimizer, each group's peak learning rate)] for cfg's optimizer: adamw (max_lr), or muon (muon_lr
    for Muon, max_lr for its AdamW part). embed_lr and head_lr (if not 0) are wte's and an untied lm_head's
    peaks, given for a 768-wide model and scaled by sqrt(768 / n_embd), as nanochat does: the same step
    relative to a narrower model's weights."""
    width = (768 / model.config.n_embd) ** 0.5
    lrs = {}  # id(parameter): its own peak
    if cfg["embed_lr"]:
        lrs[id(model.transformer.wte.weight)] = cfg["embed_lr"] * width
    if cfg["head_lr"] and model.config.untied_head:  # tied, lm_head is wte: embed_lr's
        lrs[id(model.lm_head.weight)] = cfg["head_lr"] * width
    if cfg["optimizer"] == "adamw":
        opts = [adamw(model.parameters(), cfg["weight_decay"], cfg["max_lr"], device_type, lrs=lrs)]
    else:
        opts = muon(model, cfg["weight_decay"], cfg["max_lr"], cfg["muon_lr"], device_type, lrs=lrs)
    return [(opt, [group["lr"] for group in opt.param_groups]) for opt in opts]
