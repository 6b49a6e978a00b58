"""Lipschitz bounds of feedforward nets ``f(x) = W_l phi(W_{l-1} ... phi(W_0 x))`` whose activations have slopes in
[0, 1] (paper 002-05, FLIP), shared by the FLIP method and the ``LipschitzBound`` diagnostic.

The LipSDP-Neuron certificate (Fazlyab et al. 2019): for diagonal ``Lambda_i >= 0`` and ``rho >= 0``, if the
block-tridiagonal matrix

    M(rho, Lambda) = [[rho I, -W_0^T Lambda_1, 0, ...],
                      [-Lambda_1 W_0, 2 Lambda_1, -W_1^T Lambda_2, ...],
                      ...,
                      [..., -Lambda_l W_{l-1}, 2 Lambda_l - W_l^T W_l]]

is PSD then ``L <= sqrt(rho)``. With ``Lambda_i = rho c_i I`` (one multiplier per layer) its forward Schur form is
``S_0 = I, S_i = 2 c_i I - c_i^2 W_{i-1} S_{i-1}^{-1} W_{i-1}^T`` (all positive definite) and the smallest ``rho``
is ``F(c) = lambda_max(W_l S_l^{-1} W_l^T)``. ``1 / F(c) = max{s : M_1(c) - s E >= 0}`` with ``M_1(c) = M(1, c)``
and ``E = diag(0, ..., W_l^T W_l)`` is concave in ``c`` (the hypograph is an LMI), so the best one-multiplier-per-
layer bound is a convex problem in ``l + 1`` numbers: ``flip_bound`` solves it to a certified gap with a
log-barrier Newton method whose gradient and Hessian come in closed form from a block LDL^T of the block-
tridiagonal ``M_1(c) - s E`` and the blocks of its inverse (``_Barrier``; cost per step ``O(l^2 n^3)``; no dense
SDP).

Everything runs in float64.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from errors import ConfigError

INSTALL_HINT = "pip install -e '.[sdp]'"


@dataclass
class LipschitzCertificate:
    """An upper bound ``bound`` on the l2 Lipschitz constant and its certificate.

    ``multipliers[i - 1]`` ``(n_i,)`` is the diagonal of ``Lambda_i``: with ``rho = bound^2`` the LipSDP matrix
    ``M(rho, Lambda)`` (module docstring) is PSD. ``variant`` names the algorithm that ran; ``gap`` bounds how far
    ``bound^2`` is above the best bound of its multiplier family (``inf`` when not certified); ``seconds`` is the
    wall time."""

    bound: float
    multipliers: list[Tensor]
    variant: str
    gap: float = math.inf
    seconds: float = 0.0
    info: dict[str, float] = field(default_factory=dict)


# --- input checks ------------------------------------------------------------------------------------------------
def check_weights(weights: Sequence[Tensor]) -> list[Tensor]:
    """The weights as detached float64 matrices, after checking that they chain and are finite."""
    if len(weights) == 0:
        raise ConfigError("a Lipschitz bound needs at least one weight matrix")
    out = []
    for i, w in enumerate(weights):
        if not isinstance(w, Tensor) or w.dim() != 2:
            shape = tuple(w.shape) if isinstance(w, Tensor) else type(w).__name__
            raise ConfigError(f"weights[{i}] must be a matrix (n_out, n_in) in nn.Linear's layout, got {shape}")
        if not bool(torch.isfinite(w).all()):
            raise ConfigError(f"weights[{i}] has non-finite entries (NaN or inf): no Lipschitz bound exists")
        out.append(w.detach().to(torch.float64))
    for i in range(1, len(out)):
        if out[i].shape[1] != out[i - 1].shape[0]:
            raise ConfigError(
                f"weights[{i - 1}] {tuple(out[i - 1].shape)} and weights[{i}] {tuple(out[i].shape)} do not chain: "
                f"weights[{i}] must have {out[i - 1].shape[0]} columns"
            )
    return out


def check_slopes(activation: str, bounds: tuple[float, float] | None) -> None:
    """The bounds here assume slopes in [0, 1] (ReLU, tanh, identity); anything else is refused."""
    if bounds is None or not (0.0 <= bounds[0] <= bounds[1] <= 1.0):
        raise ConfigError(
            f"activation {activation!r} has slope bounds {bounds}, outside [0, 1]: the LipSDP/FLIP bounds need "
            "slope-restricted activations such as relu or tanh"
        )


def net_weights(net: nn.Module) -> list[Tensor]:
    """The weight matrices of an ``MLP`` whose activation has slopes in [0, 1], input to output."""
    from modules.components.activations import activation_spec
    from modules.components.mlp_analysis import activation_name, affine_layers

    name = activation_name(net)
    check_slopes(name, activation_spec(name).slope_bounds)
    return [w.detach() for w, _ in affine_layers(net)]


# --- simple bounds ------------------------------------------------------------------------------------------------
def _lmax(a: Tensor) -> Tensor:
    return torch.linalg.eigvalsh(a)[-1]


def trivial_bound(weights: Sequence[Tensor]) -> float:
    """The product of the layers' spectral norms."""
    ws = check_weights(weights)
    return float(math.prod(float(torch.linalg.matrix_norm(w, ord=2)) for w in ws))


