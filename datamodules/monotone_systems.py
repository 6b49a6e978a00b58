"""Monotone discrete-time systems with box sets, the black boxes that MonoBarrier (paper 004-14) certifies.

A system is x+ = f(x, w) on the box X = [x_lo, x_hi] of R^n, with a disturbance w in the box W = [w_lo, w_hi]
of R^m, initial set X_0 = [init_lo, init_hi] and the upper-closed unsafe set X_u = {x in X : exists i,
x_i >= unsafe_at_i}. f is *monotone*: x <= y and w <= w' (componentwise) give f(x, w) <= f(y, w'), and it maps
X x W into X. Everything is float64.

Two families, both offline and procedural:

- ``cooperative_linear(n, seed, rho=0.9, b=0.02)``: x+ = clip(A x + b + w, 0, 2) with A >= 0 random sparse
  (``degree`` entries per row, spectral radius ``rho``; by default every row sums to rho), X = [0, 2]^n,
  X_0 = [0, 0.1]^n, W = [0, 0.02]^n, unsafe at 1. Its worst-case fixed point x* = (I - A)^-1 (b + w_hi) is
  (b + 0.02) / (1 - rho) in every coordinate with equal row sums: safe for b = 0.02 (x* = 0.4), unsafe for
  b = 0.1 (x* = 1.2; with random row sums the Perron vector still forces some x*_i >= (b + 0.02) / (1 - rho)).
- ``ctm_traffic(n)``: the cell-transmission model of a freeway of n cells (densities in [0, 1] of the jam
  density), free-flow speed v, congestion wave speed c, capacity q_max = v c / (v + c), an off-ramp taking a
  fraction beta of each cell's outflow, outflows q_i = min(v x_i, q_max, c (1 - x_{i+1}) / (1 - beta)), inflow
  min(w, q_max, c (1 - x_1)) with the demand w in W, free exit. With dt/dx (v + c / (1 - beta)) <= 1 (the CFL
  condition) every x_i+ is nondecreasing in every x_j and in w, and the densities stay in [0, 1]: the standard
  monotonicity of the CTM (no capacity drop). Unsafe: a density >= 0.9.

``check_monotone`` tests both properties on random ordered pairs and names the first failing pair;
``MonotoneSystemDataModule`` builds a system for the CLI and hands it to the task at ``setup`` (``system``).
Its loaders only pace the training loop: the task queries the simulator itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor

from datamodules.base import PaperlabDataModule, StepLoader
from errors import ConfigError

Step = Callable[[Tensor, Tensor], Tensor]


@dataclass
class MonotoneSystem:
    """A monotone system with box sets (module docstring). Every bound is a float64 vector.

    Args:
        step: f(x (N, n), w (N, m)) -> (N, n), monotone in x and w, mapping X x W into X.
        x_lo, x_hi: (n,) the state box X.
        w_lo, w_hi: (m,) the disturbance box W (w_hi is the worst case: f is nondecreasing in w).
        init_lo, init_hi: (n,) the initial box X_0.
        unsafe_at: (n,) the unsafe set {x in X: exists i, x_i >= unsafe_at_i}; a threshold above x_hi_i makes
            coordinate i never unsafe.
        name: a short name for tags and messages.
    """

    step: Step
    x_lo: Tensor
    x_hi: Tensor
    w_lo: Tensor
    w_hi: Tensor
    init_lo: Tensor
    init_hi: Tensor
    unsafe_at: Tensor
    name: str = "system"

    def __post_init__(self) -> None:
        for field in ("x_lo", "x_hi", "w_lo", "w_hi", "init_lo", "init_hi", "unsafe_at"):
            setattr(self, field, torch.as_tensor(getattr(self, field), dtype=torch.float64).flatten())
        n, m = self.n, self.m
        for field in ("x_hi", "init_lo", "init_hi", "unsafe_at"):
            if getattr(self, field).shape != (n,):
                raise ConfigError(f"{self.name}: {field} has {getattr(self, field).numel()} entries, x_lo has {n}")
        if self.w_hi.shape != (m,):
            raise ConfigError(f"{self.name}: w_hi has {self.w_hi.numel()} entries, w_lo has {m}")
        if not bool((self.x_lo < self.x_hi).all()) or not bool((self.w_lo <= self.w_hi).all()):
            raise ConfigError(f"{self.name}: need x_lo < x_hi and w_lo <= w_hi")
        if not bool((self.init_lo <= self.init_hi).all()):
            raise ConfigError(f"{self.name}: the initial box is empty (init_lo > init_hi somewhere)")
        outside = ((self.init_lo < self.x_lo) | (self.init_hi > self.x_hi)).nonzero().flatten()
        if len(outside):
            i = int(outside[0])
            raise ConfigError(f"{self.name}: X_0 is outside X at coordinate {i}: [{float(self.init_lo[i])}, "
                              f"{float(self.init_hi[i])}] not in [{float(self.x_lo[i])}, {float(self.x_hi[i])}]")
        meets = (self.init_hi >= self.unsafe_at).nonzero().flatten()
        if len(meets):
            i = int(meets[0])
            raise ConfigError(f"{self.name}: X_0 meets the unsafe set at coordinate {i}: init_hi "
                              f"{float(self.init_hi[i])} >= unsafe_at {float(self.unsafe_at[i])}; lower init_hi")

    @property
    def n(self) -> int:
        return int(self.x_lo.numel())

    @property
    def m(self) -> int:
        return int(self.w_lo.numel())

    def minimal_unsafe_points(self) -> Tensor:
        """(k, n) the minimal points of X_u (x_i = unsafe_at_i, every other coordinate at x_lo), one per
        coordinate whose threshold lies inside X: every unsafe x in X dominates one of them."""
        rows = (self.unsafe_at <= self.x_hi).nonzero().flatten()
        points = self.x_lo.repeat(len(rows), 1)
        points[torch.arange(len(rows)), rows] = self.unsafe_at[rows]
        return points

    def worst_case_trajectory(self, steps: int) -> Tensor:
        """(steps + 1, n) the trajectory from init_hi under w = w_hi: by monotonicity it dominates every
        trajectory from X_0, and it is one itself, so it reaches X_u iff some trajectory does (within steps)."""
        x = self.init_hi[None].clone()
        w = self.w_hi[None]
        out = [x[0]]
        for _ in range(steps):
            x = self.step(x, w)
            out.append(x[0])
        return torch.stack(out)


def _box_points(lo: Tensor, hi: Tensor, count: int, gen: torch.Generator) -> Tensor:
    return lo + (hi - lo) * torch.rand(count, len(lo), generator=gen, dtype=torch.float64)


def check_monotone(system: MonotoneSystem, pairs: int = 512, seed: int = 0, tol: float = 1e-12) -> None:
    """Raise ``ConfigError`` naming the first of ``pairs`` random ordered pairs (x <= y, w <= w') with
    f(x, w) > f(y, w') + tol somewhere, or a successor outside X. Half the pairs move a single coordinate
    (what a sparse coupling's sign error shows on), half move all of them."""
    gen = torch.Generator().manual_seed(seed)
    x = _box_points(system.x_lo, system.x_hi, pairs, gen)
    step = torch.rand(pairs, system.n, generator=gen, dtype=torch.float64) * (system.x_hi - x)
    single = torch.zeros_like(step)
    pick = torch.randint(system.n, (pairs,), generator=gen)
    single[torch.arange(pairs), pick] = step[torch.arange(pairs), pick]
    half = pairs // 2
    y = x + torch.cat([single[:half], step[half:]])
    w = _box_points(system.w_lo, system.w_hi, pairs, gen)
    w2 = w + torch.rand(pairs, system.m, generator=gen, dtype=torch.float64) * (system.w_hi - w)
    fx, fy = system.step(x, w), system.step(y, w2)
    bad = (fx > fy + tol).any(1).nonzero().flatten()
    if len(bad):
        k = int(bad[0])
        i = int((fx[k] - fy[k]).argmax())
        raise ConfigError(f"{system.name} is not monotone: x <= y (pair {k}) but f(x, w)_{i} = {float(fx[k, i]):.6g} "
                          f"> f(y, w')_{i} = {float(fy[k, i]):.6g}; x_{i} = {float(x[k, i]):.6g}, "
                          f"y_{i} = {float(y[k, i]):.6g}")
    for f in (fx, fy):
        out = ((f < system.x_lo - tol) | (f > system.x_hi + tol)).any(1).nonzero().flatten()
        if len(out):
            raise ConfigError(f"{system.name}: f maps the state of pair {int(out[0])} outside X")


def sparse_cooperative_matrix(n: int, seed: int, rho: float, degree: int = 4,
                              rows: Literal["equal_sums", "random"] = "equal_sums") -> Tensor:
    """(n, n) nonnegative, ``degree`` random entries U(0.5, 1.5) per row, with spectral radius ``rho``:
    ``equal_sums`` scales every row to sum ``rho`` (a nonnegative matrix with constant row sums has them as its
    Perron root), ``random`` keeps the rows' random sums and scales the whole matrix (row sums then spread
    around rho, up to about 1.2-1.3 for n = 100-500)."""
    gen = torch.Generator().manual_seed(seed)
    a = torch.zeros(n, n, dtype=torch.float64)
    k = min(degree, n)
    for i in range(n):
        cols = torch.randperm(n, generator=gen)[:k]
        a[i, cols] = 0.5 + torch.rand(k, generator=gen, dtype=torch.float64)
    if rows == "equal_sums":
        return a * (rho / a.sum(1, keepdim=True))
    radius = float(torch.linalg.eigvals(a).abs().max())
    return a * (rho / radius)


def cooperative_linear(n: int, seed: int = 0, rho: float = 0.9, b: float = 0.02, degree: int = 4,
                       rows: Literal["equal_sums", "random"] = "equal_sums") -> MonotoneSystem:
    """x+ = clip(A x + b + w, 0, 2), A >= 0 sparse with spectral radius ``rho`` (module docstring; ``rows``:
    ``sparse_cooperative_matrix``)."""
    if n < 1:
        raise ConfigError(f"n must be >= 1, got {n}")
    if not 0 < rho < 1:
        raise ConfigError(f"rho must be in (0, 1) for a stable cooperative system, got {rho}")
    if b < 0:
        raise ConfigError(f"b must be >= 0 (the map must send X = [0, 2]^n into itself), got {b}")
    a = sparse_cooperative_matrix(n, seed, rho, degree, rows)

    def step(x: Tensor, w: Tensor) -> Tensor:
        return (x @ a.T + b + w).clamp(0.0, 2.0)

    full = torch.ones(n, dtype=torch.float64)
    system = MonotoneSystem(step, 0 * full, 2 * full, 0 * full, 0.02 * full, 0 * full, 0.1 * full, full,
                            name=f"cooperative_linear(n={n}, seed={seed}, rho={rho}, b={b})")
    system.A = a  # type: ignore[attr-defined]  # kept for tests and the docs; certify never reads it
    return system


def ctm_traffic(n: int, v: float = 1.0, c: float = 0.5, dt_dx: float = 0.5, exit_ratio: float = 0.1,
                demand: tuple[float, float] = (0.05, 0.2), init_hi: float = 0.3, unsafe_at: float = 0.9) -> MonotoneSystem:
    """A freeway of n cells under the cell-transmission model with off-ramps (module docstring); w (N, 1) is
    the demand. A fraction ``exit_ratio`` of each cell's outflow leaves by its off-ramp (FIFO: the outflow is
    min(send_i, receive_{i+1} / (1 - exit_ratio))); without off-ramps a uniform density is a neutral fixed point
    of the interior cells, which no box-cell certificate with a margin can cover."""
    if n < 1:
        raise ConfigError(f"n must be >= 1, got {n}")
    if not 0 <= exit_ratio < 1:
        raise ConfigError(f"exit_ratio must be in [0, 1), got {exit_ratio}")
    keep = 1.0 - exit_ratio
    if dt_dx * (v + c / keep) > 1:
        raise ConfigError(f"the CTM is monotone only under dt/dx (v + c / (1 - exit_ratio)) <= 1, got "
                          f"{dt_dx * (v + c / keep):.3g}; lower dt_dx")
    q_max = v * c / (v + c)

    def step(x: Tensor, w: Tensor) -> Tensor:
        receive = c * (1.0 - x)  # what each cell can take in
        send = (v * x).clamp(max=q_max)  # what each cell can send
        inflow = torch.minimum(w[:, :1].clamp(max=q_max), receive[:, :1])
        out = torch.cat([torch.minimum(send[:, :-1], receive[:, 1:] / keep), send[:, -1:]], 1)
        q_in = torch.cat([inflow, keep * out[:, :-1]], 1)
        return (x + dt_dx * (q_in - out)).clamp(0.0, 1.0)

    full = torch.ones(n, dtype=torch.float64)
    return MonotoneSystem(step, 0 * full, full, torch.tensor([demand[0]]), torch.tensor([demand[1]]), 0 * full,
                          init_hi * full, unsafe_at * full, name=f"ctm_traffic(n={n})")


class MonotoneSystemDataModule(PaperlabDataModule):
    """A monotone system for the CLI: ``system`` is built at construction and read by the task at ``setup``.

    Args:
        kind: ``cooperative_linear`` or ``ctm_traffic``.
        n: the state dimension (linked into the task as ``num_features``).
        rho, b, degree, rows: the cooperative system (``cooperative_linear``).
        demand_hi: the CTM's worst-case inflow demand (w_hi; capacity is 1/3).
        system_seed: the seed of the cooperative system's matrix; None: the run's seed.
        steps_per_round: training steps per epoch (one epoch is one train-and-refine round).
        check: run ``check_monotone`` on the system first.
    """

    def __init__(
        self,
        kind: Literal["cooperative_linear", "ctm_traffic"] = "cooperative_linear",
        n: int = 100,
        rho: float = 0.9,
        b: float = 0.02,
        degree: int = 4,
        rows: Literal["equal_sums", "random"] = "equal_sums",
        demand_hi: float = 0.2,
        system_seed: int | None = 0,
        steps_per_round: int = 50,
        check: bool = True,
    ) -> None:
        super().__init__()
        if steps_per_round < 1:
            raise ConfigError(f"steps_per_round must be >= 1, got {steps_per_round}")
        self.kind = kind
        self.steps_per_round = steps_per_round
        if kind == "cooperative_linear":
            self.system = cooperative_linear(n, self.seed_or_run(system_seed), rho, b, degree, rows)
        else:
            self.system = ctm_traffic(n, demand=(min(0.05, demand_hi), demand_hi))
        self.dataset_name = kind
        if check:
            check_monotone(self.system)

    @property
    def num_features(self) -> int:
        """n, the state dimension."""
        return self.system.n

    def train_dataloader(self) -> StepLoader:
        return StepLoader(self.steps_per_round)

    def val_dataloader(self) -> StepLoader:
        return StepLoader(1)

    def test_dataloader(self) -> StepLoader:
        return StepLoader(1)

    def describe(self) -> dict[str, Any]:
        return {"system": self.system.name}


__all__ = ["MonotoneSystem", "MonotoneSystemDataModule", "check_monotone", "cooperative_linear", "ctm_traffic",
           "sparse_cooperative_matrix"]
