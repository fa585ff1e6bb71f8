"""The convergence gate: pure functions on numpy arrays of per-step losses.

Inputs are (seeds, steps) arrays of paired runs (same initial weights and batches per seed), so
differences between recipes are the recipes'. Every rule works on windows of steps (a single
noisy step never decides), after a warm-up where curves of every recipe still move together.
Each function returns a list of human-readable failure messages (empty: passed).

Thresholds were measured on the CPU (torch 2.13, 1 thread) with 3 seeds x 100 steps (quick):
mlp with every recipe, tiny_lm and tiny_dit with a subset; the numbers are in the comments
(rerun: ``python -m numcheck.convergence.calibrate --steps 100 --seeds 0,1,2``).
"""
from __future__ import annotations

import numpy as np

__all__ = ["DIVERGENCE_FACTOR", "GAP_TOL", "GOLDEN_SLACK", "GRAD_BIAS_TOL", "SAT_TOL", "WARMUP_FRACTION",
           "WINDOW", "bf16_gap", "divergence", "grad_bias", "nonfinite", "paired_series", "saturation",
           "window_means", "window_regression"]

# Steps per window: 10% of a 200-step run; one window of quick's 100 steps is 20%. Single-step
# loss noise of the three models (std of step-to-step changes of fp32 curves) is 5-20x larger
# than the window-mean noise at this width.
WINDOW = 20
# Warm-up excluded from the gap rule: the first 25% of steps (the LR warm-up is 10%); before it
# every recipe's relative gap to bf16 is within +-1% and dominated by the common fast descent.
WARMUP_FRACTION = 0.25
# Divergence: a window-mean loss above 1.5x the fp32 reference's, per seed. Largest healthy
# window ratio measured on mlp: 1.0078 (fp8 recipes), 1.0746 (nvfp4_rht_sr): 1.5 is 6x that
# headroom, and a diverged run leaves it within one window.
DIVERGENCE_FACTOR = 1.5
# Allowed seed-mean relative window gap to bf16 after warm-up, on top of the seed band, per
# recipe family. Largest healthy window gap measured on mlp (3 seeds): fp8_tensor/row/block and
# torchao fp8 +0.45..+0.64% (seed band <= 0.35%) -> 2% (3x); nvfp4 +7.0%, nvfp4_rht_sr +7.2%
# (band <= 0.6%) -> 15% (2x). bf16 vs fp32: < 0.01%.
GAP_TOL = {"fp8": 0.02, "fp4": 0.15}
# Saturation: a window whose seed-mean fraction of clipped values (linear.SAT_MARGIN rule)
# exceeds 1e-3. Healthy current-scaling recipes measured 0 on every model; a delayed-scaling
# FP8 recipe with a frozen amax reached 0.7-0.9% of all quantized values (2.7% of activations)
# by step 40 of mlp while its loss stayed within 2.5% of fp32 (loss rules alone miss it).
SAT_TOL = 1e-3
# Relative magnitude bias of the quantized gradients, for recipes that declare SR on them.
# Measured on mlp, 3 seeds x 100 steps, window means per seed: nvfp4_rht_sr -0.17..-0.26%
# (SR is unbiased per element; NVFP4's e4m3 block-scale rounding and flushes are not), the
# same recipe with round-to-nearest gradients -0.73..-0.80% -> 0.5%, 2x the SR worst.
GRAD_BIAS_TOL = 0.005
# Golden band multiplier for window_regression: a window fails when its median deviation from
# the golden series exceeds GOLDEN_SLACK x the golden band (mean over the window, floored).
GOLDEN_SLACK = 1.0
# Floor of the golden band, as a fraction of the run's median band: the first steps of every
# recipe are nearly identical across seeds (band ~ 0), where any benign change would "cross" it.
BAND_FLOOR = 0.5


