"""ELM-Net (004-05): the vectorised network against a per-neuron loop of the equations, parameter budgets against
``numel``, the spike-adding data, the timescale diagnostic and bad input."""

from __future__ import annotations

import math

import pytest
import torch
import yaml

from callbacks.timescale_usage import TimescaleUsage, usage_sums
from datamodules.spike_adding import SpikeAddingDataModule, adding_samples, digit_rate_maps, digit_samples, warped_maps
from errors import ConfigError
from modules.components.metrics import count_parameters
from modules.elm_net import ELMNetwork, ELMTask, budget_config, elm_network_forward, elm_param_count
from modules.protocols import MemoryUsage
from tests.helpers import REPO


def loop_forward(x, p, n_branches, tau_b=5.0, lam=5.0, dt=1.0):
    """The issue's equations, one sample, one step, one neuron, one branch and one synapse at a time."""
    bsz, n_steps, n_in = x.shape
    n, k = p["w_s"].shape
    d_m = p["tau_m"].shape[1]
    per = k // n_branches
    ys = torch.zeros(bsz, n_steps, n, dtype=x.dtype)
    ms = torch.zeros(bsz, n_steps, n, d_m, dtype=x.dtype)
    for s in range(bsz):
        b = torch.zeros(n, n_branches, dtype=x.dtype)
        m = torch.zeros(n, d_m, dtype=x.dtype)
        y = torch.zeros(n, dtype=x.dtype)
        for t in range(n_steps):
            source = torch.cat([x[s, t], y])
            b_new, m_new, y_new = b.clone(), m.clone(), y.clone()
            for i in range(n):
                for g in range(n_branches):
                    total = 0.0
                    for j in range(g * per, (g + 1) * per):
                        total = total + max(float(p["w_s"][i, j]), 0.0) * source[int(p["conn"][i, j])]
                    b_new[i, g] = math.exp(-dt / tau_b) * b[i, g] + total
                kappa_m = torch.exp(-dt / p["tau_m"][i])
                kappa_l = torch.exp(-lam * dt / p["tau_m"][i])
                inp = torch.cat([b_new[i], kappa_m * m[i]])
                hidden = torch.relu(inp @ p["W1"][i] + p["b1"][i])
                proposal = 1.7159 * torch.tanh((2.0 / 3.0) * (hidden @ p["W2"][i] + p["b2"][i]))
                m_new[i] = kappa_m * m[i] + (1 - kappa_l) * proposal
                y_new[i] = p["w_y"][i] @ m_new[i] + p["b_y"][i]
            b, m, y = b_new, m_new, y_new
            ys[s, t], ms[s, t] = y, m
    return ys, ms


