"""Copied as sitecustomize.py by tests/test_faults.py: rank 1 of a torchrun run fails alone at the phase that
FAULTS (a comma-separated list) names for this attempt (torchrun --max-restarts: attempt k, k restarts, takes
the k-th; "" or none left: no fault), as a GPU that runs out of memory there would (a bug, for "bug:PHASE"):
startup (HellaSwag's encoding, an ending too long), step:N (the N-th training forward of this attempt),
checkpoint (gathering the state to write), val, hellaswag, core, samples. FAULT_ROOT: the repo."""
import os
import sys

ATTEMPT = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0))
FAULT = (os.environ.get("FAULTS", "").split(",")[ATTEMPT:] or [""])[0]
if FAULT and os.environ.get("RANK") == "1":
    sys.path.insert(0, os.environ["FAULT_ROOT"])  # the script's folder is not on the path yet
    import torch

    import dataloader
    from gptlib import checkpoint, engine, packing
    from gptlib.errors import UserError
    import hellaswag
    import model

    bug = FAULT.startswith("bug:")
    phase, _, nth = FAULT.removeprefix("bug:").partition(":")
    calls = []

    def fail(*args, **kwargs):
        """Fail at the nth call (default the first) of the patched function; before it, run the real one."""
        calls.append(1)
        if len(calls) < int(nth or 1):
            return REAL(*args, **kwargs)
        if bug:
            raise RuntimeError(f"a bug in {phase} (injected)")
        raise torch.OutOfMemoryError(f"CUDA out of memory in {phase} (injected)")

    if phase == "startup":
        def encode_all(examples, enc, block_size, threads=1):
            raise UserError(f"a HellaSwag ending of 99 tokens does not fit the model's "
                            f"block_size={block_size}: a larger block_size, or --hellaswag=0")
        hellaswag.encode_all = encode_all
    elif phase == "step":
        REAL = model.GPT.forward

        def forward(self, *args, **kwargs):
            return fail(self, *args, **kwargs) if torch.is_grad_enabled() else REAL(self, *args, **kwargs)
        model.GPT.forward = forward
    elif phase in ("hellaswag", "core"):
        REAL = packing.predict

        def predict(model, prepared, rt, desc, progress):
            call = fail if desc == phase else REAL
            return call(model, prepared, rt, desc, progress)
        packing.predict = predict
    else:
        owner, name = {"checkpoint": (checkpoint, "gather_state"),
                       "val": (dataloader.DataLoaderLite, "read_rows"),
                       "samples": (engine.Engine, "generate")}[phase]
        REAL = getattr(owner, name)
        setattr(owner, name, fail)
