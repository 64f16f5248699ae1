"""The built-in RNN-T workload's config schema (workload=rnnt)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class RNNTWorkloadConfig:
    name: str = "rnnt"  # the built-in PyTorch RNN-T training step
    feat_dim: int = 40  # input features per frame (e.g. log-mel bins)
    frames: int = 160  # input frames per utterance, before subsampling
    subsample: int = 2  # time-stacking factor in front of the encoder
    label_len: int = 8  # target tokens per utterance (U)
    vocab: int = 448  # output vocabulary incl. blank (V)
    enc_hidden: int = 16  # encoder LSTM width
    enc_layers: int = 16  # encoder LSTM depth
    pred_hidden: int = 32  # prediction-network width
    joint_hidden: int = 32  # joint-network width
    optimizer: str = "adam"  # "adam" (state = 2x params) or "sgd"
    seed: int = 0  # model init and synthetic data
