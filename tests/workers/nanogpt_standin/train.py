# Trains model.py's bigram on data/DATASET/train.bin (from the folder it runs in) as nanoGPT's train.py is
# run: settings below, then configurator.py; ckpt.pt at every eval_interval-th step.
import os
import pickle

import numpy as np
import torch

from model import GPT, GPTConfig

out_dir, eval_interval, log_interval, eval_iters, dataset = "out", 2000, 1, 200, "openwebtext"
batch_size, block_size, n_layer, n_head, n_embd, dropout = 12, 1024, 12, 12, 768, 0.0
learning_rate, max_iters, lr_decay_iters, device, compile = 6e-4, 600000, 600000, "cuda", True
exec(open("configurator.py").read())
assert device == "cpu" and compile is False

data = np.fromfile(os.path.join("data", dataset, "train.bin"), dtype=np.uint16).astype(np.int64)
with open(os.path.join("data", dataset, "meta.pkl"), "rb") as f:
    vocab_size = pickle.load(f)["vocab_size"]
model_args = dict(n_layer=n_layer, n_head=n_head, n_embd=n_embd, block_size=block_size, bias=False,
                  vocab_size=vocab_size, dropout=dropout)
torch.manual_seed(1337)
model = GPT(GPTConfig(**model_args))
optimizer = torch.optim.Adam(model.parameters(), lr=learning_rate)
os.makedirs(out_dir, exist_ok=True)
for iter_num in range(max_iters + 1):
    if iter_num and iter_num % eval_interval == 0:
        torch.save({"model": model.state_dict(), "model_args": model_args, "iter_num": iter_num},
                   os.path.join(out_dir, "ckpt.pt"))
    starts = torch.randint(len(data) - block_size, (batch_size,))
    x = torch.stack([torch.from_numpy(data[i:i + block_size]) for i in starts])
    y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + block_size]) for i in starts])
    _, loss = model(x, y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if iter_num % log_interval == 0:
        print(f"iter {iter_num}: loss {loss.item():.4f}")
