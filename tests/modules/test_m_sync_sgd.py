"""m-Synchronous SGD (paper 002-11): time model, event clock, servers against loops, module, DDP hook, claims."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import Logger

from datamodules.dist_problems import DistProblemDataModule, make_quadratic
from errors import ConfigError
from main import cli_main
from modules.components.compute_time import (
    ComputeTimeModel,
    harmonic,
    msync_time_shape,
    rennala_lower_bound,
    rennala_time_shape,
)
from modules.components.worker_sim import AsyncServer, MSyncServer, RennalaServer, async_sgd, rennala_sgd
from modules.m_sync_sgd import SimulatedDistributedSGD, msync_sgd
from tests.helpers import REPO, CleanDistributedExit, TwoRankRegression, runs_of


class Scripted:
    """A time model that returns a scripted sequence of rounds (duck-types ComputeTimeModel)."""

    kind = "scripted"

    def __init__(self, rounds: list[list[float]]) -> None:
        self.rounds = [torch.tensor(r, dtype=torch.float64) for r in rounds]
        self.k = 0

    def check_workers(self, n: int) -> None:
        pass

    def sample(self, n: int, generator=None) -> torch.Tensor:
        out = self.rounds[self.k]
        self.k += 1
        return out


def zero_grad(x: torch.Tensor, worker: int) -> torch.Tensor:
    return torch.zeros_like(x)


# --- the time model ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind,shift", [("exponential", 0.0), ("shifted_exponential", 0.5)])
def test_mean_round_time_is_the_mth_order_statistic(kind: str, shift: float) -> None:
    """E[round] = shift + (H_n - H_{n-m}) / rate, by Monte Carlo with a tolerance of 4 standard errors."""
    n, m, rate, steps = 8, 3, 2.0, 1500
    model = ComputeTimeModel(kind, rate=rate, shift=shift)
    out = msync_sgd(zero_grad, torch.zeros(2), n, m, 0.1, steps, model, torch.Generator().manual_seed(1))
    rounds = out["clock"].diff()
    expected = shift + (harmonic(n) - harmonic(n - m)) / rate
    se = float(rounds.std()) / math.sqrt(steps)
    assert abs(float(rounds.mean()) - expected) < 4 * se, (float(rounds.mean()), expected, se)
    assert model.expected_order_statistic(n, m) == pytest.approx(expected, rel=1e-12)
    # the rounds are the m-th smallest of each round's draws
    assert torch.allclose(rounds, out["worker_times"].sort(1).values[:, m - 1])


def test_time_model_kinds_have_their_moments() -> None:
    gen = torch.Generator().manual_seed(0)
    n = 200_000
    exp = ComputeTimeModel("exponential", rate=4.0).sample(n, gen)
    assert float(exp.mean()) == pytest.approx(0.25, abs=4 * 0.25 / math.sqrt(n))
    logn = ComputeTimeModel("lognormal", rate=2.0, shift=1.0, sigma=0.5).sample(n, gen)
    mean = 1.0 + math.exp(0.5**2 / 2) / 2.0
    sd = math.sqrt((math.exp(0.25) - 1) * math.exp(0.25)) / 2.0
    assert float(logn.mean()) == pytest.approx(mean, abs=4 * sd / math.sqrt(n))
    assert float(logn.min()) > 1.0
    fixed = ComputeTimeModel("fixed", taus=[3.0, 1.0])
    assert fixed.sample(2).tolist() == [3.0, 1.0] and fixed.sample_worker(1, 2) == 1.0


# --- m-Sync SGD ------------------------------------------------------------------------------------------------
def test_used_are_the_m_fastest_and_updates_match_a_loop() -> None:
    d, n, m, lr, steps = 5, 6, 2, 0.3, 25
    a = torch.linspace(0.5, 2.0, d, dtype=torch.float64)
    c = torch.randn(n, d, generator=torch.Generator().manual_seed(3), dtype=torch.float64)

    def grad(x: torch.Tensor, i: int) -> torch.Tensor:
        return a * x + c[i]

    x0 = torch.ones(d, dtype=torch.float64)
    out = msync_sgd(grad, x0, n, m, lr, steps, ComputeTimeModel("lognormal", sigma=1.0), torch.Generator().manual_seed(7))
    assert out["x"].shape == (steps + 1, d) and out["clock"].shape == (steps + 1,)
    assert out["worker_times"].shape == (steps, n) and out["used"].shape == (steps, m)
    # independent reference: the m smallest draws of each round, by topk, and the update by a plain loop
    fastest = torch.topk(out["worker_times"], m, dim=1, largest=False).indices
    assert torch.equal(fastest.sort(1).values, out["used"].sort(1).values)
    x = x0.clone()
    clock = 0.0
    for k in range(steps):
        idx = fastest[k]
        x = x - lr * (a * x + c[idx]).mean(0)
        clock += float(out["worker_times"][k].sort().values[m - 1])
        assert torch.allclose(out["x"][k + 1], x, atol=1e-12), k
    assert float(out["clock"][-1]) == pytest.approx(clock, rel=1e-12)
    assert out["dropped"].tolist() == [n - m] * steps


def test_without_cancellation_stragglers_keep_their_worker_busy() -> None:
    # round 1: times [1, 3]; the server steps at t = 1 and worker 1 is still busy until 3.
    # round 2: times [5, 0.5]: with cancellation worker 1 restarts at 1 and wins at 1.5; without, it starts
    # only at 3 and wins at 3.5 (worker 0 would finish at 6).
    rounds = [[1.0, 3.0], [5.0, 0.5]]
    cancel = msync_sgd(zero_grad, torch.zeros(1), 2, 1, 0.1, 2, Scripted(rounds), cancel_stragglers=True)
    keep = msync_sgd(zero_grad, torch.zeros(1), 2, 1, 0.1, 2, Scripted(rounds), cancel_stragglers=False)
    assert cancel["clock"].tolist() == [0.0, 1.0, 1.5]
    assert keep["clock"].tolist() == [0.0, 1.0, 3.5]
    assert cancel["used"].tolist() == keep["used"].tolist() == [[0], [1]]


def test_silent_workers_never_answer() -> None:
    n, m = 8, 3
    server = MSyncServer(n, m, ComputeTimeModel("fixed", taus=[float(i + 1) for i in range(n)]),
                         torch.Generator().manual_seed(0), silent_fraction=0.25)
    x = torch.zeros(1)
    for _ in range(50):
        t0 = server.clock
        x, info = server.step(x, 0.1, zero_grad)
        assert len(info.silent) == 2 and not set(info.silent) & set(info.used)
        available = [i for i in range(n) if i not in info.silent]
        assert info.used == available[:m]  # fixed times: the m lowest indices among the available ones
        assert server.clock - t0 == pytest.approx(available[m - 1] + 1.0)


# --- the baselines -------------------------------------------------------------------------------------------
def test_async_with_fixed_times_makes_sum_floor_t_over_tau_updates() -> None:
    taus = [1.0, 1.7, 2.3, 3.9]
    T = 20.5
    out = async_sgd(zero_grad, torch.zeros(1), 4, 0.1, 60, ComputeTimeModel("fixed", taus=taus))
    made = int((out["clock"][1:] <= T).sum())
    assert made == sum(math.floor(T / t) for t in taus)
    # each worker's gradient arrives every tau_i: the updates of worker 3 come at 3.9, 7.8, ...
    arrivals = out["clock"][1:][out["worker"] == 3]
    assert torch.allclose(arrivals[:4], torch.tensor([3.9, 7.8, 11.7, 15.6], dtype=torch.float64))


def test_async_delays_and_delay_adaptive_stepsize() -> None:
    server = AsyncServer(4, ComputeTimeModel("fixed", taus=[1.0, 1.0, 1.0, 10.0]), stepsize="delay_adaptive")
    x = torch.zeros(1)
    infos = []
    for _ in range(40):
        x, info = server.step(x, 1.0, zero_grad)
        infos.append(info)
    slow = [i for i in infos if i.used == [3]]
    assert slow[0].delay == 30  # the 3 fast workers made 30 updates by t = 10 (ties at 10 go to them first)
    assert slow[0].lr_scale == pytest.approx(4 / slow[0].delay)
    assert all(i.lr_scale == 1.0 for i in infos if i.delay <= 4)
    assert AsyncServer(4, ComputeTimeModel(), stepsize="constant").lr_scale(100) == 1.0


def test_rennala_clock_by_hand() -> None:
    # n = 2, tau = [1, 1.5], B = 2, ties to the lower worker:
    # t=1 w0 fresh; t=1.5 w1 fresh -> update 1 (w1 restarts on x_1, w0 keeps computing on x_0)
    # t=2 w0 stale (dropped), restarts on x_1; t=3 w0 fresh, t=3 w1 fresh -> update 2 (w1 restarts on x_2)
    # t=4 w0 stale (dropped); t=4.5 w1 fresh; t=5 w0 fresh -> update 3
    out = rennala_sgd(zero_grad, torch.zeros(1), 2, 2, 0.1, 3, ComputeTimeModel("fixed", taus=[1.0, 1.5]))
    assert out["clock"].tolist() == [0.0, 1.5, 3.0, 5.0]
    assert out["used"] == [[0, 1], [0, 1], [1, 0]]
    assert out["stats"].dropped == 2


def test_rennala_batch_is_averaged_at_the_current_point() -> None:
    d = 3
    a = torch.tensor([1.0, 2.0, 0.5], dtype=torch.float64)
    c = torch.tensor([[1.0, 0, 0], [0, 1.0, 0], [0, 0, 1.0]], dtype=torch.float64)
    out = rennala_sgd(lambda x, i: a * x + c[i], torch.ones(d, dtype=torch.float64), 3, 4, 0.2, 10,
                      ComputeTimeModel("exponential"), torch.Generator().manual_seed(2))
    x = torch.ones(d, dtype=torch.float64)
    for k, used in enumerate(out["used"]):
        x = x - 0.2 * torch.stack([a * x + c[i] for i in used]).mean(0)
        assert torch.allclose(out["x"][k + 1], x, atol=1e-12)


# --- bad input ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "build,match",
    [
        (lambda: MSyncServer(8, 0, ComputeTimeModel()), "m must be in"),
        (lambda: MSyncServer(8, 9, ComputeTimeModel()), "m must be in"),
        (lambda: ComputeTimeModel("exponential", rate=0.0), "rate must be a positive"),
        (lambda: ComputeTimeModel("lognormal", rate=-1.0), "rate must be a positive"),
        (lambda: MSyncServer(3, 1, ComputeTimeModel("fixed", taus=[1.0, 2.0])), "2 taus but there are 3 workers"),
        (lambda: MSyncServer(8, 7, ComputeTimeModel(), silent_fraction=0.25), "only 6 of 8 workers"),
        (lambda: ComputeTimeModel("fixed"), "needs taus"),
        (lambda: ComputeTimeModel("exponential", shift=1.0), "shifted_exponential"),
        (lambda: RennalaServer(4, 0, ComputeTimeModel()), "batch size B"),
        (lambda: SimulatedDistributedSGD(n_workers=4, m=5), "m must be in"),
        (lambda: SimulatedDistributedSGD(method="async", silent_fraction=0.25), "synchronous methods"),
        (lambda: SimulatedDistributedSGD(lr=0.0), "lr must be a positive"),
    ],
)
def test_bad_input_is_a_clear_error(build, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        build()


# --- the Lightning module ------------------------------------------------------------------------------------
def _fit_module(model: SimulatedDistributedSGD, dm: DistProblemDataModule, steps: int, callbacks=()) -> L.Trainer:
    trainer = L.Trainer(max_steps=steps, max_epochs=-1, accelerator="cpu", devices=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0, limit_val_batches=0, callbacks=list(callbacks))
    trainer.fit(model, datamodule=dm)
    return trainer


def test_module_steps_are_server_updates_equal_to_the_functional_form() -> None:
    dm = DistProblemDataModule(dim=10, sigma=0.5, steps_per_epoch=7)
    model = SimulatedDistributedSGD(n_workers=6, m=2, lr=0.4, seed=3,
                                    time_model=ComputeTimeModel("lognormal", sigma=1.0))
    trainer = _fit_module(model, dm, 15)
    assert trainer.global_step == 15 and model.server.stats.updates == 15
    problem = make_quadratic(6, dim=10, sigma=0.5)
    noise = torch.Generator().manual_seed(6)  # the module's streams: noise seed 2s, times 2s + 1
    ref = msync_sgd(lambda x, i: problem.stochastic_grad(x, i, noise), problem.x0(), 6, 2, 0.4, 15,
                    ComputeTimeModel("lognormal", sigma=1.0), torch.Generator().manual_seed(7))
    assert torch.allclose(model.x.detach(), ref["x"][-1], atol=1e-12)
    assert model.sim_clock()["seconds"] == pytest.approx(float(ref["clock"][-1]), rel=1e-12)


def test_msync_time_shape_under_fixed_times_is_the_mth_smallest_tau_and_has_its_minimum_at_sigma2_over_epsilon() -> None:
    """``train/msync_time_shape`` of the sqrt-times claim (docs/papers/m_sync_sgd.md, claim 2): tau_(m) (1 + sigma^2
    / (m epsilon)) with tau_(m) the m-th smallest of the fixed times, here sqrt(m) for tau_i = sqrt(i) given in a
    shuffled order (so that the m-th smallest is neither the m-th listed nor the m-th largest). By hand it is
    7.069, 5.999, 5.656, 5.999, 7.071 for m = 2, 4, 8, 16, 32, smallest at m* = sigma^2 / epsilon = 8. The same
    runs log Rennala SGD's bound: its term at m, its minimum 3.564 and argmin 12 (see the brute-force tests)."""
    sigma, eps, n = 0.2828, 0.01, 32
    taus = [math.sqrt(i) for i in range(1, n + 1)]
    shuffled = [taus[int(j)] for j in torch.randperm(n, generator=torch.Generator().manual_seed(0))]
    logged = {}
    for m in (2, 4, 8, 16, 32):
        model = SimulatedDistributedSGD(n_workers=n, m=m, lr=0.4, epsilon=eps, seed=0,
                                        time_model=ComputeTimeModel("fixed", taus=shuffled))
        trainer = _fit_module(model, DistProblemDataModule(dim=10, sigma=sigma, steps_per_epoch=1), 1)
        expected = math.sqrt(m) * (1 + sigma**2 / (m * eps))
        assert model.msync_time_shape() == pytest.approx(expected, rel=1e-12), m
        logged[m] = float(trainer.callback_metrics["train/msync_time_shape"])  # logged in float32
        assert logged[m] == pytest.approx(expected, rel=1e-6), m
        bound = {k: float(trainer.callback_metrics[f"train/{k}"]) for k in ("rennala_bound_at_m", "rennala_bound",
                                                                             "rennala_bound_argmin")}
        harmonic_mean = m / sum(1 / math.sqrt(i) for i in range(1, m + 1))
        assert bound["rennala_bound_at_m"] == pytest.approx(harmonic_mean * (1 + sigma**2 / (m * eps)), rel=1e-6), m
        assert bound["rennala_bound"] == pytest.approx(3.564, abs=1e-3) and bound["rennala_bound_argmin"] == 12
    assert [round(logged[m], 3) for m in (2, 4, 8, 16, 32)] == [7.069, 5.999, 5.656, 5.999, 7.071]
    assert min(logged, key=logged.get) == 8


