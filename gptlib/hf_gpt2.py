"""Hugging Face GPT-2 weights in and out, without transformers: OpenAI's GPT-2 by name (downloaded once from
the Hub) or a local folder in HF GPT-2 format (config.json + model.safetensors) into a GPT, and a GPT out into
that format with GPT-2's tokenizer files, which transformers' GPT2LMHeadModel and AutoTokenizer read.
HF's GPT-2 uses Conv1D where model.py uses nn.Linear: those weights are transposed on the way in and out.
"""
import dataclasses
import json
import os

import torch

from gptlib.errors import UserError, first_line
from gptlib.runtime import hub_online
from gptlib.tokenizer import hf_tokenizer_files
from model import GPT, GPT2_SIZES, GPT2_VOCAB, GPTConfig

OPENAI = {"gpt2": "124M", "gpt2-medium": "350M", "gpt2-large": "774M", "gpt2-xl": "1558M"}  # name: size
PRETRAINED = {name: f"openai-community/{name}" for name in OPENAI}  # Hub ids
HF_FIELDS = ("block_size", "vocab_size", "n_layer", "n_head", "n_embd")  # GPTConfig's fields in HF's config
UNSAVED = ("grad_checkpoint", "flash", "zero_init")  # how a model trains or computes, not what it computes
CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def from_pretrained(name_or_dir):
    """OpenAI's GPT-2 weights by name (downloaded once from the Hugging Face Hub into its cache) or a
    local folder in HF GPT-2 format: config.json + model.safetensors (or pytorch_model.bin), e.g. what
    save_pretrained or transformers wrote."""
    folder = name_or_dir if os.path.isdir(name_or_dir) else download_gpt2(name_or_dir)
    model = GPT(pretrained_config(folder))
    sd = {}
    for k, v in read_hf_weights(folder).items():
        # OpenAI's files: no prefix
        k = k if k.startswith(("transformer.", "lm_head.")) else "transformer." + k
        if not k.endswith((".attn.bias", ".attn.masked_bias")):  # causal-mask buffers of older versions
            sd[k] = (v.t() if k.endswith(CONV1D) else v).float()
    sd.setdefault("lm_head.weight", sd.get("transformer.wte.weight"))  # tied: stored once
    mine = model.state_dict()
    missing, extra = sorted(set(mine) - set(sd)), sorted(set(sd) - set(mine))
    bad = [k for k in mine if k in sd and sd[k] is not None and sd[k].shape != mine[k].shape]
    if missing or extra or bad:
        raise UserError(f"{folder}: weights do not match its config.json as GPT-2 (missing "
                        f"{missing[:3]}, unexpected {extra[:3]}, wrong shape {bad[:3]})")
    model.load_state_dict(sd)
    return model


def save_pretrained(model, out_dir):
    """Write out_dir in HF GPT-2 format (config.json + model.safetensors) with GPT-2's tokenizer files:
    from_pretrained(out_dir) and transformers' GPT2LMHeadModel.from_pretrained(out_dir) give the same
    logits, and its AutoTokenizer the same tokens as ours. The padded vocab rows beyond 50257 are dropped;
    lm_head is tied to wte, so it is stored once."""
    from safetensors.torch import save_file
    c = model.config
    gpt2 = GPTConfig(**{k: getattr(c, k) for k in HF_FIELDS})  # what HF's GPT-2 expresses, the rest GPT-2's
    other = [f"{f.name}={getattr(c, f.name)!r}" for f in dataclasses.fields(c) if f.name not in UNSAVED
             and getattr(c, f.name) != getattr(gpt2, f.name)]
    if other:
        raise UserError(f"{', '.join(other)}: Hugging Face GPT-2 has no such option, so this model cannot be "
                        "saved in its format; GPT-2's own can be (--recipe=gpt2, no other model options)")
    vocab = GPT2_VOCAB if c.vocab_size > GPT2_VOCAB else c.vocab_size
    eot = GPT2_VOCAB - 1 if vocab == GPT2_VOCAB else None
    config = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": vocab,
              "n_positions": c.block_size, "n_embd": c.n_embd, "n_layer": c.n_layer, "n_head": c.n_head,
              "n_inner": None, "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5,
              "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0, "initializer_range": 0.02,
              "scale_attn_weights": True, "tie_word_embeddings": True, "bos_token_id": eot,
              "eos_token_id": eot}
    sd = {k: (v.t() if k.endswith(CONV1D) else v[:vocab] if k.endswith("wte.weight") else v)
          for k, v in model.state_dict().items() if k != "lm_head.weight"}
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "model.safetensors")
    save_file({k: v.detach().float().contiguous().cpu() for k, v in sd.items()}, path + ".tmp",
              metadata={"format": "pt"})
    umask = os.umask(0)  # reading the umask means setting it
    os.umask(umask)
    os.chmod(path + ".tmp", 0o666 & ~umask)  # safetensors writes 0600: the mode the other files get
    os.replace(path + ".tmp", path)
    files = {**hf_tokenizer_files(c.block_size), "config.json": json.dumps(config, indent=2)}
    for name, text in files.items():
        with open(os.path.join(out_dir, name), "w", encoding="utf-8") as f:
            f.write(text)