def _gram(w: Tensor, chol: Tensor | None) -> Tensor:
    """``W S^{-1} W^T`` for ``S = chol chol^T`` (``S = I`` when ``chol`` is None)."""
    if chol is None:
        return w @ w.T
    half = torch.linalg.solve_triangular(chol, w.T, upper=False)
    return half.T @ half


def schur_bound_squared(weights: Sequence[Tensor], c: Tensor) -> Tensor:
    """``F(c) = lambda_max(W_l S_l^{-1} W_l^T)`` for scaled multipliers ``c`` (l,); ``inf`` if some ``S_i`` is not
    positive definite (``c`` infeasible)."""
    ws = check_weights(weights)
    chols = _forward_cholesky(ws, c.to(torch.float64))
    if chols is None:
        return torch.tensor(math.inf, dtype=torch.float64)
    return _lmax(_gram(ws[-1], chols[-1] if chols else None))


def _forward_cholesky(ws: list[Tensor], c: Tensor) -> list[Tensor] | None:
    chols: list[Tensor] = []
    for i in range(1, len(ws)):
        p = _gram(ws[i - 1], chols[-1] if chols else None)
        s = 2 * c[i - 1] * torch.eye(p.shape[0], dtype=p.dtype) - c[i - 1] ** 2 * p
        chol, info = torch.linalg.cholesky_ex(s)
        if int(info) != 0 or not bool(c[i - 1] > 0):
            return None
        chols.append(chol)
    return chols


def eclipse_fast_bound(weights: Sequence[Tensor]) -> LipschitzCertificate:
    """ECLipsE-Fast (arXiv 2404.04375): the greedy input-to-output choice ``c_i = 1 / lambda_max(W_{i-1}
    S_{i-1}^{-1} W_{i-1}^T)``, the maximiser of ``2c - c^2 mu``; no solver."""
    start = time.perf_counter()
    ws = check_weights(weights)
    c = _eclipse_c(ws)
    bound = math.sqrt(float(schur_bound_squared(ws, c)))
    mult = [bound**2 * float(ci) * torch.ones(w.shape[0], dtype=torch.float64) for ci, w in zip(c, ws[:-1])]
    return LipschitzCertificate(bound, mult, "eclipse-fast", seconds=time.perf_counter() - start)


def _eclipse_c(ws: list[Tensor]) -> Tensor:
    c: list[Tensor] = []
    chol: Tensor | None = None
    for i in range(1, len(ws)):
        p = _gram(ws[i - 1], chol)
        ci = 1.0 / _lmax(p)
        c.append(ci)
        chol = torch.linalg.cholesky(2 * ci * torch.eye(p.shape[0], dtype=p.dtype) - ci**2 * p)
    return torch.stack(c) if c else torch.zeros(0, dtype=torch.float64)