def test_rennala_bound_for_sqrt_times_is_smallest_at_m_12_by_hand() -> None:
    """tau_i = sqrt(i), n = 32, sigma^2 / epsilon = 8: (m + 8) / sum_{i<=m} i^(-1/2) by a plain loop is 3.5849,
    3.5697, 3.5643, 3.5663 for m = 10..13 (smallest at 12; 3.6601 at m = 8, 3.6014 at 16), while m-Sync's own
    shape sqrt(m) (1 + 8 / m) is smallest at m = 8 (5.6569; 5.7735 at 12)."""
    n, s = 32, 8.0
    taus = [math.sqrt(i) for i in range(n, 0, -1)]  # listed slowest first: the functions must sort
    by_hand = {10: 3.5849, 11: 3.5697, 12: 3.5643, 13: 3.5663, 8: 3.6601, 16: 3.6014}
    for m, v in by_hand.items():
        assert rennala_time_shape(taus, m, s) == pytest.approx(v, abs=1e-4), m
    assert rennala_lower_bound(taus, s) == (pytest.approx(3.5643, abs=1e-4), 12)
    assert msync_time_shape(taus, 8, s) == pytest.approx(5.6569, abs=1e-4)
    assert msync_time_shape(taus, 12, s) == pytest.approx(5.7735, abs=1e-4)
    assert min(range(1, n + 1), key=lambda m: msync_time_shape(taus, m, s)) == 8


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_rennala_bound_is_the_best_subset_and_sandwiches_the_batch_collection_time(seed: int) -> None:
    """Two independent references for random fixed times (n = 8):
    - brute force over all 255 subsets S of workers: min_S (|S| + s) / sum_{i in S} 1/tau_i is the bound (the m
      fastest are the best subset of size m);
    - an event loop: the time T(s) for the n workers, each computing back to back, to finish s gradients in all
      (one Rennala batch of s = sigma^2 / epsilon) satisfies T(s) <= bound <= 2 T(s): the harmonic-mean form is
      the batch time up to a factor 2, which m-Sync's tau_(m) form is not (checked on tau_i = sqrt(i))."""
    from itertools import combinations

    gen = torch.Generator().manual_seed(seed)
    n = 8
    taus = (0.2 + 5 * torch.rand(n, generator=gen, dtype=torch.float64) ** 2).tolist()
    for s in (0.0, 3.0, 8.0, 40.0):
        value, argmin = rennala_lower_bound(taus, s)
        subsets = [c for k in range(1, n + 1) for c in combinations(range(n), k)]
        brute = min(subsets, key=lambda c: (len(c) + s) / sum(1 / taus[i] for i in c))
        assert value == pytest.approx((len(brute) + s) / sum(1 / taus[i] for i in brute), rel=1e-12), s
        assert argmin == len(brute) and sorted(taus[i] for i in brute) == sorted(taus)[:argmin], s
        if s >= 1:
            finish = sorted(t * k for t in taus for k in range(1, int(s) + 2))  # every worker's finishing times
            collect = finish[int(s) - 1]  # the s-th gradient to finish
            assert collect <= value <= 2 * collect, (s, collect, value)
    sq = [math.sqrt(i) for i in range(1, 33)]
    finish = sorted(t * k for t in sq for k in range(1, 10))
    collect = finish[7]  # s = 8
    assert collect <= rennala_lower_bound(sq, 8.0)[0] <= 2 * collect
    assert min(msync_time_shape(sq, m, 8.0) for m in range(1, 33)) > 2 * collect