def pretrained_config(name_or_dir):
    """The GPTConfig of OpenAI's GPT-2 `name` (no download) or of an HF GPT-2 folder (its config.json)."""
    if not os.path.isdir(name_or_dir):
        if name_or_dir not in OPENAI:
            raise UserError(f"unknown model {name_or_dir!r}: use one of {', '.join(OPENAI)}, a local folder "
                            "in HF GPT-2 format (config.json + model.safetensors) or a train_gpt2.py "
                            "checkpoint (.pt)")
        return GPTConfig(**GPT2_SIZES[OPENAI[name_or_dir]], block_size=1024, vocab_size=GPT2_VOCAB)
    c = read_json(os.path.join(name_or_dir, "config.json"))
    want = {"model_type": "gpt2", "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5,
            "scale_attn_by_inverse_layer_idx": False, "reorder_and_upcast_attn": False,
            "tie_word_embeddings": True}
    for key, value in want.items():
        if c.get(key, value) != value:
            raise UserError(f"{name_or_dir}/config.json has {key}={c[key]!r}; this GPT-2 implementation "
                            f"supports only {value!r}")
    if c.get("n_inner") not in (None, 4 * c["n_embd"]):
        raise UserError(f"{name_or_dir}/config.json has n_inner={c['n_inner']}; this GPT-2 has an MLP 4 x "
                        "n_embd wide")
    return GPTConfig(block_size=c["n_positions"], vocab_size=c["vocab_size"], n_layer=c["n_layer"],
                     n_head=c["n_head"], n_embd=c["n_embd"])


def download_gpt2(name):
    """The local folder of OpenAI's GPT-2 `name` (config.json + model.safetensors), from the Hugging Face
    Hub's cache, downloading what is missing (huggingface_hub comes with datasets)."""
    pretrained_config(name)  # an unknown name: the one-line error
    try:
        from huggingface_hub import hf_hub_download
        from huggingface_hub.utils import logging
    except ImportError:
        raise UserError(f"downloading {name!r} needs huggingface_hub (pip install huggingface_hub); or pass "
                        "a local folder in HF GPT-2 format (config.json + model.safetensors)") from None
    logging.set_verbosity_error()  # no retry chatter: one line below says what went wrong
    online = hub_online()  # offline, only the Hub cache is read: seconds, not half a minute of retries
    try:
        for file in ("config.json", "model.safetensors"):
            path = hf_hub_download(PRETRAINED[name], file, local_files_only=not online)
    except Exception as e:  # offline, proxy, Hub outage: all end the same way for the user
        why = first_line(e) if online else "the Hub cannot be reached and they are not in its local cache"
        raise UserError(f"could not download GPT-2 weights {name!r} ({PRETRAINED[name]}) from the Hugging "
                        f"Face Hub ({why}); without internet, pass a local folder in HF GPT-2 format "
                        "(config.json + model.safetensors) instead") from None
    return os.path.dirname(path)


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        raise UserError(f"{path} does not exist: an HF GPT-2 folder holds config.json and "
                        f"model.safetensors") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{path} is damaged or not JSON ({first_line(e)})") from None


def read_hf_weights(folder):
    """The state dict in an HF folder: model.safetensors, or pytorch_model.bin as older uploads have it."""
    st, pt = os.path.join(folder, "model.safetensors"), os.path.join(folder, "pytorch_model.bin")
    try:
        if os.path.exists(st):
            from safetensors.torch import load_file
            return load_file(st)
        if os.path.exists(pt):
            return torch.load(pt, map_location="cpu", weights_only=True)
    except Exception as e:  # safetensors' and torch's errors for truncated or altered files
        raise UserError(f"{st if os.path.exists(st) else pt} is damaged ({first_line(e)}): download or save "
                        f"it again") from None
    raise UserError(f"{folder} holds no model.safetensors or pytorch_model.bin")
