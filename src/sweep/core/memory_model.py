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

No confident wrong predictions (issue 31): a fit predicts anything only when it has
more ok peaks than parameters it estimates, and when its own error, checked on the
pairs already run, allows it: each ok peak is predicted by the fit without it
(leave-one-out); if any cannot be, nothing is predicted, and a prediction's standard
error is at least the root-mean-square of those errors. On an H100 at 24 GiB, four ok
peaks fitted four parameters exactly (the OOMs adding the degrees of freedom), and the
model put accum=1 split=64 at 31.5 GiB with P(OOM) 1.00; it ran at 13.7 GiB.
tests/test_memory_model_h100.py replays those sweeps.

The numerics are numpy's (SVD least squares) and scipy's (Student t, normal).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from sweep.core.schema import OK, OOM, TrialResult
from sweep.core.stats import normal_pdf, special

OOM_PROBABILITY = 0.95  # p_exceeds at or above this: the pair is not launched
MIN_OK_POINTS = 3  # fewer ok peaks than this: no predictions at all (and more than the fit's rank)
MIN_DOF = 2  # residual degrees of freedom needed for an error estimate
# A fit through near-exact points would claim near-certainty: peaks drift by the allocator's
# rounding and fragmentation, so every prediction keeps at least this relative error.
RELATIVE_SE_FLOOR = 0.02
EM_ROUNDS = 20
FEATURES = ("base", "per_device_batch", "joint_batch", "split_overhead")
# Singular values below this share of the largest (column-scaled design) are directions the data
# do not determine: left out, as a pseudo-inverse does.
RANK_TOLERANCE = 3e-5


class Pair(Protocol):
    """Anything with batch sizes: a Candidate or a TrialResult."""

    @property
    def per_device_batch(self) -> int:  # read-only: Candidate and TrialResult are frozen or records
        raise NotImplementedError

    @property
    def joint_batch(self) -> int:
        raise NotImplementedError

    @property
    def split(self) -> int:
        raise NotImplementedError


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
    # Root-mean-square error of predicting each ok peak from the fit without it (GiB); None: not
    # checked (the fit was itself one of those leave-one-out fits).
    loo_rmse_gib: float | None = None


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


def fit_memory(obs: Sequence[MemoryObservation], check: bool = True) -> MemoryFit | None:
    """The least-squares fit with censored OOMs, or None when the data cannot vouch for one: too few
    ok peaks, no more ok peaks than the ok design's rank, fewer than MIN_DOF residual degrees of
    freedom, or an ok peak that the fit without it cannot predict. check=False: the leave-one-out
    fits, of which only the coefficients are used (no gates but MIN_OK_POINTS, no error check)."""
    ok = [o for o in obs if not o.censored]
    cens = [o for o in obs if o.censored]
    if len(ok) < MIN_OK_POINTS:
        return None
    x_ok = np.array([features(o) for o in ok])
    y_ok = np.array([o.peak_gib for o in ok])
    # Start from the ok points alone, then impute each censored point given the fit.
    fitted = _least_squares(x_ok, y_ok)
    if fitted is None or (check and fitted[2] >= len(ok)):  # as many parameters as ok peaks: an exact fit
        return None
    beta, pinv, rank, basis, scale = fitted
    sigma = _residual_se(x_ok, y_ok, beta, len(ok) - rank)
    rows, ys = x_ok, y_ok
    if cens:
        rows = np.vstack([x_ok, [features(o) for o in cens]])
        bounds = np.array([o.peak_gib for o in cens])
        for _ in range(EM_ROUNDS):
            ys = np.concatenate([y_ok, _censored_mean(rows[len(ok):] @ beta, sigma, bounds)])
            refit = _least_squares(rows, ys)
            if refit is None:
                break
            new_beta, pinv, rank, basis, scale = refit
            sigma = max(_residual_se(rows, ys, new_beta, len(rows) - rank), 1e-9)
            moved = float(np.max(np.abs(new_beta - beta)))
            beta = new_beta
            if moved < 1e-9:
                break
        ys = np.concatenate([y_ok, _censored_mean(rows[len(ok):] @ beta, sigma, bounds)])
    dof = len(rows) - rank
    if check and dof < MIN_DOF:
        return None
    fit = MemoryFit(
        tuple(float(b) for b in beta), tuple(tuple(float(v) for v in r) for r in pinv), tuple(tuple(float(v) for v in u) for u in basis),
        tuple(float(c) for c in scale), _residual_se(rows, ys, beta, dof), int(dof), len(ok), len(cens),
    )
    if not check:
        return fit
    errors = []
    for i, o in enumerate(ok):
        # Only the point estimate of the fit without this peak is needed: it may have no error of its own.
        without = fit_memory([p for j, p in enumerate(ok) if j != i] + cens, check=False)
        x = np.array(features(o), dtype=float)
        if without is None or not _estimable(without, x):  # the others cannot pin this pair down
            return None
        errors.append(o.peak_gib - float(np.dot(without.coefficients, x)))
    return MemoryFit(**{**fit.__dict__, "loo_rmse_gib": float(np.sqrt(np.mean(np.square(errors))))})