def random_params(n_in=5, n=4, k=4, n_branches=2, d_m=3, h=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    conn = torch.stack([torch.randperm(n_in + n, generator=g)[:k] for _ in range(n)])
    conn[0, 0] = n_in  # a neuron reading its own previous output, and one reading another's
    conn[1, 1] = n_in + 3
    return {"w_s": r(n, k), "conn": conn, "W1": r(n, n_branches + d_m, h), "b1": r(n, h), "W2": r(n, h, d_m),
            "b2": r(n, d_m), "tau_m": torch.rand(n, d_m, generator=g, dtype=torch.float64) * 20 + 0.5,
            "w_y": r(n, d_m), "b_y": r(n)}


@pytest.mark.parametrize("seed", [0, 1])
def test_forward_matches_a_per_neuron_loop(seed: int) -> None:
    p = random_params(seed=seed)
    x = (torch.rand(2, 7, 5, generator=torch.Generator().manual_seed(seed)) < 0.5).double()
    y, m = elm_network_forward(x, p, n_branches=2, tau_b=3.0, lambda_value=4.0, dt=0.7)
    y_ref, m_ref = loop_forward(x, p, 2, tau_b=3.0, lam=4.0, dt=0.7)
    assert y.shape == (2, 7, 4) and m.shape == (2, 7, 4, 3)
    torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(m, m_ref, rtol=1e-10, atol=1e-10)


def test_network_runs_its_own_parameters_and_gradients_reach_them() -> None:
    torch.manual_seed(0)
    net = ELMNetwork(n_inputs=6, n_outputs=3, n_neurons=5, d_memory=2, k_conn=4, n_branches=2, learn_tau=True).double()
    x = torch.rand(3, 4, 6, dtype=torch.float64)
    y_net, _ = net.hidden(x)
    p = {k: v.detach() for k, v in net.layer_params().items()}
    y_ref, _ = loop_forward(x, p, 2)
    torch.testing.assert_close(y_net, y_ref, rtol=1e-10, atol=1e-10)
    net(x).sum().backward()
    assert all(p.grad is not None for p in net.parameters())
    tau = net.tau_m()
    assert tau.min() >= 1.0 and tau.max() <= 1000.0
    torch.testing.assert_close(tau[0], torch.tensor([1.0, 1000.0], dtype=torch.float64), rtol=1e-4, atol=1e-3)


def test_wiring_is_fixed_by_the_seed_and_without_repeats() -> None:
    a, b = ELMNetwork(n_neurons=8, seed=3), ELMNetwork(n_neurons=8, seed=3)
    assert torch.equal(a.conn, b.conn) and not torch.equal(a.conn, ELMNetwork(n_neurons=8, seed=4).conn)
    assert all(len(set(row.tolist())) == a.k_conn for row in a.conn)
    assert int(a.conn.max()) < 70 + 8


@pytest.mark.parametrize("kw", [{}, {"learn_tau": True}, {"mlp_hidden": 7, "n_branches": 2, "k_conn": 6},
                                {"n_inputs": 128, "n_outputs": 128, "n_neurons": 3, "d_memory": 5}])
def test_closed_form_count_equals_numel(kw: dict) -> None:
    args = {"n_inputs": 70, "n_outputs": 19, "n_neurons": 9, "d_memory": 4, "k_conn": 16, "n_branches": 4} | kw
    net = ELMNetwork(**args)
    assert elm_param_count(args["n_inputs"], args["n_outputs"], args["n_neurons"], args["d_memory"],
                           args.get("mlp_hidden"), args["k_conn"], args["n_branches"],
                           args.get("learn_tau", False)) == count_parameters(net)


@pytest.mark.parametrize("P", [3_000, 20_000, 40_000])
def test_budget_config_is_the_largest_pair_under_the_budget(P: int) -> None:
    for n in (2, 8, 16):
        got = budget_config(P, 8, n_neurons=n)
        d = got["d_memory"]
        assert got["n_neurons"] == n and got["params"] == count_parameters(ELMNetwork(n_neurons=n, d_memory=d, k_conn=8))
        assert count_parameters(ELMNetwork(n_neurons=n, d_memory=d, k_conn=8)) <= P
        assert count_parameters(ELMNetwork(n_neurons=n, d_memory=d + 1, k_conn=8)) > P
    got = budget_config(P, 8, d_memory=3)
    n = got["n_neurons"]
    assert count_parameters(ELMNetwork(n_neurons=n, d_memory=3, k_conn=8)) <= P
    assert count_parameters(ELMNetwork(n_neurons=n + 1, d_memory=3, k_conn=8)) > P


def test_budget_sweep_points_are_budget_config_pairs() -> None:
    """Every (N, d_m) point of the budget sweep is budget_config's pair for its param_budget and N."""
    sweep = yaml.safe_load((REPO / "configs/elm_net/budget_sweep.yaml").read_text())
    key = "model.init_args.net.init_args."
    for point in sweep["points"]:
        P, n, d = point[key + "param_budget"], point[key + "n_neurons"], point[key + "d_memory"]
        assert budget_config(P, 16, n_neurons=n)["d_memory"] == d, point
    assert {p[key + "param_budget"] for p in sweep["points"]} == {20_000, 80_000}


def test_bad_input_is_one_config_error() -> None:
    with pytest.raises(ConfigError, match="divisible by n_branches"):
        ELMNetwork(k_conn=10, n_branches=4)
    with pytest.raises(ConfigError, match="exceeds the n_inputs"):
        ELMNetwork(n_inputs=4, n_neurons=4, k_conn=12)
    with pytest.raises(ConfigError, match="below one neuron"):
        budget_config(100, 16, n_neurons=4)
    with pytest.raises(ConfigError, match="exactly one"):
        budget_config(20_000, 16)
    with pytest.raises(ConfigError, match="exactly one"):
        budget_config(20_000, 16, n_neurons=8, d_memory=4)
    with pytest.raises(ConfigError, match="param_budget"):
        ELMNetwork(n_neurons=32, d_memory=16, param_budget=20_000)
    with pytest.raises(ConfigError, match=r"\(B, T, 70\)"):
        ELMNetwork(n_neurons=4, d_memory=2)(torch.zeros(2, 5, 7))
    with pytest.raises(ConfigError, match="char_lm"):
        ELMTask(input_shape=(64,), num_classes=128)


def test_task_steps_memory_usage_and_parameter_count() -> None:
    torch.manual_seed(0)
    net = lambda n_in, n_out: ELMNetwork(n_in, n_out, n_neurons=4, d_memory=3, k_conn=8)  # noqa: E731
    task = ELMTask(net, task="seq_class", input_shape=(9, 10), num_classes=19)
    out = task.step((torch.randint(0, 2, (5, 9, 10), dtype=torch.uint8), torch.randint(0, 19, (5,))), "train")
    assert out.preds.shape == (5,) and out.inputs["bpc"] is None and torch.isfinite(out.loss)
    assert isinstance(task, MemoryUsage)
    tau, abs_m = task.memory_usage((torch.ones(2, 9, 10), torch.zeros(2)))
    assert tau.shape == abs_m.shape == (4, 3) and (abs_m > 0).all()
    assert float(task.extra_epoch_metrics("test", {})["test/P"]) == count_parameters(task.net)
    lm = ELMTask(net, task="char_lm", input_shape=(6,), num_classes=128)
    tokens = torch.randint(0, 128, (3, 7))
    out = lm.step((tokens[:, :-1], tokens[:, 1:]), "val")
    bpc, n = out.inputs["bpc"]
    assert n == 18 and out.preds.shape == (18,)
    assert float(bpc) == pytest.approx(float(out.loss.detach()) / math.log(2))
    assert lm.net.n_inputs == 128


def test_warped_maps_shift_and_stretch_the_rate_map() -> None:
    maps = digit_rate_maps(6, 12, seed=0)
    v = warped_maps(maps, jitter=2, warp=0.1)
    assert v.shape == (10, 5, 21, 6, 12)
    torch.testing.assert_close(v[:, 2, 10], maps)  # shift 0, stretch 1
    torch.testing.assert_close(v[:, 3, 10, :, 1:], maps[:, :, :-1])  # one step later
    assert float(v[:, 3, 10, :, 0].abs().max()) == 0.0  # silent before the map starts
    # stretch 1.1 at step t reads the map at t / 1.1: linear interpolation between the two neighbours
    t = 7
    u = t / 1.1
    ref = (1 - (u - 6)) * maps[..., 6] + (u - 6) * maps[..., 7]
    torch.testing.assert_close(v[:, 2, 20, :, t], ref)


def test_spike_frequencies_match_the_rates_and_labels_are_sums() -> None:
    maps = digit_rate_maps(5, 8, seed=1)
    variants = warped_maps(maps, jitter=0, warp=0.0)
    gen = torch.Generator().manual_seed(0)
    spikes = digit_samples(variants, torch.full((20_000,), 3), gen).double().mean(0)
    se = (maps[3].double() * (1 - maps[3].double()) / 20_000).sqrt()
    assert ((spikes - maps[3].double()).abs() <= 5 * se + 1e-9).all()  # Monte Carlo, 5 standard errors
    x, y = adding_samples(maps, 50, gap=3, jitter=1, warp=0.1, seed=2)
    assert x.shape == (50, 19, 5) and x.dtype == torch.uint8
    assert int(x[:, 8:11].sum()) == 0  # the gap is silent
    assert y.min() >= 0 and y.max() <= 18


def test_datamodule_sizes_and_determinism() -> None:
    dm = SpikeAddingDataModule(digit_steps=10, gap=2, n_train=40, n_val=8, n_test=8)
    assert dm.input_shape == (22, 70) and dm.num_classes == 19
    a = dm.build_splits()
    b = SpikeAddingDataModule(digit_steps=10, gap=2, n_train=40, n_val=8, n_test=8).build_splits()
    assert torch.equal(a["train"][0], b["train"][0]) and not torch.equal(a["train"][0][:8], a["test"][0])
    with pytest.raises(ConfigError, match="warp"):
        SpikeAddingDataModule(warp=1.5)


def test_timescale_usage_bands_against_a_direct_count() -> None:
    tau = torch.tensor([[1.0, 5.0, 50.0, 999.0], [2.0, 20.0, 200.0, 700.0]])
    abs_m = torch.tensor([[0.1, 0.3, 0.5, 0.7], [0.2, 0.4, 0.6, 0.8]])
    diag = TimescaleUsage()
    out = diag.finalize(usage_sums(tau, abs_m))
    assert out["abs_m_tau1_10"] == pytest.approx((0.1 + 0.3 + 0.2) / 3)
    assert out["abs_m_tau10_100"] == pytest.approx((0.5 + 0.4) / 2)
    assert out["abs_m_tau100_1000"] == pytest.approx((0.7 + 0.6 + 0.8) / 3)
    w = (abs_m * tau.log10()).sum() / abs_m.sum()
    assert out["weighted_log10_tau"] == pytest.approx(float(w))
    assert out["mean_log10_tau"] == pytest.approx(float(tau.log10().mean()))
    # the network's grid ends at tau_max = 1000 exactly: it belongs to the last decade, not to a band of its own
    grid = torch.logspace(0, 3, 4)[None, :]
    out = diag.finalize(usage_sums(grid, torch.ones_like(grid)))
    assert sorted(k for k in out if k.startswith("abs_m_")) == ["abs_m_tau100_1000", "abs_m_tau10_100", "abs_m_tau1_10"]
    assert out["abs_m_tau100_1000"] == 1.0