# --- FLIP: the best one-multiplier-per-layer bound --------------------------------------------------------------
class _Barrier:
    """``phi(z) = s + mu log det N(z)`` with ``N(c, s) = M_1(c) - s E`` (affine in ``z = (c_1, ..., c_l, s)``), its
    gradient ``dphi/dz_k = [k = s] + mu tr(N^{-1} A_k)`` and Hessian ``-mu tr(N^{-1} A_j N^{-1} A_k)``
    (``A_k = dN/dz_k``), all from the block-tridiagonal structure of ``N`` (blocks ``0..l``, sizes ``n_0..n_l``):

    - block LDL^T: ``D_0 = I``, ``G_i = N_{i+1,i} D_i^{-1}``, ``D_{i+1} = N_{i+1,i+1} - G_i N_{i+1,i}^T``, so
      ``log det N = sum_i log det D_i`` and ``N > 0`` iff every ``D_i > 0`` (``D_i`` is the Schur form's ``S_i``);
    - the blocks ``X_ii``, ``X_{i,i+1}`` of ``X = N^{-1}`` backward (Takahashi): ``X_ll = D_l^{-1}``,
      ``X_{i,i+1} = -G_i^T X_{i+1,i+1}``, ``X_ii = D_i^{-1} - X_{i,i+1} G_i``: ``tr(X A_k)`` needs only these,
      since ``A_{c_k}`` lives on blocks ``{k-1, k}`` and ``A_s`` on block ``l``;
    - ``tr(X A_j X A_k) = tr(A_j Z^k)`` with ``Z^k = X A_k X``, whose blocks on ``S_k`` (the support of ``A_k``)
      come from ``X``'s blocks there and whose blocks below it follow from ``X_{b,c} = -G_b^T X_{b+1,c}``
      (``b < c``): ``Z^k_{b,b+1} = -G_b^T Z^k_{b+1,b+1}``, ``Z^k_{bb} = -Z^k_{b,b+1} G_b``. Unlike the gradient,
      an entry with ``|j - k| >= 2`` needs blocks of ``X`` far from the diagonal; the recursion reaches them in
      ``O(l)`` products per column.

    A step costs ``O(l^2 n^3)`` (``n`` the width) against ``O(l^3 n^3)`` for a dense ``N``."""

    def __init__(self, ws: list[Tensor]) -> None:
        if len(ws) < 2:
            raise ValueError("the barrier needs at least one hidden layer (one layer's bound is its norm)")
        self.ws = ws
        self.l = len(ws) - 1  # hidden layers: blocks 0..l, parameters c_1..c_l and s
        self.gram_out = ws[-1].T @ ws[-1]  # E's only block, W_l^T W_l

    def _diag_block(self, i: int, z: Tensor) -> Tensor:
        """``N_ii`` for ``i >= 1``: ``2 c_i I``, minus ``s W_l^T W_l`` on the last block."""
        n = self.ws[i - 1].shape[0]
        blk = 2 * z[i - 1] * torch.eye(n, dtype=torch.float64)
        return blk - z[-1] * self.gram_out if i == self.l else blk

    def _ldl(self, z: Tensor, inverses: bool) -> tuple[list[Tensor], list[Tensor], list[Tensor]] | None:
        """Cholesky factors of ``D_1..D_l`` and, with ``inverses``, ``D_0^{-1}..D_l^{-1}`` and ``G_0..G_{l-1}``;
        None when ``N(z)`` is not positive definite or some ``c_i <= 0``."""
        if not bool((z[:-1] > 0).all()):
            return None
        chols: list[Tensor] = []
        dinv = [torch.eye(self.ws[0].shape[1], dtype=torch.float64)]
        gs: list[Tensor] = []
        for i in range(1, self.l + 1):
            w, c = self.ws[i - 1], z[i - 1]
            if inverses:
                g = -c * (w @ dinv[-1])  # G_{i-1} = N_{i,i-1} D_{i-1}^{-1}, N_{i,i-1} = -c_i W_{i-1}
                gs.append(g)
                d = self._diag_block(i, z) + c * (g @ w.T)  # - G N^T = + c_i G W^T
            else:
                d = self._diag_block(i, z) - c**2 * _gram(w, chols[-1] if chols else None)
            chol, info = torch.linalg.cholesky_ex(d)
            if int(info) != 0:
                return None
            chols.append(chol)
            if inverses:
                dinv.append(torch.cholesky_inverse(chol))
        return chols, dinv, gs

    def value(self, z: Tensor, mu: float) -> float:
        f = self._ldl(z, inverses=False)
        if f is None:
            return -math.inf
        return float(z[-1]) + mu * 2 * sum(float(torch.log(torch.diagonal(ch)).sum()) for ch in f[0])

    def _traces(self, diag: list[Tensor], off: list[Tensor], upto: int) -> Tensor:
        """``tr(A_k Y)`` for a symmetric ``Y`` given by its blocks ``Y_bb`` (``diag[b]``) and ``Y_{b,b+1}``
        (``off[b]``), ``b <= upto``: entries ``c_1..c_upto`` and, when ``upto == l``, ``s``; NaN elsewhere."""
        out = torch.full((self.l + 1,), math.nan, dtype=torch.float64)
        for i in range(1, upto + 1):
            out[i - 1] = 2 * torch.diagonal(diag[i]).sum() - 2 * (off[i - 1] * self.ws[i - 1].T).sum()
        if upto == self.l:
            out[-1] = -(diag[self.l] * self.gram_out).sum()
        return out

    def _z_blocks(self, k: int, xd: list[Tensor], xo: list[Tensor], gs: list[Tensor]) -> tuple[list[Tensor], list[Tensor], int]:
        """Blocks ``Z_bb`` and ``Z_{b,b+1}`` of ``Z = X A_k X`` for ``b`` up to the top of ``A_k``'s support
        (parameter ``k``: 0-based, ``c_{k+1}`` for ``k < l``, ``s`` for ``k = l``), and that top block."""
        if k == self.l:  # A_s = -W_l^T W_l on block l: Z_ll = -(X_ll W_l^T)(X_ll W_l^T)^T
            top = self.l
            v = xd[top] @ self.ws[-1].T
            diag: dict[int, Tensor] = {top: -(v @ v.T)}
            off: dict[int, Tensor] = {}
        else:  # A_{c_top} on blocks (m, top) = (top - 1, top): [[0, -W^T], [-W, 2I]], W = W_{top-1}
            top = k + 1
            m, w = top - 1, self.ws[top - 1]
            p, q, r = xd[m], xo[m], xd[top]
            wp, wq = w @ p, w @ q
            qwp = q @ wp
            rwq = r @ wq
            diag = {m: 2 * (q @ q.T) - qwp - qwp.T, top: 2 * (r @ r) - rwq - rwq.T}
            off = {m: q @ (2 * r - wq) - wp.T @ r}
        for b in range(min(diag) - 1, -1, -1):
            off[b] = -gs[b].T @ diag[b + 1]
            diag[b] = -off[b] @ gs[b]
        return [diag[b] for b in range(top + 1)], [off[b] for b in range(top)], top

    def derivatives(self, z: Tensor, mu: float) -> tuple[float, Tensor, Tensor]:
        """``phi(z)``, its gradient and its Hessian; ``z`` must be strictly feasible."""
        f = self._ldl(z, inverses=True)
        if f is None:
            raise ValueError("derivatives of the barrier outside its domain")
        chols, dinv, gs = f
        value = float(z[-1]) + mu * 2 * sum(float(torch.log(torch.diagonal(ch)).sum()) for ch in chols)
        xd: list[Tensor] = [torch.empty(0)] * (self.l + 1)
        xo: list[Tensor] = [torch.empty(0)] * self.l
        xd[self.l] = dinv[self.l]
        for i in range(self.l - 1, -1, -1):
            xo[i] = -gs[i].T @ xd[i + 1]
            xd[i] = dinv[i] - xo[i] @ gs[i]
        g = mu * self._traces(xd, xo, self.l)
        g[-1] += 1.0
        h = torch.zeros(self.l + 1, self.l + 1, dtype=torch.float64)
        for k in range(self.l + 1):
            diag, off, top = self._z_blocks(k, xd, xo, gs)
            col = self._traces(diag, off, top)
            known = ~torch.isnan(col)
            h[known, k] = -mu * col[known]
            h[k, known] = -mu * col[known]
        return value, g, h


