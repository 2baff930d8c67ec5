"""The optimizers: GPT-2's AdamW, or Muon for the blocks' weight matrices with AdamW for the rest.

Every parameter group is named by its role (ROLES), whatever the learning rates are, so a checkpoint's
optimizer state fits the optimizer a resume builds even when a learning rate changed. train_gpt2.py steps,
unscales (fp16) and checkpoints every optimizer of the list alike, and sets each group's learning rate from
its role's peak on the schedule (get_lr: warmup, then a cosine).
"""
import math

import torch

ROLES = {  # role: whether its weights decay
    "muon": True,  # the blocks' weight matrices, under Muon
    "decay": True,  # the other matrices: the blocks' under AdamW, wpe
    "no_decay": False,  # biases and LayerNorm gains
    "embedding": True,  # wte (also lm_head when tied)
    "head": True,  # an untied lm_head
}


def role_peaks(s, n_embd):
    """{role: peak learning rate} of every parameter role, from settings s. embed_lr and head_lr (if not 0)
    are given for a 768-wide model and scaled by sqrt(768 / n_embd), as nanochat does: the same step relative
    to a narrower model's weights."""
    width = (768 / n_embd) ** 0.5
    return {"muon": s.muon_lr, "decay": s.max_lr, "no_decay": s.max_lr,
            "embedding": s.embed_lr * width or s.max_lr, "head": s.head_lr * width or s.max_lr}


def get_lr(step, peak, s):
    """The learning rate of `step` (from 0) for a role of this peak, settings s: a linear warmup to the peak,
    then a cosine to peak * min_lr_ratio at max_steps."""
    min_lr = peak * s.min_lr_ratio
    if step < s.warmup_steps:
        return peak * (step + 1) / s.warmup_steps
    if step >= s.max_steps:
        return min_lr
    ratio = (step - s.warmup_steps) / max(1, s.max_steps - s.warmup_steps)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (peak - min_lr)


def set_lr(optimizers, step, peaks, s):
    """Each parameter group's learning rate for `step`: get_lr from its role's peak (peaks[role]). Returns
    the rate at max_lr's peak, the one the log shows."""
    for opt in optimizers:
        for group in opt.param_groups:
            group["lr"] = get_lr(step, peaks[group["role"]], s)
    return get_lr(step, s.max_lr, s)


def param_roles(model, muon):
    """{role: [parameters]} for the roles that have any (which depends only on the model's shape and the
    optimizer, never on a learning rate); every parameter in exactly one."""
    # tied, lm_head is wte: the later key wins, and the matrix is the embedding's
    special = {id(model.lm_head.weight): "head", id(model.transformer.wte.weight): "embedding"}
    matrices = {id(p) for p in model.transformer.h.parameters() if p.dim() == 2}
    roles = {}
    for p in model.parameters():  # each shared parameter once
        role = special.get(id(p)) or ("muon" if muon and id(p) in matrices else
                                      "decay" if p.dim() >= 2 else "no_decay")
        roles.setdefault(role, []).append(p)
    return {role: roles[role] for role in ROLES if role in roles}


def make_optimizers(model, optimizer, weight_decay, peaks, fused):
    """[AdamW] or [Muon, AdamW] over the model's parameter roles, each group {"role", "params", "lr": its
    role's peak (peaks[role]), "weight_decay"}. fused: AdamW's fused kernel (CUDA), the whole update in a
    few launches instead of several per tensor."""
    roles = param_roles(model, muon=optimizer == "muon")

    def groups(names):
        return [{"role": r, "params": roles[r], "lr": peaks[r], "weight_decay": weight_decay * ROLES[r]}
                for r in names if r in roles]
    opts = []
    if "muon" in roles:
        opts.append(Muon(groups(["muon"]), qkv_splits(model)))
    opts.append(torch.optim.AdamW(groups([r for r in ROLES if r != "muon"]), lr=peaks["decay"],
                                  betas=(0.9, 0.95), eps=1e-8, fused=fused))
    return opts


def qkv_splits(model):
    """{id(c_attn.weight): [rows of Q, K, V]}: the fused projection is three matrices to the model."""
    c = model.config
    kv = c.n_kv_head * c.head_dim
    return {id(block.attn.c_attn.weight): [c.n_embd, kv, kv] for block in model.transformer.h}


def orthogonalize(g, steps=5, eps=1e-7):
    """The Newton-Schulz quintic of Keller Jordan's Muon, as torch.optim.Muon computes it (in bf16): g (2-D)
    with its singular values pushed to about 1, so every direction of the update moves alike."""
    a, b, c = 3.4445, -4.7750, 2.0315  # coefficients chosen for the steepest slope at zero
    x = g.bfloat16()
    tall = g.size(0) > g.size(1)
    if tall:
        x = x.T
    x = x / x.norm().clamp(min=eps)  # spectral norm <= 1
    for _ in range(steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if tall else x


class Muon(torch.optim.Optimizer):
    """Muon: Nesterov momentum (0.95), then each matrix's update orthogonalized and scaled by
    sqrt(max(1, rows / columns)) (nanochat's and modded-nanogpt's step size), with decoupled weight decay.
    The same update as torch.optim.Muon(adjust_lr_fn="original"), except that a matrix listed in `splits`
    ({id(parameter): [rows of each part]}) is orthogonalized part by part: c_attn's Q, K and V each get a
    whole orthogonal step, as the separate matrices of nanochat and modded-nanogpt do, instead of sharing
    one in which V takes most of the norm."""

    def __init__(self, params, splits=None, lr=0.02, weight_decay=0.0, momentum=0.95):
        super().__init__(params, dict(lr=lr, weight_decay=weight_decay, momentum=momentum))
        self.splits = splits or {}

    @torch.no_grad()
    def step(self, closure=None):
        assert closure is None, "Muon takes no closure"
        for group in self.param_groups:
            lr, momentum = group["lr"], group["momentum"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                buf = self.state[p].setdefault("momentum_buffer", torch.zeros_like(p))
                buf.lerp_(p.grad, 1 - momentum)
                update = p.grad.lerp(buf, momentum)  # Nesterov
                p.mul_(1 - lr * group["weight_decay"])
                rows = self.splits.get(id(p), [len(p)])
                for part, u in zip(p.split(rows), update.split(rows)):  # views: updated in place
                    part.add_(orthogonalize(u), alpha=-lr * max(1, u.size(0) / u.size(1)) ** 0.5)
