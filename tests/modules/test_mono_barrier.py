"""MonoBarrier (paper 004-14): the monotone network, the exact corner checks against a fine grid, soundness."""

from __future__ import annotations

import itertools

import pytest
import torch

from datamodules.monotone_systems import (
    MonotoneSystem,
    MonotoneSystemDataModule,
    check_monotone,
    cooperative_linear,
    ctm_traffic,
)
from errors import ConfigError
from modules.mono_barrier import (
    CHECK_TOL,
    BarrierSearch,
    MaxMonotoneNet,
    MonotoneBarrierModule,
    cells_tile,
    certify,
    fit_loglog,
    verify,
)
from modules.protocols import CertificateReport
from tests.helpers import client as store_client

torch.set_num_threads(1)


def ordered_pairs(n: int, count: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(count, n, generator=gen, dtype=torch.float64) * 2
    return x, x + torch.rand(count, n, generator=gen, dtype=torch.float64) * (torch.rand(count, n, generator=gen) < 0.5)


@pytest.mark.parametrize("branch", ["pos_mlp", "minmax"])
def test_max_monotone_net_is_monotone_on_random_ordered_pairs_after_training_moves_its_weights(branch: str) -> None:
    net = MaxMonotoneNet(6, n_branches=4, hidden=8, branch=branch, seed=1)
    with torch.no_grad():  # weights anywhere, as an optimiser may leave them: softplus keeps slopes >= 0
        for p in net.parameters():
            p.add_(3 * torch.randn_like(p))
    x, y = ordered_pairs(6, 4000)
    assert bool((net(x) <= net(y)).all())


@pytest.mark.parametrize("branch", [pytest.param("pos_mlp", marks=pytest.mark.slow), "minmax"])
def test_max_monotone_net_fits_a_staircase(branch: str) -> None:
    """Target: +1 on the upper set of {(0.3, 0.8), (0.6, 0.5), (0.85, 0.2)} in [0, 1]^2, else -1 (a 3-step
    staircase boundary), on cell centres; the learned branches alone (no axis branches) fit its sign to 98 %."""
    torch.manual_seed(0)
    net = MaxMonotoneNet(2, n_branches=6, hidden=8, branch=branch, axis=False, seed=0)
    with torch.no_grad():
        net.d.fill_(0.0)
    corners = torch.tensor([[0.3, 0.8], [0.6, 0.5], [0.85, 0.2]], dtype=torch.float64)
    g = (torch.arange(16, dtype=torch.float64) + 0.5) / 16
    x = torch.cartesian_prod(g, g)
    target = (x[:, None, :] >= corners[None]).all(-1).any(-1).double() * 2 - 1
    opt = torch.optim.Adam(net.parameters(), lr=0.05)
    for _ in range(200):
        opt.zero_grad()
        loss = torch.relu(0.1 - target * net(x)).mean()
        loss.backward()
        opt.step()
    assert float(((net(x) > 0).double() * 2 - 1 == target).double().mean()) >= 0.98


def grid_violations(system: MonotoneSystem, barrier: torch.nn.Module, points: int = 301) -> dict[str, int]:
    """Brute force in 2-D: (C3) at every point of a points x points grid of X and every corner of W, (C1) on a
    grid of X_0, (C2) on the grid points of X_u."""
    axes = [torch.linspace(float(lo), float(hi), points, dtype=torch.float64) for lo, hi in zip(system.x_lo, system.x_hi)]
    x = torch.cartesian_prod(*axes)
    with torch.no_grad():
        b = barrier(x)
        inside = x[b <= 0]
        bad3 = 0
        for w in itertools.product(*zip(system.w_lo.tolist(), system.w_hi.tolist())):
            wt = torch.tensor(w, dtype=torch.float64).expand(len(inside), -1)
            bad3 += int((barrier(system.step(inside, wt)) > 0).sum())
        init = torch.cartesian_prod(*[torch.linspace(float(a), float(c), 21, dtype=torch.float64)
                                      for a, c in zip(system.init_lo, system.init_hi)])
        unsafe = x[(x >= system.unsafe_at).any(1)]
        return {"c3": bad3, "c1": int((barrier(init) > 0).sum()), "c2": int((barrier(unsafe) <= 0).sum())}


def axis_barrier(n: int, threshold: float) -> MaxMonotoneNet:
    """B(x) = max_i (x_i - threshold) / 2 on X = [0, 2]^n (axis branches only, slope 1 in z = x / 2)."""
    net = MaxMonotoneNet(n, n_branches=0, axis=True)
    net.set_box(torch.zeros(n, dtype=torch.float64), 2 * torch.ones(n, dtype=torch.float64))
    net.set_axis_thresholds(torch.full((n,), threshold / 2, dtype=torch.float64))
    return net


def partition_for(system: MonotoneSystem, barrier: MaxMonotoneNet) -> tuple[torch.Tensor, torch.Tensor]:
    """The search's partition for a fixed barrier (one rebuild, no training; thresholds kept)."""
    t = barrier.axis_t.detach().clone()
    search = BarrierSearch(system, barrier, max_queries=10_000, bisect_depth=6)
    barrier.set_axis_thresholds(t)
    search.refine()
    return search.cells_lo, search.cells_hi


def test_certified_barrier_in_2d_has_no_violation_on_a_fine_grid() -> None:
    system = cooperative_linear(2, seed=3, rows="random")
    cert = certify(system, n_branches=4, hidden=8)
    assert cert.certified and cert.queries <= 20
    assert cells_tile(cert.cells_lo, cert.cells_hi, system.x_lo, system.x_hi)
    assert verify(system, cert.barrier, cert.cells_lo, cert.cells_hi)["certified"] == 1.0
    assert grid_violations(system, cert.barrier) == {"c3": 0, "c1": 0, "c2": 0}


@pytest.mark.parametrize("threshold", [0.2, 0.3, 0.37, 0.43, 0.5, 0.7, 0.95])
def test_exact_check_agrees_with_the_grid_on_a_family_of_box_barriers(threshold: float) -> None:
    """x+ = clip(A x + 0.02 + w) with row sums 0.9: B_t = max_i x_i - t is a barrier iff 0.9 t + 0.04 <= t,
    i.e. t >= 0.4 (the worst-case fixed point); the exact check and the grid both say so."""
    system = cooperative_linear(2, seed=0)
    net = axis_barrier(2, threshold)
    lo, hi = partition_for(system, net)
    exact = verify(system, net, lo, hi)["certified"] == 1.0
    grid = grid_violations(system, net)
    assert exact == (threshold > 0.4)
    assert (grid["c3"] == 0) == exact


def test_a_planted_bad_barrier_is_rejected() -> None:
    """A certified barrier whose sublevel set is then shrunk below the fixed point: the exact check rejects
    it, the grid finds the violating states, and the search never certifies it without training."""
    system = cooperative_linear(2, seed=1)
    cert = certify(system, n_branches=2, hidden=4)
    assert cert.certified
    net = cert.barrier
    with torch.no_grad():
        net.axis_t.fill_(0.3 / 2)  # box [0, 0.3]^2 while x* = 0.4: f(0.3, 0.3) = 0.31 leaves it
    assert verify(system, net, cert.cells_lo, cert.cells_hi)["certified"] == 0.0
    lo, hi = partition_for(system, net)
    assert verify(system, net, lo, hi)["certified"] == 0.0
    assert grid_violations(system, net)["c3"] > 0


@pytest.mark.parametrize(("n", "seed"), [(2, 0), pytest.param(5, 1, marks=pytest.mark.slow),
                                         pytest.param(10, 2, marks=pytest.mark.slow)])
def test_unsafe_instances_are_never_certified_and_simulation_shows_the_violation(n: int, seed: int) -> None:
    system = cooperative_linear(n, seed=seed, b=0.1)
    cert = certify(system, n_branches=2, hidden=4, max_rounds=6, steps_per_round=10)
    assert not cert.certified
    assert bool((system.worst_case_trajectory(200) >= system.unsafe_at).any())


def test_certify_n20_within_10n_queries_and_an_independent_check_agrees() -> None:
    system = cooperative_linear(20, seed=0)
    cert = certify(system)
    assert cert.certified and cert.queries <= 200
    report = verify(system, cert.barrier, cert.cells_lo, cert.cells_hi)
    assert report["certified"] == 1.0 and report["checked"] >= 1
    assert cells_tile(cert.cells_lo, cert.cells_hi, system.x_lo, system.x_hi)
    assert not bool((system.worst_case_trajectory(300) >= system.unsafe_at).any())


def test_ctm_is_monotone_and_a_short_freeway_is_certified() -> None:
    system = ctm_traffic(8)
    check_monotone(system, pairs=2000)
    cert = certify(system, n_branches=2, hidden=4)
    assert cert.certified and cert.queries <= 80
    assert verify(system, cert.barrier, cert.cells_lo, cert.cells_hi)["certified"] == 1.0


def test_cells_tile_rejects_gaps_and_overlaps() -> None:
    lo, hi = torch.zeros(2, dtype=torch.float64), torch.ones(2, dtype=torch.float64)
    halves = (torch.tensor([[0.0, 0.0], [0.5, 0.0]], dtype=torch.float64), torch.tensor([[0.5, 1.0], [1.0, 1.0]], dtype=torch.float64))
    assert cells_tile(*halves, lo, hi)
    assert not cells_tile(halves[0][:1], halves[1][:1], lo, hi)  # a gap
    over = (torch.tensor([[0.0, 0.0], [0.4, 0.0]], dtype=torch.float64), torch.tensor([[0.5, 1.0], [0.9, 1.0]], dtype=torch.float64))
    assert not cells_tile(*over, lo, hi)


def test_check_monotone_names_the_failing_pair() -> None:
    good = cooperative_linear(3, seed=0)
    bad = MonotoneSystem(lambda x, w: (1.0 - x).clamp(0, 2), good.x_lo, good.x_hi, good.w_lo, good.w_hi,
                         good.init_lo, good.init_hi, good.unsafe_at, name="flip")
    with pytest.raises(ConfigError, match=r"flip is not monotone: x <= y \(pair \d+\)"):
        check_monotone(bad)


@pytest.mark.parametrize(("init_hi", "message"), [(3.0, "X_0 is outside X at coordinate 0"),
                                                   (1.0, "X_0 meets the unsafe set at coordinate 0")])
def test_bad_initial_sets_are_refused(init_hi: float, message: str) -> None:
    one = torch.ones(2, dtype=torch.float64)
    with pytest.raises(ConfigError, match=message):
        MonotoneSystem(lambda x, w: x, 0 * one, 2 * one, 0 * one, 0 * one, 0 * one, torch.tensor([init_hi, 0.1]), one)


def test_fit_loglog_recovers_a_power_law() -> None:
    n = [10, 20, 50, 100, 200, 500]
    fit = fit_loglog(n + n, [3 * k**1.0 for k in n] + [3.3 * k**1.0 for k in n])
    assert fit["slope"] == pytest.approx(1.0, abs=1e-9) and fit["slope_lo"] < 1.0 < fit["slope_hi"] + 1e-9


def test_the_module_reports_its_certificate_and_refuses_other_data() -> None:
    dm = MonotoneSystemDataModule(n=5, steps_per_round=2)
    task = MonotoneBarrierModule(num_features=5)
    assert isinstance(task, CertificateReport) and task.certificate_report() == {}
    assert dm.num_features == 5
    with pytest.raises(ConfigError, match="refine_every"):
        MonotoneBarrierModule(num_features=5, refine_every=0)
    assert CHECK_TOL > 0


def test_slope_analysis_reads_a_sweeps_runs_and_logs_its_fit(paperlab_tmp: object) -> None:
    """A fake sweep in the test's own MLflow store: queries = 2 n + 1 at n = 10 ... 100 (one uncertified run
    left out); the fit is logged as a run of its own."""

    from modules.mono_barrier import slope_analysis

    client = store_client()  # this test's store: an earlier in-process fit leaves MLflow's process-wide URI
    exp = client.create_experiment("mono_barrier")
    parent = client.create_run(exp, run_name="scaling", tags={"sweep.name": "scaling", "sweep.role": "parent"})
    for n, certified in [(10, 1.0), (20, 1.0), (50, 1.0), (100, 1.0), (100, 0.0)]:
        run = client.create_run(exp, run_name=f"scaling-n={n}-c{certified}", tags={"mlflow.parentRunId": parent.info.run_id})
        client.log_param(run.info.run_id, "data.init_args.n", str(n))
        client.log_metric(run.info.run_id, "diag/certificate/queries", 2 * n + 1)
        client.log_metric(run.info.run_id, "diag/certificate/certified", certified)
        client.set_terminated(run.info.run_id)
    fit = slope_analysis("scaling")
    expected = fit_loglog([10, 20, 50, 100], [21, 41, 101, 201])
    assert fit["slope"] == pytest.approx(expected["slope"]) and fit["runs"] == 4 and fit["uncertified_runs"] == 1
    logged = client.get_run(str(fit["run_id"]))
    assert logged.data.params["sweep"] == "scaling" and logged.data.metrics["slope/slope"] == pytest.approx(fit["slope"])