def _predict(barrier: _Barrier, z: Tensor, h: Tensor, mu: float, mu_next: float) -> Tensor:
    """A step along the central path's tangent from the centre ``z`` for ``mu`` towards ``mu_next``: at a centre
    ``e_s + mu q(z) = 0`` (``q = grad log det N``), so ``dz/dmu = H^{-1} e_s / mu``; halved until feasible, else
    ``z`` itself. It spares the damped Newton steps that otherwise follow each cut of ``mu``."""
    e_s = torch.zeros_like(z)
    e_s[-1] = 1.0
    try:
        dz = torch.linalg.solve(h, e_s) * ((mu_next - mu) / mu)
    except RuntimeError:
        return z
    t = 1.0
    while t >= 1e-3:
        if barrier.value(z + t * dz, mu_next) > -math.inf:
            return z + t * dz
        t *= 0.5
    return z


def flip_bound(
    weights: Sequence[Tensor],
    n_sweeps: int = 3,
    tol: float = 1e-8,
    gap_tol: float = 1e-4,
    max_newton: int = 200,
    mu0: float = 0.1,
    shrink: float = 20.0,
) -> LipschitzCertificate:
    """The best LipSDP bound with one multiplier per hidden layer, ``min_c sqrt(F(c))``, to a relative gap
    ``gap_tol`` on ``L^2``.

    A log-barrier path-following Newton method on the concave problem ``max s s.t. M_1(c) - s E >= 0`` in
    ``l + 1`` numbers, started at ECLipsE-Fast's ``c``: at the barrier's maximiser for weight ``mu`` the dual
    matrix ``mu (M_1 - s E)^{-1}`` is feasible, so ``s`` is within ``mu N`` (``N = n_0 + ... + n_l``) of the
    optimum; ``mu`` starts at ``mu0 s`` and shrinks by ``shrink`` per stage (at least ``n_sweeps`` stages, each
    started by a predictor step along the central path) until ``mu N <= gap_tol s``; the last stage ends when the
    Newton decrement is below ``tol``, earlier ones below 0.1. The Newton steps use ``_Barrier``'s closed-form
    derivatives on the block-tridiagonal ``N`` (``O(l^2 n^3)`` per step). The returned bound is ``sqrt(F(c))`` at the last iterate
    (valid for any feasible ``c``), never the barrier's ``1/s``.

    Returns a ``LipschitzCertificate`` whose ``gap`` is the certified relative gap ``mu N s / (1 - mu N s)``
    (``bound^2 <= (1 + gap) x`` the optimum of the family) and ``multipliers[i-1] = bound^2 c_i 1``.
    """
    if n_sweeps < 1 or not tol > 0 or not gap_tol > 0:
        raise ConfigError(f"n_sweeps must be >= 1 and tol, gap_tol > 0, got {n_sweeps}, {tol}, {gap_tol}")
    start = time.perf_counter()
    ws = check_weights(weights)
    if len(ws) == 1:
        b = float(torch.linalg.matrix_norm(ws[0], ord=2))
        return LipschitzCertificate(b, [], "exact (one layer)", gap=0.0, seconds=time.perf_counter() - start)
    c = _eclipse_c(ws)
    f0 = float(schur_bound_squared(ws, c))
    z = torch.cat([c, torch.tensor([0.5 / f0], dtype=torch.float64)])
    n_dual = ws[0].shape[1] + sum(w.shape[0] for w in ws[:-1])  # the barrier's parameter: N's size
    barrier = _Barrier(ws)
    mu = float(z[-1]) * mu0  # the first stage sits near the analytic centre, where Newton starts fast
    stages, newton_steps, final = 0, 0, False
    while True:
        # only the last centre certifies the gap: earlier stages stop once roughly centred (Newton decrement
        # <= 0.1, inside the quadratic region), which saves about a quarter of the Newton steps
        stage_tol = tol if final else max(tol, 0.1)
        h: Tensor | None = None
        for _ in range(max_newton):
            val, g, h = barrier.derivatives(z, mu)
            try:
                step = torch.linalg.solve(-h, g)
            except RuntimeError:  # a singular Hessian: no Newton direction, end the stage here
                h = None
                break
            decrement = float(g @ step)
            newton_steps += 1
            # the Newton decrement of the self-concordant phi / mu: below tol the stage's centre is reached
            if decrement / mu <= stage_tol:
                break
            t = 1.0
            while t > 1e-12:
                cand = z + t * step
                if barrier.value(cand, mu) >= val + 0.25 * t * decrement:
                    break
                t *= 0.5
            if t <= 1e-12:
                break
            z = cand
        if final:
            break
        stages += 1
        if stages >= n_sweeps and mu * n_dual <= gap_tol * float(z[-1]):
            final = True  # centre tightly at this mu before certifying
            continue
        mu_next = mu / shrink
        if h is not None:
            z = _predict(barrier, z, h, mu, mu_next)
        mu = mu_next
    c = z[:-1]
    f = float(schur_bound_squared(ws, c))
    bound = math.sqrt(f)
    # s is within mu N of the optimum s*, and F(c) <= 1 / s: F(c) / F* <= s* / s <= 1 / (1 - mu N / s)
    ratio = mu * n_dual / float(z[-1])
    gap = ratio / (1 - ratio) if ratio < 1 else math.inf
    mult = [f * float(ci) * torch.ones(w.shape[0], dtype=torch.float64) for ci, w in zip(c, ws[:-1])]
    return LipschitzCertificate(
        bound,
        mult,
        "scalar-barrier-newton",
        gap=gap,
        seconds=time.perf_counter() - start,
        info={"stages": float(stages), "newton_steps": float(newton_steps)},
    )


