"""Utterance lengths and model size of the built-in RNN-T: pure Python, no torch.

Lengths. Real batches are padded to their longest utterance, so memory moves
from step to step and a pair that fits on average can still run out on the
longest batch. With `lengths="lognormal"` a corpus of `corpus_utterances`
durations is drawn once from a log-normal with the given mean and standard
deviation, each redrawn until it lies in [min_duration_s, max_duration_s]
(caiman-asr drops clips outside its limits rather than clipping them); a
transcript has round(duration * tokens_per_s) tokens.

Batches as caiman-asr draws them: the corpus is sorted by duration into
`num_buckets` buckets of equal size, and each step's global batch comes from one
bucket (its bucketing sampler), picked and sampled by a generator seeded by
(seed, step). Every (accum, split, num_devices) trains on the same utterances in
the same order: ranks, micro-batches and joint chunks are contiguous slices of
that sequence.

The worst batch on purpose, twice: step 0 and step `stress_step` are the longest
bucket's longest utterances, longest first. Step 0 (a warm-up step by default)
meets a fresh allocator; the stress step meets it after batches of other shapes
have come and gone (the late OOMs seen on an H100 came at steps 9 and 22), and
the trial's per-step reserved peaks show whether it still grows.

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

import numpy as np

from sweep.workloads.rnnt.config import LENGTH_MODES, RNNTWorkloadConfig


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
    corpus_utterances: int = 281241
    num_buckets: int = 6
    stress_step: int = 0  # 0: no stress step

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
    if cfg.num_buckets < 1:
        raise ValueError(f"workload.num_buckets={cfg.num_buckets} is not valid: expected 1 or more duration buckets")
    if cfg.stress_step < 0:
        raise ValueError(f"workload.stress_step={cfg.stress_step} is not valid: expected a step index, or 0 for none")
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
        corpus_utterances=max(1, int(cfg.corpus_utterances)),
        num_buckets=int(cfg.num_buckets),
        stress_step=int(cfg.stress_step),
    )


def _lognormal_params(mean: float, std: float) -> tuple[float, float]:
    sigma2 = math.log1p((std / mean) ** 2)
    return math.log(mean) - sigma2 / 2, math.sqrt(sigma2)


@lru_cache(maxsize=4)
def corpus(spec: LengthSpec, seed: int) -> tuple[tuple[int, int], ...]:
    """(frames, tokens) of every utterance of the synthetic corpus, shortest first."""
    rng = np.random.default_rng([seed, 20261125])
    mu, sigma = _lognormal_params(spec.mean_s, spec.std_s)
    durations = np.empty(0)
    while durations.size < spec.corpus_utterances:  # redraw what falls outside the limits
        draws = rng.lognormal(mu, sigma, size=spec.corpus_utterances)
        durations = np.concatenate([durations, draws[(draws >= spec.min_s) & (draws <= spec.max_s)]])
    durations = np.sort(durations[: spec.corpus_utterances])
    return tuple((spec.frames_of(float(d)), spec.tokens_of(float(d))) for d in durations)


def buckets(spec: LengthSpec, seed: int) -> list[tuple[tuple[int, int], ...]]:
    """The corpus in num_buckets duration buckets of equal size (the last ones one longer), shortest first."""
    utts = corpus(spec, seed)
    edges = np.linspace(0, len(utts), min(spec.num_buckets, len(utts)) + 1).round().astype(int)
    return [utts[lo:hi] for lo, hi in zip(edges[:-1], edges[1:])]


def is_worst_step(spec: LengthSpec, step: int) -> bool:
    """Step 0 and the stress step carry the worst batch."""
    return step == 0 or (spec.stress_step > 0 and step == spec.stress_step)


@lru_cache(maxsize=64)
def step_lengths(spec: LengthSpec, seed: int, step: int, global_batch: int) -> tuple[tuple[int, int], ...]:
    """(frames, tokens) of every utterance in the global batch of `step`, in order."""
    if spec.mode == "fixed":
        return ((spec.max_frames, spec.max_tokens),) * global_batch
    if is_worst_step(spec, step):
        return worst_batch(spec, seed, global_batch)
    rng = random.Random(f"{seed}/{step}")  # str seeds hash the same in every process (PYTHONHASHSEED aside)
    bucket = buckets(spec, seed)[rng.randrange(min(spec.num_buckets, spec.corpus_utterances))]
    if len(bucket) >= global_batch:
        return tuple(rng.sample(bucket, global_batch))
    return tuple(rng.choices(bucket, k=global_batch))


def worst_batch(spec: LengthSpec, seed: int, global_batch: int) -> tuple[tuple[int, int], ...]:
    """The longest bucket's longest utterances, longest first (repeated if the corpus is smaller)."""
    if spec.mode == "fixed":
        return ((spec.max_frames, spec.max_tokens),) * global_batch
    longest = corpus(spec, seed)[::-1]
    return tuple(longest[i % len(longest)] for i in range(global_batch))


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


