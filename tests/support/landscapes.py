"""Synthetic (accum, split) landscapes with known truth, and a simulated orchestrator.

Memory (GiB), after the seed's account of an RNN-T step:
    encoder phase: base + enc * per_device_batch + overhead * (split > 1)
    joint phase:   encoder phase + joint * joint_batch   (encoder activations are still held)
The first phase whose peak exceeds the budget is where the trial OOMs.

Time per optimizer step (s):
    accum * (micro_fixed + per_sample * per_device_batch + split * chunk_fixed + split_fixed * (split > 1)) + step_fixed
so throughput rises and saturates with the per-device batch, and every joint chunk costs
time. `pressure` slows pairs whose peak is within 10% of the budget (allocator retries);
it breaks the "bigger batch, fewer chunks is faster" ordering on purpose.

Measured step times are the noiseless time times a per-trial offset, per-step lognormal
noise and occasional slow outlier steps, so a trial's median throughput scatters around
the truth the way short real trials do.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from sweep.core.schema import FAILED, OK, OOM, PHASE_ENCODER, PHASE_JOINT, TrialResult
from sweep.core.space import Candidate, enumerate_candidates
from sweep.core.stats import throughput_summary
from sweep.core.strategies import Strategy


@dataclass(frozen=True)
class Landscape:
    name: str = "typical"
    global_batch_size: int = 1024
    num_devices: int = 8
    accum_values: tuple[int, ...] | None = None
    split_values: tuple[int, ...] | None = None
    # memory, GiB
    budget_gib: float = 80.0
    base_gib: float = 10.0
    enc_gib: float = 0.4  # per sample of per_device_batch
    overhead_gib: float = 3.0  # batch splitting, split > 1
    joint_gib: float = 3.0  # per sample of joint_batch
    # time, s
    step_fixed_s: float = 0.05
    micro_fixed_s: float = 0.04
    per_sample_s: float = 0.002
    chunk_fixed_s: float = 0.004
    split_fixed_s: float = 0.0
    pressure: float = 0.0
    # measurement
    step_noise: float = 0.03  # lognormal sigma per step
    trial_noise: float = 0.0  # lognormal sigma of one offset per trial
    outlier_rate: float = 0.0  # share of steps slowed by 1.3-2x
    steps: int = 8
    mem_noise: float = 0.01  # relative scatter of a measured peak around the model's
    fails: frozenset[str] = field(default_factory=frozenset)  # keys that fail (not OOM); infeasible in truth
    # (key, factor): those pairs' steps take factor times as long (allocator retries near the limit: largest_fit_slower)
    slowed: tuple[tuple[str, float], ...] = ()

    def candidates(self) -> list[Candidate]:
        return enumerate_candidates(self.global_batch_size, self.num_devices, self.accum_values, self.split_values)

    def valid(self) -> list[Candidate]:
        return [c for c in self.candidates() if c.valid]

    def peaks(self, c: Candidate) -> tuple[float, float]:
        encoder = self.base_gib + self.enc_gib * c.per_device_batch + self.overhead_gib * (c.split > 1)
        return encoder, encoder + self.joint_gib * c.joint_batch

    def outcome(self, c: Candidate) -> tuple[str, str | None]:
        encoder, joint = self.peaks(c)
        if encoder > self.budget_gib:
            return OOM, PHASE_ENCODER
        if joint > self.budget_gib:
            return OOM, PHASE_JOINT
        if c.key in self.fails:
            return FAILED, None
        return OK, None

    def feasible(self, c: Candidate) -> bool:
        return self.outcome(c)[0] == OK

    def step_time_s(self, c: Candidate) -> float:
        micro = (
            self.micro_fixed_s
            + self.per_sample_s * c.per_device_batch
            + self.chunk_fixed_s * c.split
            + self.split_fixed_s * (c.split > 1)
        )
        t = c.accum * micro + self.step_fixed_s
        use = self.peaks(c)[1] / self.budget_gib
        if self.pressure and use > 0.9:
            t *= 1 + self.pressure * min(1.0, (use - 0.9) / 0.1)
        return t * dict(self.slowed).get(c.key, 1.0)

    def true_throughput(self, c: Candidate) -> float:
        return self.global_batch_size / self.step_time_s(c)

    def ranking(self) -> list[Candidate]:
        """Feasible pairs, truly fastest first."""
        return sorted((c for c in self.valid() if self.feasible(c)), key=lambda c: -self.true_throughput(c))

    def best(self) -> Candidate | None:
        r = self.ranking()
        return r[0] if r else None

    def trial(self, c: Candidate, rng: random.Random) -> TrialResult:
        status, phase = self.outcome(c)
        res = TrialResult(
            **c.numbers(self.global_batch_size, self.num_devices),
            status=status,
            oom_phase=phase,
            device="sim",
        )
        # Peaks from their own generator, so adding them left every step-time draw as it was.
        encoder, joint = self.peaks(c)
        mem_rng = random.Random(f"{self.name}/{c.key}")
        if status == OOM:  # what was allocated when the failing phase began
            res.peak_mem_gib = min(self.budget_gib, self.base_gib if phase == PHASE_ENCODER else encoder)
        else:
            res.peak_mem_gib = joint * (1.0 + self.mem_noise * mem_rng.gauss(0.0, 1.0))
        if status != OK:
            res.error = f"simulated {status}" + (f" in {phase}" if phase else "")
            return res
        offset = math.exp(rng.gauss(0.0, self.trial_noise))
        times = []
        for _ in range(self.steps):
            t = self.step_time_s(c) * offset * math.exp(rng.gauss(0.0, self.step_noise))
            if rng.random() < self.outlier_rate:
                t *= rng.uniform(1.3, 2.0)
            times.append(t)
        res.step_times_s = times
        res.throughput, res.throughput_low, res.throughput_high = throughput_summary(times, self.global_batch_size)
        return res

    def with_(self, **changes: object) -> Landscape:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]


# Named landscapes for the strategy tables (gbs 1024 on 8 devices: per-device batch 1..128).
# The comment on each says what makes it interesting; tests assert those shapes hold.
LANDSCAPES: dict[str, Landscape] = {
    # Joint fits at accum 8 (p=16); the stairs climb to p=128 where the encoder gives out.
    "typical": Landscape("typical", enc_gib=0.45, joint_gib=3.0, overhead_gib=3.0),
    # Splitting is expensive per micro-batch: the best pair has split=1.
    "split1_best": Landscape("split1_best", split_fixed_s=0.1, chunk_fixed_s=0.01),
    # Tight memory: stairs OOM in the joint phase (held encoder activations) and need a bigger split.
    "stair_joint_oom": Landscape("stair_joint_oom", budget_gib=40.0, enc_gib=0.25, overhead_gib=6.0, joint_gib=1.6),
    # The split overhead alone breaks the first stair (encoder OOM): the seed's special case.
    "special_case": Landscape("special_case", budget_gib=40.0, enc_gib=1.0, joint_gib=2.0, overhead_gib=18.0),
    # The whole accum=1 row (p=128) OOMs in the joint phase, even at split 64.
    "accum1_joint_oom": Landscape("accum1_joint_oom", enc_gib=0.52, overhead_gib=1.0, joint_gib=2.5),
    # Only accum=128 (p=1, split 1) fits.
    "one_fits": Landscape("one_fits", budget_gib=20.0, base_gib=10.0, enc_gib=2.0, joint_gib=6.0, overhead_gib=5.0),
    # The weights alone do not fit.
    "nothing_fits": Landscape("nothing_fits", base_gib=90.0),
    # Pairs within 10% of the budget run slower (allocator retries): the throughput ordering breaks.
    "pressure": Landscape("pressure", enc_gib=0.45, joint_gib=3.0, pressure=0.3),
    # Noisy, short trials with outliers and between-trial drift.
    "noisy": Landscape("noisy", step_noise=0.06, trial_noise=0.01, outlier_rate=0.1, steps=6),
}


def largest_fit_slower(land: Landscape, ratio: float = 1.4, split: int | None = None) -> Landscape:
    """The same landscape, but the feasible pairs with the largest micro-batch (per-device batch) that fits (at `split`,
    or anywhere) run `ratio` times slower than the next one down (issue 50): the feasible pair with the next smaller
    micro-batch at the same joint batch, else the biggest joint batch below (in a 1-D sweep, the next accumulation up).
    PyTorch's caching allocator retrying near the memory limit does this; the throughput ordering ("no bigger
    micro-batch is no faster") gets it wrong."""
    fits = [c for c in land.valid() if land.feasible(c)]
    tops = [c for c in fits if split is None or c.split == split]
    if not tops:
        return land
    top = max(c.per_device_batch for c in tops)
    below = [c for c in fits if c.per_device_batch < top]
    nxt = max((c.per_device_batch for c in below), default=None)
    slowed = []
    for largest in (c for c in tops if c.per_device_batch == top):
        down = [c for c in below if c.per_device_batch == nxt and c.joint_batch <= largest.joint_batch]
        if down:
            next_down = max(down, key=lambda c: c.joint_batch)
            slowed.append((largest.key, ratio * land.step_time_s(next_down) / land.step_time_s(largest)))
    return land.with_(name=f"{land.name}_largest_slow" + (f"_at_split{split}" if split else ""), slowed=tuple(slowed))


