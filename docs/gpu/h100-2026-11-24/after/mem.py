"""The training step at B (default 64), T=1024, GPT-2 124M, every ladder switch on: median ms and peak memory."""
import sys
import torch
import bench, runtime
rt = runtime.setup("cuda")
B = int(sys.argv[1]) if len(sys.argv) > 1 else 64
s = dict(bench.BASE, tf32=True, bf16=True, compile=True, flash=True, vocab_size=50304, fused=True)
size = dict(n_layer=12, n_head=12, n_embd=768, block_size=1024)
dt, peak = bench.time_steps(bench.training_step(size, s, B, 1024, rt), "cuda", 10, 3)
print(f"train step B={B}: {dt * 1000:.1f} ms, {B * 1024 / dt:,.0f} tok/s, peak {peak / 2**30:.2f} GiB")
