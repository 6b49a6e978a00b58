"""Distributed optimisation problems with known constants, for the simulated distributed-SGD methods.

A *problem* gives n workers stochastic gradients of f = (1/n) sum_i f_i and the exact quantities a method
is judged by (f(x), grad f(x), f*). Two families:

``QuadraticProblem`` (diagonal in an orthonormal basis Q, so every constant is closed-form):
    f_i(x) = g_i(Q^T x),  g_i(y) = 1/2 sum_j a_ij y_j^2 - b_ij y_j,
    f = (1/n) sum_i f_i = 1/2 x^T Q diag(abar) Q^T x - (Q bbar)^T x,   grad f_i(x) = Q (a_i * Q^T x - b_i),
    stochastic gradient of worker i: grad f_i(x) + xi,  xi ~ N(0, sigma^2/d I)  (so E|xi|^2 = sigma^2),
    L = max_j abar_j, mu = min_j abar_j, x* = Q (bbar / abar), f* = -1/2 sum_j bbar_j^2 / abar_j.
  Q = I (the default) is the separable problem: each coordinate of grad f_i depends on that coordinate of x
  only. ``rotate`` draws Q once from ``seed`` (Haar, a stream of its own, so the heterogeneity draws do not
  change): the same spectrum, optimum value, Delta and |grad f(x0)| (x0 is rotated with it), the same
  functional constants (every norm is kept), isotropic noise unchanged, but a dense Hessian: a method whose
  update relies on coordinate separability (a per-coordinate uplink, say) sees the difference, a
  rotation-equivariant one (GD, SGD, MARINA-P on a homogeneous problem) does not.
  ``make_quadratic`` builds the spectrum lambda (``slow_fraction`` of the d eigenvalues log-spaced in
  [mu, L], the rest at L) and the start x0 with grad f(x0)_j equal in every coordinate and |grad f(x0)| =
  ``grad_norm0`` (so the slow directions carry as much gradient as the fast ones). ``heterogeneity`` h >= 0
  splits f over the workers without changing it: a_ij = lambda_j (1 + h z_ij), b_ij = h lambda_j w_ij with
  z, w ~ N(0, 1) centred over the workers (sum_i z_ij = sum_i w_ij = 0), so abar = lambda and bbar = 0
  (x* = 0, f* = 0) for every h. For A_i = A + E_i with E_i = h diag(lambda z_i) the functional
  (L_A, L_B) inequality of Gruntkowska, Tyurin & Richtarik (2024),
      |(1/n) sum_i (grad f_i(x + u_i) - grad f_i(x))|^2 <= L_A^2 (1/n) sum_i |u_i|^2 + L_B^2 |(1/n) sum_i u_i|^2,
  holds with L_A = 0, L_B = L when h = 0 and, by Cauchy-Schwarz per coordinate and |a + b|^2 <= 2|a|^2 +
  2|b|^2, with L_A^2 = 2 h^2 max_j lambda_j^2 (1/n) sum_i z_ij^2 and L_B^2 = 2 L^2 when h > 0
  (``functional_constants``).

``DigitsProblem``: a small MLP (flat parameter vector x) on scikit-learn's digits, the training images
split over the workers (``iid``: a random split; ``by_label``: sorted by label, so workers see few
classes); worker i's stochastic gradient is the gradient on ``batch_per_worker`` of its own images drawn
with replacement; f = the mean training cross-entropy, grad f its full-batch gradient. L, sigma and f* are
unknown (``sigma2_at`` estimates the variance at a point).

``DistProblemDataModule`` wraps either for the CLI. The problem depends on the number of workers, which is
the model's argument, so the model asks for it at setup: ``datamodule.build_problem(n_workers)``. Its
loaders only pace the Lightning loop: one train batch per server update (the batch is the step index;
resumable within an epoch), one validation/test batch (the model evaluates f, |grad f|^2 and the test
accuracy there).
"""

from __future__ import annotations

import math
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from datamodules.base import PaperlabDataModule, StepLoader, seeded_split
from errors import ConfigError