# --- certificates -----------------------------------------------------------------------------------------------
def lipsdp_matrix(weights: Sequence[Tensor], rho: float, multipliers: Sequence[Tensor]) -> Tensor:
    """The dense LipSDP matrix ``M(rho, Lambda)`` (module docstring), for checks on small nets."""
    ws = check_weights(weights)
    if len(multipliers) != len(ws) - 1:
        raise ConfigError(f"need one multiplier vector per hidden layer ({len(ws) - 1}), got {len(multipliers)}")
    sizes = [ws[0].shape[1]] + [w.shape[0] for w in ws[:-1]]
    offs = [0]
    for n in sizes:
        offs.append(offs[-1] + n)
    m = torch.zeros(offs[-1], offs[-1], dtype=torch.float64)
    m[: sizes[0], : sizes[0]] = rho * torch.eye(sizes[0], dtype=torch.float64)
    for i in range(1, len(ws)):
        lam = multipliers[i - 1].to(torch.float64)
        a, b = offs[i], offs[i + 1]
        m[a:b, a:b] = 2 * torch.diag(lam)
        block = -lam[:, None] * ws[i - 1]
        m[a:b, offs[i - 1] : offs[i]] = block
        m[offs[i - 1] : offs[i], a:b] = block.T
    a = offs[-2]
    m[a:, a:] -= ws[-1].T @ ws[-1]
    return m


