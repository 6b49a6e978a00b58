"""How long a worker takes to compute one stochastic gradient: the time models of the distributed-SGD papers.

``ComputeTimeModel(kind, rate, shift, sigma, taus).sample(n, generator)`` draws the n workers' times for
one job each, as float64 seconds:

- ``fixed``: tau_i = ``taus[i]`` every time (the fixed computation model of Rennala SGD; heterogeneous
  workers, no randomness);
- ``exponential``: tau ~ Exp(rate), mean 1 / rate, independent over workers and jobs;
- ``shifted_exponential``: tau = shift + Exp(rate) (a minimum time plus a memoryless delay);
- ``lognormal``: tau = shift + exp(sigma Z) / rate with Z ~ N(0, 1) (heavy right tail for large sigma).

For n i.i.d. (shifted) exponentials the m-th smallest has mean shift + (H_n - H_{n-m}) / rate with
H_k = 1 + 1/2 + ... + 1/k (Renyi's representation): ``expected_order_statistic`` returns it, and by Monte
Carlo for the other kinds.

Two time complexities of fixed times tau_(1) <= ... <= tau_(n), both per L Delta / epsilon (s = sigma^2 / epsilon):

- ``msync_time_shape``: m-Synchronous SGD's own, tau_(m) (1 + s / m): a round waits for the m-th fastest
  worker, and the minibatch of m divides the variance;
- ``rennala_time_shape`` / ``rennala_lower_bound``: Rennala SGD's optimal time (Tyurin & Richtarik 2023, the
  lower bound of the fixed computation model) min over m of ((1/m) sum_{i<=m} 1/tau_(i))^(-1) (1 + s / m):
  the m fastest workers compute at the sum of their rates, so the harmonic mean of their times, not the m-th
  time, sets the pace. The two agree for equal times; for tau_i = sqrt(i), n = 32, s = 8 the first is
  smallest at m = 8, the bound at m = 12.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor

from errors import ConfigError

TimeKind = Literal["fixed", "exponential", "shifted_exponential", "lognormal"]


def harmonic(k: int) -> float:
    """H_k = sum_{j=1}^k 1/j (H_0 = 0)."""
    return float(sum(1.0 / j for j in range(1, k + 1)))


def _check_m(taus: list[float], m: int) -> list[float]:
    if not taus or any(not (t > 0 and math.isfinite(t)) for t in taus):
        raise ConfigError(f"need one positive computation time per worker, got {taus}")
    if not 1 <= m <= len(taus):
        raise ConfigError(f"m must be in [1, n] = [1, {len(taus)}], got {m}")
    return sorted(taus)


def msync_time_shape(taus: list[float], m: int, sigma2_over_eps: float) -> float:
    """m-Sync SGD's time per L Delta / epsilon under fixed times: tau_(m) (1 + sigma^2 / (m epsilon))."""
    return _check_m(taus, m)[m - 1] * (1 + sigma2_over_eps / m)


def rennala_time_shape(taus: list[float], m: int, sigma2_over_eps: float) -> float:
    """The term of Rennala SGD's lower bound for m workers, per L Delta / epsilon:
    ((1/m) sum_{i<=m} 1/tau_(i))^(-1) (1 + sigma^2 / (m epsilon)) = (m + sigma^2 / epsilon) / sum_{i<=m} 1/tau_(i)."""
    fastest = _check_m(taus, m)[:m]
    return (m + sigma2_over_eps) / sum(1.0 / t for t in fastest)


def rennala_lower_bound(taus: list[float], sigma2_over_eps: float) -> tuple[float, int]:
    """Rennala SGD's optimal time per L Delta / epsilon, min_m ``rennala_time_shape``, and its argmin m (ties to
    the smallest m)."""
    values = [rennala_time_shape(taus, m, sigma2_over_eps) for m in range(1, len(taus) + 1)]
    best = min(range(len(values)), key=lambda k: values[k])
    return values[best], best + 1