def fit_from_results(results: Iterable[TrialResult], capacity_gib: float) -> MemoryFit | None:
    return fit_memory(observations(results, capacity_gib))


def predict_peak(fit: MemoryFit | None, pair: Pair) -> PeakPrediction | None:
    """Predicted peak with its uncertainty (its standard error at least the fit's leave-one-out error);
    None when the data cannot pin this pair down."""
    if fit is None:
        return None
    x = np.array(features(pair))
    if not _estimable(fit, x):
        return None
    peak = float(np.dot(fit.coefficients, x))
    leverage = max(0.0, float(x @ np.array(fit.covariance_unscaled) @ x))
    se = max(fit.residual_se_gib * np.sqrt(1.0 + leverage), RELATIVE_SE_FLOOR * abs(peak), fit.loo_rmse_gib or 0.0, 1e-12)
    se = float(se)
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


# --- numerics: scipy's Student t, numpy's SVD ---------------------------------------------------
# scipy.special's, the functions scipy.stats' t and norm call, imported on first use (core/stats.py's special()):
# this module is imported by trial processes and the command line, which should not pay scipy.stats' 0.5 s import.


def student_t_cdf(t: float, dof: int) -> float:
    return float(special().stdtr(dof, t))  # scipy.stats.t.cdf(t, dof)


def student_t_quantile(p: float, dof: int) -> float:
    return float(special().stdtrit(dof, p))  # scipy.stats.t.ppf(p, dof)


def _least_squares(xs: np.ndarray, ys: np.ndarray) -> Any:
    """(coefficients, generalised inverse of X'X, rank, row-space basis, column scale), or None.

    Columns are scaled to unit maximum for conditioning; directions the data do not determine
    (singular values of the scaled design near 0) are left out, as a pseudo-inverse does.
    """
    xs, ys = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
    scale = np.maximum(np.abs(xs).max(axis=0), 1e-12)
    z = xs / scale
    _, sv, vt = np.linalg.svd(z, full_matrices=False)
    if sv.size == 0 or sv[0] <= 0:
        return None
    keep = sv > RANK_TOLERANCE * sv[0]
    basis, kept = vt[keep], sv[keep]
    pinv_z = basis.T @ np.diag(1.0 / kept**2) @ basis  # generalised inverse of Z'Z
    beta = (pinv_z @ z.T @ ys) / scale
    pinv = pinv_z / np.outer(scale, scale)
    return beta, pinv, int(keep.sum()), basis, scale


def _estimable(fit: MemoryFit, x: np.ndarray) -> bool:
    """Is x in the row space of the fitted design? Only then is x'beta determined by the data."""
    z = np.asarray(x, dtype=float) / np.array(fit.column_scale)
    basis = np.array(fit.row_space).reshape(-1, z.size)
    residual = z - basis.T @ (basis @ z)
    return float(np.linalg.norm(residual)) <= 1e-6 * (float(np.linalg.norm(z)) or 1.0)


def _residual_se(xs: np.ndarray, ys: np.ndarray, beta: np.ndarray, dof: int) -> float:
    if dof <= 0:
        return 0.0
    return float(np.sqrt(np.sum((np.asarray(ys) - np.asarray(xs) @ np.asarray(beta)) ** 2) / dof))


def _censored_mean(mean: np.ndarray, sigma: float, bound: np.ndarray) -> np.ndarray:
    """E[peak | peak > bound] for peak ~ Normal(mean, sigma): an OOM's expected true peak."""
    mean, bound = np.asarray(mean, dtype=float), np.asarray(bound, dtype=float)
    if sigma <= 0:
        return np.asarray(np.maximum(mean, bound), dtype=float)
    alpha = (bound - mean) / sigma
    # The inverse Mills ratio pdf/sf; in the far tail, its asymptote alpha + 1/alpha (so the
    # expectation is bound + sigma/alpha), where pdf and sf both underflow.
    far = alpha > 30.0
    safe = np.where(far, 0.0, alpha)
    mills = np.where(far, alpha + 1.0 / np.where(far, alpha, 1.0), normal_pdf(safe) / special().ndtr(-safe))  # norm.pdf / norm.sf
    return np.asarray(mean + sigma * mills, dtype=float)