class DistributedProblem:
    """What a simulated distributed method needs of a problem (the two families below implement it).

    Attributes:
        n_workers, dim: n and d.
        sigma2: the bound sigma^2 on E|stochastic gradient - grad f_i|^2 (None when unknown).
        L: the smoothness constant of f (None when unknown); f_star: min f (None when unknown).
    """

    n_workers: int
    dim: int
    sigma2: float | None = None
    L: float | None = None
    f_star: float | None = None
    dtype: torch.dtype = torch.float64

    def x0(self) -> Tensor:
        raise NotImplementedError

    def loss(self, x: Tensor) -> float:
        """f(x)."""
        raise NotImplementedError

    def grad(self, x: Tensor) -> Tensor:
        """grad f(x), exact."""
        raise NotImplementedError

    def stochastic_grad(self, x: Tensor, worker: int, generator: torch.Generator) -> Tensor:
        """One stochastic gradient of worker ``worker`` at ``x`` (unbiased for grad f_i(x))."""
        raise NotImplementedError

    def evaluate(self, x: Tensor, split: str) -> dict[str, float]:
        """Extra metrics of ``x`` on a held-out ``split`` ("val", "test"); default none."""
        return {}


class QuadraticProblem(DistributedProblem):
    """Quadratics f_i(x) = g_i(Q^T x), g_i(y) = 1/2 sum_j a_ij y_j^2 - b_ij y_j, with Gaussian gradient noise
    (see the module docstring).

    Args:
        a: (n, d) the diagonals of A_i in the basis Q (or (d,) shared by every worker).
        b: (n, d) the b_i in the basis Q (or (d,) shared).
        sigma: gradient noise: xi ~ N(0, sigma^2/d I).
        x0: (d,) the start (in the coordinates of x, not of Q^T x).
        n_workers: n when ``a`` and ``b`` are shared (default: the rows of ``a``).
        basis: (d, d) the orthogonal Q; None: the identity (separable).
    """

    def __init__(self, a: Tensor, b: Tensor, sigma: float, x0: Tensor, n_workers: int | None = None,
                 basis: Tensor | None = None) -> None:
        a = a.double()
        b = b.double()
        if a.dim() == 1:
            a = a[None]
        if b.dim() == 1:
            b = b[None].expand_as(a)
        if a.shape != b.shape:
            raise ConfigError(f"a {tuple(a.shape)} and b {tuple(b.shape)} must have the same shape")
        abar = a.mean(0)
        if not bool((abar > 0).all()):
            raise ConfigError("the mean Hessian diag(abar) must be positive definite")
        if sigma < 0:
            raise ConfigError(f"sigma must be >= 0, got {sigma}")
        self.a, self.b = a, b
        self.shared = a.shape[0] == 1
        if not self.shared and n_workers not in (None, a.shape[0]):
            raise ConfigError(f"a has {a.shape[0]} worker rows but n_workers={n_workers}")
        self.n_workers = n_workers if n_workers is not None else a.shape[0]
        self.dim = a.shape[1]
        self.abar, self.bbar = abar, b.mean(0)
        self.sigma = float(sigma)
        self.sigma2 = float(sigma) ** 2
        self.L = float(abar.max())
        self.mu = float(abar.min())
        self.f_star = float(-0.5 * (self.bbar**2 / self.abar).sum())
        self._x0 = x0.double().clone()
        self.basis: Tensor | None = None
        self._split: tuple[float, Tensor, Tensor] | None = None
        if basis is not None:
            basis = basis.double()
            if basis.shape != (self.dim, self.dim):
                raise ConfigError(f"the basis must be ({self.dim}, {self.dim}), got {tuple(basis.shape)}")
            self.basis = basis
            self._low_rank_split()
        self.x_star = self._out(self.bbar / self.abar)

    def _low_rank_split(self) -> None:
        """A shared a with one value c on most coordinates: A = c I + Q_S diag(a_S - c) Q_S^T, so a
        product costs 2 d |S| instead of 2 d^2 (|S| = 100 of d = 1000 on the default spectrum)."""
        self._split: tuple[float, Tensor, Tensor] | None = None
        if not self.shared:
            return
        values, counts = torch.unique(self.a[0], return_counts=True)
        c = values[counts.argmax()]
        rest = (self.a[0] != c).nonzero().flatten()
        if 2 * len(rest) < self.dim:
            assert self.basis is not None
            self._split = (float(c), self.basis[:, rest].contiguous(), (self.a[0, rest] - c).contiguous())

    def _in(self, x: Tensor) -> Tensor:
        """Q^T x for a vector or for the rows of a matrix."""
        return x if self.basis is None else x @ self.basis

    def _out(self, y: Tensor) -> Tensor:
        """Q y for a vector or for the rows of a matrix."""
        return y if self.basis is None else y @ self.basis.T

    def _hessian_times(self, xs: Tensor, rows: Tensor | None) -> Tensor:
        """A_i x_i for rows x_i of ``xs`` (``rows``: their workers; None: every worker, or the shared A)."""
        a = self.a if rows is None or self.shared else self.a[rows]
        if self.basis is None:
            return a * xs
        if self._split is not None:
            c, qs, extra = self._split
            return c * xs + ((xs @ qs) * extra) @ qs.T
        return self._out(a * self._in(xs))

    def x0(self) -> Tensor:
        return self._x0.clone()

    def loss(self, x: Tensor) -> float:
        y = self._in(x)
        return float(0.5 * (self.abar * y * y).sum() - (self.bbar * y).sum())

    def grad(self, x: Tensor) -> Tensor:
        return self._out(self.abar * self._in(x) - self.bbar)

    def worker_grad(self, x: Tensor, worker: int) -> Tensor:
        """grad f_i(x), exact."""
        return self.worker_grads(x[None], [worker])[0]

    def worker_grads(self, xs: Tensor, workers: list[int] | None = None) -> Tensor:
        """grad f_i(x_i) for many workers at once: ``xs`` (n, d) -> (n, d); with ``workers``, only those rows
        (``xs`` then holds one row per listed worker)."""
        rows = None if workers is None else torch.as_tensor(workers, dtype=torch.long)
        b = self.b if rows is None or self.shared else self.b[rows]
        return self._hessian_times(xs, rows) - self._out(b)

    def noise(self, shape: tuple[int, ...], generator: torch.Generator) -> Tensor:
        if self.sigma == 0:
            return torch.zeros(shape, dtype=torch.float64)
        return torch.randn(shape, generator=generator, dtype=torch.float64) * (self.sigma / math.sqrt(self.dim))

    def stochastic_grad(self, x: Tensor, worker: int, generator: torch.Generator) -> Tensor:
        return self.worker_grad(x, worker) + self.noise((self.dim,), generator)

    def functional_constants(self) -> tuple[float, float]:
        """An admissible (L_A, L_B) of the functional inequality (see the module docstring)."""
        dev = self.a - self.abar  # E_i = diag(a_i - abar)
        if self.shared or float(dev.abs().max()) == 0.0:
            return 0.0, self.L
        return math.sqrt(2 * float((dev**2).mean(0).max())), math.sqrt(2) * self.L


