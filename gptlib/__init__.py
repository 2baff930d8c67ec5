"""What the commands at the top level are built from: settings, runtime (processes, devices, signals), errors,
the run's log and trackers, checkpoints, the tokenizer, packing of evaluation examples, accounting (FLOPs,
memory), optimizers, the sampling engine, and the GPU report's checks. Nothing here imports a command."""
