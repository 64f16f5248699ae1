"""Writes the tiny data set nanoGPT's train.py reads for the tests: train.bin and val.bin (uint16 token ids,
as nanoGPT's own prepare.py scripts write them) and meta.pkl with the vocabulary size, beside this file.
Random tokens: the tests time steps, they don't need the model to learn anything."""

import os
import pickle

import numpy as np

VOCAB_SIZE = 256
HERE = os.path.dirname(os.path.abspath(__file__))

if __name__ == "__main__":
    rng = np.random.default_rng(0)
    for split, tokens in (("train", 200_000), ("val", 20_000)):
        rng.integers(0, VOCAB_SIZE, tokens, dtype=np.uint16).tofile(os.path.join(HERE, f"{split}.bin"))
    with open(os.path.join(HERE, "meta.pkl"), "wb") as f:
        pickle.dump({"vocab_size": VOCAB_SIZE}, f)
