"""The built-in RNN-T workload's config schema (workload=rnnt, rnnt_base, rnnt_large).

The defaults are the CPU demo (workload=rnnt): fixed lengths, one encoder LSTM
after frame stacking, fp32. The presets in conf/workload/ set the caiman-asr
dimensions and the LibriSpeech-shaped length distribution (see data.py).

The demo is sized for one CPU rank at global batch 128 (one of 8 ranks' share of
the recipe's 1024) under the default 0.018 GiB budget: short utterances and a
narrow, deep encoder, so a micro-batch's fixed cost dominates small batches and
throughput grows with the per-device batch as on a GPU (about 1.3x from 16 to 32
samples); and encoder and joint memory per sample of about the same size, so the
encoder runs out at 64 samples and the joint at 32 samples in one chunk, neither
within 5% of the budget.
"""

from __future__ import annotations

from dataclasses import dataclass

# workload.precision's values (what each means: RNNTWorkloadConfig.precision).
PRECISIONS = ("fp32", "auto", "fp16", "bf16")
# workload.joint's values (what each means: RNNTWorkloadConfig.joint).
JOINTS = ("reference", "fused")


def check_precision(precision: str) -> None:
    """Raises ValueError naming a workload.precision outside PRECISIONS (before launch and in the trial)."""
    if precision not in PRECISIONS:
        raise ValueError(f"workload.precision={precision!r} is not valid: expected one of {', '.join(PRECISIONS)}")


def check_joint(joint: str, packed: bool) -> None:
    """Raises ValueError naming a workload.joint / packed_joint setting no trial could run with."""
    if joint not in JOINTS:
        raise ValueError(f"workload.joint={joint!r} is not valid: expected one of {', '.join(JOINTS)}")
    if packed and joint != "fused":
        raise ValueError("workload.packed_joint=true needs workload.joint=fused (the reference loss takes padded log-probs)")


@dataclass
class RNNTWorkloadConfig:
    name: str = "rnnt"  # the built-in PyTorch RNN-T training step
    feat_dim: int = 40  # input features per 10 ms frame (e.g. log-mel bins; caiman-asr: 80)
    frames: int = 48  # input frames per utterance when lengths="fixed", before stacking
    subsample: int = 2  # frontend frame stacking = subsampling in front of the encoder (caiman-asr: 3)
    label_len: int = 6  # target tokens per utterance (U) when lengths="fixed"
    vocab: int = 176  # output vocabulary incl. blank (V): sentencepiece size + 1
    enc_hidden: int = 8  # encoder LSTM width (caiman-asr enc_n_hid)
    enc_pre_layers: int = 0  # encoder LSTM layers before the time stacking (caiman-asr enc_pre_rnn_layers)
    enc_stack_time: int = 1  # time-stacking factor inside the encoder (caiman-asr enc_stack_time_factor)
    enc_layers: int = 16  # encoder LSTM layers after the time stacking (caiman-asr enc_post_rnn_layers)
    pred_hidden: int = 32  # prediction-network width, embedding and LSTM (caiman-asr pred_n_hid)
    pred_layers: int = 1  # prediction-network LSTM depth (caiman-asr pred_rnn_layers)
    joint_hidden: int = 8  # joint-network width (caiman-asr joint_n_hid)
    optimizer: str = "adam"  # "adam" (state = 2x params) or "sgd"
    seed: int = 0  # model init and synthetic data
    # Mixed precision: "fp32"; "auto" = the recipe's fp16 autocast + GradScaler on CUDA and fp32
    # elsewhere; "fp16" / "bf16" = autocast at that dtype on any device that supports it.
    precision: str = "fp32"
    # Utterance lengths: "fixed" (frames and label_len for every utterance) or "lognormal"
    # (durations drawn per utterance; each batch padded to its longest). See data.py.
    lengths: str = "fixed"
    duration_mean_s: float = 12.3  # lognormal: mean utterance duration before truncation (LibriSpeech train-960)
    duration_std_s: float = 4.0  # lognormal: standard deviation of the duration before truncation
    min_duration_s: float = 0.5  # lognormal: shorter draws are redrawn
    max_duration_s: float = 35.0  # lognormal: longer draws are redrawn; the first step is at this length
    tokens_per_s: float = 3.5  # lognormal: transcript tokens per second of audio (U = round(duration * this))
    frame_shift_ms: float = 10.0  # lognormal: one input frame per this many ms of audio
    # lognormal: utterances are drawn from a corpus of this many (LibriSpeech train-960's count), sorted by
    # duration into num_buckets buckets of equal size; each step's global batch comes from one bucket,
    # as caiman-asr's bucketing sampler draws them (its --num_buckets, default 6). See data.py.
    corpus_utterances: int = 281241
    num_buckets: int = 6
    # lognormal: the step index that repeats step 0's worst batch (the longest bucket's longest
    # utterances) after the allocator has seen other shapes: by default the last step every trial
    # runs (trial.warmup_steps 2 + trial.measure_steps 8 - 1); 0: step 0 only.
    stress_step: int = 9
    # The joint and loss: "reference" = log_softmax then the loss on fp32 log-probs (about 10 bytes a
    # lattice cell under fp16 autocast); "fused" = caiman-asr's: the loss takes the joint's logits,
    # computes the normaliser itself and writes its gradient into the logits' buffer (2 bytes a cell
    # under fp16). See fused.py.
    joint: str = "reference"
    packed_joint: bool = False  # fused only: keep each utterance's valid T x (U+1) cells only (apex pack_output)
    joint_chunk_mib: float = 64.0  # fused only: fp32 temporaries per chunk of lattice rows (or a 64th of the lattice, if more)
