"""Scoring a compression ladder against the truth (paper 000-13): the held-out-rho bound, the signal-specific
and calibrated-constant predictions and the local error maps of every test signal, from the fits
f_0 .. f_{n-1} of all signals (``CompressionLadder.error_ladder``, which the ``ErrorLadder`` diagnostic reads).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from modules.compression_error.functional import (
    ContractionError,
    contraction_factor,
    gaussian_blur,
    predict_errors,
    rms,
    spearman,
)

SUMMARY_KEYS = ("bound_coverage", "bound_coverage_triangle", "bound_ratio", "tightness", "tightness_calib",
                "spearman_local", "spearman_local_blur", "rho_calib", "rho_self")


@torch.no_grad()
def score_ladder(fits: Tensor, signals: Tensor, calib: Tensor, levels: Sequence[int], orthogonal: bool | Tensor,
                 rho_quantile: float = 1.0) -> dict[str, Any]:
    """True errors, bounds and predictions of a ladder: ``fits (n, S, H, W, C)`` of the signals
    ``(S, H, W, C)`` at the first n of ``levels``; ``calib (S,)`` bool marks the calibration signals.

    rho_calib is the ``rho_quantile`` quantile of the calibration signals' ratios ||f_{k+1} - f*|| / ||f_k - f*||;
    bound_k = d_k factor(rho_calib), with 1 / sqrt(1 - rho^2) where ``orthogonal`` is on and 1 / (1 - rho)
    elsewhere (``orthogonal``: one flag, or ``(S, n - 1)`` bool, per signal and level pair (k, k + 1)); the
    signal-specific prediction is ``predict_errors`` on each signal's own ladder; the calibrated constant is
    c d_k with c the median ||f_k - f*|| / d_k of the calibration pairs. The scores (``summary``, keys from
    ``SUMMARY_KEYS``) are over the test signals; ``CompressionLadder`` defines them.

    Returns ``{"levels", "true" (S, n), "calib" (S,), "d" (S, n - 1), "bound", "pred_self", "pred_calib"
    (S, n - 1), "rho_calib", "orthogonal" (S, n - 1) bool, "summary" {metric: value}, "per_level" [{"true",
    "bound", "pred", "orthogonal" (share of test signals with the tighter factor)}], "maps": {"true", "pred"}
    (n - 1, H, W) of the first test signal}``; NaN where undefined (with n < 2: the true errors only).
    """
    n, n_sig = fits.shape[0], fits.shape[1]
    true = torch.stack([rms(f - signals) for f in fits], 1)  # (S, n)
    orth = torch.as_tensor(orthogonal, dtype=torch.bool)
    orth = (orth[:, : n - 1] if orth.dim() == 2 else orth).expand(n_sig, max(n - 1, 0)).clone()
    summary: dict[str, float] = {}
    per_level = [{"true": float(true[~calib, k].mean()), "bound": math.nan, "pred": math.nan, "orthogonal": math.nan}
                 for k in range(n)]
    out: dict[str, Any] = {"levels": list(levels[:n]), "true": true, "calib": calib, "orthogonal": orth,
                           "per_level": per_level, "summary": summary}
    if n < 2:
        return out
    d = torch.stack([rms(fits[k] - fits[k + 1]) for k in range(n - 1)], 1)  # (S, n - 1)
    out["d"] = d
    test = (~calib).nonzero().squeeze(1).tolist()
    e = true[:, : n - 1]
    # rho from the held-out (calibration) signals, whose ground truth is known
    rho_cal = math.nan
    if calib.any():
        ratios = (true[calib, 1:] / true[calib, :-1]).reshape(-1)
        ratios = ratios[torch.isfinite(ratios)]
        if len(ratios):
            rho_cal = float(torch.quantile(ratios, rho_quantile))
    out["rho_calib"] = summary["rho_calib"] = rho_cal
    bound = torch.full_like(d, math.nan)
    if 0 <= rho_cal < 1:
        factor = torch.where(orth, contraction_factor(rho_cal, True), contraction_factor(rho_cal, False))
        bound = d * factor
        tri = d * contraction_factor(rho_cal, False)
        summary["bound_coverage"] = float((bound[test] >= e[test]).double().mean())
        summary["bound_coverage_triangle"] = float((tri[test] >= e[test]).double().mean())
        summary["bound_ratio"] = float((bound[test] / e[test]).median())
    out["bound"] = bound
    # signal-specific: rho from each signal's own ladder
    pred = torch.full_like(d, math.nan)
    rho_self: list[float] = []
    if n >= 3:
        for s in range(signals.shape[0]):
            try:
                p = predict_errors(fits[:, s], orthogonal=orth[s].tolist())
            except ContractionError:
                continue
            pred[s] = p["bound"]
            if s in test:
                rho_self.append(p["rho"])
        logr = (pred[test] / e[test]).log().abs()
        logr = torch.where(torch.isnan(logr), torch.full_like(logr, math.inf), logr)  # undefined = a miss
        summary["tightness"] = float(logr.reshape(-1).median())
        if rho_self:
            summary["rho_self"] = float(np.median(rho_self))
    out["pred_self"] = pred
    # calibrated constant: pred = c d_k, c the median true / d over the calibration pairs
    pred_c = torch.full_like(d, math.nan)
    if calib.any():
        c = (e[calib] / d[calib]).reshape(-1)
        c = c[torch.isfinite(c)]
        if len(c):
            pred_c = d * float(c.median())
            summary["tightness_calib"] = float((pred_c[test] / e[test]).log().abs().reshape(-1).median())
    out["pred_calib"] = pred_c
    # local maps: |f_k - f_{k+1}| against |f_k - f*|, raw and both blurred by a 2-pixel Gaussian
    rhos, rhos_blur = [], []
    for s in test:
        for k in range(n - 1):
            pred_map = (fits[k, s] - fits[k + 1, s]).abs().mean(-1)
            true_map = (fits[k, s] - signals[s]).abs().mean(-1)
            rhos.append(spearman(pred_map, true_map))
            rhos_blur.append(spearman(gaussian_blur(pred_map, 2.0), gaussian_blur(true_map, 2.0)))
    summary["spearman_local"] = float(np.mean(rhos))
    summary["spearman_local_blur"] = float(np.mean(rhos_blur))
    s0 = test[0]
    out["maps"] = {"true": (fits[:-1, s0] - signals[s0]).abs().mean(-1),
                   "pred": (fits[:-1, s0] - fits[1:, s0]).abs().mean(-1)}
    for k in range(n - 1):  # means over the test signals where defined
        per_level[k]["bound"] = float(bound[test, k].nanmean())
        per_level[k]["pred"] = float(pred[test, k].nanmean())
        per_level[k]["orthogonal"] = float(orth[test, k].double().mean())
    return out
