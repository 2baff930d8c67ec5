"""Tokenizing throughput: the common approach (build-nanogpt: a process pool mapping encode_ordinary over
single documents, chunksize 16) vs fineweb.py's batches (processes, encode_to_numpy), on the same documents
held in memory (reading is left out of both), checking that both produce the same token stream.

    python dev/bench_tokenize.py corpus.jsonl [--text_field text]
"""
import argparse
import json
import multiprocessing as mp
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from fineweb import encode_batches  # noqa: E402
from gptlib.tokenizer import get_encoding  # noqa: E402


def tokenize(doc):  # build-nanogpt's per-document function
    enc = get_encoding()
    return np.array([enc.eot_token] + enc.encode_ordinary(doc), dtype=np.uint16)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("corpus")
    parser.add_argument("--text_field", default="text")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with open(args.corpus, encoding="utf-8") as f:
        docs = [json.loads(line)[args.text_field] for line in f if line.strip()]
    tokenize_reference = np.concatenate([tokenize(doc) for doc in docs])
    n = os.cpu_count()

    def baseline():
        with mp.Pool(n) as pool:
            return np.concatenate(list(pool.imap(tokenize, docs, chunksize=16)))

    def ours():
        return np.concatenate([tokens for tokens, _ in encode_batches(iter(docs), n)])

    times = {baseline: [], ours: []}
    for _ in range(args.rounds):  # interleaved, so both see the same machine load
        for fn in times:
            t0 = time.time()
            out = fn()
            times[fn].append(time.time() - t0)
            assert np.array_equal(out, tokenize_reference), "the token streams differ"

    print(f"{len(docs):,} documents, {len(out):,} tokens, {n} cores, {args.rounds} rounds; tokens/s median "
          "(best)")
    rate = {fn: (len(out) / np.median(t), len(out) / min(t)) for fn, t in times.items()}
    print(f"process pool, encode_ordinary per document, chunksize 16: {rate[baseline][0]:,.0f} "
          f"({rate[baseline][1]:,.0f})")
    print(f"fineweb.py: processes, encode_to_numpy, 256-doc batches:  {rate[ours][0]:,.0f} "
          f"({rate[ours][1]:,.0f}), {rate[ours][0] / rate[baseline][0]:.2f}x")


if __name__ == "__main__":
    main()