def window_means(a: np.ndarray, window: int = WINDOW, start: int = 0) -> tuple[np.ndarray,
                                                                              np.ndarray]:
    """(window start steps, means over the last axis) of non-overlapping windows from ``start``;
    a trailing partial window shorter than window/2 is dropped."""
    a = np.asarray(a, dtype=np.float64)
    n = a.shape[-1]
    starts = [s for s in range(start, n, window) if min(window, n - s) >= max(1, window // 2)]
    if not starts:
        return np.zeros(0, dtype=np.int64), np.zeros((*a.shape[:-1], 0))
    means = np.stack([a[..., s:s + window].mean(-1) for s in starts], axis=-1)
    return np.asarray(starts), means


def _steps(s: int, window: int, n: int) -> str:
    return f"steps {s}-{min(s + window, n) - 1}"


def nonfinite(loss: np.ndarray, grad_norm: np.ndarray | None = None,
              seeds: list[int] | None = None) -> list[str]:
    """Any NaN/Inf loss or gradient norm fails, at the first step it appears (per seed)."""
    out = []
    loss = np.atleast_2d(loss)
    gn = None if grad_norm is None else np.atleast_2d(grad_norm)
    for i in range(loss.shape[0]):
        name = f"seed {seeds[i]}" if seeds else f"seed #{i}"
        for what, a in (("loss", loss[i]), ("grad norm", None if gn is None else gn[i])):
            if a is None:
                continue
            bad = np.flatnonzero(~np.isfinite(a))
            if bad.size:
                out.append(f"{name}: {what} non-finite ({a[bad[0]]}) from step {bad[0]}")
                break
    return out


def divergence(loss: np.ndarray, ref: np.ndarray, factor: float = DIVERGENCE_FACTOR,
               window: int = WINDOW) -> list[str]:
    """Per seed, a window whose mean loss exceeds ``factor`` x the reference's window mean."""
    out = []
    loss, ref = np.atleast_2d(loss), np.atleast_2d(ref)
    starts, lm = window_means(loss, window)
    _, rm = window_means(ref, window)
    for i in range(loss.shape[0]):
        bad = np.flatnonzero(np.isfinite(lm[i]) & (lm[i] > factor * rm[i]))
        if bad.size:
            j = bad[0]
            out.append(f"seed #{i}: diverged, {_steps(starts[j], window, loss.shape[1])} mean "
                       f"loss {lm[i, j]:.4g} > {factor} x reference {rm[i, j]:.4g}")
    return out


def _seed_mean_windows(a: np.ndarray, window: int):
    """(window starts, seed-mean window means, steps) of a per-step statistic; NaN steps (not
    measured) count as 0; None when nothing was measured at all."""
    a = np.atleast_2d(np.asarray(a, dtype=np.float64))
    if not np.isfinite(a).any():
        return None
    starts, m = window_means(np.where(np.isfinite(a), a, 0.0), window)
    return starts, m.mean(0), a.shape[1]


def saturation(sat: np.ndarray, tol: float = SAT_TOL, window: int = WINDOW) -> list[str]:
    """Windows whose seed-mean saturated fraction exceeds ``tol`` (NaN = not measured: skip)."""
    w = _seed_mean_windows(sat, window)
    if w is None:
        return []
    starts, mean, n = w
    return [f"{_steps(starts[j], window, n)}: {100 * mean[j]:.2f}% of quantized values "
            f"saturated (> {100 * tol:.2g}%: a stale or wrong scale)"
            for j in np.flatnonzero(mean > tol)]


def grad_bias(bias: np.ndarray, tol: float = GRAD_BIAS_TOL, window: int = WINDOW) -> list[str]:
    """Windows whose seed-mean relative magnitude bias of the quantized gradients exceeds
    ``tol``, for recipes that declare stochastic rounding on gradients (SR is unbiased; a
    round-to-nearest in its place shrinks small gradients, too slowly for 100 steps of loss to
    show)."""
    w = _seed_mean_windows(bias, window)
    if w is None:
        return []
    starts, mean, n = w
    return [f"{_steps(starts[j], window, n)}: quantized gradients biased by "
            f"{100 * mean[j]:+.2f}% of their magnitude (> {100 * tol:.2g}%: the recipe declares "
            f"stochastic rounding, which is unbiased)"
            for j in np.flatnonzero(np.abs(mean) > tol)]


def relative_window_gap(loss: np.ndarray, base: np.ndarray, window: int = WINDOW,
                        warmup: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(window starts, per-seed relative gap of window means: loss/base - 1), shape (seeds, W)."""
    starts, lm = window_means(np.atleast_2d(loss), window, warmup)
    _, bm = window_means(np.atleast_2d(base), window, warmup)
    return starts, lm / bm - 1.0


def bf16_gap(loss: np.ndarray, bf16: np.ndarray, tol: float, window: int = WINDOW,
             warmup: int | None = None) -> list[str]:
    """Windows after warm-up whose seed-mean relative gap to bf16 exceeds band + tol.

    band = max over seeds of |gap_seed - gap_mean| in that window (the seeds' own spread), so a
    gap fails only when it is larger than the tolerance even after allowing for seed noise.
    """
    loss, bf16 = np.atleast_2d(loss), np.atleast_2d(bf16)
    n = loss.shape[1]
    warmup = int(WARMUP_FRACTION * n) if warmup is None else warmup
    starts, g = relative_window_gap(loss, bf16, window, warmup)
    mean = g.mean(0)
    band = np.abs(g - mean).max(0)
    out = []
    for j in np.flatnonzero(mean > band + tol):
        out.append(f"{_steps(starts[j], window, n)}: loss {100 * mean[j]:+.1f}% vs bf16 "
                   f"(seed band {100 * band[j]:.1f}%, tolerance {100 * tol:.0f}%)")
    return out


def paired_series(loss: np.ndarray, ref: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(per-step mean over seeds of loss - ref, per-step band = max over seeds of
    |diff - mean|): the golden series and its band."""
    d = np.atleast_2d(loss) - np.atleast_2d(ref)
    mean = d.mean(0)
    return mean, np.abs(d - mean).max(0)


def window_regression(cur_series, golden_series, golden_band, window: int = WINDOW,
                      slack: float = GOLDEN_SLACK, warmup: int = 0,
                      sides: str = "both") -> list[str]:
    """Windows where the current curve leaves its golden band, as messages naming the steps.

    Per window of ``window`` steps (non-overlapping, from ``warmup``): dev = median over the
    window of (cur - golden); limit = slack x max(mean band over the window, BAND_FLOOR x the
    median band of the whole run). The median makes it a sustained-shift rule: one step outside
    the band (however far) moves the median by at most one rank, so it never fails alone; a shift
    over at least half a window does. ``sides``: "both" (default: a curve that got much better is
    a changed numerics too) or "upper" (only worse). Any non-finite current value fails.
    """
    cur = np.asarray(cur_series, dtype=np.float64)
    gold = np.asarray(golden_series, dtype=np.float64)
    band = np.abs(np.asarray(golden_band, dtype=np.float64))
    n = min(cur.size, gold.size, band.size)
    if cur.size != gold.size:
        out = [f"series length {cur.size} != golden length {gold.size} (compared first {n})"]
    else:
        out = []
    cur, gold, band = cur[:n], gold[:n], band[:n]
    bad = np.flatnonzero(~np.isfinite(cur))
    if bad.size:
        return out + [f"non-finite value {cur[bad[0]]} at step {bad[0]}"]
    floor = BAND_FLOOR * float(np.median(band[np.isfinite(band)])) if n else 0.0
    for s in range(warmup, n, window):
        e = min(s + window, n)
        if e - s < max(1, window // 2):
            break
        dev = float(np.median(cur[s:e] - gold[s:e]))
        lim = slack * max(float(np.mean(band[s:e])), floor)
        if dev > lim or (sides == "both" and dev < -lim):
            word = "above" if dev > 0 else "below"
            out.append(f"{_steps(s, window, n)}: smoothed loss diff {word} golden by {dev:+.4g} "
                       f"(median over the window; band {lim:.3g})")
    return out
