"""The maths of gamma-canonical empirical-Bayes Laplace (paper 004-10) for a ReLU ``MLP``, in float64.

- ``gamma_canonicalize(net, gamma)``: the canonical representative c_gamma(theta) of theta's ReLU scale orbit and
  the per-parameter log scales with theta_c = exp(log_scale) * theta (D = diag(exp(log_scale))).
- ``laplace_log_evidence``: log p(D|theta) - delta/2 ||theta||^2 + P/2 log delta - 1/2 log det(H + delta I) with
  the full GGN H = sum_n J_n^T Lambda_n J_n (Lambda_n: the output-space Hessian of the NLL).
- ``LaplaceFit``: the GGN's eigen-decomposition at one parameter point, from which the evidence-maximising delta*
  (concave in log delta, one root), the evidence at any delta and the linearised predictive follow cheaply.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from errors import ConfigError
from modules.components.mlp import MLP
from modules.components.mlp_analysis import activation_name, affine_layers, rescale_hidden

Likelihood = Literal["gaussian", "categorical"]
#: beyond this many parameters the dense P x P GGN (and its eigen-decomposition) is the wrong tool
MAX_FULL_GGN_PARAMS = 5000


def _check_relu(net: MLP) -> None:
    act = activation_name(net)
    if act != "relu":
        raise ConfigError(f"gamma-canonical Laplace needs a ReLU MLP (its scale symmetry), got activation {act!r}")


def _check_gamma(gamma: float) -> None:
    if not 0.0 <= gamma <= 1.0:
        raise ConfigError(f"gamma must lie in [0, 1], got {gamma}")


def _hidden_log_alpha(layers: list[tuple[Tensor, Tensor]], gamma: float) -> list[Tensor]:
    """log alpha of every hidden neuron such that ``rescale_hidden(net, log_alpha)`` is c_gamma(theta).

    c_0 normalises hidden layers first to last, so that each layer's scale freedom is removed after the previous
    layers' is (a parallel per-layer normalisation is not orbit-invariant in deep nets). A neuron is dead when its
    incoming row restricted to the previous layer's live neurons, and its bias, are zero: it outputs 0 for every
    input, so its row cannot fix its scale; its outgoing column, normalised over the next layer's live rows once
    those are canonical, does. The norms of live rows leave dead inputs out, since those still carry a free scale.
    """
    ws = [w.detach().clone() for w, _ in layers]
    bs = [b.detach().clone() for _, b in layers]
    n_hidden = len(layers) - 1
    log_alpha = [torch.zeros(ws[i].shape[0], dtype=ws[i].dtype) for i in range(n_hidden)]

    def scale(i: int, f: Tensor) -> None:
        ws[i].mul_(f[:, None])
        bs[i].mul_(f)
        ws[i + 1].div_(f[None, :])
        log_alpha[i].add_(f.log())

    def normalise_dead_columns(i: int, dead: Tensor, rows: Tensor) -> None:
        c = ws[i + 1][rows][:, dead].norm(dim=0)
        f = torch.ones_like(log_alpha[i])
        f[dead] = torch.where(c > 0, c, torch.ones_like(c))  # incoming x c, outgoing / c: a unit column
        scale(i, f)

    live_in = torch.ones(ws[0].shape[1], dtype=torch.bool)
    dead_prev: Tensor | None = None
    for i in range(n_hidden):
        a = (ws[i][:, live_in].square().sum(1) + bs[i].square()).sqrt()
        dead = a == 0
        scale(i, torch.where(dead, torch.ones_like(a), 1.0 / a))
        if dead_prev is not None and bool(dead_prev.any()):
            normalise_dead_columns(i - 1, dead_prev, ~dead)
        dead_prev, live_in = dead, ~dead
    if dead_prev is not None and bool(dead_prev.any()):
        normalise_dead_columns(n_hidden - 1, dead_prev, torch.ones(ws[-1].shape[0], dtype=torch.bool))
    if gamma != 0.0:
        # h_gamma: alpha_j = c_j^gamma with c_j the outgoing norm in the c_0 form, all neurons at once (every c_j
        # is read before any neuron moves, so the step is a function of the c_0 form only)
        cs = [ws[i + 1].norm(dim=0) for i in range(n_hidden)]
        for i, c in enumerate(cs):
            scale(i, torch.where(c > 0, c.pow(gamma), torch.ones_like(c)))
    return log_alpha


def log_scale_vector(net: MLP, log_alpha: list[Tensor]) -> Tensor:
    """Per-parameter log scale of the rescaling ``log_alpha``, in ``net.parameters()`` order (W_0 row-major, b_0,
    W_1, ...): W_i[j, k] moves by alpha_i[j] / alpha_{i-1}[k], b_i[j] by alpha_i[j] (the read-out by 1 / alpha)."""
    layers = affine_layers(net)
    parts: list[Tensor] = []
    lin_layers = [m for m in net.layers if isinstance(m, nn.Linear)]
    for i, ((w, _), lin) in enumerate(zip(layers, lin_layers, strict=True)):
        out_la = log_alpha[i] if i < len(log_alpha) else torch.zeros(w.shape[0], dtype=w.dtype)
        in_la = log_alpha[i - 1] if i > 0 else torch.zeros(w.shape[1], dtype=w.dtype)
        parts.append((out_la[:, None] - in_la[None, :]).reshape(-1))
        if lin.bias is not None:
            parts.append(out_la)
    return torch.cat(parts)


def gamma_canonicalize(net: MLP, gamma: float) -> tuple[MLP, Tensor]:
    """``(c_gamma(net), log_scale)``: a new ``MLP`` at the canonical point of net's ReLU scale orbit and the log
    scales ``(P,)`` with theta_c = exp(log_scale) * theta in ``net.parameters()`` order.

    gamma = 0: every hidden neuron's incoming row and bias have unit norm; with one hidden layer gamma = 1 gives unit
    outgoing columns and gamma = 1/2 balanced incoming and outgoing norms."""
    _check_relu(net)
    _check_gamma(gamma)
    layers = affine_layers(net)
    with torch.no_grad():
        log_alpha = _hidden_log_alpha(layers, float(gamma))
        canonical = rescale_hidden(net, log_alpha)
        return canonical, log_scale_vector(net, log_alpha)


# --- the GGN and the evidence ----------------------------------------------------------------------------------


def flat_parameters(net: nn.Module) -> Tensor:
    return torch.cat([p.detach().reshape(-1) for p in net.parameters()])


def _autograd_jacobians(net: nn.Module, x: Tensor) -> tuple[Tensor, Tensor]:
    names = [n for n, _ in net.named_parameters()]
    params = [p.detach() for p in net.parameters()]
    shapes, sizes = [p.shape for p in params], [p.numel() for p in params]

    def f(flat: Tensor) -> Tensor:
        pieces = torch.split(flat, sizes)
        return torch.func.functional_call(net, {n: t.reshape(s) for n, t, s in zip(names, pieces, shapes, strict=True)},
                                          (x,))

    theta = torch.cat([p.reshape(-1) for p in params])
    return f(theta).detach(), torch.func.jacrev(f)(theta).detach()


def jacobians(net: nn.Module, x: Tensor) -> tuple[Tensor, Tensor]:
    """``(f (N, K), J (N, K, P))``: outputs and their Jacobians in the flat parameter vector (``parameters()``
    order). A ReLU ``MLP`` gets the closed-form back-propagation (J for W_i[j, k] is G_i[:, :, j] h_{i-1}[:, k],
    G_i = G_{i+1} W_{i+1} relu'(z_i)), about 50x faster than ``jacrev`` here; anything else gets ``jacrev``."""
    if not (isinstance(net, MLP) and activation_name(net) == "relu"):
        return _autograd_jacobians(net, x)
    lins = [m for m in net.layers if isinstance(m, nn.Linear)]
    h = x.flatten(1)
    inputs, masks = [], []
    for i, lin in enumerate(lins):
        inputs.append(h)
        z = F.linear(h, lin.weight.detach(), None if lin.bias is None else lin.bias.detach())
        if i < len(lins) - 1:
            masks.append((z > 0).to(z.dtype))  # relu'(0) = 0, as torch's relu backward
            h = z.relu()
        else:
            out = z
    n, k = out.shape
    g = torch.eye(k, dtype=out.dtype).expand(n, k, k)  # d f / d z_L
    blocks: list[list[Tensor]] = []
    for i in range(len(lins) - 1, -1, -1):
        lin = lins[i]
        parts = [(g[:, :, :, None] * inputs[i][:, None, None, :]).reshape(n, k, -1)]
        if lin.bias is not None:
            parts.append(g)
        blocks.append(parts)
        if i > 0:
            g = (g @ lin.weight.detach()) * masks[i - 1][:, None, :]
    jac = torch.cat([p for parts in reversed(blocks) for p in parts], dim=-1)
    return out.detach(), jac


def check_targets(y: Tensor, n: int, k: int, likelihood: Likelihood) -> Tensor:
    """``y`` as the likelihood needs it: ``(N, K)`` float for gaussian (``(N,)`` allowed when K = 1), ``(N,)``
    integer labels for categorical."""
    if likelihood == "gaussian":
        if y.dim() == 1 and k == 1:
            y = y[:, None]
        if tuple(y.shape) != (n, k) or y.is_floating_point() is False:
            raise ConfigError(f"gaussian likelihood needs float targets of shape ({n},) or ({n}, {k}), got "
                              f"{tuple(y.shape)} {y.dtype}")
        return y
    if likelihood == "categorical":
        if tuple(y.shape) != (n,) or y.is_floating_point():
            raise ConfigError(f"categorical likelihood needs integer labels of shape ({n},), got {tuple(y.shape)} "
                              f"{y.dtype}")
        return y
    raise ConfigError(f"likelihood must be 'gaussian' or 'categorical', got {likelihood!r}")


def output_hessians(f: Tensor, likelihood: Likelihood, sigma_noise: float) -> Tensor:
    """Lambda_n ``(N, K, K)``: the Hessian of -log p(y_n | f_n) in f_n (independent of y for both likelihoods)."""
    n, k = f.shape
    if likelihood == "gaussian":
        return torch.eye(k, dtype=f.dtype).expand(n, k, k) / sigma_noise**2
    p = f.softmax(-1)
    return torch.diag_embed(p) - p[:, :, None] * p[:, None, :]


def log_likelihood(f: Tensor, y: Tensor, likelihood: Likelihood, sigma_noise: float) -> Tensor:
    if likelihood == "gaussian":
        return (-0.5 * (y - f).square() / sigma_noise**2 - 0.5 * math.log(2 * math.pi * sigma_noise**2)).sum()
    return -F.cross_entropy(f, y, reduction="sum")


def ggn(jac: Tensor, lam: Tensor) -> Tensor:
    """H = sum_n J_n^T Lambda_n J_n, ``(P, P)``."""
    return torch.einsum("nkp,nkl,nlq->pq", jac, lam, jac)


def _check_size(p: int) -> None:
    if p > MAX_FULL_GGN_PARAMS:
        raise ConfigError(f"the full GGN of {p} parameters is beyond {MAX_FULL_GGN_PARAMS}: use a narrower MLP "
                          "(model.hidden)")


def laplace_log_evidence(
    net: MLP,
    x: Tensor,
    y: Tensor,
    likelihood: Likelihood = "gaussian",
    delta: float = 1.0,
    gamma: float | None = None,
    sigma_noise: float = 1.0,
) -> Tensor:
    """The Laplace log evidence at net's parameters, or with ``gamma`` at c_gamma(net) (which equals, in the
    original coordinates, log p - delta/2 ||D theta||^2 + P/2 log delta + log|det D| - 1/2 log det(H + delta D^2))."""
    if not delta > 0:
        raise ConfigError(f"the prior precision delta must be > 0, got {delta}")
    if not sigma_noise > 0:
        raise ConfigError(f"sigma_noise must be > 0, got {sigma_noise}")
    if gamma is not None:
        net, _ = gamma_canonicalize(net, gamma)
    fit = LaplaceFit.at(net, x, y, likelihood, sigma_noise)
    return fit.log_evidence_direct(delta)


def _sqrt_psd(lam: Tensor) -> Tensor:
    """Symmetric square roots of the PSD matrices ``(N, K, K)``."""
    if lam.shape[-1] == 1:
        return lam.clamp_min(0).sqrt()
    evals, evecs = torch.linalg.eigh(lam)
    return evecs @ torch.diag_embed(evals.clamp_min(0).sqrt()) @ evecs.transpose(-1, -2)


@dataclass
class LaplaceFit:
    """The Laplace approximation's ingredients at one parameter point (float64).

    The GGN is kept as its factor A ``(R, P)``, H = A^T A (A's rows: Lambda_n^(1/2) J_n), and its nonzero spectrum
    ``(s, V)``: H = V diag(s) V^T. With R = N K below P, s comes from the R x R Gram matrix A A^T (Sylvester:
    det(delta I_P + A^T A) = delta^(P - R) det(delta I_R + A A^T)), an order of magnitude cheaper than the
    P x P eigen-decomposition on these nets.
    """

    net: nn.Module
    log_lik: float
    sq_norm: float
    n_params: int
    factor: Tensor  # A (R, P)
    spectrum: Tensor  # s (r,) > 0
    basis: Tensor  # V (P, r), orthonormal columns
    likelihood: Likelihood
    sigma_noise: float

    @classmethod
    def at(cls, net: nn.Module, x: Tensor, y: Tensor, likelihood: Likelihood, sigma_noise: float) -> LaplaceFit:
        p = sum(t.numel() for t in net.parameters())
        _check_size(p)
        if not sigma_noise > 0:
            raise ConfigError(f"sigma_noise must be > 0, got {sigma_noise}")
        if x.dim() != 2:
            raise ConfigError(f"inputs must be (N, d), got shape {tuple(x.shape)}")
        f, jac = jacobians(net, x)
        y = check_targets(y, f.shape[0], f.shape[1], likelihood)
        a = (_sqrt_psd(output_hessians(f, likelihood, sigma_noise)) @ jac).reshape(-1, p)
        if a.shape[0] <= p:
            s, u = torch.linalg.eigh(a @ a.T)
            keep = s > 1e-12 * s.max().clamp_min(1e-300)
            s, u = s[keep], u[:, keep]
            v = (a.T @ u) / s.sqrt()
        else:
            s, v = torch.linalg.eigh(a.T @ a)
            keep = s > 1e-12 * s.max().clamp_min(1e-300)
            s, v = s[keep], v[:, keep]
        return cls(net, float(log_likelihood(f, y, likelihood, sigma_noise)), float(flat_parameters(net).square().sum()),
                   p, a, s, v, likelihood, sigma_noise)

    @property
    def hessian(self) -> Tensor:
        """The full GGN ``(P, P)``."""
        return self.factor.T @ self.factor

    def log_evidence_direct(self, delta: float) -> Tensor:
        """The evidence with log det(H + delta I) from a Cholesky factor of the full GGN (no eigen-decomposition)."""
        eye = torch.eye(self.n_params, dtype=self.factor.dtype)
        chol = torch.linalg.cholesky(self.hessian + delta * eye)
        logdet = 2.0 * chol.diagonal().log().sum()
        return torch.as_tensor(self.log_lik - 0.5 * delta * self.sq_norm + 0.5 * self.n_params * math.log(delta),
                               dtype=self.factor.dtype) - 0.5 * logdet

    def log_evidence(self, delta: float) -> float:
        logdet = float(torch.log1p(self.spectrum / delta).sum()) + self.n_params * math.log(delta)
        return self.log_lik - 0.5 * delta * self.sq_norm + 0.5 * self.n_params * math.log(delta) - 0.5 * logdet

    def optimal_delta(self) -> float:
        """delta* = argmax log Z(delta): log Z is concave in u = log delta with derivative
        1/2 sum_i s_i / (s_i + e^u) - e^u ||theta||^2 / 2, strictly decreasing, so bisection on it in u finds the
        one root (MacKay's fixed point: effective parameters = delta ||theta||^2)."""
        s, m = self.spectrum, self.sq_norm

        def grad(u: float) -> float:
            d = math.exp(u)
            return 0.5 * float((s / (s + d)).sum()) - 0.5 * d * m

        lo, hi = -60.0, 60.0
        if grad(lo) <= 0 or grad(hi) >= 0:
            raise ConfigError("the evidence has no interior maximum in delta (a zero GGN or zero parameters)")
        while hi - lo > 1e-14:  # bisection to the last bits of u: robust where Newton steps overshoot
            mid = 0.5 * (lo + hi)
            if mid in (lo, hi):
                break
            if grad(mid) > 0:
                lo = mid
            else:
                hi = mid
        return math.exp(0.5 * (lo + hi))

    def predictive_variance(self, x: Tensor, delta: float) -> tuple[Tensor, Tensor]:
        """``(f (M, K), var (M, K))``: the MAP outputs and the diagonal of J(x) (H + delta I)^-1 J(x)^T
        = (|J|^2 - sum_r (J v_r)^2 s_r / (s_r + delta)) / delta."""
        f, jac = jacobians(self.net, x)
        proj = jac @ self.basis  # (M, K, r)
        var = (jac.square().sum(-1) - (proj.square() * (self.spectrum / (self.spectrum + delta))).sum(-1)) / delta
        return f, var

    def predictive_nll(self, f: Tensor, var: Tensor, y: Tensor) -> float:
        """Mean test NLL of the linearised predictive: N(f, sigma^2 + var) for gaussian; the probit approximation
        softmax(f / sqrt(1 + pi var / 8)) for categorical."""
        y = check_targets(y, f.shape[0], f.shape[1], self.likelihood)
        if self.likelihood == "gaussian":
            total = self.sigma_noise**2 + var
            return float((0.5 * (y - f).square() / total + 0.5 * torch.log(2 * math.pi * total)).mean())
        return float(F.cross_entropy(f / torch.sqrt(1.0 + math.pi * var / 8.0), y))
