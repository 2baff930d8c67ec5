"""Verify a train_gpt2.py checkpoint and say what it holds; optionally write it for transformers.

    python checkpoint.py log/model_019073.pt               # verify it, and say what it holds
    python checkpoint.py log/model_019073.pt --hf my-gpt2  # and write it for transformers, tokenizer included

A checkpoint's checksum is the sha256 of everything else in it, so a truncated or altered file is detected
before any of it is used; gptlib/checkpoint.py, which writes, verifies and resumes them, lists what one holds.
"""
import os

from gptlib import hf_gpt2
from gptlib.checkpoint import load_checkpoint
from gptlib.errors import UserError, command_line, main_guard
from gptlib.runlog import nearest_existing
from model import GPT, GPTConfig


def main():
    parser = command_line(__doc__)
    parser.add_argument("checkpoint", help="a train_gpt2.py checkpoint (model_*.pt)")
    parser.add_argument("--hf", default=None, metavar="DIR",
                        help="write it to DIR in Hugging Face GPT-2 format (config.json, model.safetensors) "
                        "with GPT-2's tokenizer files: GPT2LMHeadModel, AutoTokenizer and pipeline load it "
                        "offline")
    args = parser.parse_args()
    ckpt = load_checkpoint(args.checkpoint, "python checkpoint.py")
    model = GPT(GPTConfig(**ckpt["model_config"]))
    model.load_state_dict(ckpt["model"])
    print(f"{args.checkpoint}: verified (its checksum matches); step {ckpt.get('step', '?')}, "
          f"{model.num_params():,} parameters, {model.config}")
    if args.hf:
        if os.path.isfile(args.hf):
            raise UserError(f"--hf {args.hf} is a file: give a folder")
        where = nearest_existing(args.hf)  # the folder itself, or where it will be made
        if not os.access(where, os.W_OK):
            raise UserError(f"--hf {args.hf}: {where} is not writable (read-only or no permission): choose "
                            "another folder")
        hf_gpt2.save_pretrained(model, args.hf)
        print(f"wrote {args.hf}: {', '.join(sorted(os.listdir(args.hf)))}")


if __name__ == "__main__":
    main_guard(main)