def bound_from_multipliers(weights: Sequence[Tensor], multipliers: Sequence[Tensor]) -> float:
    """The smallest ``sqrt(rho)`` that makes ``M(rho, Lambda)`` PSD for the given diagonal multipliers (a valid
    bound for any of them; ``inf`` when no ``rho`` does), by the backward Schur recursion
    ``R_l = 2 Lambda_l - W_l^T W_l``, ``R_i = 2 Lambda_i - W_i^T Lambda_{i+1} R_{i+1}^{-1} Lambda_{i+1} W_i``,
    ``rho* = lambda_max(W_0^T Lambda_1 R_1^{-1} Lambda_1 W_0)``. It re-checks a solver's multipliers exactly."""
    ws = check_weights(weights)
    if len(multipliers) != len(ws) - 1:
        raise ConfigError(f"need one multiplier vector per hidden layer ({len(ws) - 1}), got {len(multipliers)}")
    if not multipliers:
        return float(torch.linalg.matrix_norm(ws[0], ord=2))
    lam = [m.detach().to(torch.float64) for m in multipliers]
    r = 2 * torch.diag(lam[-1]) - ws[-1].T @ ws[-1]
    for i in range(len(lam) - 1, -1, -1):
        chol, info = torch.linalg.cholesky_ex(r)
        if int(info) != 0:
            return math.inf
        coupling = lam[i][:, None] * ws[i]  # Lambda_{i+1} W_i in 0-based layer numbering
        g = _gram(coupling.T, chol)
        if i == 0:
            return math.sqrt(max(float(_lmax(g)), 0.0))
        r = 2 * torch.diag(lam[i - 1]) - g
    raise AssertionError("unreachable")


