"""Exact Gaussian moment matching (paper 002-06): the closed forms.

For ``z ~ N(m, V)`` (``m (N, n)``, ``V (N, n, n)``) and an elementwise activation ``phi``, ``activation_moments``
returns ``E[phi(z)]`` and the full ``Cov(phi(z))``; ``residual_layer_moments`` the moments of
``y = A x + B phi(C x + d)`` for ``x ~ N(mean, cov)``, with the cross-covariance ``Cov(x, phi(z))`` from Stein's
lemma, ``Cov(x, phi(z_j)) = Cov(x, z_j) E[phi'(z_j)]``.

Pairwise expectations reduce to the bivariate normal CDF ``Phi_2`` (``bvn_cdf``) and truncated moments of a
bivariate normal (Rosenbaum 1961):

- probit ``Phi``: ``E[Phi(z_i) Phi(z_j)] = Phi_2(h_i, h_j; V_ij / (s_i s_j))``, ``s_i = sqrt(1 + V_ii)``,
  ``h_i = m_i / s_i`` (``Phi(z) = P(U <= z)`` with an independent ``U ~ N(0, 1)`` per factor, so the diagonal
  is the same formula);
- heaviside: the same with ``s_i = sqrt(V_ii)``; the diagonal is ``Phi(h_i)``;
- relu: ``E[z_i z_j 1(z_i > 0) 1(z_j > 0)]``, a truncated second moment;
- gelu ``z Phi(z)``: ``E[z_i z_j 1(w_i > 0) 1(w_j > 0)]`` with ``w = z - U``: regress ``z`` on ``w`` (jointly
  Gaussian, ``Cov(z, w) = V``, ``Cov(w) = V + I``) and take the truncated moments of ``w``;
- sine: ``E[sin z_i sin z_j] = (E cos(z_i - z_j) - E cos(z_i + z_j)) / 2``, ``E cos u = cos(E u) e^{-Var u / 2}``.
"""

from __future__ import annotations

import math
from typing import Any, Literal, get_args

import numpy as np
import torch
from torch import Tensor

from errors import ConfigError

Activation = Literal["probit", "heaviside", "gelu", "relu", "sine"]
ACTIVATIONS: tuple[str, ...] = get_args(Activation)

_SQRT_2PI = math.sqrt(2 * math.pi)
# Gauss-Legendre rules of Genz (2004): 6 nodes for |r| < 0.3, 12 below 0.75, 20 above
_GL = {n: tuple(torch.from_numpy(a) for a in np.polynomial.legendre.leggauss(n)) for n in (6, 12, 20)}
_HIGH_R = 0.925  # Genz (2004): above this |r|, the asin-substitution integrand is too peaked for 20 nodes


def norm_pdf(x: Tensor) -> Tensor:
    return torch.exp(-0.5 * x * x) / _SQRT_2PI


def norm_cdf(x: Tensor) -> Tensor:
    return torch.special.ndtr(x)


# --- the bivariate normal CDF ---------------------------------------------------------------------------------
def _nodes(n: int, like: Tensor) -> tuple[Tensor, Tensor]:
    x, w = _GL[n]
    return x.to(like.dtype).to(like.device), w.to(like.dtype).to(like.device)


def _bvn_upper_low(h: Tensor, k: Tensor, r: Tensor, n_nodes: int) -> Tensor:
    """``|r| < 0.925``: ``Phi(-h) Phi(-k) + 1/(2 pi) int_0^{asin r} exp(-(h^2 + k^2 - 2 h k sin t) / (2 cos^2 t)) dt``."""
    x, w = _nodes(n_nodes, h)
    half = torch.asin(r) / 2
    sn = torch.sin(half.unsqueeze(-1) * (x + 1))
    hs = ((h * h + k * k) / 2).unsqueeze(-1)
    integrand = torch.exp((sn * (h * k).unsqueeze(-1) - hs) / (1 - sn * sn))
    return (integrand * w).sum(-1) * half / (2 * math.pi) + norm_cdf(-h) * norm_cdf(-k)


