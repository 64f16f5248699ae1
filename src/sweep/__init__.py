"""sweep: find the fastest (grad_accumulation_batches, batch_split_factor) at a fixed global batch."""

from __future__ import annotations

__version__ = "0.1.0"