def lipsdp_bound(
    weights: Sequence[Tensor], solver: str = "SCS", multipliers: str = "neuron", eps: float = 1e-6
) -> LipschitzCertificate:
    """LipSDP (Fazlyab et al. 2019) through cvxpy: ``min rho`` s.t. ``M(rho, Lambda) >= 0``, with one multiplier per
    neuron (``multipliers="neuron"``, LipSDP-Neuron) or per layer (``"layer"``). The returned bound is re-checked
    exactly from the solver's multipliers (``bound_from_multipliers``), since a first-order solver's LMI can come
    out slightly infeasible; ``info["solver_bound"]`` is the solver's own ``sqrt(rho)``."""
    import numpy as np

    try:
        import cvxpy as cp
    except ImportError:
        raise ConfigError(f"lipsdp_bound needs cvxpy and SCS: {INSTALL_HINT}") from None
    if multipliers not in ("neuron", "layer"):
        raise ConfigError(f"multipliers must be 'neuron' or 'layer', got {multipliers!r}")
    start = time.perf_counter()
    ws = [w.numpy() for w in check_weights(weights)]
    sizes = [ws[0].shape[1]] + [w.shape[0] for w in ws[:-1]]
    rho = cp.Variable(nonneg=True)
    lams = [cp.Variable(n if multipliers == "neuron" else 1, nonneg=True) for n in sizes[1:]]
    diag = [lam if multipliers == "neuron" else lam * np.ones(n) for lam, n in zip(lams, sizes[1:])]
    blocks: list[list] = [[None] * len(sizes) for _ in sizes]
    for i in range(len(sizes)):
        for j in range(len(sizes)):
            blocks[i][j] = np.zeros((sizes[i], sizes[j]))
    blocks[0][0] = rho * np.eye(sizes[0])
    for i in range(1, len(sizes)):
        blocks[i][i] = 2 * cp.diag(diag[i - 1])
        off = -cp.diag(diag[i - 1]) @ ws[i - 1]
        blocks[i][i - 1] = off
        blocks[i - 1][i] = off.T
    blocks[-1][-1] = blocks[-1][-1] - ws[-1].T @ ws[-1]
    mat = cp.bmat(blocks)
    prob = cp.Problem(cp.Minimize(rho), [(mat + mat.T) / 2 >> 0])
    try:
        prob.solve(solver=solver, eps=eps) if solver == "SCS" else prob.solve(solver=solver)
    except cp.error.SolverError as err:
        raise ConfigError(f"lipsdp_bound: solver {solver!r} failed ({err}); install it or pick another") from None
    mult = [torch.as_tensor(d.value, dtype=torch.float64).reshape(-1).expand(n).clone() for d, n in zip(diag, sizes[1:])]
    mult = [m.clamp_min(0.0) for m in mult]
    checked = bound_from_multipliers(weights, mult)
    solver_bound = math.sqrt(max(float(rho.value), 0.0)) if rho.value is not None else math.nan
    return LipschitzCertificate(
        checked,
        mult,
        f"lipsdp-{multipliers} ({solver})",
        seconds=time.perf_counter() - start,
        info={"solver_bound": solver_bound},
    )


# --- lower bound --------------------------------------------------------------------------------------------------
def jacobian_lower_bound(
    net: nn.Module | Callable[[Tensor], Tensor], x: Tensor, n_steps: int = 0, step_size: float = 0.1
) -> float:
    """A lower bound on L: the largest ``||J_f(x)||_2`` over the rows of ``x`` (N, d), each a valid lower bound
    wherever ``f`` is differentiable. ``n_steps > 0`` moves every point along its Jacobian's top right singular
    vector (a step of ``step_size`` times the batch's input scale each) and keeps the best norm seen: a cheap
    search across activation patterns, since the norm itself is piecewise constant for ReLU nets."""
    if x.dim() != 2:
        raise ConfigError(f"jacobian_lower_bound expects inputs (N, d), got shape {tuple(x.shape)}")
    dtype = next(net.parameters()).dtype if isinstance(net, nn.Module) else x.dtype
    pts = x.detach().to(dtype)
    scale = float(pts.std()) if pts.numel() > 1 else 1.0
    best = 0.0
    for _ in range(n_steps + 1):
        jac = _row_jacobians(net, pts)
        _, sv, vh = torch.linalg.svd(jac, full_matrices=False)
        best = max(best, float(sv[:, 0].max()))
        pts = pts + step_size * scale * vh[:, 0, :]
    return best


def _row_jacobians(net: nn.Module | Callable[[Tensor], Tensor], x: Tensor) -> Tensor:
    """``d f(x_n) / d x_n`` (N, out, d) by one backward pass per output: rows do not interact, so the gradient
    of ``sum_n f(x_n)_k`` at row n is row k of that row's Jacobian (plain autograd: ``torch.func``'s first call
    costs seconds)."""
    # Lightning's test and validation loops run under inference mode, which enable_grad alone does not lift
    with torch.inference_mode(False), torch.enable_grad():
        xg = x.detach().clone().requires_grad_(True)
        out = net(xg).reshape(len(x), -1)
        rows = [torch.autograd.grad(out[:, k].sum(), xg, retain_graph=k + 1 < out.shape[1])[0] for k in range(out.shape[1])]
    return torch.stack(rows, 1).detach()