def _bvn_upper_high(h: Tensor, k: Tensor, r: Tensor) -> Tensor:
    """``|r| >= 0.925``: an expansion in ``1 - r^2`` with its singular part integrated in closed form (Genz 2004);
    ``|r| = 1`` gives the degenerate limits."""
    x, w = _nodes(20, h)
    tp = 2 * math.pi
    neg = r < 0
    k = torch.where(neg, -k, k)  # reflect: Y -> -Y makes r positive
    hk = h * k
    ra = r.abs().clamp(max=1.0)
    as_ = ((1 - ra) * (1 + ra)).clamp_min(1e-300)
    a = torch.sqrt(as_)
    bs = (h - k) ** 2
    c = (4 - hk) / 8
    d = (12 - hk) / 16
    bvn = a * torch.exp(-(bs / as_ + hk) / 2) * (1 - c * (bs - as_) * (1 - d * bs / 5) / 3 + c * d * as_ * as_ / 5)
    b = torch.sqrt(bs)
    hk_safe = hk.clamp_min(-160.0)
    tail = torch.exp(-hk_safe / 2) * math.sqrt(tp) * norm_cdf(-b / a) * b * (1 - c * bs * (1 - d * bs / 5) / 3)
    bvn = bvn - torch.where(hk > -160, tail, torch.zeros_like(tail))
    a2 = (a / 2).unsqueeze(-1)
    xs = (a2 * (x + 1)) ** 2
    rs = torch.sqrt(1 - xs)
    bs_, hk_, c_, d_ = (t.unsqueeze(-1) for t in (bs, hk, c, d))
    ep = torch.exp(-hk_ * (1 - rs) / (2 * (1 + rs))) / rs
    sp = 1 + c_ * xs * (1 + d_ * xs)
    bvn = bvn + (a2 * w * torch.exp(-(bs_ / xs + hk_) / 2) * (ep - sp)).sum(-1)
    bvn = -bvn / tp
    bvn = torch.where(ra >= 1, torch.zeros_like(bvn), bvn)  # |r| = 1: only the limit term below
    pos = bvn + norm_cdf(-torch.maximum(h, k))
    negv = -bvn + (norm_cdf(-h) - norm_cdf(-k)).clamp_min(0)
    return torch.where(neg, negv, pos)


def _bvn_upper(h: Tensor, k: Tensor, r: Tensor) -> Tensor:
    """``P(X > h, Y > k)`` for standard normals with correlation ``r`` (Genz 2004, after Drezner & Wesolowsky
    1990), each element by the rule its ``|r|`` needs. Double precision to about 1e-15."""
    h, k, r = torch.broadcast_tensors(h, k, r)
    shape = h.shape
    h, k, r = h.reshape(-1), k.reshape(-1), r.reshape(-1)
    out = torch.empty_like(h)
    ra = r.abs()
    groups = ((ra < 0.3, 6), ((ra >= 0.3) & (ra < 0.75), 12), ((ra >= 0.75) & (ra < _HIGH_R), 20))
    for mask, n_nodes in groups:
        if bool(mask.any()):
            out[mask] = _bvn_upper_low(h[mask], k[mask], r[mask], n_nodes)
    high = ra >= _HIGH_R
    if bool(high.any()):
        out[high] = _bvn_upper_high(h[high], k[high], r[high])
    return out.clamp(0, 1).reshape(shape)


class _BivariateNormalCDF(torch.autograd.Function):
    @staticmethod
    def forward(h: Tensor, k: Tensor, r: Tensor) -> Tensor:  # type: ignore[override]
        return _bvn_upper(-h, -k, r)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Tensor, Tensor, Tensor], output: Tensor) -> None:
        ctx.save_for_backward(*inputs)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        h, k, r = ctx.saved_tensors
        # d/dh Phi_2 = phi(h) Phi((k - r h) / sqrt(1 - r^2)); d/dr Phi_2 = the bivariate density
        one_m = (1 - r * r).clamp_min(1e-300)
        s = torch.sqrt(one_m)
        gh = norm_pdf(h) * norm_cdf((k - r * h) / s)
        gk = norm_pdf(k) * norm_cdf((h - r * k) / s)
        gr = torch.exp(-(h * h - 2 * r * h * k + k * k) / (2 * one_m)) / (2 * math.pi * s)
        out = []
        for g, t in ((gh, h), (gk, k), (gr, r)):
            out.append(_unbroadcast(grad * g, t.shape) if ctx.needs_input_grad[len(out)] else None)
        return tuple(out)


