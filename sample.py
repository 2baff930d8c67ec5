"""Generate text from a training checkpoint or an OpenAI / Hugging Face GPT-2.

    python sample.py                                # the newest checkpoint in log/ (else OpenAI's gpt2)
    python sample.py --model log/model_000150.pt
    python sample.py --model gpt2 --prompt "The meaning of life is" --num_samples 3 --max_new_tokens 100
    python sample.py --model log/model_019073.pt --prompt FILE:prompt.txt --top_k 200 --temperature 0.8

sample() is the one sampling function: train_gpt2.py draws its evaluation samples with it.
"""
import os
import time

import torch

from gptlib import runtime
from gptlib.checkpoint import checkpoints, load_model
from gptlib.engine import Engine
from gptlib.errors import UserError, check_range, command_line, main_guard
from gptlib.tokenizer import get_encoding


@torch.no_grad()
def sample(engine, prompt, num_samples, max_new_tokens, temperature, top_k, seed, rt):
    """(texts, tokens/s, warm-up seconds): num_samples continuations of prompt in one batch (one prefill for
    all, then the KV-cache), from a generator seeded with seed (the same tokens on every rank; the global RNG
    is untouched). An engine.compile's decode step is compiled by a warm-up call first, timed apart from
    tokens/s. Without it decoding runs eagerly, also where the model's regions are compiled (the training
    run's few short samples: compiling would cost more than it saves)."""
    enc = get_encoding()
    ids = enc.encode_ordinary(prompt)
    start = 0 if ids else 1  # an empty prompt starts a new document: <|endoftext|>, not shown in the text
    ids = ids or [enc.eot_token]
    idx = torch.tensor([ids] * num_samples, device=rt.device)
    warm_up = 0.0
    stance = "default" if engine.compile else "force_eager"
    with runtime.autocast(rt.device, rt.dtype), torch.compiler.set_stance(stance):
        if engine.compile:  # compile, capture, the prompt's attention plan: once, on a generator of its own
            t0 = time.time()
            engine.generate(idx, min(2, max_new_tokens), temperature=temperature, top_k=top_k,
                            generator=torch.Generator(rt.device).manual_seed(seed))
            runtime.synchronize(rt.device)
            warm_up = time.time() - t0
        gen = torch.Generator(rt.device).manual_seed(seed)
        t0 = time.time()
        out = engine.generate(idx, max_new_tokens, temperature=temperature, top_k=top_k, generator=gen)
        out = out.tolist()  # waits for the device
    tok_s = num_samples * max_new_tokens / (time.time() - t0)
    return [enc.decode(row[start:]) for row in out], tok_s, warm_up


def main():
    parser = command_line(__doc__)
    parser.add_argument("--model", default=None,
                        help="a train_gpt2.py checkpoint (.pt), an HF GPT-2 folder, or "
                        "gpt2[-medium|-large|-xl] (default: the newest checkpoint in log/, else gpt2)")
    parser.add_argument("--prompt", default="Hello, I'm a language model,",
                        help='text, or FILE:path to read it')
    parser.add_argument("--num_samples", type=int, default=4, help="continuations, in one batch")
    parser.add_argument("--max_new_tokens", type=int, default=64, help="tokens each")
    parser.add_argument("--temperature", type=float, default=1.0, help="< 1 sharper, > 1 more random")
    parser.add_argument("--top_k", type=int, default=50, help="sample among the k likeliest tokens (0 = all)")
    parser.add_argument("--seed", type=int, default=42, help="the sampling generator's seed")
    parser.add_argument("--device", default="auto", help="auto (cuda, then mps, then cpu), cuda, mps or cpu")
    parser.add_argument("--compile", default="auto", choices=["auto", "True", "False"],
                        help="compile the decode step and replay it as a CUDA graph (auto: on CUDA)")
    parser.add_argument("--span", type=int, default=0, help="attend over the filled cache only, in steps "
                        "of this many positions (a compiled graph each); 0: the whole cache (engine.Decoder)")
    args = parser.parse_args()
    if args.temperature == 0:  # as some samplers take it
        raise UserError("--temperature=0: for greedy sampling (the likeliest token each step) drop it and "
                        "use --top_k=1")
    for option, bounds in (("num_samples", (1,)), ("max_new_tokens", (1,)), ("temperature", (None, None, 0)),
                           ("top_k", (0,)), ("seed", (0,)), ("span", (0,))):
        check_range(f"--{option}", getattr(args, option), *bounds)
    prompt = args.prompt
    if prompt.startswith("FILE:"):
        try:
            with open(prompt[5:], encoding="utf-8") as f:
                prompt = f.read()
        except FileNotFoundError:
            raise UserError(f"prompt file {prompt[5:]} does not exist") from None
    if args.model is None:  # what a user who just trained wants to see
        args.model = (checkpoints("log") or ["gpt2"])[-1]
        print(f"sample: {args.model} (--model picks another)" if args.model != "gpt2" else
              f"sample: gpt2, OpenAI's weights: no checkpoint in {os.path.abspath('log')} (the log/ of the "
              f"folder you run from; --model picks another)")
    rt = runtime.setup(args.device)
    for note in rt.notes:
        print(f"NOTE: {note}")
    compile, note = runtime.compile_choice(args.compile, rt)
    if note:
        print(f"NOTE: {note}")
    # inference keeps no fp32 master weights: in bf16 (fp16) a decode step reads half the bytes and casts none
    model = load_model(args.model, "--model").to(rt.device, runtime.TORCH_DTYPES[rt.dtype]).eval()
    texts, tok_s, warm_up = sample(Engine(model, compile, args.span), prompt, args.num_samples,
                                   args.max_new_tokens, args.temperature, args.top_k or None, args.seed, rt)
    for text in texts:
        print(text)
        print("-" * 80)
    print(f"{args.num_samples} x {args.max_new_tokens} tokens, {tok_s:,.1f} tokens/s on {rt.device}"
          + (f" (compiled: {warm_up:.1f} s of compiling and warm-up before)" if compile else " (eager)"))


if __name__ == "__main__":
    main_guard(main)