def test_seed_none_is_the_run_seed_the_cli_sets_after_construction() -> None:
    """seed None reads run_seed at setup (the CLI sets it after __init__): the same simulation as seed = run_seed,
    another one for another run seed."""
    def final(seed: int | None, run_seed: int) -> tuple[torch.Tensor, float]:
        model = SimulatedDistributedSGD(n_workers=6, m=2, lr=0.4, seed=seed,
                                        time_model=ComputeTimeModel("lognormal", sigma=1.0))
        model.run_seed = run_seed
        _fit_module(model, DistProblemDataModule(dim=10, sigma=0.5, steps_per_epoch=7), 5)
        return model.x.detach().clone(), model.server.clock

    (x3, t3), (x_run3, t_run3), (x_run4, t_run4) = final(3, 0), final(None, 3), final(None, 4)
    assert torch.equal(x3, x_run3) and t3 == t_run3
    assert not torch.equal(x3, x_run4) and t3 != t_run4


def test_simulated_clock_logs_the_first_hitting_time_and_stops() -> None:
    from callbacks.simulated_clock import SimulatedClock

    dm = DistProblemDataModule(dim=10, sigma=0.0, mu=0.3, steps_per_epoch=100)
    model = SimulatedDistributedSGD(n_workers=4, m=2, lr=0.5, epsilon=1e-2, seed=1)
    clock = SimulatedClock(target=1e-2)
    trainer = _fit_module(model, dm, 300, [clock])
    # without noise this is gradient descent: |grad f(x_k)|^2 = sum_j (lam_j (1 - lr lam_j)^k x0_j)^2
    problem = make_quadratic(4, dim=10, sigma=0.0, mu=0.3)
    lam, x0 = problem.abar, problem.x0()
    k_hit = next(k for k in range(1, 300) if float((lam * (1 - 0.5 * lam) ** k * x0).pow(2).sum()) <= 1e-2)
    assert clock.reached_step == k_hit == trainer.global_step  # stopped there
    assert clock.reached_at == pytest.approx(model.server.clock)
    assert trainer.callback_metrics["train/time_to_target"] == pytest.approx(model.server.clock)


