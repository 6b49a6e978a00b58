"""KernelShape (002-02): line fits on exact power laws and exponentials, and the diagnostic on a FRAC model."""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
import torch

from callbacks.diagnostic import Moment
from callbacks.kernel_shape import KernelShape, fit_lines, log_spaced_lags, shape_stats
from errors import ConfigError
from modules.components.ssm import frac_kernel_weights, log_spaced_rates
from modules.frac_ssm import FracSSMLM, FracSSMNet


def test_fit_lines_recovers_slopes_exactly() -> None:
    x = torch.linspace(0, 5, 20, dtype=torch.float64)
    y = torch.stack([2.0 - 0.7 * x, 1.0 + 0.0 * x, 3 * x + torch.sin(7 * x)])
    slope, r2 = fit_lines(x, y)
    assert math.isclose(slope[0].item(), -0.7, rel_tol=1e-12) and math.isclose(r2[0].item(), 1.0, rel_tol=1e-12)
    assert math.isnan(r2[1].item())  # no variance: R^2 undefined
    # a noisy line: R^2 of a simple regression is the squared Pearson correlation, slope as numpy's polyfit
    r = np.corrcoef(x.numpy(), y[2].numpy())[0, 1]
    assert math.isclose(r2[2].item(), r * r, rel_tol=1e-12) and 0.9 < r2[2].item() < 1.0
    assert math.isclose(slope[2].item(), np.polyfit(x.numpy(), y[2].numpy(), 1)[0], rel_tol=1e-12)


def test_power_law_and_exponential_are_told_apart() -> None:
    t = torch.arange(1, 1025, dtype=torch.float64)
    lags = log_spaced_lags(4, 1024, 32)
    power = (-0.5 * t.log())[None]
    expo = (-t / 200.0)[None]
    sp, se = shape_stats(power, lags), shape_stats(expo, lags)
    assert math.isclose(sp["loglog_slope"].item(), -0.5, rel_tol=1e-12) and sp["loglog_r2"].item() > 0.999999
    assert se["semilog_r2"].item() > 0.999999 and se["loglog_r2"].item() < 0.8
    assert sp["semilog_r2"].item() < 0.8


def test_the_frac_mode_sum_is_straight_in_log_log() -> None:
    """The default grid's kernel at selective time tau = t (Delta lambda = 1): R^2 > 0.99 on [4, 1024]."""
    rates = log_spaced_rates(1e-4, 1.0, 8)
    w = frac_kernel_weights(torch.tensor([0.3, 0.5, 0.7], dtype=torch.float64), rates)
    t = torch.arange(1, 1025, dtype=torch.float64)
    lk = (w[:, :, None] * torch.exp(-rates[None, :, None] * t)).sum(1).log()
    st = shape_stats(lk, log_spaced_lags(4, 1024, 32))
    assert (st["loglog_r2"] > 0.99).all()
    assert torch.allclose(st["loglog_slope"], torch.tensor([-0.7, -0.5, -0.3], dtype=torch.float64), atol=0.05)


@pytest.mark.parametrize("kernel", ["frac", "exp"])
def test_measure_on_a_model(kernel: str) -> None:
    torch.manual_seed(0)
    model = FracSSMLM(net=functools.partial(FracSSMNet, d_model=8, n_layers=2, kernel=kernel))
    batch = (torch.randint(0, 64, (3, 120)), torch.full((3, 120), -100), torch.zeros(3, 120, dtype=torch.long))
    diag = KernelShape(t_min=2, t_max=1000)
    out = diag.measure(None, model, Moment("validation", 5, 0, batch))
    assert {"loglog_r2", "semilog_r2", "loglog_slope", "powerlaw_fraction", "layer1/loglog_r2"} <= set(out)
    assert math.isclose(out["decades"], math.log10(119 / 2))
    if kernel == "exp":  # one exponential per channel: exactly straight in semilog on average over the batch
        assert out["semilog_r2"] > 0.99
    assert diag.figure() is not None


def test_bad_arguments_and_unsupported_modules() -> None:
    with pytest.raises(ConfigError, match="t_min"):
        KernelShape(t_min=10, t_max=5)
    reason = KernelShape().unsupported_reason(None, torch.nn.Linear(2, 2))
    assert "memory_kernels(batch)" in reason
