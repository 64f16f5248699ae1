"""Utterance lengths and model size of the built-in RNN-T: pure Python, no torch.

Lengths. Real batches are padded to their longest utterance, so memory moves
from step to step and a pair that fits on average can still run out on the
longest batch. With `lengths="lognormal"` each utterance's duration is drawn
from a log-normal with the given mean and standard deviation, redrawn until it
lies in [min_duration_s, max_duration_s] (caiman-asr drops clips outside its
limits rather than clipping them); its transcript has round(duration *
tokens_per_s) tokens. The draws for step k come from a generator seeded by
(seed, k) and cover the whole global batch, so every (accum, split,
num_devices) trains on the same utterances in the same order: ranks,
micro-batches and joint chunks are contiguous slices of that sequence.

The long tail on purpose: every utterance of step 0 is at the maximum length
(max_duration_s, and the token count that goes with it). A trial's first step
(a warm-up step by default) is therefore the worst padded batch the
distribution can produce, and the trial's peak memory, taken over all its
steps, includes it.

Default shape: LibriSpeech train-960 (train-clean-100 + train-clean-360 +
train-other-500): 281,241 utterances, 960.9 h, so a mean of 12.3 s; the corpus
was segmented into pieces of at most 35 s (Panayotov et al., ICASSP 2015). The
standard deviation of 4.0 s is our choice: it puts 99.9% of draws under 31 s.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache

from sweep.workloads.rnnt.config import RNNTWorkloadConfig

LENGTH_MODES = ("fixed", "lognormal")


@dataclass(frozen=True)
class LengthSpec:
    """What data.py needs from the workload config, hashable so draws can be cached."""

    mode: str
    fixed_frames: int
    fixed_tokens: int
    mean_s: float
    std_s: float
    min_s: float
    max_s: float
    tokens_per_s: float
    frame_shift_ms: float
    min_frames: int  # at least one encoder frame per utterance

    @property
    def max_frames(self) -> int:
        return self.fixed_frames if self.mode == "fixed" else self.frames_of(self.max_s)

    @property
    def max_tokens(self) -> int:
        return self.fixed_tokens if self.mode == "fixed" else self.tokens_of(self.max_s)

    def frames_of(self, duration_s: float) -> int:
        return max(self.min_frames, int(round(duration_s * 1000.0 / self.frame_shift_ms)))

    def tokens_of(self, duration_s: float) -> int:
        return max(1, int(round(duration_s * self.tokens_per_s)))


def length_spec(cfg) -> LengthSpec:
    """The length settings of a workload config; raises ValueError naming a bad value."""
    if cfg.lengths not in LENGTH_MODES:
        raise ValueError(f"workload.lengths={cfg.lengths!r} is not valid: expected one of {', '.join(LENGTH_MODES)}")
    if cfg.lengths == "lognormal" and not (0 < cfg.min_duration_s < cfg.max_duration_s and cfg.duration_mean_s > 0 and cfg.duration_std_s > 0):
        raise ValueError(
            f"workload duration settings are not valid: need 0 < min_duration_s ({cfg.min_duration_s}) < "
            f"max_duration_s ({cfg.max_duration_s}), duration_mean_s ({cfg.duration_mean_s}) > 0, duration_std_s ({cfg.duration_std_s}) > 0"
        )
    return LengthSpec(
        mode=cfg.lengths,
        fixed_frames=int(cfg.frames),
        fixed_tokens=int(cfg.label_len),
        mean_s=float(cfg.duration_mean_s),
        std_s=float(cfg.duration_std_s),
        min_s=float(cfg.min_duration_s),
        max_s=float(cfg.max_duration_s),
        tokens_per_s=float(cfg.tokens_per_s),
        frame_shift_ms=float(cfg.frame_shift_ms),
        min_frames=int(cfg.subsample) * int(cfg.enc_stack_time),
    )


def _lognormal_params(mean: float, std: float) -> tuple[float, float]:
    sigma2 = math.log1p((std / mean) ** 2)
    return math.log(mean) - sigma2 / 2, math.sqrt(sigma2)


@lru_cache(maxsize=64)
def step_lengths(spec: LengthSpec, seed: int, step: int, global_batch: int) -> tuple[tuple[int, int], ...]:
    """(frames, tokens) of every utterance in the global batch of `step`, in order."""
    if spec.mode == "fixed" or step == 0:
        return ((spec.max_frames, spec.max_tokens),) * global_batch
    rng = random.Random(f"{seed}/{step}")  # str seeds hash the same in every process (PYTHONHASHSEED aside)
    mu, sigma = _lognormal_params(spec.mean_s, spec.std_s)
    out = []
    for _ in range(global_batch):
        d = rng.lognormvariate(mu, sigma)
        while not spec.min_s <= d <= spec.max_s:
            d = rng.lognormvariate(mu, sigma)
        out.append((spec.frames_of(d), spec.tokens_of(d)))
    return tuple(out)


def encoder_frames(frames: int, subsample: int, stack_time: int) -> int:
    """Encoder output frames of an utterance: frontend stacking, then the encoder's time stacking (ragged tails dropped)."""
    return (frames // subsample) // stack_time


# ---------------------------------------------------------------- size


def _lstm_params(inputs: int, hidden: int, layers: int) -> int:
    if layers <= 0:
        return 0
    first = 4 * hidden * (inputs + hidden) + 8 * hidden  # weights ih, hh and two biases, as torch.nn.LSTM
    return first + (layers - 1) * (4 * hidden * 2 * hidden + 8 * hidden)


def parameter_count(cfg) -> int:
    """Parameters of model.RNNT built from cfg, counted from the dimensions alone."""
    frontend = cfg.feat_dim * cfg.subsample
    H, P, J, V = cfg.enc_hidden, cfg.pred_hidden, cfg.joint_hidden, cfg.vocab
    post_in = (H if cfg.enc_pre_layers > 0 else frontend) * cfg.enc_stack_time
    encoder = _lstm_params(frontend, H, cfg.enc_pre_layers) + _lstm_params(post_in, H, cfg.enc_layers)
    prediction = V * P + _lstm_params(P, P, cfg.pred_layers)
    joint = (H * J + J) + (P * J + J) + (J * V + V)
    return encoder + prediction + joint




def _human(n: float, units=("", "K", "M", "G", "T")) -> str:
    for unit in units:
        if abs(n) < 1000 or unit == units[-1]:
            return f"{n:.1f}{unit}" if unit else f"{int(n)}"
        n /= 1000.0
    return str(n)


def _gib(n: float) -> str:
    return f"{n / 1024**3:.2f} GiB" if n >= 1024**3 else f"{n / 1024**2:.1f} MiB"


def size_summary(cfg: RNNTWorkloadConfig | Mapping) -> str:
    """Two lines for dry_run: parameters, the largest joint lattice T x (U+1) x V, and its bytes per utterance.

    The joint's log-probs are fp32 under every precision (autocast runs
    log_softmax in fp32); the backward holds their gradient, the same size,
    beside them. With mixed precision the logits before the softmax are at the
    amp dtype on top.
    """
    if isinstance(cfg, Mapping):  # the plan's resolved workload dict
        cfg = RNNTWorkloadConfig(**cfg)
    spec = length_spec(cfg)
    T = encoder_frames(spec.max_frames, cfg.subsample, cfg.enc_stack_time)
    U1, V = spec.max_tokens + 1, cfg.vocab
    cells = T * U1 * V
    half = "bf16" if cfg.precision == "bf16" else "fp16"
    amp = "" if cfg.precision == "fp32" else f", +{_gib(cells * 2)} of {half} logits under precision={cfg.precision}{' on CUDA' if cfg.precision == 'auto' else ''}"
    if spec.mode == "fixed":
        lengths = f"fixed lengths: {spec.max_frames} frames, {spec.max_tokens} tokens"
    else:
        lengths = (
            f"lognormal lengths: mean {spec.mean_s:g} s, sd {spec.std_s:g} s, in [{spec.min_s:g}, {spec.max_s:g}] s; "
            f"step 0 at the maximum ({spec.max_frames} frames, {spec.max_tokens} tokens)"
        )
    return (
        f"workload: RNN-T {_human(parameter_count(cfg))} parameters (encoder {cfg.enc_pre_layers}+{cfg.enc_layers} x {cfg.enc_hidden}, "
        f"prediction {cfg.pred_layers} x {cfg.pred_hidden}, joint {cfg.joint_hidden}, vocab {V}); {lengths}\n"
        f"largest joint T x (U+1) x V = {T} x {U1} x {V} = {_human(cells)} cells: {_gib(cells * 4)} of fp32 log-probs "
        f"per utterance, {_gib(cells * 8)} with their gradient{amp}"
    )