def random_landscape(rng: random.Random) -> Landscape:
    """A landscape with randomised memory limits, speed curve and noise, for calibration runs."""
    per_device_total = rng.choice([32, 64, 128, 256])
    devices = rng.choice([1, 2, 4, 8])
    budget, base = 80.0, rng.uniform(5.0, 30.0)
    free = budget - base
    overhead = free * rng.uniform(0.0, 0.15)
    # Place the encoder limit anywhere from a small fraction of the space to beyond it.
    enc_limit = per_device_total * math.exp(rng.uniform(math.log(0.05), math.log(3.0)))
    enc = (free - overhead) / enc_limit
    joint = enc * math.exp(rng.uniform(math.log(2.0), math.log(40.0)))
    per_sample = 0.001
    return Landscape(
        name="random",
        global_batch_size=per_device_total * devices,
        num_devices=devices,
        budget_gib=budget,
        base_gib=base,
        enc_gib=enc,
        overhead_gib=overhead,
        joint_gib=joint,
        step_fixed_s=per_sample * rng.uniform(0, 64),
        micro_fixed_s=per_sample * math.exp(rng.uniform(math.log(2), math.log(256))),
        per_sample_s=per_sample,
        chunk_fixed_s=per_sample * math.exp(rng.uniform(math.log(0.25), math.log(32))),
        split_fixed_s=per_sample * rng.choice([0.0, rng.uniform(0, 32)]),
        pressure=rng.choice([0.0, 0.0, rng.uniform(0.0, 0.2)]),
        step_noise=math.exp(rng.uniform(math.log(0.005), math.log(0.08))),
        trial_noise=math.exp(rng.uniform(math.log(0.002), math.log(0.02))),
        outlier_rate=rng.choice([0.0, 0.0, 0.05]),
        steps=rng.randint(5, 20),
    )