class _Capture(Logger):
    """Every ``log_metrics`` call, in memory."""

    name, version = "capture", "0"

    def __init__(self) -> None:
        super().__init__()
        self.logged: list[tuple[int | None, dict[str, float]]] = []

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.logged.append((step, dict(metrics)))

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass

    def train_values(self, step: int) -> dict[str, float]:
        return {k: v for s, m in self.logged if s == step for k, v in m.items() if k.startswith("train/")}


def test_the_step_loader_resumes_within_an_epoch() -> None:
    """The train loader is resumable (so the CLI writes checkpoints within epochs): after a checkpoint at batch 3
    of epoch 1 it yields batches 3.. of that epoch, and whole epochs after it."""
    loader = DistProblemDataModule(steps_per_epoch=6).train_dataloader()
    loader.sampler.set_epoch(1)
    it = iter(loader)
    [next(it) for _ in range(3)]
    state = loader.state_dict()
    assert state == {"epoch": 1, "consumed": 3}
    fresh = DistProblemDataModule(steps_per_epoch=6).train_dataloader()
    fresh.load_state_dict(state)
    fresh.sampler.set_epoch(1)
    assert [int(b) for b in fresh] == [3, 4, 5]
    fresh.sampler.set_epoch(2)
    assert [int(b) for b in fresh] == list(range(6))


