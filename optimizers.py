"""The optimizers: GPT-2's AdamW, or Muon for the blocks' weight matrices with AdamW for the rest.

train_gpt2.py steps, unscales (fp16) and checkpoints every optimizer of the list alike, each following the
same warmup and cosine from its own peak learning rate.
"""
import torch


def adamw(params, weight_decay, lr, device_type, fused=None):
    """AdamW with weight decay on matrices and embeddings (>= 2-D) only, not on biases and LayerNorm gains.
    fused=None uses the fused kernel on CUDA (bench.py turns it off to measure what it is worth)."""
    params = [p for p in params if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    # the fused kernel does the whole update in a few launches instead of several per tensor
    fused = device_type == "cuda" if fused is None else fused
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8, fused=fused)


def muon(model, weight_decay, adamw_lr, muon_lr, device_type):
    """[Muon, AdamW]: torch.optim.Muon for the blocks' weight matrices (attention and MLP: each update is
    orthogonalized, so every direction of the matrix moves alike), AdamW for the rest (embeddings = lm_head,
    biases, LayerNorm), which Muon is not meant for. match_rms_adamw scales Muon's step to AdamW's size."""
    matrices = [p for p in model.transformer.h.parameters() if p.dim() == 2]
    ids = {id(p) for p in matrices}
    return [torch.optim.Muon(matrices, lr=muon_lr, weight_decay=weight_decay, adjust_lr_fn="match_rms_adamw"),
            adamw([p for p in model.parameters() if id(p) not in ids], weight_decay, adamw_lr, device_type)]


def make_optimizers(model, cfg, device_type):
    """[(optimizer, its peak learning rate)] for cfg's optimizer: adamw (max_lr), or muon (muon_lr for Muon,
    max_lr for its AdamW part)."""
    if cfg["optimizer"] == "adamw":
        return [(adamw(model.parameters(), cfg["weight_decay"], cfg["max_lr"], device_type), cfg["max_lr"])]
    muon_opt, adamw_opt = muon(model, cfg["weight_decay"], cfg["max_lr"], cfg["muon_lr"], device_type)
    return [(muon_opt, cfg["muon_lr"]), (adamw_opt, cfg["max_lr"])]
