"""Synthetic utterances resident on the device (the built-in workload's data, split out of model.py)."""

from __future__ import annotations

import torch

from sweep.workloads.rnnt.data import encoder_frames, length_spec, step_lengths


class SyntheticData:
    """Synthetic utterances resident on the device: features randn, labels in 1..V-1.

    A bank of `size` utterances at the longest length is made once from the
    seed; sample g of the global batch at step k is row (k * global_batch + g)
    mod size, cut to the length data.step_lengths gives it (the same for every
    way of cutting the global batch). So every pair trains on the same global
    batch however it cuts it into ranks, micro-batches and chunks, and making a
    micro-batch is one gather on the device, not host-side generation inside
    the timed step. A batch is padded to its longest utterance.
    """

    def __init__(self, cfg, seed: int, device: torch.device, size: int = 64) -> None:
        self.spec = length_spec(cfg)
        self.seed = seed
        self.subsample, self.stack_time = int(cfg.subsample), int(cfg.enc_stack_time)
        gen = torch.Generator().manual_seed(seed)
        self.feats = torch.randn(size, self.spec.max_frames, cfg.feat_dim, generator=gen).to(device)
        self.labels = torch.randint(1, cfg.vocab, (size, self.spec.max_tokens), generator=gen).to(device)

    def lengths(self, step_index: int, first_sample: int, count: int, global_batch: int) -> tuple[list[int], list[int]]:
        """(input frames, tokens) of samples first_sample .. first_sample+count-1 of step `step_index`."""
        chosen = step_lengths(self.spec, self.seed, step_index, global_batch)[first_sample : first_sample + count]
        return [f for f, _ in chosen], [u for _, u in chosen]

    def batch(self, step_index: int, first_sample: int, count: int, global_batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Samples first_sample .. first_sample+count-1 of the global batch of step `step_index`, padded."""
        feats, labels, _, _ = self.padded_batch(step_index, first_sample, count, global_batch)
        return feats, labels

    def padded_batch(self, step_index: int, first_sample: int, count: int, global_batch: int):
        """(feats, labels, encoder frame lengths, label lengths); lengths are None when all are full."""
        frames, tokens = self.lengths(step_index, first_sample, count, global_batch)
        start = step_index * global_batch + first_sample
        rows = torch.arange(start, start + count, device=self.feats.device) % self.feats.shape[0]
        F, U = max(frames), max(tokens)
        if self.spec.mode == "fixed":
            return self.feats[rows], self.labels[rows], None, None
        feats = self.feats[rows, :F]
        valid = torch.arange(F, device=feats.device)[None, :] < torch.tensor(frames, device=feats.device)[:, None]
        feats = feats * valid[:, :, None]  # zeros after each utterance's end, as a real loader pads
        enc_lens = torch.tensor([encoder_frames(f, self.subsample, self.stack_time) for f in frames])
        return feats, self.labels[rows, :U], enc_lens, torch.tensor(tokens)
