"""Writes the tiny image data set timm's train.py reads for the tests, in the folder layout its default reader
takes (<root>/train/<class>/*.png, <root>/validation/<class>/*.png): random 32x32 images in 2 classes (320 for training: 20 updates of 16)."""

import sys
from pathlib import Path

import numpy as np
from PIL import Image

if __name__ == "__main__":
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "data")
    rng = np.random.default_rng(0)
    for split, per_class in (("train", 160), ("validation", 8)):
        for label in ("a", "b"):
            folder = root / split / label
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(per_class):
                Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(folder / f"{i}.png")
