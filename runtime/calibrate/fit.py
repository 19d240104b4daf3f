"""Fitting measured times to the calibrated model's linear terms: non-negative least squares
(``nnls``, Lawson and Hanson's active-set method, written here because the runtime install has
numpy but not scipy) and the fit's quality (``FitQuality``).

Every coefficient of a device profile is a cost, so a fit never returns a negative one: an
ordinary least-squares fit of noisy times gives a slightly negative intercept or per-byte
term as often as not, which the profile's bounds would refuse and the planner could not use.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from planner_service.plan.types import (
    MAX_FIXED_MS,
    MAX_PROFILE_RELATIVE_ERROR,
    FitQuality,
)

Matrix = npt.NDArray[np.float64]
# Below this share of the largest singular value a column is taken as a combination of the
# others: the measurements cannot tell its coefficient from theirs.
RANK_TOLERANCE = 1e-9
# Times below this weigh as this in a relative fit (a clock's resolution, not a cost).
MIN_WEIGHTED_MS = 1e-3


class DegenerateFitError(ValueError):
    """The measurements cannot determine the coefficients (too few, or terms that never
    vary independently); the message names the terms and what to measure."""


class LinearFit(NamedTuple):
    coefficients: tuple[float, ...]  # in the units of ``times`` per unit of each term
    quality: FitQuality


def nnls(a: Matrix, b: Matrix, max_iterations: int | None = None) -> Matrix:
    """``x >= 0`` minimising ``|a x - b|``: Lawson and Hanson's active-set method. Columns
    move from the zero set to the free set while the gradient says that would help, and the
    free set's least-squares solution is pulled back into the feasible region whenever it
    leaves it."""
    rows, cols = a.shape
    x = np.zeros(cols)
    free = np.zeros(cols, dtype=bool)
    limit = max_iterations if max_iterations is not None else 3 * cols + 30
    tolerance = 10 * np.finfo(float).eps * max(rows, cols) * max(1.0, float(np.abs(a).max()))
    for _ in range(limit):
        gradient = a.T @ (b - a @ x)
        candidates = np.where(~free & (gradient > tolerance))[0]
        if candidates.size == 0:
            break
        free[candidates[np.argmax(gradient[candidates])]] = True
        x = _feasible_step(a, b, x, free)
    return np.maximum(x, 0.0)


def _feasible_step(a: Matrix, b: Matrix, x: Matrix, free: npt.NDArray[np.bool_]) -> Matrix:
    """Move ``x`` toward the least-squares solution on the ``free`` columns, dropping columns
    whose coefficient would turn negative, until the solution is feasible."""
    while True:
        z = np.zeros_like(x)
        z[free] = np.linalg.lstsq(a[:, free], b, rcond=None)[0]
        negative = free & (z <= 0)
        if not negative.any():
            return z
        share = np.min(x[negative] / (x[negative] - z[negative]))
        x = x + share * (z - x)
        free &= x > 0  # columns that reached zero leave the free set
        x[~free] = 0.0


def fit_linear(
    terms: Sequence[str], features: Matrix, times_ms: Matrix, relative_to_ms: Matrix | None = None
) -> LinearFit:
    """Non-negative coefficients of ``terms`` (the columns of ``features``) that best give
    ``times_ms`` relative to each time, with the fit's quality. Relative, because the grid
    spans times from microseconds to tens of milliseconds: absolute residuals would let the
    largest cases decide every term and leave the per-call terms (which dominate the small
    cases, as in most plans' shards) at whatever suits them. Columns are scaled to one norm
    before solving, so terms of very different magnitudes (one call, a million bytes) weigh
    alike. ``relative_to_ms``: the times the residuals are relative to, when ``times_ms`` is
    a part of them (default: ``times_ms``). Raises ``DegenerateFitError`` when the samples
    cannot determine every term."""
    _check_determined(terms, features)
    scale_ms = times_ms if relative_to_ms is None else relative_to_ms
    weights = 1.0 / np.maximum(np.abs(scale_ms), MIN_WEIGHTED_MS)
    weighted = features * weights[:, None]
    norms = np.linalg.norm(weighted, axis=0)
    scaled = nnls(weighted / norms, times_ms * weights) / norms
    return LinearFit(tuple(float(c) for c in scaled), quality_of(features @ scaled, times_ms))


def _check_determined(terms: Sequence[str], features: Matrix) -> None:
    samples, count = features.shape
    if samples < count + 1:
        raise DegenerateFitError(
            f"{samples} measurements cannot fit the {count} terms {', '.join(terms)} with a "
            f"residual: measure at least {count + 1} (give a larger --budget-s)"
        )
    zero = [
        term
        for term, norm in zip(terms, np.linalg.norm(features, axis=0), strict=True)
        if norm == 0
    ]
    if zero:
        raise DegenerateFitError(
            f"the measurements never vary the term(s) {', '.join(zero)}: it is zero in every "
            "sample, so its coefficient is unknown"
        )
    singular = np.linalg.svd(features / np.linalg.norm(features, axis=0), compute_uv=False)
    if singular[-1] < RANK_TOLERANCE * singular[0]:
        raise DegenerateFitError(
            f"the terms {', '.join(terms)} do not vary independently in these {samples} "
            "measurements (one is a combination of the others): vary the grid"
        )


def quality_of(predicted_ms: Matrix, measured_ms: Matrix) -> FitQuality:
    """R², RMS residual and the relative residuals of ``predicted_ms`` against
    ``measured_ms``, clamped into the profile's bounds."""
    residual = predicted_ms - measured_ms
    total = float(np.sum((measured_ms - measured_ms.mean()) ** 2))
    r2 = 1.0 - float(np.sum(residual**2)) / total if total > 0 else 1.0
    relative = np.abs(residual) / np.maximum(np.abs(measured_ms), 1e-12)
    bound = MAX_PROFILE_RELATIVE_ERROR
    return FitQuality(
        samples=int(measured_ms.size),
        r2=max(-bound, min(1.0, r2)),
        rms_residual_ms=min(MAX_FIXED_MS, float(np.sqrt(np.mean(residual**2)))),
        median_relative_error=min(bound, float(np.median(relative))),
        max_relative_error=min(bound, float(relative.max())),
    )


def in_profile_units(
    terms: Sequence[str],
    per_ms: Sequence[float],
    scales: Sequence[float],
    bounds: Sequence[float],
) -> dict[str, float]:
    """Coefficients fit in ms per unit of each term, times ``scales`` (to the profile's
    units: µs per id, ns per byte) and within the profile's ``bounds``."""
    return {
        term: min(bound, value * scale)
        for term, value, scale, bound in zip(terms, per_ms, scales, bounds, strict=True)
    }
