"""A linear memory model: predict an untried pair's peak memory from the peaks measured so far (pure).

    peak_gib ~ base + a * per_device_batch + b * joint_batch + c * (split > 1)

per_device_batch carries the encoder and prediction activations (held through the
backward pass), joint_batch the joint network and loss tensors, and the last term
the buffers batch splitting adds (none at split=1; the strategies' monotonicity
rules assume no more than that, so it is an indicator, not a per-chunk cost).

Fitted by least squares on the ok trials' peaks of what meets the capacity (`counted_peak`:
the reserved peak where one was measured). An OOM trial is a censored point: its
peak was at least max(capacity, what was measured before it failed). Censored
points enter by expectation-maximisation (Tobit style): each is imputed as the
fit's expected peak given that it exceeds its bound, and the fit is redone.

A prediction carries its 95% prediction interval (Student t on the residual
standard error, widened by the point's leverage), so extrapolating far beyond
the measured pairs is uncertain and does not skip anything. A pair the measured
data cannot pin down (e.g. split > 1 before any split > 1 trial) has no
prediction. `p_exceeds` >= OOM_PROBABILITY counts as "predicted OOM".
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Protocol

from sweep.core.schema import OK, OOM, TrialResult

OOM_PROBABILITY = 0.95  # p_exceeds at or above this: the pair is not launched
MIN_OK_POINTS = 3  # fewer ok peaks than this: no predictions at all
MIN_DOF = 2  # residual degrees of freedom needed for an error estimate
# A fit through near-exact points would claim near-certainty: peaks drift by the allocator's
# rounding and fragmentation, so every prediction keeps at least this relative error.
RELATIVE_SE_FLOOR = 0.02
EM_ROUNDS = 20
FEATURES = ("base", "per_device_batch", "joint_batch", "split_overhead")
_STD = NormalDist()


class Pair(Protocol):
    """Anything with batch sizes: a Candidate or a TrialResult."""

    per_device_batch: int
    joint_batch: int
    split: int


@dataclass(frozen=True)
class MemoryObservation:
    per_device_batch: int
    joint_batch: int
    split: int
    peak_gib: float  # measured peak (ok), or the lower bound the true peak exceeded (OOM)
    censored: bool  # True for an OOM: the true peak is above peak_gib


@dataclass(frozen=True)
class MemoryFit:
    coefficients: tuple[float, ...]  # GiB, in FEATURES order
    covariance_unscaled: tuple[tuple[float, ...], ...]  # a generalised inverse of X'X
    row_space: tuple[tuple[float, ...], ...]  # orthonormal basis of the design's rows, in column-scaled units
    column_scale: tuple[float, ...]  # what each feature was divided by for that basis
    residual_se_gib: float  # residual standard error
    dof: int  # residual degrees of freedom
    n_ok: int
    n_oom: int


@dataclass(frozen=True)
class PeakPrediction:
    peak_gib: float  # predicted peak
    se_gib: float  # prediction standard error (residual and coefficient uncertainty)
    dof: int  # of the Student t it follows
    low_gib: float  # 95% prediction interval
    high_gib: float

    def p_exceeds(self, capacity_gib: float) -> float:
        """P(the true peak is above capacity_gib)."""
        return 1.0 - student_t_cdf((capacity_gib - self.peak_gib) / self.se_gib, self.dof)


def features(pair: Pair) -> tuple[float, ...]:
    return (1.0, float(pair.per_device_batch), float(pair.joint_batch), 1.0 if pair.split > 1 else 0.0)


def counted_peak(r: TrialResult) -> float | None:
    """The peak that meets the capacity: the reserved peak where the trial measured one (CUDA's
    allocator reserve, the CPU's address space: what runs out), else the used peak."""
    return counted_peak_of(r.peak_mem_gib, r.peak_reserved_gib)


def counted_peak_of(used_gib: float | None, reserved_gib: float | None) -> float | None:
    """counted_peak from the two figures alone, for records that are not a TrialResult (table rows)."""
    return reserved_gib if reserved_gib is not None else used_gib


def observations(results: Iterable[TrialResult], capacity_gib: float) -> list[MemoryObservation]:
    """Ok trials with a measured peak, and OOM trials as lower bounds at (at least) the capacity."""
    out = []
    for r in results:
        peak = counted_peak(r)
        if r.status == OK and peak is not None and peak > 0:
            out.append(MemoryObservation(r.per_device_batch, r.joint_batch, r.split, peak, False))
        elif r.status == OOM:
            bound = max(capacity_gib, peak or 0.0)
            out.append(MemoryObservation(r.per_device_batch, r.joint_batch, r.split, bound, True))
    return out


def fit_memory(obs: Sequence[MemoryObservation]) -> MemoryFit | None:
    """The least-squares fit with censored OOMs, or None when there are too few ok peaks."""
    ok = [o for o in obs if not o.censored]
    cens = [o for o in obs if o.censored]
    if len(ok) < MIN_OK_POINTS:
        return None
    xs = [features(o) for o in ok] + [features(o) for o in cens]
    ys = [o.peak_gib for o in ok] + [o.peak_gib for o in cens]
    # Start from the ok points alone, then impute each censored point given the fit.
    fitted = _least_squares([features(o) for o in ok], [o.peak_gib for o in ok])
    if fitted is None:
        return None
    beta, pinv, rank, basis, scale = fitted
    sigma = _residual_se([features(o) for o in ok], [o.peak_gib for o in ok], beta, len(ok) - rank)
    if cens:
        for _ in range(EM_ROUNDS):
            imputed = ys[: len(ok)] + [_censored_mean(_dot(beta, features(o)), sigma, o.peak_gib) for o in cens]
            refit = _least_squares(xs, imputed)
            if refit is None:
                break
            new_beta, pinv, rank, basis, scale = refit
            sigma = max(_residual_se(xs, imputed, new_beta, len(xs) - rank), 1e-9)
            moved = max(abs(a - b) for a, b in zip(new_beta, beta))
            beta = new_beta
            if moved < 1e-9:
                break
    n = len(xs) if cens else len(ok)
    dof = n - rank
    if dof < MIN_DOF:
        return None
    rows = xs if cens else [features(o) for o in ok]
    ys_fit = ([*ys[: len(ok)], *(_censored_mean(_dot(beta, features(o)), sigma, o.peak_gib) for o in cens)]
              if cens else ys[: len(ok)])
    se = _residual_se(rows, ys_fit, beta, dof)
    return MemoryFit(
        tuple(beta), tuple(tuple(r) for r in pinv), tuple(basis), tuple(scale), se, dof, len(ok), len(cens)
    )


def fit_from_results(results: Iterable[TrialResult], capacity_gib: float) -> MemoryFit | None:
    return fit_memory(observations(results, capacity_gib))


def predict_peak(fit: MemoryFit | None, pair: Pair) -> PeakPrediction | None:
    """Predicted peak with its uncertainty; None when the data cannot pin this pair down."""
    if fit is None:
        return None
    x = features(pair)
    if not _estimable(fit, x):
        return None
    peak = _dot(fit.coefficients, x)
    leverage = max(0.0, _dot(x, _matvec(fit.covariance_unscaled, x)))
    se = max(fit.residual_se_gib * math.sqrt(1.0 + leverage), RELATIVE_SE_FLOOR * abs(peak), 1e-12)
    t = student_t_quantile(0.975, fit.dof)
    return PeakPrediction(peak, se, fit.dof, peak - t * se, peak + t * se)


def p_exceeds(fit: MemoryFit | None, pair: Pair, capacity_gib: float) -> float | None:
    """P(pair's peak > capacity_gib); None when unknown (too few points, or not estimable)."""
    pred = predict_peak(fit, pair)
    return None if pred is None else pred.p_exceeds(capacity_gib)


def predicted_oom(fit: MemoryFit | None, pair: Pair, capacity_gib: float) -> PeakPrediction | None:
    """The prediction when the pair exceeds capacity with probability >= OOM_PROBABILITY, else None."""
    pred = predict_peak(fit, pair)
    if pred is None or pred.p_exceeds(capacity_gib) < OOM_PROBABILITY:
        return None
    return pred


def predicted_oom_reason(pred: PeakPrediction, capacity_gib: float) -> str:
    """The table's reason for a pair skipped on a prediction."""
    return (
        f"predicted OOM: {pred.peak_gib:.3g} GiB > {capacity_gib:.3g} GiB "
        f"(95% {pred.low_gib:.3g}-{pred.high_gib:.3g}, P(OOM) {pred.p_exceeds(capacity_gib):.2f})"
    )


# --- Student t (exact for integer degrees of freedom; Abramowitz & Stegun 26.7.3-4) ---------


def student_t_cdf(t: float, dof: int) -> float:
    if dof > 200:
        return _STD.cdf(t)
    theta = math.atan(t / math.sqrt(dof))
    c2 = math.cos(theta) ** 2
    s = math.sin(theta)
    if dof % 2:
        term, total = 1.0, 1.0 if dof > 1 else 0.0
        for k in range(1, (dof - 1) // 2):  # 1 + 2/3 c2 + 2*4/(3*5) c2^2 + ...
            term *= c2 * (2 * k) / (2 * k + 1)
            total += term
        a = (2 / math.pi) * (theta + (s * math.cos(theta) * total if dof > 1 else 0.0))
    else:
        term, total = 1.0, 1.0
        for k in range(1, dof // 2):  # 1 + 1/2 c2 + 1*3/(2*4) c2^2 + ...
            term *= c2 * (2 * k - 1) / (2 * k)
            total += term
        a = s * total
    return 0.5 + 0.5 * a  # a = P(|T| < |t|) * sign(t)


def student_t_quantile(p: float, dof: int) -> float:
    if dof > 200:  # where student_t_cdf is the normal's
        return _STD.inv_cdf(p)
    lo, hi = -1e3, 1e3
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if student_t_cdf(mid, dof) < p:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


# --- small dense linear algebra (4 unknowns; no numpy in the pure core) -------------------------


def _dot(a: Sequence[float], b: Sequence[float]) -> float:
    return sum(x * y for x, y in zip(a, b))


def _matvec(m: Sequence[Sequence[float]], v: Sequence[float]) -> list[float]:
    return [_dot(row, v) for row in m]


def _jacobi_eigen(a: list[list[float]]) -> tuple[list[float], list[list[float]]]:
    """Eigenvalues and eigenvectors (columns) of a small symmetric matrix."""
    n = len(a)
    a = [row[:] for row in a]
    v = [[float(i == j) for j in range(n)] for i in range(n)]
    for _ in range(100):
        off = sum(a[i][j] ** 2 for i in range(n) for j in range(n) if i != j)
        if off < 1e-30 * max(1e-300, sum(a[i][i] ** 2 for i in range(n))):
            break
        for p in range(n):
            for q in range(p + 1, n):
                if abs(a[p][q]) < 1e-300:
                    continue
                theta = (a[q][q] - a[p][p]) / (2 * a[p][q])
                t = math.copysign(1.0, theta) / (abs(theta) + math.sqrt(theta * theta + 1))
                c = 1 / math.sqrt(t * t + 1)
                s = t * c
                for k in range(n):
                    akp, akq = a[k][p], a[k][q]
                    a[k][p], a[k][q] = c * akp - s * akq, s * akp + c * akq
                for k in range(n):
                    apk, aqk = a[p][k], a[q][k]
                    a[p][k], a[q][k] = c * apk - s * aqk, s * apk + c * aqk
                for k in range(n):
                    vkp, vkq = v[k][p], v[k][q]
                    v[k][p], v[k][q] = c * vkp - s * vkq, s * vkp + c * vkq
    return [a[i][i] for i in range(n)], v


def _least_squares(xs: list[tuple[float, ...]], ys: list[float]):
    """(coefficients, generalised inverse of X'X, rank, row-space basis, column scale), or None.

    Columns are scaled to unit maximum for conditioning; directions the data do not
    determine (eigenvalues of the scaled X'X near 0) are left out, as a pseudo-inverse does.
    """
    n = len(xs[0])
    scale = [max(1e-12, max(abs(x[j]) for x in xs)) for j in range(n)]
    zs = [[x[j] / scale[j] for j in range(n)] for x in xs]
    xtx = [[sum(z[i] * z[j] for z in zs) for j in range(n)] for i in range(n)]
    xty = [sum(z[i] * y for z, y in zip(zs, ys)) for i in range(n)]
    vals, vecs = _jacobi_eigen(xtx)
    top = max(vals)
    if top <= 0:
        return None
    keep = [k for k in range(n) if vals[k] > 1e-9 * top]
    pinv_z = [[sum(vecs[i][k] * vecs[j][k] / vals[k] for k in keep) for j in range(n)] for i in range(n)]
    beta_z = _matvec(pinv_z, xty)
    beta = [beta_z[j] / scale[j] for j in range(n)]
    pinv = [[pinv_z[i][j] / (scale[i] * scale[j]) for j in range(n)] for i in range(n)]
    basis = [tuple(vecs[i][k] for i in range(n)) for k in keep]
    return beta, pinv, len(keep), basis, scale


def _estimable(fit: MemoryFit, x: Sequence[float]) -> bool:
    """Is x in the row space of the fitted design? Only then is x'beta determined by the data."""
    z = [a / b for a, b in zip(x, fit.column_scale)]
    proj = [0.0] * len(z)
    for u in fit.row_space:
        w = _dot(u, z)
        proj = [p + w * ui for p, ui in zip(proj, u)]
    norm = math.sqrt(_dot(z, z)) or 1.0
    return math.sqrt(sum((a - b) ** 2 for a, b in zip(proj, z))) <= 1e-6 * norm


def _residual_se(xs: Sequence[Sequence[float]], ys: Sequence[float], beta: Sequence[float], dof: int) -> float:
    if dof <= 0:
        return 0.0
    return math.sqrt(sum((y - _dot(beta, x)) ** 2 for x, y in zip(xs, ys)) / dof)


def _censored_mean(mean: float, sigma: float, bound: float) -> float:
    """E[peak | peak > bound] for peak ~ Normal(mean, sigma): an OOM's expected true peak."""
    if sigma <= 0:
        return max(mean, bound)
    alpha = (bound - mean) / sigma
    tail = 1.0 - _STD.cdf(alpha)
    if tail < 1e-12:
        return bound + sigma / max(alpha, 1e-6)  # Mills ratio asymptote
    return mean + sigma * _STD.pdf(alpha) / tail