# Bytes a lattice cell (T x (U+1) x V) costs at the joint's peak, as bench/bench_caiman.py counts
# them (every storage joint_and_loss allocates). Reference: the fp32 log-probs, their gradient and
# the logits' gradient live together in the backward (10.0 under fp16 autocast, 12.0 in fp32).
# Fused: the logits alone, at the amp dtype (fp32 without autocast), their gradient written into
# the same buffer (fused.py): 2.0-2.1 and 4.1.
REFERENCE_BYTES_PER_CELL = {"fp32": 12, "half": 10}
FUSED_BYTES_PER_CELL = {"fp32": 4, "half": 2}


def joint_bytes_per_cell(joint: str, precision: str, on_cuda: bool) -> int:
    """The joint's bytes per lattice cell at its peak, for dry_run's figures."""
    half = "half" if precision in ("fp16", "bf16") or (precision == "auto" and on_cuda) else "fp32"
    return (FUSED_BYTES_PER_CELL if joint == "fused" else REFERENCE_BYTES_PER_CELL)[half]


def worst_batch_cells(cfg: RNNTWorkloadConfig, utterances: int) -> tuple[int, int]:
    """(padded, packed) lattice cells T x (U+1) x V of the worst batch's first `utterances`
    utterances in one joint chunk: padded to its longest, or only each utterance's valid cells."""
    spec = length_spec(cfg)
    batch = worst_batch(spec, int(cfg.seed), utterances)
    shape = [(encoder_frames(f, cfg.subsample, cfg.enc_stack_time), u + 1) for f, u in batch]
    T, U1 = max(t for t, _ in shape), max(u for _, u in shape)
    return len(batch) * T * U1 * cfg.vocab, sum(t * u for t, u in shape) * cfg.vocab


def size_summary(cfg: RNNTWorkloadConfig | Mapping, utterances: int = 16) -> str:
    """dry_run's lines: parameters, lengths, and the joint of the worst batch's first `utterances`
    (a joint chunk of that many): its cells padded and packed, and their bytes for the joint in use
    (and the other) on CUDA, where precision=auto means fp16."""
    if isinstance(cfg, Mapping):  # the plan's resolved workload dict
        cfg = RNNTWorkloadConfig(**cfg)
    spec = length_spec(cfg)
    T = encoder_frames(spec.max_frames, cfg.subsample, cfg.enc_stack_time)
    V = cfg.vocab
    if spec.mode == "fixed":
        lengths = f"fixed lengths: {spec.max_frames} frames, {spec.max_tokens} tokens"
    else:
        lengths = (
            f"lognormal lengths: mean {spec.mean_s:g} s, sd {spec.std_s:g} s, in [{spec.min_s:g}, {spec.max_s:g}] s, "
            f"{spec.num_buckets} duration buckets; the worst batch at step 0"
            + (f" and step {spec.stress_step}" if spec.stress_step else "")
        )
    padded, packed = worst_batch_cells(cfg, utterances)
    used = f"{cfg.joint}{' packed' if cfg.packed_joint else ''}"

    def cost(joint: str, cells: int) -> str:
        return _gib(cells * joint_bytes_per_cell(joint, cfg.precision, on_cuda=True))

    return (
        f"workload: RNN-T {_human(parameter_count(cfg))} parameters (encoder {cfg.enc_pre_layers}+{cfg.enc_layers} x {cfg.enc_hidden}, "
        f"prediction {cfg.pred_layers} x {cfg.pred_hidden}, joint {cfg.joint_hidden}, vocab {V}); {lengths}\n"
        f"largest joint T x (U+1) x V = {T} x {spec.max_tokens + 1} x {V} = {_human(T * (spec.max_tokens + 1) * V)} cells per utterance; "
        f"worst batch, {utterances} utterances in a joint chunk: {_human(padded)} cells padded, {_human(packed)} packed; "
        f"joint={used} on CUDA: {cost(cfg.joint, packed if cfg.packed_joint else padded)} "
        f"(reference padded {cost('reference', padded)}, fused padded {cost('fused', padded)}, fused packed {cost('fused', packed)})"
    )