@pytest.mark.parametrize("method", ["msync", "rennala"])
def test_a_resume_within_an_epoch_logs_the_epoch_values_of_an_uninterrupted_run(method: str, tmp_path: Path) -> None:
    """Epochs of 10 server updates; a checkpoint at update 15, in the middle of the second epoch. A fresh module
    and trainer resumed from it log the same train/* values at the end of that epoch (update 20) as the run that
    went straight through: the epoch's training-metric state (train/loss averages updates 11..20, 5 of them
    before the checkpoint) and the simulator (clock, jobs, noise and time streams) both travel in it."""

    def fit(ckpt_path: str | None = None, checkpoint_every: int = 0) -> tuple[_Capture, SimulatedDistributedSGD]:
        dm = DistProblemDataModule(dim=10, sigma=0.5, steps_per_epoch=10)
        model = SimulatedDistributedSGD(n_workers=6, m=2, method=method, lr=0.4, seed=3,
                                        time_model=ComputeTimeModel("lognormal", sigma=1.0))
        logger = _Capture()
        saves = [ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=checkpoint_every, save_top_k=-1)]
        trainer = L.Trainer(max_steps=20, max_epochs=-1, accelerator="cpu", devices=1, logger=logger,
                            callbacks=saves if checkpoint_every else [], enable_checkpointing=bool(checkpoint_every),
                            enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                            limit_val_batches=0)
        trainer.fit(model, datamodule=dm, ckpt_path=ckpt_path)
        return logger, model

    straight, straight_model = fit(checkpoint_every=15)
    (ckpt,) = tmp_path.glob("*.ckpt")
    assert torch.load(ckpt, weights_only=False)["global_step"] == 15
    resumed, resumed_model = fit(ckpt_path=str(ckpt))
    assert resumed_model.server.stats.updates == 20
    assert torch.equal(resumed_model.x.detach(), straight_model.x.detach())
    expected = straight.train_values(20)
    assert {"train/loss", "train/sim_seconds", "train/updates", "train/dropped_share"} <= set(expected)
    assert straight.train_values(10) != expected  # the epochs differ: the comparison can tell them apart
    got = resumed.train_values(20)
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, rel=1e-12, abs=0), key


