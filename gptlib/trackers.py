"""TensorBoard and Weights & Biases: what a run writes to metrics.jsonl, also sent to either or both (rank 0).

    python train_gpt2.py --tracker=tensorboard         # LOG_DIR/tensorboard: tensorboard --logdir LOG_DIR
    WANDB_MODE=offline python train_gpt2.py --tracker=wandb   # no internet: wandb sync LOG_DIR/wandb/* later

Each gets every step's values, every evaluation (val loss, bits per byte, HellaSwag), the samples as text, and
the start record (settings, model, versions) as the run's config. A resumed run continues the same
TensorBoard step axis (the steps after its checkpoint, written by the attempt that died, are purged) and the
same W&B run (its id is kept in LOG_DIR/wandb_id). Neither package is imported unless asked for.
"""
import json
import os
import uuid

from gptlib.errors import UserError, first_line

TRACKERS = ("tensorboard", "wandb")


def open_trackers(names, log_dir, start):
    """The trackers named (comma-separated) for the run in log_dir whose start record is `start`."""
    kinds = {"tensorboard": TensorBoard, "wandb": WandB}
    return [kinds[name](log_dir, start) for name in names.split(",") if name]


def tag(name):
    """A metrics.jsonl name under its section, as both group them: eval/val_loss, speed/tok_s, train/loss."""
    if name.startswith(("val_", "hellaswag")):
        return f"eval/{name}"
    return f"speed/{name}" if name in ("ms", "tok_s", "mfu", "elapsed", "eta") else f"train/{name}"


def values(record):
    """({tag: number}, {tag: text}) of a metrics.jsonl record: the samples as one text."""
    numbers = {tag(k): v for k, v in record.items()
               if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)}
    texts = {"eval/samples": "\n\n".join(record["samples"])} if "samples" in record else {}
    return numbers, texts


class TensorBoard:
    def __init__(self, log_dir, start):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise UserError("--tracker=tensorboard needs the tensorboard package: pip install tensorboard") \
                from None
        # a resume from step N drops what the attempt that died logged after N: one value a step
        self.writer = SummaryWriter(os.path.join(log_dir, "tensorboard"), purge_step=start["step"] + 1)
        self.writer.add_text("config", f"    {json.dumps(start, indent=1)}".replace("\n", "\n    "),
                             start["step"])

    def write(self, record):
        numbers, texts = values(record)
        for name, value in numbers.items():
            self.writer.add_scalar(name, value, record["step"])
        for name, text in texts.items():
            self.writer.add_text(name, text, record["step"])

    def close(self):
        self.writer.close()


class WandB:
    def __init__(self, log_dir, start):
        try:
            import wandb
        except ImportError:
            raise UserError("--tracker=wandb needs the wandb package: pip install wandb") from None
        id_file = os.path.join(log_dir, "wandb_id")  # the run a resume continues
        if os.path.exists(id_file):
            with open(id_file) as f:
                run_id = f.read().strip()
        else:
            run_id = uuid.uuid4().hex[:8]
            with open(id_file, "w") as f:
                f.write(run_id)
        config = {**start["config"], "model": start["model_config"], "run": start["run"],
                  "world_size": start["world_size"]}
        try:
            self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "gpt2-repro"), id=run_id,
                                  name=os.path.basename(os.path.abspath(log_dir)), resume="allow",
                                  dir=log_dir, config=config)
        except Exception as e:  # not logged in, no network: the same way out
            raise UserError(f"could not start the W&B run ({first_line(e)}): `wandb login`, or "
                            "WANDB_MODE=offline and `wandb sync` later") from None

    def write(self, record):
        numbers, texts = values(record)
        self.run.log({**numbers, **texts}, step=record["step"])

    def close(self):
        self.run.finish()
