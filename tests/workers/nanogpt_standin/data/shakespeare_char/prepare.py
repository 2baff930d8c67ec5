# The characters of the input.txt beside this file: the first 90% to train.bin, the rest to val.bin (uint16
# ids), the vocabulary to meta.pkl.
import os
import pickle

import numpy as np

here = os.path.dirname(__file__)
with open(os.path.join(here, "input.txt")) as f:
    text = f.read()
itos = dict(enumerate(sorted(set(text))))
stoi = {c: i for i, c in itos.items()}
cut = int(len(text) * 0.9)
for name, part in (("train", text[:cut]), ("val", text[cut:])):
    np.array([stoi[c] for c in part], dtype=np.uint16).tofile(os.path.join(here, f"{name}.bin"))
with open(os.path.join(here, "meta.pkl"), "wb") as f:
    pickle.dump({"vocab_size": len(itos), "itos": itos, "stoi": stoi}, f)
print(f"{len(text):,} characters, {len(itos)} distinct")
