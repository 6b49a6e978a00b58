"""FRAC (paper 002-02): a selective SSM whose memory kernel is a power law, built from log-spaced exponential modes.

A Mamba-style selective SSM forgets exponentially: channel ``c`` keeps ``exp(-lambda_c sum_j Delta_j)`` of
what it wrote. FRAC replaces that by the kernel of fractional dynamics of order ``alpha_c``,
``tau^(alpha_c - 1) / Gamma(alpha_c)`` in the selective time ``tau = lambda_c sum_j Delta_j``, written as a
Laplace transform and discretised on ``K`` log-spaced rates ``s_k``::

    h_t[c, n, k] = exp(-Delta_t[c] s_k lambda_c) h_{t-1}[c, n, k] + Delta_t[c] B_t[n] x_t[c]
    y_t[c]       = sum_n C_t[n] sum_k w_k(alpha_c) h_t[c, n, k] + D[c] x_t[c]

with ``w_k(alpha) = frac_kernel_weights(alpha, rates)``: every mode is a diagonal linear recurrence, so
training and prefill use one chunked-parallel scan and decoding keeps ``C N K`` numbers per layer.
``alpha_c = sigmoid(raw_c)`` is learned per channel, the rates are fixed.

- ``FracSSMNet`` (``net.py``): the network, a task network ``(in_shape, out_dim, ...)`` over token
  sequences or real series; ``kernel="exp"`` is the baseline: one mode of rate 1 (exponential forgetting)
  with ``d_state * n_modes`` states per channel, so both kernels hold the same number of state floats.
- ``FracSSMLM`` (``tasks.py``): token sequences (delayed recall, MQAR, or plain next-token data); accuracy per
  lag bucket (``LagAccuracy``, ``metrics.py``).
- ``FracSSMRegressor`` (``tasks.py``): real-valued series (ARFIMA next-step prediction); MSE and its ratio to
  the optimal linear predictor's.

The functional API (``functional.py``): ``frac_kernel_weights(alpha (C,), rates (K,)) -> (C, K)`` and
``frac_selective_scan(x, delta, Bm, Cm, rates, weights, lam=None, D=None) -> (B, L, C)`` (both computed in
``modules.components.ssm``).
"""

from modules.frac_ssm.functional import frac_kernel_weights, frac_selective_scan
from modules.frac_ssm.metrics import LAG_BUCKETS, LagAccuracy
from modules.frac_ssm.net import FracSSMNet
from modules.frac_ssm.tasks import FracSSMLM, FracSSMRegressor

__all__ = [
    "LAG_BUCKETS",
    "FracSSMLM",
    "FracSSMNet",
    "FracSSMRegressor",
    "LagAccuracy",
    "frac_kernel_weights",
    "frac_selective_scan",
]
