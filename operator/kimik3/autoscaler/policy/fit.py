"""Least-squares fits of ``(t, value)`` points (times in seconds) for the demand forecast
(forecast.py): a line or a parabola carried to a time ``now``, with the standard errors that
decide how much of their trend is noise."""

from __future__ import annotations

import math


def line_now(points: list[tuple[float, float]], now: float) -> tuple[float, float, float]:
    """Least-squares line through ``(t, value)`` points: (its value at ``now``, slope, residual
    standard deviation)."""
    n = len(points)
    mt = sum(t for t, _ in points) / n
    md = sum(d for _, d in points) / n
    var = sum((t - mt) ** 2 for t, _ in points)
    slope = sum((t - mt) * (d - md) for t, d in points) / var if var > 0 else 0.0
    resid = sum((d - md - slope * (t - mt)) ** 2 for t, d in points)
    scatter = math.sqrt(resid / (n - 2)) if n > 2 else 0.0
    return md + slope * (now - mt), slope, scatter


def slope_se(points: list[tuple[float, float]]) -> float:
    """Standard error of the least-squares slope of ``(t, value)`` points."""
    n = len(points)
    mt = sum(t for t, _ in points) / n
    var = sum((t - mt) ** 2 for t, _ in points)
    if n < 3 or var <= 0:
        return 0.0
    return line_now(points, mt)[2] / math.sqrt(var)


def quadratic_now(points: list[tuple[float, float]], now: float) -> tuple[float, float, float, float, float]:
    """Least-squares ``value = a + b (t - now) + c (t - now)^2`` through ``(t, value)`` points:
    (a, b, c, standard error of b, standard error of c)."""
    xs = [t - now for t, _ in points]
    ys = [v for _, v in points]
    n = len(xs)
    # Normal equations on the 3x3 moment matrix, solved by Cramer's rule.
    m = [[sum(x ** (i + j) for x in xs) for j in range(3)] for i in range(3)]
    r = [sum(y * x ** i for x, y in zip(xs, ys)) for i in range(3)]
    d = _det3(m)
    if n < 4 or abs(d) < 1e-12:
        level, slope, _ = line_now(points, now)
        return level, slope, 0.0, slope_se(points), 0.0
    coef = []
    for k in range(3):
        mk = [row[:] for row in m]
        for i in range(3):
            mk[i][k] = r[i]
        coef.append(_det3(mk) / d)
    a, b, c = coef
    resid = sum((y - a - b * x - c * x * x) ** 2 for x, y in zip(xs, ys)) / (n - 3)
    # Variances: the residual variance times the inverse moment matrix's diagonal (cofactor / det).
    inv_bb = (m[0][0] * m[2][2] - m[0][2] * m[2][0]) / d
    inv_cc = (m[0][0] * m[1][1] - m[0][1] * m[1][0]) / d
    return a, b, c, math.sqrt(max(0.0, resid * inv_bb)), math.sqrt(max(0.0, resid * inv_cc))


def _det3(a: list[list[float]]) -> float:
    return (a[0][0] * (a[1][1] * a[2][2] - a[1][2] * a[2][1]) - a[0][1] * (a[1][0] * a[2][2] - a[1][2] * a[2][0])
            + a[0][2] * (a[1][0] * a[2][1] - a[1][1] * a[2][0]))