def test_divergence_stops_the_run_without_a_nonfinite_point() -> None:
    dm = DistProblemDataModule(dim=10, sigma=0.1, steps_per_epoch=200)
    model = SimulatedDistributedSGD(n_workers=4, m=2, lr=3.0, seed=0)  # lr L > 2: diverges
    trainer = _fit_module(model, dm, 200)
    assert model.diverged and trainer.global_step < 200
    assert bool(torch.isfinite(model.x).all())


def test_fit_and_test_through_the_cli_reach_the_target(paperlab_tmp: Path) -> None:
    """The default experiment (m = 8, lr 0.8) reaches |grad f|^2 <= 0.01 in ~90 server updates and stops there."""
    config = str(REPO / "configs" / "m_sync_sgd" / "quadratic_exp.yaml")
    args = ["--config", config, "--run.name", "cli"]
    assert cli_main(["fit", *args, "--trainer.max_steps", "300"]) == 0
    assert cli_main(["test", *args, "--ckpt_path", "last"]) == 0
    (run,) = runs_of("m_sync_sgd")
    metrics = run.data.metrics
    assert metrics["train/target_reached"] == 1.0 and metrics["train/steps_to_target"] < 300
    assert metrics["train/time_to_target"] == pytest.approx(metrics["train/sim_seconds"])
    assert metrics["test/grad_norm_sq"] <= 0.01 and metrics["test/sim_seconds"] == pytest.approx(metrics["train/sim_seconds"])
    assert run.data.tags["paper_id"] == "002-11"


