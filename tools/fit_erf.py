"""Fits the rational erf that f32 GELU uses (`erf_rational_f32` in
core/src/dtype.rs) and checks it in f32 arithmetic.

    python3 tools/fit_erf.py

erf(x) = x * P(x^2) / Q(x^2) on |x| <= 4 (erf(4) rounds to 1 in f32), with P
of degree 6 and Q of degree 4 in t = x^2, Q(0) = 1. The fit minimises the
maximum relative error of erf(x) / x over t in [0, 16]: linearised least
squares, iterated (Sanathanan-Koerner) so the weights track the previous
denominator, then Lawson re-weighting towards the minimax solution.

The check then rounds the coefficients to f32 and evaluates exactly as the
Rust code does (Horner's rule, one multiply and one add per step, no FMA, so
numpy's float32 gives the same bits), against math.erf in double precision.
Needs numpy only; CI never runs it.
"""

import math

import numpy as np

CLAMP = 4.0
DEG_P, DEG_Q = 6, 4


def fit(deg_p, deg_q, iters=120):
    t = np.unique(
        np.concatenate(
            [np.linspace(0, CLAMP**2, 6000), np.linspace(0, 1, 3000) ** 2 * CLAMP**2]
        )
    )
    x = np.sqrt(t)
    f = np.array([math.erf(v) / v if v > 0 else 2 / math.sqrt(math.pi) for v in x])
    s = t / CLAMP**2  # scaled for conditioning
    weight = np.ones_like(s)
    q_prev = np.ones_like(s)
    for it in range(iters):
        cols = [s**i for i in range(deg_p + 1)] + [-f * s**j for j in range(1, deg_q + 1)]
        a = np.stack(cols, 1)
        scale = weight / (f * q_prev)
        sol, *_ = np.linalg.lstsq(a * scale[:, None], f * scale, rcond=None)
        p = sol[: deg_p + 1]
        q = np.concatenate([[1.0], sol[deg_p + 1 :]])
        pv = sum(p[i] * s**i for i in range(deg_p + 1))
        qv = sum(q[j] * s**j for j in range(deg_q + 1))
        err = (pv / qv - f) / f
        q_prev = qv
        if it > 5:
            weight = weight * np.abs(err) ** 0.5
            weight /= weight.max()
    p_t = [p[i] / CLAMP ** (2 * i) for i in range(deg_p + 1)]
    q_t = [q[j] / CLAMP ** (2 * j) for j in range(deg_q + 1)]
    return p_t, q_t, np.abs(err).max()


def eval_f32(x, p_t, q_t):
    x = np.asarray(x, np.float32)
    ax = np.minimum(np.abs(x), np.float32(CLAMP))
    t = ax * ax
    p = np.float32(p_t[-1])
    for c in p_t[-2::-1]:
        p = p * t + np.float32(c)
    q = np.float32(q_t[-1])
    for c in q_t[-2::-1]:
        q = q * t + np.float32(c)
    return np.copysign(np.minimum(ax * p / q, np.float32(1.0)), x)


def main():
    p_t, q_t, fit_err = fit(DEG_P, DEG_Q)
    xs = np.concatenate(
        [
            np.linspace(0, 4.5, 2_000_001, dtype=np.float32),
            (10.0 ** np.linspace(-30, 0.6, 100_001)).astype(np.float32),
        ]
    )
    want = np.array([math.erf(float(v)) for v in xs])
    got = eval_f32(xs, p_t, q_t).astype(np.float64)
    nz = xs > 0
    rel = np.abs(got[nz] - want[nz]) / want[nz]
    print(f"fit: max relative error {fit_err:.3g} (exact coefficients, double arithmetic)")
    print(f"f32: max relative error {rel.max():.3g}, absolute {np.abs(got - want).max():.3g}")
    print("P (t^6 first):", ", ".join(f"{np.float32(c):.8e}" for c in reversed(p_t)))
    print("Q (t^4 first):", ", ".join(f"{np.float32(c):.8e}" for c in reversed(q_t)))


if __name__ == "__main__":
    main()