class ComputeTimeModel:
    """Computation times of one job per worker (see the module docstring).

    Args:
        kind: ``fixed``, ``exponential``, ``shifted_exponential`` or ``lognormal``.
        rate: the rate lambda of the exponential part (mean 1/lambda), or the lognormal's 1/scale; > 0.
        shift: a constant added to every random time (``shifted_exponential``, ``lognormal``); >= 0.
        sigma: the lognormal's log-standard deviation; > 0.
        taus: the fixed times tau_1..tau_n of ``fixed`` (one per worker, each > 0).
    """

    def __init__(
        self,
        kind: TimeKind = "exponential",
        rate: float = 1.0,
        shift: float = 0.0,
        sigma: float = 1.0,
        taus: list[float] | None = None,
    ) -> None:
        if kind not in ("fixed", "exponential", "shifted_exponential", "lognormal"):
            raise ConfigError(f"time model kind must be fixed, exponential, shifted_exponential or lognormal, got {kind!r}")
        if not (rate > 0 and math.isfinite(rate)):
            raise ConfigError(f"the time model's rate must be a positive number (mean time 1/rate), got {rate}")
        if not (shift >= 0 and math.isfinite(shift)):
            raise ConfigError(f"the time model's shift must be >= 0, got {shift}")
        if not sigma > 0:
            raise ConfigError(f"the lognormal time model's sigma must be > 0, got {sigma}")
        if kind == "exponential" and shift != 0:
            raise ConfigError("kind 'exponential' has no shift: use kind 'shifted_exponential' for shift + Exp(rate)")
        if kind == "fixed":
            if not taus:
                raise ConfigError("kind 'fixed' needs taus: one computation time per worker, e.g. taus: [1.0, 1.41, ...]")
            if any(not (t > 0 and math.isfinite(t)) for t in taus):
                raise ConfigError(f"every fixed time in taus must be a positive number, got {taus}")
        elif taus is not None:
            raise ConfigError(f"taus belongs to kind 'fixed', not {kind!r}: drop it or set kind: fixed")
        self.kind = kind
        self.rate = float(rate)
        self.shift = float(shift)
        self.sigma = float(sigma)
        self.taus = [float(t) for t in taus] if taus is not None else None

    def __repr__(self) -> str:
        extra = f", taus={self.taus}" if self.kind == "fixed" else ""
        return f"ComputeTimeModel(kind={self.kind!r}, rate={self.rate}, shift={self.shift}, sigma={self.sigma}{extra})"

    def check_workers(self, n: int) -> None:
        """A ``fixed`` model needs exactly one time per worker."""
        if self.kind == "fixed" and len(self.taus or []) != n:
            raise ConfigError(f"the fixed time model has {len(self.taus or [])} taus but there are {n} workers: "
                              "give one time per worker")

    def sample(self, n: int, generator: torch.Generator | None = None) -> Tensor:
        """One job's time for each of ``n`` workers, ``(n,)`` float64."""
        if n < 1:
            raise ConfigError(f"need at least one worker, got n={n}")
        if self.kind == "fixed":
            self.check_workers(n)
            return torch.tensor(self.taus, dtype=torch.float64)
        if self.kind == "lognormal":
            z = torch.randn(n, generator=generator, dtype=torch.float64)
            return self.shift + torch.exp(self.sigma * z) / self.rate
        # exponential by inversion: -log(U) / rate with U in (0, 1]
        u = 1.0 - torch.rand(n, generator=generator, dtype=torch.float64)
        return self.shift - torch.log(u) / self.rate

    def sample_worker(self, worker: int, n: int, generator: torch.Generator | None = None) -> float:
        """One job's time for worker ``worker`` of ``n`` (the asynchronous methods draw one job at a time)."""
        if self.kind == "fixed":
            self.check_workers(n)
            return float(self.taus[worker])  # type: ignore[index]
        if self.kind == "lognormal":
            z = torch.randn(1, generator=generator, dtype=torch.float64)
            return float(self.shift + torch.exp(self.sigma * z) / self.rate)
        u = 1.0 - torch.rand(1, generator=generator, dtype=torch.float64)
        return float(self.shift - torch.log(u) / self.rate)

    def expected_order_statistic(self, n: int, m: int, samples: int = 20_000, seed: int = 0) -> float:
        """E[tau_(m:n)], the mean m-th smallest of n draws: closed form for (shifted) exponential and fixed
        times, Monte Carlo (``samples`` draws) for lognormal."""
        if not 1 <= m <= n:
            raise ConfigError(f"m must be in [1, n] = [1, {n}], got {m}")
        if self.kind in ("exponential", "shifted_exponential"):
            return self.shift + (harmonic(n) - harmonic(n - m)) / self.rate
        if self.kind == "fixed":
            return float(self.sample(n).sort().values[m - 1])
        gen = torch.Generator().manual_seed(seed)
        z = torch.randn(samples, n, generator=gen, dtype=torch.float64)
        times = self.shift + torch.exp(self.sigma * z) / self.rate
        return float(times.kthvalue(m, dim=1).values.mean())