# --- the real path: MSyncDDPStrategy on 2 gloo processes ------------------------------------------------------
def _regression(out: str) -> TwoRankRegression:
    """w in R^3, rank r's data; rank 0 and 1 report the hook's selection and clock."""
    def report(strategy) -> dict:
        state = strategy.hook_state
        return {"selected": state.last_selected, "clock": state.clock}
    return TwoRankRegression(out, dim=3, init=0.5, data_seed=100, rows=8, report=report)


def test_msync_strategy_with_m1_keeps_the_faster_rank(tmp_path: Path) -> None:
    """2 gloo processes, forked (about 1 s; spawned ones re-import torch and Lightning, about a minute on a busy
    machine). Forking is safe here: the suite runs torch on one thread (tests/conftest.py)."""
    from modules.components.ddp_hooks import MSyncDDPStrategy, MSyncHookState

    out = str(tmp_path / "w")
    model = _regression(out)
    times = ComputeTimeModel("lognormal", sigma=1.0)
    strategy = MSyncDDPStrategy(m=1, time_model=times, seed=5, start_method="fork")
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy=strategy, max_steps=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[CleanDistributedExit()])
    trainer.fit(model)
    results = [json.loads(Path(f"{out}.{r}").read_text()) for r in (0, 1)]
    ref_state = MSyncHookState(1, times, 5, 2, 0)
    fast = ref_state.fastest(0)[0]
    assert results[0]["selected"] == results[1]["selected"] == [fast]
    assert results[0]["clock"] == pytest.approx(float(ref_state.times(0).min()))
    # independent reference: the faster rank's own gradient step
    grads = _regression(out).rank_grads()
    expected = torch.full((3,), 0.5) - 0.1 * grads[fast]
    for r in results:
        assert torch.allclose(torch.tensor(r["w"]), expected, atol=1e-6)
    # the other rank's step would differ: the test can tell them apart
    other = torch.full((3,), 0.5) - 0.1 * grads[1 - fast]
    assert not torch.allclose(other, expected, atol=1e-3)


# --- the claims at reduced scale (slow): the sweeps' problem, time models, step-size ladders and budgets ----------
# (configs/m_sync_sgd/*_sweep.yaml), on the servers directly (no Lightning), with other seeds than the sweeps.
LADDER = {1: (0.1, 0.2, 0.4), 2: (0.2, 0.4, 0.8), 4: (0.4, 0.8, 1.6), 8: (0.4, 0.8, 1.6), 16: (0.4, 0.8, 1.6),
          24: (0.4, 0.8, 1.6), 32: (0.4, 0.8, 1.6)}
