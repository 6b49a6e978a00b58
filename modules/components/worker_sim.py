"""Simulated parameter-server SGD: real gradients, a simulated clock, n workers with random computation times.

Each server owns the clock and the workers' jobs; ``step(x, lr)`` advances the clock to the next server
update and returns the new point. Gradients are real (``grad_fn(x, worker)``: one stochastic gradient of
worker ``worker`` at ``x``); only the time they take is simulated, drawn from a ``ComputeTimeModel``.
Communication is free here (the compressed methods of ``modules/inkheart_sgd.py`` add it).

- ``MSyncServer`` (m-Synchronous SGD, Begunov & Tyurin, arXiv 2602.03802; Synchronous SGD is m = n):
  round k broadcasts x_k; every available worker starts one job at x_k with a fresh time draw; at the m-th
  arrival the server steps ``x_{k+1} = x_k - lr * mean of the m gradients``. With
  ``cancel_stragglers=True`` (default, the backup-worker reading) the other jobs are cancelled and every
  worker restarts at x_{k+1} at once, so a round lasts tau_(m:n), the m-th smallest of n fresh draws. With
  ``False`` the stragglers finish their jobs (their gradients, now stale, are dropped) and only then start
  on the newest point. ``silent_fraction``: in every round a fresh uniformly random set of
  round(silent_fraction n) workers computes nothing (partial participation); the server waits for the m-th
  arrival among the others.
- ``RennalaServer`` (Rennala SGD, Tyurin & Richtarik, NeurIPS 2023): workers compute without pause; a
  gradient computed at the current x_k joins the batch, a stale one (computed at an older point) is
  dropped; every worker restarts at the newest point it knows. After B gradients at x_k the server steps
  with their mean and the worker that completed the batch restarts at x_{k+1}; jobs in flight keep running.
- ``AsyncServer`` (Asynchronous SGD): every arriving gradient is applied at once,
  ``x_{k+1} = x_k - lr_k g(x_{k - delta_k})``, and its worker restarts at x_{k+1}. Step sizes:
  ``constant`` (lr_k = lr) or ``delay_adaptive``, lr_k = lr min(1, n / delta_k), the delay-adaptive rule
  of Mishchenko, Bach, Even & Woodworth (NeurIPS 2022: gamma_k = min(1/(2nL), 1/(2L delta_k)) with
  lr = 1/(2nL)), which damps the rare very stale gradients and leaves the typical delay ~ n untouched.

Ties between equal arrival times go to the lower worker index. ``msync_sgd``, ``rennala_sgd`` and
``async_sgd`` run a server for a number of updates and return the trajectory.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import Tensor

from errors import ConfigError
from modules.components.compute_time import ComputeTimeModel

#: one stochastic gradient of worker ``worker`` at ``x``: ``grad_fn(x (d,), worker) -> (d,)``
GradFn = Callable[[Tensor, int], Tensor]
AsyncStepsize = Literal["constant", "delay_adaptive"]


@dataclass
class StepInfo:
    """What one server update did.

    Attributes:
        clock: the simulated time of the update.
        used: the workers whose gradients were averaged (a worker repeats when it sent several, Rennala).
        worker_times: the n times drawn at the round's start (synchronous rounds; None otherwise).
        dropped: gradients finished or cancelled without being used (stale or straggling jobs).
        delay: Asynchronous SGD: updates since the applied gradient's point (0 for the synchronous methods).
        lr_scale: the factor on lr of this update (delay-adaptive step sizes; 1 otherwise).
        silent: the workers that computed nothing this round (partial participation).
    """

    clock: float
    used: list[int]
    worker_times: Tensor | None = None
    dropped: int = 0
    delay: int = 0
    lr_scale: float = 1.0
    silent: list[int] = field(default_factory=list)


@dataclass
class ServerStats:
    """Running counts of a server: updates, jobs started (``computed``, cancelled ones included), gradients
    used, jobs dropped (cancelled, or finished stale), and the coordinates sent per link worker -> server
    (``coords_up``) and server -> worker (``coords_down``; zero for the servers here, which communicate for
    free: the compressed methods of ``modules/inkheart_sgd.py`` count them)."""

    updates: int = 0
    computed: int = 0
    used: int = 0
    dropped: int = 0
    coords_up: float = 0.0
    coords_down: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


def _mean_grad(grad_fn: GradFn, x: Tensor, workers: list[int]) -> Tensor:
    return torch.stack([grad_fn(x, i) for i in workers]).mean(0)


def _check_workers(n_workers: int) -> None:
    if n_workers < 1:
        raise ConfigError(f"n_workers must be >= 1, got {n_workers}")


class SimulatedServer:
    """Base of the simulated servers: the clock, the counts, the generator of the computation times."""

    def __init__(self, n_workers: int, time_model: ComputeTimeModel, generator: torch.Generator | None) -> None:
        _check_workers(n_workers)
        time_model.check_workers(n_workers)
        self.n = n_workers
        self.time_model = time_model
        self.generator = generator if generator is not None else torch.Generator().manual_seed(0)
        self.clock = 0.0
        self.stats = ServerStats()

    def step(self, x: Tensor, lr: float, grad_fn: GradFn) -> tuple[Tensor, StepInfo]:
        """Advance to the next server update from the current point ``x``; return the new point."""
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        return {"clock": self.clock, "stats": vars(self.stats).copy(), "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.clock = float(state["clock"])
        self.stats = ServerStats(**state["stats"])
        self.generator.set_state(state["generator"])


class MSyncServer(SimulatedServer):
    """m-Synchronous SGD (``m = n``: Synchronous SGD); see the module docstring.

    Args:
        n_workers: n.
        m: gradients averaged per update, 1 <= m <= n - round(silent_fraction n).
        time_model: the computation times.
        generator: draws the times and the silent workers.
        cancel_stragglers: cancel the unfinished jobs at the m-th arrival (True) or let them finish and drop
            their stale gradients (False).
        silent_fraction: share of workers that compute nothing in a round (a fresh random set each round).
    """

    def __init__(
        self,
        n_workers: int,
        m: int,
        time_model: ComputeTimeModel,
        generator: torch.Generator | None = None,
        cancel_stragglers: bool = True,
        silent_fraction: float = 0.0,
    ) -> None:
        super().__init__(n_workers, time_model, generator)
        if not 1 <= m <= n_workers:
            raise ConfigError(f"m must be in [1, n_workers] = [1, {n_workers}], got {m}")
        if not 0.0 <= silent_fraction < 1.0:
            raise ConfigError(f"silent_fraction must be in [0, 1), got {silent_fraction}")
        self.silent = round(silent_fraction * n_workers)
        if n_workers - self.silent < m:
            raise ConfigError(
                f"only {n_workers - self.silent} of {n_workers} workers are available per round "
                f"(silent_fraction={silent_fraction}) but m={m} gradients are awaited: lower m or silent_fraction"
            )
        self.m = m
        self.cancel = cancel_stragglers
        self.busy_until = torch.zeros(n_workers, dtype=torch.float64)  # no-cancel mode: end of a stale job

    def step(self, x: Tensor, lr: float, grad_fn: GradFn) -> tuple[Tensor, StepInfo]:
        times = self.time_model.sample(self.n, self.generator)
        available = torch.ones(self.n, dtype=torch.bool)
        silent: list[int] = []
        if self.silent:
            silent = sorted(torch.randperm(self.n, generator=self.generator)[: self.silent].tolist())
            available[silent] = False
        start = torch.full((self.n,), self.clock, dtype=torch.float64)
        if not self.cancel:
            start = torch.maximum(start, self.busy_until)
        end = torch.where(available, start + times, torch.full_like(times, float("inf")))
        order = torch.sort(end, stable=True).indices
        used = order[: self.m].tolist()
        t_next = float(end[used[-1]])
        started = available & (start < t_next)
        n_started = int(started.sum())
        if not self.cancel:
            # stragglers that started on x_k keep their worker busy until they finish; the gradient is dropped
            stale = started.clone()
            stale[used] = False
            self.busy_until = torch.where(stale, end, self.busy_until)
        g = _mean_grad(grad_fn, x, used)
        self.clock = t_next
        dropped = n_started - self.m
        self.stats.updates += 1
        self.stats.computed += n_started
        self.stats.used += self.m
        self.stats.dropped += dropped
        return x - lr * g, StepInfo(t_next, used, times, dropped, silent=silent)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "busy_until": self.busy_until.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.busy_until = state["busy_until"].clone()


class _EventServer(SimulatedServer):
    """Workers that compute without pause: a heap of (finish time, worker, iteration the job started at)."""

    def __init__(self, n_workers: int, time_model: ComputeTimeModel, generator: torch.Generator | None) -> None:
        super().__init__(n_workers, time_model, generator)
        self.k = 0  # server iteration
        self.heap: list[tuple[float, int, int]] = []
        self.started = False

    def _start(self, worker: int, at: float, iteration: int) -> None:
        heapq.heappush(self.heap, (at + self.time_model.sample_worker(worker, self.n, self.generator), worker, iteration))

    def _start_all(self) -> None:
        if not self.started:
            for i in range(self.n):
                self._start(i, self.clock, self.k)
            self.started = True

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "k": self.k, "heap": list(self.heap), "started": self.started}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.k, self.heap, self.started = int(state["k"]), [tuple(e) for e in state["heap"]], bool(state["started"])


class RennalaServer(_EventServer):
    """Rennala SGD: B gradients computed at the current point per update (see the module docstring)."""

    def __init__(self, n_workers: int, batch: int, time_model: ComputeTimeModel,
                 generator: torch.Generator | None = None) -> None:
        super().__init__(n_workers, time_model, generator)
        if batch < 1:
            raise ConfigError(f"Rennala SGD's batch size B must be >= 1, got {batch}")
        self.batch = batch

    def step(self, x: Tensor, lr: float, grad_fn: GradFn) -> tuple[Tensor, StepInfo]:
        self._start_all()
        collected: list[int] = []
        dropped = 0
        while len(collected) < self.batch:
            t, worker, k0 = heapq.heappop(self.heap)
            self.clock = t
            self.stats.computed += 1
            if k0 == self.k:
                collected.append(worker)
            else:
                dropped += 1
            # the worker that completes the batch gets the new point; the others restart at x_k
            self._start(worker, t, self.k + 1 if len(collected) == self.batch else self.k)
        g = _mean_grad(grad_fn, x, collected)
        self.k += 1
        self.stats.updates += 1
        self.stats.used += self.batch
        self.stats.dropped += dropped
        return x - lr * g, StepInfo(self.clock, collected, None, dropped)


class AsyncServer(_EventServer):
    """Asynchronous SGD: one update per arriving gradient (see the module docstring)."""

    def __init__(self, n_workers: int, time_model: ComputeTimeModel, generator: torch.Generator | None = None,
                 stepsize: AsyncStepsize = "delay_adaptive") -> None:
        super().__init__(n_workers, time_model, generator)
        if stepsize not in ("constant", "delay_adaptive"):
            raise ConfigError(f"async stepsize must be 'constant' or 'delay_adaptive', got {stepsize!r}")
        self.stepsize = stepsize
        self.pending: dict[int, Tensor] = {}  # each worker's gradient, computed at the point its job started

    def lr_scale(self, delay: int) -> float:
        """lr_k / lr for a gradient of delay ``delay``."""
        if self.stepsize == "constant" or delay <= self.n:
            return 1.0
        return self.n / delay

    def step(self, x: Tensor, lr: float, grad_fn: GradFn) -> tuple[Tensor, StepInfo]:
        if not self.started:
            for i in range(self.n):
                self.pending[i] = grad_fn(x, i)
            self._start_all()
        t, worker, k0 = heapq.heappop(self.heap)
        self.clock = t
        delay = self.k - k0
        scale = self.lr_scale(delay)
        x_new = x - lr * scale * self.pending[worker]
        self.k += 1
        self.pending[worker] = grad_fn(x_new, worker)
        self._start(worker, t, self.k)
        self.stats.updates += 1
        self.stats.computed += 1
        self.stats.used += 1
        return x_new, StepInfo(t, [worker], None, 0, delay, scale)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "pending": {k: v.clone() for k, v in self.pending.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.pending = {int(k): v.clone() for k, v in state["pending"].items()}


class ServerStepCounter(torch.optim.Optimizer):
    """A no-op optimizer: the simulated server applies the update; ``step()`` only advances Lightning's
    ``global_step`` (which counts optimizer steps), so ``max_steps`` and schedules count server updates."""

    def __init__(self, params: Any) -> None:
        super().__init__(params, {})

    def step(self, closure: Any = None) -> None:  # noqa: D102 - see the class docstring
        if closure is not None:
            with torch.enable_grad():
                closure()
        return None


def _run(server: SimulatedServer, grad_fn: GradFn, x0: Tensor, lr: float, steps: int) -> dict[str, Any]:
    if steps < 0:
        raise ConfigError(f"steps must be >= 0, got {steps}")
    if not lr > 0:
        raise ConfigError(f"lr must be > 0, got {lr}")
    x = x0.clone()
    xs, clock, infos = [x.clone()], [0.0], []
    for _ in range(steps):
        x, info = server.step(x, lr, grad_fn)
        xs.append(x.clone())
        clock.append(info.clock)
        infos.append(info)
    return {"x": torch.stack(xs), "clock": torch.tensor(clock, dtype=torch.float64), "infos": infos,
            "stats": server.stats}


def msync_sgd(
    grad_fn: GradFn,
    x0: Tensor,
    n_workers: int,
    m: int,
    lr: float,
    steps: int,
    time_model: ComputeTimeModel,
    generator: torch.Generator | None = None,
    cancel_stragglers: bool = True,
) -> dict[str, Tensor]:
    """``steps`` updates of m-Synchronous SGD from ``x0``.

    Returns ``x`` (steps+1, d) the iterates, ``clock`` (steps+1,) the simulated time of each, ``worker_times``
    (steps, n) the times drawn at each round's start, ``used`` (steps, m) the workers averaged in each round
    (in arrival order), ``dropped`` (steps,) the cancelled or stale jobs of each round.
    """
    server = MSyncServer(n_workers, m, time_model, generator, cancel_stragglers)
    out = _run(server, grad_fn, x0, lr, steps)
    infos = out.pop("infos")
    d = x0.numel()
    out["worker_times"] = torch.stack([i.worker_times for i in infos]) if infos else torch.zeros(0, n_workers, dtype=torch.float64)
    out["used"] = torch.tensor([i.used for i in infos], dtype=torch.long).reshape(steps, m)
    out["dropped"] = torch.tensor([i.dropped for i in infos], dtype=torch.long)
    out["x"] = out["x"].reshape(steps + 1, d)
    out.pop("stats")
    return out


def rennala_sgd(grad_fn: GradFn, x0: Tensor, n_workers: int, batch: int, lr: float, steps: int,
                time_model: ComputeTimeModel, generator: torch.Generator | None = None) -> dict[str, Any]:
    """``steps`` updates of Rennala SGD with batch size B = ``batch``: ``x``, ``clock``, ``used`` (list per step)."""
    out = _run(RennalaServer(n_workers, batch, time_model, generator), grad_fn, x0, lr, steps)
    out["used"] = [i.used for i in out.pop("infos")]
    return out


def async_sgd(grad_fn: GradFn, x0: Tensor, n_workers: int, lr: float, steps: int, time_model: ComputeTimeModel,
              generator: torch.Generator | None = None, stepsize: AsyncStepsize = "delay_adaptive") -> dict[str, Any]:
    """``steps`` updates of Asynchronous SGD: ``x``, ``clock``, ``worker`` (steps,), ``delay`` (steps,)."""
    out = _run(AsyncServer(n_workers, time_model, generator, stepsize), grad_fn, x0, lr, steps)
    infos = out.pop("infos")
    out["worker"] = torch.tensor([i.used[0] for i in infos], dtype=torch.long)
    out["delay"] = torch.tensor([i.delay for i in infos], dtype=torch.long)
    return out