def quadratic_spectrum(dim: int, L: float, mu: float, slow_fraction: float) -> Tensor:
    """d eigenvalues: ``round(slow_fraction d)`` log-spaced in [mu, L] (mu included), the rest at L."""
    if dim < 1:
        raise ConfigError(f"dim must be >= 1, got {dim}")
    if not 0 < mu <= L:
        raise ConfigError(f"need 0 < mu <= L, got mu={mu}, L={L}")
    if not 0 <= slow_fraction <= 1:
        raise ConfigError(f"slow_fraction must be in [0, 1], got {slow_fraction}")
    n_slow = round(slow_fraction * dim)
    fast = torch.full((dim - n_slow,), float(L), dtype=torch.float64)
    if n_slow == 0:
        return fast
    if n_slow == 1:
        return torch.cat([fast, torch.tensor([float(mu)], dtype=torch.float64)])
    slow = torch.logspace(math.log10(mu), math.log10(L), n_slow, dtype=torch.float64)
    return torch.cat([fast, slow])


def make_quadratic(
    n_workers: int,
    dim: int = 100,
    L: float = 1.0,
    mu: float = 0.04,
    slow_fraction: float = 0.1,
    grad_norm0: float = 10.0,
    sigma: float = 0.283,
    heterogeneity: float = 0.0,
    seed: int = 0,
    rotate: bool = False,
) -> QuadraticProblem:
    """The quadratic of the module docstring; ``heterogeneity`` 0 gives n identical workers; ``rotate`` the
    same problem in the random orthonormal basis ``random_basis(dim, seed)``."""
    if n_workers < 1:
        raise ConfigError(f"n_workers must be >= 1, got {n_workers}")
    if heterogeneity < 0:
        raise ConfigError(f"heterogeneity must be >= 0, got {heterogeneity}")
    if grad_norm0 <= 0:
        raise ConfigError(f"grad_norm0 must be > 0, got {grad_norm0}")
    lam = quadratic_spectrum(dim, L, mu, slow_fraction)
    x0 = grad_norm0 / (lam * math.sqrt(dim))  # grad f(x0) = lam * x0 = grad_norm0 / sqrt(d) per coordinate
    basis = random_basis(dim, seed) if rotate else None
    if basis is not None:
        x0 = basis @ x0
    if heterogeneity == 0:
        return QuadraticProblem(lam, torch.zeros(dim, dtype=torch.float64), sigma, x0, n_workers, basis=basis)
    gen = torch.Generator().manual_seed(seed)
    z = torch.randn(n_workers, dim, generator=gen, dtype=torch.float64)
    w = torch.randn(n_workers, dim, generator=gen, dtype=torch.float64)
    if n_workers > 1:
        z, w = z - z.mean(0), w - w.mean(0)
    else:
        z, w = torch.zeros_like(z), torch.zeros_like(w)
    return QuadraticProblem(lam * (1 + heterogeneity * z), heterogeneity * lam * w, sigma, x0, basis=basis)