SEEDS = (10, 11, 12)


def _hitting_time(make_server, lr: float, seed: int, max_steps: int = 600, n: int = 32) -> float:
    """Simulated seconds until |grad f|^2 <= epsilon = 0.01 on the sweeps' quadratic (inf if never)."""
    problem = make_quadratic(n, mu=0.04, sigma=0.2828)
    noise = torch.Generator().manual_seed(2 * seed)
    server = make_server(torch.Generator().manual_seed(2 * seed + 1))
    x = problem.x0()
    for _ in range(max_steps):
        x, info = server.step(x, lr, lambda z, i: problem.stochastic_grad(z, i, noise))
        if float(problem.grad(x).pow(2).sum()) <= 0.01:
            return info.clock
        if not bool(torch.isfinite(x).all()) or float(x.abs().max()) > 1e6:
            return math.inf
    return math.inf


def _best(make_server, lrs, max_steps: int = 600) -> float:
    """The best over step sizes of the mean hitting time over 3 seeds (a step size counts only if every seed
    reaches epsilon, as in compare's n = 3 rows)."""
    return min(sum(_hitting_time(make_server, lr, s, max_steps) for s in SEEDS) / len(SEEDS) for lr in lrs)


def _msync_best(m: int, times: ComputeTimeModel, silent_fraction: float = 0.0) -> float:
    return _best(lambda g: MSyncServer(32, m, times, g, silent_fraction=silent_fraction), LADDER[m])


EXP = ComputeTimeModel("exponential")
LOGN = ComputeTimeModel("lognormal", sigma=1.5)
SQRT = ComputeTimeModel("fixed", taus=[math.sqrt(i) for i in range(1, 33)])


@pytest.mark.slow
def test_claim_best_m_is_within_2x_of_rennala_and_async_under_exponential_times() -> None:
    msync = min(_msync_best(m, EXP) for m in (1, 2, 4))
    rennala = min(_best(lambda g, b=b: RennalaServer(32, b, EXP, g), LADDER[b]) for b in (2, 4, 8))
    asyn = _best(lambda g: AsyncServer(32, EXP, g), (0.071, 0.1, 0.141), max_steps=1500)
    assert msync <= 2 * min(rennala, asyn), (msync, rennala, asyn)


@pytest.mark.slow
def test_claim_synchronous_sgd_is_2x_slower_than_the_best_m_under_lognormal_times() -> None:
    best = min(_msync_best(m, LOGN) for m in (1, 2, 4))
    assert _msync_best(32, LOGN) >= 2 * best


@pytest.mark.slow
def test_claim_the_best_m_under_sqrt_times_lies_on_the_flat_part_between_both_optima() -> None:
    """What the runs can resolve: the best m lies in [4, 16], around m-Sync's own optimum (8) and Rennala's bound's
    (12). The spec's +-30 % window around 12 is not asserted: the page finds it inconclusive (m = 6..14 within noise)."""
    times = {m: _msync_best(m, SQRT) for m in (2, 4, 8, 16, 32)}
    m_best = min(times, key=times.get)
    assert 4 <= m_best <= 16, times


@pytest.mark.slow
def test_claim_silent_workers_slow_m8_by_less_than_1_5x_and_m24_by_more_than_2x() -> None:
    """25 % of the workers silent per round: m = 8 loses < 1.5x, m = 24 (every available worker) > 2x, as the
    order statistics predict (E tau_(8:24) / E tau_(8:32) = 1.40, E tau_(24:24) / E tau_(24:32) = 2.82)."""
    ratio = {m: _msync_best(m, EXP, 0.25) / _msync_best(m, EXP) for m in (8, 24)}
    assert ratio[8] < 1.5 and ratio[24] > 2.0, ratio
    assert EXP.expected_order_statistic(24, 8) / EXP.expected_order_statistic(32, 8) == pytest.approx(1.40, abs=0.01)
    assert EXP.expected_order_statistic(24, 24) / EXP.expected_order_statistic(32, 24) == pytest.approx(2.82, abs=0.01)
