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

from sweep.core.config import INTEGER, POSITIVE_INT, Rule, one_of, ruled

# workload.precision's values (what each means: RNNTWorkloadConfig.precision).
PRECISIONS = ("fp32", "auto", "fp16", "bf16")
# workload.joint's values (what each means: RNNTWorkloadConfig.joint).
JOINTS = ("reference", "fused")
OPTIMIZERS = ("adam", "sgd")
# workload.lengths's values (what each means: RNNTWorkloadConfig.lengths; data.py draws them).
LENGTH_MODES = ("fixed", "lognormal")
POSITIVE = Rule("a positive number", above=0)


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


@dataclass(frozen=True)
class RNNTWorkloadConfig:
    name: str = "rnnt"  # the built-in PyTorch RNN-T training step
    feat_dim: int = ruled(40, POSITIVE_INT)  # input features per 10 ms frame (e.g. log-mel bins; caiman-asr: 80)
    frames: int = ruled(48, POSITIVE_INT)  # input frames per utterance when lengths="fixed", before stacking
    subsample: int = ruled(2, POSITIVE_INT)  # frontend frame stacking = subsampling in front of the encoder (caiman-asr: 3)
    label_len: int = ruled(6, POSITIVE_INT)  # target tokens per utterance (U) when lengths="fixed"
    vocab: int = ruled(176, POSITIVE_INT)  # output vocabulary incl. blank (V): sentencepiece size + 1
    enc_hidden: int = ruled(8, POSITIVE_INT)  # encoder LSTM width (caiman-asr enc_n_hid)
    enc_pre_layers: int = ruled(0, Rule("an integer >= 0", INTEGER, at_least=0))  # encoder LSTM layers before the time stacking (caiman-asr enc_pre_rnn_layers)
    enc_stack_time: int = ruled(1, POSITIVE_INT)  # time-stacking factor inside the encoder (caiman-asr enc_stack_time_factor)
    enc_layers: int = ruled(16, POSITIVE_INT)  # encoder LSTM layers after the time stacking (caiman-asr enc_post_rnn_layers)
    pred_hidden: int = ruled(32, POSITIVE_INT)  # prediction-network width, embedding and LSTM (caiman-asr pred_n_hid)
    pred_layers: int = ruled(1, POSITIVE_INT)  # prediction-network LSTM depth (caiman-asr pred_rnn_layers)
    joint_hidden: int = ruled(8, POSITIVE_INT)  # joint-network width (caiman-asr joint_n_hid)
    optimizer: str = ruled("adam", one_of(OPTIMIZERS))  # "adam" (state = 2x params) or "sgd"
    seed: int = 0  # model init and synthetic data
    # Mixed precision: "fp32"; "auto" = the recipe's fp16 autocast + GradScaler on CUDA and fp32
    # elsewhere; "fp16" / "bf16" = autocast at that dtype on any device that supports it.
    precision: str = ruled("fp32", one_of(PRECISIONS))
    # Utterance lengths: "fixed" (frames and label_len for every utterance) or "lognormal"
    # (durations drawn per utterance; each batch padded to its longest). See data.py.
    lengths: str = ruled("fixed", one_of(LENGTH_MODES))
    duration_mean_s: float = ruled(12.3, POSITIVE)  # lognormal: mean utterance duration before truncation (LibriSpeech train-960)
    duration_std_s: float = ruled(4.0, POSITIVE)  # lognormal: standard deviation of the duration before truncation
    min_duration_s: float = ruled(0.5, POSITIVE)  # lognormal: shorter draws are redrawn
    max_duration_s: float = ruled(35.0, POSITIVE)  # lognormal: longer draws are redrawn; the first step is at this length
    tokens_per_s: float = ruled(3.5, POSITIVE)  # lognormal: transcript tokens per second of audio (U = round(duration * this))
    frame_shift_ms: float = ruled(10.0, POSITIVE)  # lognormal: one input frame per this many ms of audio
    # lognormal: utterances are drawn from a corpus of this many (LibriSpeech train-960's count), sorted by
    # duration into num_buckets buckets of equal size; each step's global batch comes from one bucket,
    # as caiman-asr's bucketing sampler draws them (its --num_buckets, default 6). See data.py.
    corpus_utterances: int = ruled(281241, POSITIVE_INT)
    num_buckets: int = ruled(6, POSITIVE_INT)
    # lognormal: the step index that repeats step 0's worst batch (the longest bucket's longest
    # utterances) after the allocator has seen other shapes: by default the last step every trial
    # runs (trial.warmup_steps 2 + trial.measure_steps 8 - 1); 0: step 0 only.
    stress_step: int = ruled(9, Rule("a step index, or 0 for step 0 only", INTEGER, at_least=0))
    # The joint and loss: "reference" = log_softmax then the loss on fp32 log-probs (about 10 bytes a
    # lattice cell under fp16 autocast); "fused" = caiman-asr's: the loss takes the joint's logits,
    # computes the normaliser itself and writes its gradient into the logits' buffer (2 bytes a cell
    # under fp16). See fused.py.
    joint: str = ruled("reference", one_of(JOINTS))
    packed_joint: bool = False  # fused only: keep each utterance's valid T x (U+1) cells only (apex pack_output)
    joint_chunk_mib: float = ruled(64.0, POSITIVE)  # fused only: fp32 temporaries per chunk of lattice rows (or a 64th of the lattice, if more)