# --- Out of sample: a family the confidence priors were NOT fitted on ---------------------------
# The priors in core/confidence.py were fitted on random_landscape above (affine step time, two
# deterministic memory phases, lognormal noise). This family differs in every part that matters:
# step time from a compute roofline with tile padding and per-chunk launches, memory with an
# allocator reserve, padding and a ragged cliff, and heavy-tailed step noise with periodic stalls.


def _padded(batch: int, tile: int) -> int:
    return -(-batch // tile) * tile


@dataclass(frozen=True)
class RooflineLandscape(Landscape):
    """Compute-bound model: a micro-batch runs at roof * utilisation(batch), utilisation = b / (b + half)."""

    name: str = "roofline"
    enc_roof: float = 4000.0  # encoder samples/s per device at full utilisation
    enc_half: float = 16.0  # per-device batch at half utilisation
    joint_roof: float = 6000.0  # joint samples/s at full utilisation
    joint_half: float = 4.0
    tile: int = 8  # the joint pads its batch to a multiple of this (tensor-core tiles)
    launch_s: float = 0.002  # per joint chunk (kernel launches, loss, bookkeeping)
    allreduce_s: float = 0.01  # per optimizer step and log2(devices)
    act_gib: float = 0.4  # encoder activations per sample of the per-device batch
    joint_tile_gib: float = 2.0  # joint activations per sample of the padded joint batch
    reserve: float = 0.08  # share of the budget the allocator keeps (fragmentation)
    cliff: float = 0.04  # pairs within this share below the limit OOM when their hash says so
    tail_dof: int = 3  # Student-t degrees of freedom of the per-step noise
    stall_every: int = 0  # every n-th timed step stalls (data loader, checkpoint); 0: never
    stall_factor: float = 1.5

    def peaks(self, c: Candidate) -> tuple[float, float]:
        encoder = self.base_gib + self.act_gib * c.per_device_batch
        return encoder, encoder + self.joint_tile_gib * _padded(c.joint_batch, self.tile)

    def outcome(self, c: Candidate) -> tuple[str, str | None]:
        limit = self.budget_gib * (1.0 - self.reserve)
        encoder, joint = self.peaks(c)
        if encoder > limit:
            return OOM, PHASE_ENCODER
        # Near the limit fragmentation decides, pair by pair: a ragged edge, not a clean line.
        ragged = random.Random(f"cliff/{self.name}/{c.key}").random() < 0.5
        if joint > limit or (joint > limit * (1.0 - self.cliff) and ragged):
            return OOM, PHASE_JOINT
        if c.key in self.fails:
            return FAILED, None
        return OK, None

    def step_time_s(self, c: Candidate) -> float:
        p, j = c.per_device_batch, _padded(c.joint_batch, self.tile)
        encoder = p / (self.enc_roof * p / (p + self.enc_half))
        joint = j / (self.joint_roof * j / (j + self.joint_half)) + self.launch_s
        return c.accum * (encoder + c.split * joint) + self.allreduce_s * max(1.0, math.log2(self.num_devices))

    def trial(self, c: Candidate, rng: random.Random) -> TrialResult:
        status, phase = self.outcome(c)
        encoder, joint = self.peaks(c)
        res = TrialResult(**c.numbers(self.global_batch_size, self.num_devices), status=status, oom_phase=phase, device="sim")
        res.peak_mem_gib = self.base_gib if phase == PHASE_ENCODER else encoder if status == OOM else joint
        if status != OK:
            res.error = f"simulated {status}" + (f" in {phase}" if phase else "")
            return res
        offset = math.exp(rng.gauss(0.0, self.trial_noise))
        scale = self.step_noise / math.sqrt(self.tail_dof / (self.tail_dof - 2))  # unit variance t, then step_noise
        times = []
        for i in range(self.steps):
            t_draw = rng.gauss(0.0, 1.0) / math.sqrt(sum(rng.gauss(0.0, 1.0) ** 2 for _ in range(self.tail_dof)) / self.tail_dof)
            t = self.step_time_s(c) * offset * max(0.5, 1.0 + scale * t_draw)
            if self.stall_every and (i + 1) % self.stall_every == 0:
                t *= self.stall_factor
            times.append(t)
        res.step_times_s = times
        res.throughput, res.throughput_low, res.throughput_high = throughput_summary(times, self.global_batch_size)
        return res


def random_roofline_landscape(rng: random.Random) -> RooflineLandscape:
    """A roofline landscape with randomised roofs, memory and noise: the out-of-sample calibration family."""
    per_device_total = rng.choice([16, 32, 64, 128, 256])
    devices = rng.choice([1, 2, 4, 8, 16])
    budget, base = rng.choice([24.0, 40.0, 80.0]), rng.uniform(2.0, 12.0)
    free = budget * 0.92 - base
    act = free / (per_device_total * math.exp(rng.uniform(math.log(0.1), math.log(2.5))))
    return RooflineLandscape(
        name="roofline",
        global_batch_size=per_device_total * devices,
        num_devices=devices,
        budget_gib=budget,
        base_gib=base,
        act_gib=act,
        joint_tile_gib=act * math.exp(rng.uniform(math.log(0.2), math.log(6.0))),
        enc_roof=math.exp(rng.uniform(math.log(500), math.log(20000))),
        enc_half=math.exp(rng.uniform(math.log(1), math.log(64))),
        joint_roof=math.exp(rng.uniform(math.log(500), math.log(20000))),
        joint_half=math.exp(rng.uniform(math.log(0.5), math.log(32))),
        tile=rng.choice([1, 4, 8, 16]),
        launch_s=math.exp(rng.uniform(math.log(1e-4), math.log(1e-2))),
        allreduce_s=rng.uniform(0.0, 0.05),
        reserve=rng.uniform(0.0, 0.15),
        cliff=rng.choice([0.0, 0.03, 0.08]),
        step_noise=math.exp(rng.uniform(math.log(0.005), math.log(0.08))),
        trial_noise=math.exp(rng.uniform(math.log(0.002), math.log(0.03))),
        tail_dof=rng.choice([3, 4, 6, 30]),
        stall_every=rng.choice([0, 0, 4, 7]),
        steps=rng.randint(5, 20),
    )


FAMILIES: dict[str, Callable[[random.Random], Landscape]] = {
    "in-sample": random_landscape,  # what the confidence priors were fitted on
    "out-of-sample": random_roofline_landscape,
}


class ContractError(AssertionError):
    """The strategy broke the propose() contract."""


OnResult = Callable[[Mapping[str, TrialResult], frozenset], None]


def run_sweep(
    strategy: Strategy,
    landscape: Landscape,
    max_in_flight: int = 1,
    seed: int = 0,
    on_result: OnResult | None = None,
) -> dict[str, TrialResult]:
    """Drive `strategy` like the asynchronous orchestrator, against a simulated cluster.

    Trials take simulated time (startup jitter plus their steps), so with several
    in flight results land in any order. Checks the propose() contract on every
    call. `on_result(finished, in_flight)` runs after every landed result.
    """
    rng = random.Random(seed)
    valid = {c.key for c in landscape.valid()}
    finished: dict[str, TrialResult] = {}
    running: list[tuple[float, int, str, TrialResult]] = []
    now, launched, done = 0.0, 0, False
    while True:
        in_flight = frozenset(k for _, _, k, _ in running)
        if not done:
            prop = strategy.propose(dict(finished), in_flight)
            keys = [c.key for c in prop.candidates]
            bad = [k for k in keys if k not in valid or k in finished or k in in_flight]
            if bad or len(set(keys)) != len(keys):
                raise ContractError(f"{strategy.name} proposed {keys} (finished/in flight/invalid: {bad})")
            if prop.done and keys:
                raise ContractError(f"{strategy.name} is done but still proposes {keys}")
            done = prop.done
            for c in prop.candidates[: max_in_flight - len(running)]:
                result = landscape.trial(c, rng)
                steps = landscape.steps + 2 if result.status == OK else 1
                duration = rng.uniform(5.0, 30.0) + steps * landscape.step_time_s(c) * rng.uniform(0.5, 1.5)
                launched += 1
                heapq.heappush(running, (now + duration, launched, c.key, result))
        if not running:
            if done:
                return finished
            raise ContractError(f"{strategy.name} waits for a result with nothing in flight")
        now, _, key, result = heapq.heappop(running)
        finished[key] = result
        if on_result is not None:
            on_result(finished, frozenset(k for _, _, k, _ in running))


# --- Calibration of the confidence score (bench/bench_confidence.py, tests/test_confidence.py) ----

BANDS = [(0, 20), (20, 40), (40, 60), (60, 80), (80, 90), (90, 100)]
Sample = tuple[int, bool, bool, str]  # (stated confidence, near hit, strict hit, sweep id)
Band = tuple[str, int, float, float]  # (band, samples, mean stated %, observed %)


def grid_reference(land: Landscape, seed: int) -> tuple[str | None, dict[str, float], float]:
    """A full grid run of the landscape: (its best pair, every ok pair's median, the low end of the best's interval)."""
    rng = random.Random(f"grid/{seed}")
    medians, low = {}, {}
    for c in land.valid():
        res = land.trial(c, rng)
        if res.status == OK and res.throughput:
            medians[c.key], low[c.key] = res.throughput, res.throughput_low or res.throughput
    if not medians:
        return None, {}, 0.0
    best = max(medians, key=medians.__getitem__)
    return best, medians, low[best]


def simulate_calibration(
    seed: int, strategy: str, family: str, trial_noise: float | None = None, run_to_run: float | None = None, capped: bool = False
) -> tuple[list[Sample], int]:
    """One simulated sweep: (a sample after every landed result that has a leader, trials run).

    near: the leader is the grid's best or inside its interval (its grid median at or above the low end
    of the grid best's 95% interval); strict: the leader is the truly fastest feasible pair.
    trial_noise: replaces the landscape's own run-to-run noise; run_to_run: what the score is told
    of it (None: the score's default floor). capped: the score as a sweep states it, held below 80 while the leader's
    neighbours or a thin figure are not measured (core/confidence.confidence_score's caps: a rule, conservative where
    the assumption held); by default the model's probability, the part that claims to be calibrated.
    """
    from sweep.core.confidence import TRIAL_FLOOR, confidence_score, leader_key
    from sweep.core.strategies import make_strategy

    rng = random.Random(seed)
    land = FAMILIES[family](rng)
    if trial_noise is not None:
        land = land.with_(trial_noise=trial_noise)
    told = TRIAL_FLOOR if run_to_run is None else run_to_run
    cands = land.candidates()
    best = land.best()
    grid_best, grid_medians, grid_low = grid_reference(land, seed)
    samples: list[Sample] = []

    def on_result(finished: Mapping[str, TrialResult], _in_flight: frozenset) -> None:
        score = confidence_score(cands, finished, run_to_run=told, capped=capped)
        if score is None:
            return
        lead = leader_key(finished)
        near = lead == grid_best or grid_medians.get(lead or "", 0.0) >= grid_low > 0
        samples.append((score, near, best is not None and lead == best.key, f"{family}:{strategy}:{seed}"))

    res = run_sweep(make_strategy(strategy, cands), land, rng.choice([1, 2, 3]), seed, on_result)
    return samples, len(res)


def calibration_table(samples: list[Sample], outcome: str = "strict") -> list[Band]:
    """(band, samples, mean stated %, observed % of the outcome: "near" or "strict") per band; nan when empty."""
    index = 1 if outcome == "near" else 2
    rows = []
    for lo, hi in BANDS:
        got = [x for x in samples if lo <= x[0] < hi]
        n = len(got)
        stated = sum(x[0] for x in got) / n if n else float("nan")
        observed = 100.0 * sum(x[index] for x in got) / n if n else float("nan")
        rows.append((f"{lo}-{hi}", n, stated, observed))
    return rows