def _unbroadcast(g: Tensor, shape: torch.Size) -> Tensor:
    while g.dim() > len(shape):
        g = g.sum(0)
    for i, n in enumerate(shape):
        if n == 1 and g.shape[i] != 1:
            g = g.sum(i, keepdim=True)
    return g


def bvn_cdf(h: Tensor, k: Tensor, r: Tensor) -> Tensor:
    """``Phi_2(h, k; r) = P(X <= h, Y <= k)`` for standard normals with correlation ``r`` (broadcast), float64,
    differentiable in all three (analytic gradients). ``|r| = 1`` gives the degenerate limits."""
    return _BivariateNormalCDF.apply(h, k, r)


# --- truncated moments of a bivariate normal --------------------------------------------------------------------
def _orthant_moments(
    mu1: Tensor, mu2: Tensor, s11: Tensor, s22: Tensor, s12: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """For ``w ~ N((mu1, mu2), [[s11, s12], [s12, s22]])`` (elementwise over broadcast pairs):
    ``P = P(w > 0)``, ``T1_k = E[w_k 1(w > 0)]``, ``T2_kl = E[w_k w_l 1(w > 0)]`` (Rosenbaum 1961), as
    ``(P, T1_1, T1_2, T2_11, T2_22, T2_12)``."""
    sd1, sd2 = torch.sqrt(s11), torch.sqrt(s22)
    h1, h2 = mu1 / sd1, mu2 / sd2
    rho = (s12 / (sd1 * sd2)).clamp(-1.0, 1.0)
    rr = torch.sqrt((1 - rho * rho).clamp_min(1e-300))
    p = bvn_cdf(h1, h2, rho)
    a1 = (h2 - rho * h1) / rr  # a collinear pair (|rho| = 1, equal h) gives 0/tiny = 0: the right limit
    a2 = (h1 - rho * h2) / rr
    f1, f2 = norm_pdf(h1), norm_pdf(h2)
    q1, q2 = norm_cdf(a1), norm_cdf(a2)
    joint = f1 * norm_pdf(a1)  # = phi_2(h1, h2; rho) sqrt(1 - rho^2)
    e1 = f1 * q1 + rho * f2 * q2
    e2 = f2 * q2 + rho * f1 * q1
    e11 = p - h1 * f1 * q1 - rho * rho * h2 * f2 * q2 + rho * rr * joint
    e22 = p - h2 * f2 * q2 - rho * rho * h1 * f1 * q1 + rho * rr * joint
    e12 = rho * p - rho * h1 * f1 * q1 - rho * h2 * f2 * q2 + rr * joint
    t1 = mu1 * p + sd1 * e1
    t2 = mu2 * p + sd2 * e2
    t11 = mu1 * mu1 * p + 2 * mu1 * sd1 * e1 + s11 * e11
    t22 = mu2 * mu2 * p + 2 * mu2 * sd2 * e2 + s22 * e22
    t12 = mu1 * mu2 * p + mu1 * sd2 * e2 + mu2 * sd1 * e1 + sd1 * sd2 * e12
    return p, t1, t2, t11, t22, t12


# --- elementwise moments ---------------------------------------------------------------------------------------
def activation_mean_var(m: Tensor, v: Tensor, activation: str) -> tuple[Tensor, Tensor]:
    """``E[phi(z)]`` and ``Var[phi(z)]`` for independent ``z_i ~ N(m_i, v_i)`` (elementwise)."""
    if activation == "probit":
        s = torch.sqrt(1 + v)
        h = m / s
        mean = norm_cdf(h)
        second = bvn_cdf(h, h, v / (1 + v))
    elif activation == "heaviside":
        mean = norm_cdf(m / torch.sqrt(v))
        second = mean
    elif activation == "relu":
        s = torch.sqrt(v)
        h = m / s
        mean = m * norm_cdf(h) + s * norm_pdf(h)
        second = (m * m + v) * norm_cdf(h) + m * s * norm_pdf(h)
    elif activation == "gelu":
        mean = _gelu_mean(m, v)
        second = _gelu_second(m, m, v, v, v)
    elif activation == "sine":
        mean = torch.sin(m) * torch.exp(-v / 2)
        second = 0.5 * (1 - torch.cos(2 * m) * torch.exp(-2 * v))
    else:
        raise ConfigError(f"unknown activation {activation!r}; choose from {list(ACTIVATIONS)}")
    return mean, (second - mean * mean).clamp_min(0)


def activation_slope_mean(m: Tensor, v: Tensor, activation: str) -> Tensor:
    """``E[phi'(z)]`` for ``z ~ N(m, v)`` (elementwise; heaviside: the density of z at 0), the Stein factor."""
    if activation == "probit":
        s = torch.sqrt(1 + v)
        return norm_pdf(m / s) / s
    if activation == "heaviside":
        s = torch.sqrt(v)
        return norm_pdf(m / s) / s
    if activation == "relu":
        return norm_cdf(m / torch.sqrt(v))
    if activation == "gelu":  # phi' = Phi(z) + z pdf(z)
        s = torch.sqrt(1 + v)
        h = m / s
        return norm_cdf(h) + m * norm_pdf(h) / s**3
    if activation == "sine":
        return torch.cos(m) * torch.exp(-v / 2)
    raise ConfigError(f"unknown activation {activation!r}; choose from {list(ACTIVATIONS)}")


def activation_derivative(z: Tensor, activation: str) -> Tensor:
    """``phi'(z)`` pointwise (heaviside: 0 almost everywhere), for linearisation."""
    if activation == "probit":
        return norm_pdf(z)
    if activation == "heaviside":
        return torch.zeros_like(z)
    if activation == "relu":
        return (z > 0).to(z.dtype)
    if activation == "gelu":
        return norm_cdf(z) + z * norm_pdf(z)
    if activation == "sine":
        return torch.cos(z)
    raise ConfigError(f"unknown activation {activation!r}; choose from {list(ACTIVATIONS)}")


def activation_fn(z: Tensor, activation: str) -> Tensor:
    """``phi(z)`` pointwise: the functions whose moments this file computes (gelu is the exact ``z Phi(z)``)."""
    if activation == "probit":
        return norm_cdf(z)
    if activation == "heaviside":
        return (z > 0).to(z.dtype)
    if activation == "relu":
        return torch.relu(z)
    if activation == "gelu":
        return z * norm_cdf(z)
    if activation == "sine":
        return torch.sin(z)
    raise ConfigError(f"unknown activation {activation!r}; choose from {list(ACTIVATIONS)}")


def _gelu_mean(m: Tensor, v: Tensor) -> Tensor:
    # E[z Phi(z)] = m E[Phi(z)] + v E[pdf(z)] (Stein)
    s = torch.sqrt(1 + v)
    h = m / s
    return m * norm_cdf(h) + v * norm_pdf(h) / s


def _gelu_second(mi: Tensor, mj: Tensor, a: Tensor, b: Tensor, c: Tensor) -> Tensor:
    """``E[z_i Phi(z_i) z_j Phi(z_j)]`` for ``(z_i, z_j) ~ N((mi, mj), [[a, c], [c, b]])``: with ``w = z - U``
    (``U ~ N(0, I)``), ``E[z | w] = L w + S^-1 m``, ``L = I - S^-1``, ``S = V + I``, residual covariance ``L``."""
    s11, s22, s12 = 1 + a, 1 + b, c
    det = s11 * s22 - s12 * s12
    i11, i22, i12 = s22 / det, s11 / det, -s12 / det  # S^-1
    l11, l22, l12 = 1 - i11, 1 - i22, -i12  # L = I - S^-1 (symmetric)
    ell1 = i11 * mi + i12 * mj
    ell2 = i12 * mi + i22 * mj
    p, t1, t2, t11, t22, t12 = _orthant_moments(mi, mj, s11, s22, s12)
    # (L T2 L^T)_12 with T2 symmetric
    ltl = l11 * (t11 * l12 + t12 * l22) + l12 * (t12 * l12 + t22 * l22)
    lt_1 = l11 * t1 + l12 * t2
    lt_2 = l12 * t1 + l22 * t2
    return ltl + lt_1 * ell2 + ell1 * lt_2 + p * (ell1 * ell2 + l12)


# --- full moments ----------------------------------------------------------------------------------------------
def _pairs(mean: Tensor, cov: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    var = torch.diagonal(cov, dim1=-2, dim2=-1)
    return mean.unsqueeze(-1), mean.unsqueeze(-2), var.unsqueeze(-1), var.unsqueeze(-2), cov


def _moments(mean: Tensor, cov: Tensor, activation: str) -> tuple[Tensor, Tensor]:
    """``activation_moments`` without the input checks (for propagation inside a net)."""
    mi, mj, a, b, c = _pairs(mean, cov)
    var = torch.diagonal(cov, dim1=-2, dim2=-1)
    eye = torch.eye(mean.shape[-1], dtype=torch.bool, device=mean.device)
    if activation == "probit":
        si, sj = torch.sqrt(1 + a), torch.sqrt(1 + b)
        mu = norm_cdf(mean / torch.sqrt(1 + var))
        second = bvn_cdf(mi / si, mj / sj, c / (si * sj))
    elif activation == "heaviside":
        si, sj = torch.sqrt(a), torch.sqrt(b)
        mu = norm_cdf(mean / torch.sqrt(var))
        off = bvn_cdf(mi / si, mj / sj, (c / (si * sj)).clamp(-1, 1))
        second = torch.where(eye, mu.unsqueeze(-1).expand_as(off), off)
    elif activation == "relu":
        mu, v_phi = activation_mean_var(mean, var, "relu")
        *_, off = _orthant_moments(mi, mj, a, b, c)
        diag = v_phi + mu * mu
        second = torch.where(eye, torch.diag_embed(diag), off)
    elif activation == "gelu":
        mu = _gelu_mean(mean, var)
        second = _gelu_second(mi, mj, a, b, c)
    elif activation == "sine":
        mu = torch.sin(mean) * torch.exp(-var / 2)
        second = 0.5 * (torch.cos(mi - mj) * torch.exp(-(a + b - 2 * c) / 2)
                        - torch.cos(mi + mj) * torch.exp(-(a + b + 2 * c) / 2))
    else:
        raise ConfigError(f"unknown activation {activation!r}; choose from {list(ACTIVATIONS)}")
    out = second - mu.unsqueeze(-1) * mu.unsqueeze(-2)
    return mu, 0.5 * (out + out.transpose(-1, -2))


def check_gaussian(mean: Tensor, cov: Tensor, what: str = "input") -> None:
    """One-line ``ConfigError`` for shapes that do not match, an asymmetric or a non-PSD covariance."""
    if mean.dim() != 2 or cov.dim() != 3 or cov.shape != (mean.shape[0], mean.shape[1], mean.shape[1]):
        raise ConfigError(
            f"{what}: expected mean (N, n) and cov (N, n, n), got mean {tuple(mean.shape)} and cov {tuple(cov.shape)}"
        )
    scale = float(cov.detach().abs().amax()) if cov.numel() else 0.0
    asym = float((cov - cov.transpose(-1, -2)).detach().abs().amax()) if cov.numel() else 0.0
    if asym > 1e-10 * max(scale, 1e-300):
        raise ConfigError(f"{what}: the covariance is not symmetric (max |cov - cov^T| = {asym:.3g}); symmetrise it")
    low = float(torch.linalg.eigvalsh(cov.detach()).amin()) if cov.numel() else 0.0
    if low < -1e-10 * max(scale, 1e-300):
        raise ConfigError(f"{what}: the covariance is not positive semi-definite (smallest eigenvalue {low:.3g})")


def activation_moments(mean: Tensor, cov: Tensor, activation: Activation) -> tuple[Tensor, Tensor]:
    """Exact ``E[phi(z)] (N, n)`` and ``Cov(phi(z)) (N, n, n)`` for ``z ~ N(mean, cov)``, differentiable.

    ``activation``: ``probit`` (``Phi``), ``heaviside`` (``1(z > 0)``; every variance must be positive),
    ``gelu`` (``z Phi(z)``), ``relu`` or ``sine``.
    """
    if activation not in ACTIVATIONS:
        raise ConfigError(f"unknown activation {activation!r}; choose from {list(ACTIVATIONS)}")
    check_gaussian(mean, cov)
    if activation in ("heaviside", "relu"):
        var = torch.diagonal(cov, dim1=-2, dim2=-1)
        if bool((var <= 0).any()):
            raise ConfigError(
                f"{activation} needs a positive variance on every unit (a unit has variance "
                f"{float(var.min()):.3g}): its moments jump at a point mass; add input noise or use probit/gelu"
            )
    return _moments(mean, cov, activation)


def _layer(
    mean: Tensor, cov: Tensor, a: Tensor | None, b: Tensor, c: Tensor, d: Tensor, activation: str,
    diagonal: bool = False,
) -> tuple[Tensor, Tensor]:
    z_mean = mean @ c.T + d
    if diagonal:  # independent units everywhere: only variances propagate
        var = torch.diagonal(cov, dim1=-2, dim2=-1)
        z_var = var @ (c * c).T
        phi_mean, phi_var = activation_mean_var(z_mean, z_var, activation)
        phi_cov = torch.diag_embed(phi_var)
        cov = torch.diag_embed(var)
        slope = activation_slope_mean(z_mean, z_var, activation)
    else:
        z_cov = c @ cov @ c.T
        phi_mean, phi_cov = _moments(z_mean, z_cov, activation)
        slope = activation_slope_mean(z_mean, torch.diagonal(z_cov, dim1=-2, dim2=-1), activation)
    y_mean = phi_mean @ b.T
    y_cov = b @ phi_cov @ b.T
    if a is not None:
        k = (cov @ c.T) * slope.unsqueeze(-2)  # Cov(x, phi(z)) = Sigma C^T diag(E phi'(z)) (Stein)
        akb = a @ k @ b.T
        y_mean = y_mean + mean @ a.T
        y_cov = y_cov + a @ cov @ a.T + akb + akb.transpose(-1, -2)
    y_cov = 0.5 * (y_cov + y_cov.transpose(-1, -2))
    if diagonal:
        y_cov = torch.diag_embed(torch.diagonal(y_cov, dim1=-2, dim2=-1))
    return y_mean, y_cov


def residual_layer_moments(
    mean: Tensor, cov: Tensor, A: Tensor | None, B: Tensor, C: Tensor, d: Tensor, activation: Activation,
) -> tuple[Tensor, Tensor]:
    """Exact mean ``(N, p)`` and covariance ``(N, p, p)`` of ``y = A x + B phi(C x + d)`` for
    ``x ~ N(mean, cov)``: ``Cov(y) = A S A^T + A K B^T + B K^T A^T + B Cov(phi) B^T`` with
    ``K = S C^T diag(E phi'(z))``. ``A = None``: the plain layer ``y = B phi(C x + d)``."""
    if activation not in ACTIVATIONS:
        raise ConfigError(f"unknown activation {activation!r}; choose from {list(ACTIVATIONS)}")
    check_gaussian(mean, cov)
    n = mean.shape[1]
    if C.dim() != 2 or C.shape[1] != n or d.shape != (C.shape[0],):
        raise ConfigError(f"C must be (h, {n}) and d (h,) for inputs of width {n}, got C {tuple(C.shape)}, "
                          f"d {tuple(d.shape)}")
    if B.dim() != 2 or B.shape[1] != C.shape[0]:
        raise ConfigError(f"B must be (p, {C.shape[0]}) to read the {C.shape[0]} activations, got {tuple(B.shape)}")
    if A is not None and A.shape != (B.shape[0], n):
        raise ConfigError(f"A must be ({B.shape[0]}, {n}) (or None for a plain layer), got {tuple(A.shape)}")
    z_var = torch.diagonal(C @ cov @ C.T, dim1=-2, dim2=-1)
    if activation in ("heaviside", "relu") and bool((z_var <= 0).any()):
        raise ConfigError(f"{activation} needs a positive pre-activation variance on every unit (a unit has "
                          f"{float(z_var.min()):.3g}); add input noise or use probit/gelu")
    return _layer(mean, cov, A, B, C, d, activation)


__all__ = [
    "ACTIVATIONS", "Activation", "activation_derivative", "activation_fn", "activation_mean_var",
    "activation_moments", "activation_slope_mean", "bvn_cdf", "check_gaussian", "residual_layer_moments",
]