# the basis has a random stream of its own: drawing it must not move the heterogeneity draws of the same seed
_BASIS_STREAM = 7_919


def random_basis(dim: int, seed: int) -> Tensor:
    """A (dim, dim) orthogonal matrix drawn from the Haar measure: the QR factor of a Gaussian matrix with the
    signs of R's diagonal moved into Q (without it Q is not uniformly distributed), seeded by ``seed``."""
    gen = torch.Generator().manual_seed(_BASIS_STREAM + seed)
    q, r = torch.linalg.qr(torch.randn(dim, dim, generator=gen, dtype=torch.float64))
    return q * torch.sign(torch.diagonal(r))[None, :]


class DigitsProblem(DistributedProblem):
    """An MLP on digits with the training images split over the workers (see the module docstring).

    Args:
        n_workers: n.
        hidden: hidden widths of the MLP (``[]``: multinomial logistic regression).
        batch_per_worker: images per stochastic gradient.
        split: ``iid`` (random) or ``by_label`` (sorted by label, then cut into n shards).
        test_size: held-out images for the test accuracy (not given to any worker).
        seed: seed of the split and the initial weights.
    """

    dtype = torch.float32

    def __init__(self, n_workers: int, hidden: list[int] | None = None, batch_per_worker: int = 16,
                 split: Literal["iid", "by_label"] = "iid", test_size: int = 360, seed: int = 0) -> None:
        from datamodules.digits import load_digits_tensors

        hidden = [32] if hidden is None else list(hidden)
        if batch_per_worker < 1:
            raise ConfigError(f"batch_per_worker must be >= 1, got {batch_per_worker}")
        if split not in ("iid", "by_label"):
            raise ConfigError(f"split must be 'iid' or 'by_label', got {split!r}")
        x, y = load_digits_tensors()
        n_train = x.shape[0] - test_size
        if n_train < n_workers:
            raise ConfigError(f"{n_train} training images cannot be split over {n_workers} workers")
        tr, te = seeded_split(x.shape[0], (n_train, test_size), seed)
        self.x_train, self.y_train, self.x_test, self.y_test = x[tr], y[tr], x[te], y[te]
        order = torch.argsort(self.y_train, stable=True) if split == "by_label" else torch.arange(n_train)
        self.shards = list(order.tensor_split(n_workers))
        self.n_workers = n_workers
        self.batch = batch_per_worker
        self.widths = [64, *hidden, 10]
        self.shapes = [(self.widths[k + 1], self.widths[k]) for k in range(len(self.widths) - 1)]
        self.dim = sum(o * i + o for o, i in self.shapes)
        gen = torch.Generator().manual_seed(seed)
        parts = []
        for o, i in self.shapes:  # PyTorch's default Linear init: U(-1/sqrt(fan_in), 1/sqrt(fan_in))
            bound = 1.0 / math.sqrt(i)
            parts += [(torch.rand(o * i, generator=gen) * 2 - 1) * bound, (torch.rand(o, generator=gen) * 2 - 1) * bound]
        self._x0 = torch.cat(parts)

    def x0(self) -> Tensor:
        return self._x0.clone()

    def logits(self, x: Tensor, inputs: Tensor) -> Tensor:
        h, offset = inputs, 0
        for k, (o, i) in enumerate(self.shapes):
            w = x[offset : offset + o * i].view(o, i)
            offset += o * i
            bias = x[offset : offset + o]
            offset += o
            h = F.linear(h, w, bias)
            if k < len(self.shapes) - 1:
                h = torch.relu(h)
        return h

    def _loss_grad(self, x: Tensor, inputs: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
        # Lightning evaluates under inference mode; this gradient is the measurement itself
        with torch.inference_mode(False), torch.enable_grad():
            p = x.detach().clone().requires_grad_(True)
            loss = F.cross_entropy(self.logits(p, inputs), targets)
            (g,) = torch.autograd.grad(loss, p)
        return loss.detach(), g

    def loss(self, x: Tensor) -> float:
        with torch.no_grad():
            return float(F.cross_entropy(self.logits(x, self.x_train), self.y_train))

    def grad(self, x: Tensor) -> Tensor:
        return self._loss_grad(x, self.x_train, self.y_train)[1]

    def stochastic_grad(self, x: Tensor, worker: int, generator: torch.Generator) -> Tensor:
        shard = self.shards[worker]
        idx = shard[torch.randint(len(shard), (self.batch,), generator=generator)]
        return self._loss_grad(x, self.x_train[idx], self.y_train[idx])[1]

    def sigma2_at(self, x: Tensor, draws: int = 64, seed: int = 0) -> float:
        """Monte Carlo E|g_i - grad f|^2 at ``x`` over workers and draws (the sigma^2 the theory assumes)."""
        gen = torch.Generator().manual_seed(seed)
        full = self.grad(x)
        total = 0.0
        for k in range(draws):
            total += float((self.stochastic_grad(x, k % self.n_workers, gen) - full).pow(2).sum())
        return total / draws

    def evaluate(self, x: Tensor, split: str) -> dict[str, float]:
        with torch.no_grad():
            acc = (self.logits(x, self.x_test).argmax(-1) == self.y_test).float().mean()
        return {"acc": float(acc)}


class DistProblemDataModule(PaperlabDataModule):
    """A ``QuadraticProblem`` or ``DigitsProblem`` for the simulated distributed methods.

    Args:
        problem: ``quadratic`` or ``digits``.
        dim, L, mu, slow_fraction, grad_norm0, sigma, heterogeneity, rotate: the quadratic (``make_quadratic``;
            ``rotate``: the same problem in a random orthonormal basis from ``problem_seed``, not separable).
        hidden, batch_per_worker, split, test_size: the digits problem (``DigitsProblem``).
        steps_per_epoch: server updates per Lightning epoch (the length of the train loader).
        problem_seed: seed of the quadratic's heterogeneity and basis and of the digits split and initial weights.
    """

    def __init__(
        self,
        problem: Literal["quadratic", "digits"] = "quadratic",
        dim: int = 100,
        L: float = 1.0,
        mu: float = 0.04,
        slow_fraction: float = 0.1,
        grad_norm0: float = 10.0,
        sigma: float = 0.283,
        heterogeneity: float = 0.0,
        rotate: bool = False,
        hidden: list[int] | None = None,
        batch_per_worker: int = 16,
        split: Literal["iid", "by_label"] = "iid",
        test_size: int = 360,
        steps_per_epoch: int = 1000,
        problem_seed: int = 0,
    ) -> None:
        super().__init__()
        if problem not in ("quadratic", "digits"):
            raise ConfigError(f"problem must be 'quadratic' or 'digits', got {problem!r}")
        if steps_per_epoch < 1:
            raise ConfigError(f"steps_per_epoch must be >= 1, got {steps_per_epoch}")
        self.problem = problem
        self.quadratic_args = dict(dim=dim, L=L, mu=mu, slow_fraction=slow_fraction, grad_norm0=grad_norm0,
                                   sigma=sigma, heterogeneity=heterogeneity, seed=problem_seed, rotate=rotate)
        self.digits_args = dict(hidden=[32] if hidden is None else hidden, batch_per_worker=batch_per_worker,
                                split=split, test_size=test_size, seed=problem_seed)
        self.steps_per_epoch = steps_per_epoch
        self.dataset_name = f"dist_{problem}"
        # fail on bad arguments now, not when the model asks
        if problem == "quadratic":
            quadratic_spectrum(dim, L, mu, slow_fraction)
            if sigma < 0 or heterogeneity < 0 or grad_norm0 <= 0:
                raise ConfigError("need sigma >= 0, heterogeneity >= 0 and grad_norm0 > 0")
        elif rotate:
            raise ConfigError("rotate applies to problem: quadratic; drop data.init_args.rotate for digits")

    def build_problem(self, n_workers: int) -> DistributedProblem:
        """The problem for ``n_workers`` workers (what the task asks for: ``modules.protocols.ProvidesProblem``)."""
        if self.problem == "quadratic":
            return make_quadratic(n_workers, **self.quadratic_args)  # type: ignore[arg-type]
        return DigitsProblem(n_workers, **self.digits_args)  # type: ignore[arg-type]

    def train_dataloader(self) -> StepLoader:
        return StepLoader(self.steps_per_epoch)

    def val_dataloader(self) -> StepLoader:
        return StepLoader(1)

    def test_dataloader(self) -> StepLoader:
        return StepLoader(1)

    def predict_dataloader(self) -> StepLoader:
        return StepLoader(1)

    def describe(self) -> dict[str, Any]:
        return {"problem": self.problem, **(self.quadratic_args if self.problem == "quadratic" else self.digits_args)}
