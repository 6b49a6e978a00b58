"""ScaleBITS (paper 004-09) and ``modules.components.fake_quant``: RTN against a per-group loop, the greedy
allocation against brute force, reordering against the FP logits, Delta_b against measured loss changes."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F
from scipy.stats import spearmanr

from errors import ConfigError
from modules.components.fake_quant import quantize_rtn, quantize_ste
from modules.components.tiny_gpt import TinyGPT
from modules.scalebits import (
    ScaleBITSQuantizer,
    allocate_bits,
    gini,
    greedy_round,
    random_allocation,
    reorder_channels,
    tile_layout,
)


def rtn_loop(w: torch.Tensor, bits: int, group_size: int) -> torch.Tensor:
    """The issue's formula, one group of one row at a time, in Python floats."""
    out = w.clone()
    levels = 2**bits - 1
    for r in range(w.shape[0]):
        for c0 in range(0, w.shape[1], group_size):
            vals = w[r, c0 : c0 + group_size].tolist()
            lo, hi = min(vals), max(vals)
            if hi == lo:
                continue
            s = (hi - lo) / levels
            for j, v in enumerate(vals):
                out[r, c0 + j] = lo + min(max(round((v - lo) / s), 0), levels) * s
    return out


@pytest.mark.parametrize("bits", [2, 3, 4])
def test_rtn_matches_a_per_group_loop_and_keeps_dtype(bits: int) -> None:
    g = torch.Generator().manual_seed(bits)
    w = torch.randn(6, 32, generator=g, dtype=torch.float64)
    w[2, 8:16] = 0.7  # a constant group stays as it is
    q = quantize_rtn(w, bits, 8)
    assert q.dtype == w.dtype and q.shape == w.shape
    assert torch.allclose(q, rtn_loop(w, bits, 8), atol=1e-12)
    assert torch.equal(q[2, 8:16], w[2, 8:16])
    groups = q.reshape(6, 4, 8)
    assert all(len(set(grp.tolist())) <= 2**bits for grp in groups.reshape(-1, 8))
    # the extremes of each group are levels: represented exactly
    wg = w.reshape(6, 4, 8)
    assert torch.allclose(groups.amax(-1), wg.amax(-1)) and torch.allclose(groups.amin(-1), wg.amin(-1))
    w32 = w.float()
    assert quantize_rtn(w32, bits, 8).dtype == torch.float32


def test_straight_through_forward_is_rtn_and_backward_the_identity() -> None:
    w = torch.randn(4, 16, requires_grad=True)
    q = quantize_ste(w, 2, 16)
    assert torch.equal(q.detach(), quantize_rtn(w.detach(), 2, 16))
    (q * torch.arange(64.0).view(4, 16)).sum().backward()
    assert torch.equal(w.grad, torch.arange(64.0).view(4, 16))


def brute_force(costs: list[list[float]], bits: list[int], budget: float) -> float:
    """The least total cost over every allocation that meets the budget (equal block sizes)."""
    best = math.inf
    for alloc in itertools.product(range(len(bits)), repeat=len(costs)):
        if sum(bits[a] for a in alloc) <= budget * len(costs) + 1e-9:
            best = min(best, sum(c[a] for c, a in zip(costs, alloc)))
    return best


@pytest.mark.parametrize("budget", [2.0, 2.5, 3.0, 3.5])
def test_greedy_one_block_a_round_equals_brute_force_on_separable_convex_costs(budget: float) -> None:
    bits = [2, 3, 4]
    g = torch.Generator().manual_seed(int(budget * 10))
    n = 6
    # cost of block i at each width: convex in the bits removed (increments grow as bits fall)
    steps = torch.rand(n, 2, generator=g, dtype=torch.float64).cumsum(1)  # [4->3, 3->2], increasing
    costs = [[float(s[0] + s[1]), float(s[0]), 0.0] for s in steps]  # at 2, 3, 4 bits
    calls = []

    def marginal(alloc: torch.Tensor) -> torch.Tensor:
        calls.append(alloc.clone())
        idx = (alloc - 2).tolist()  # 0: 2 bits, 1: 3, 2: 4
        return torch.tensor([c[i - 1] - c[i] if i > 0 else 0.0 for c, i in zip(costs, idx)], dtype=torch.float64)

    alloc = allocate_bits(marginal, torch.full((n,), 256), bits, budget, round_frac=0.05)
    total = sum(c[a - 2] for c, a in zip(costs, alloc.tolist()))
    assert total == pytest.approx(brute_force(costs, bits, budget), abs=1e-12)
    assert alloc.sum() <= budget * n and alloc.sum() + 1 > budget * n  # stopped the moment the budget held
    assert all(int((b - a).abs().sum()) == 1 for a, b in zip(calls, calls[1:]))  # one block a round


def test_a_round_ranks_by_cost_per_size_and_bit_and_stops_at_the_budget() -> None:
    alloc = torch.tensor([4, 4, 3, 2])
    sizes = torch.tensor([100, 10, 10, 10])
    cost = torch.tensor([50.0, 10.0, 4.0, 0.0])  # per size and bit: 0.5, 1.0, 0.4, (at min bits)
    # total 490 bits over 130 weights; block 2 (0.4) goes first: 480 <= 3.75 * 130 = 487.5, so it stops there
    new, done = greedy_round(alloc, cost, sizes, [2, 3, 4], 3.75, k=4)
    assert new.tolist() == [4, 4, 2, 2] and done
    # then block 0 (0.5): 380 <= 3.5 * 130 = 455
    new, done = greedy_round(alloc, cost, sizes, [2, 3, 4], 3.5, k=4)
    assert new.tolist() == [3, 4, 2, 2] and done
    # k = 2 blocks a round: the same two, budget not met yet
    new, done = greedy_round(alloc, cost, sizes, [2, 3, 4], 2.5, k=2)
    assert new.tolist() == [3, 4, 2, 2] and not done
    assert alloc.tolist() == [4, 4, 3, 2]  # the input is left alone


def test_random_allocation_mixes_the_two_widths_around_the_budget() -> None:
    gen = torch.Generator().manual_seed(0)
    alloc = random_allocation(100, [2, 3, 4], 2.5, gen)
    assert set(alloc.tolist()) == {2, 3} and alloc.float().mean() <= 2.5 and (alloc == 2).sum() == 50
    assert set(random_allocation(10, [2, 3, 4], 3.0, gen).tolist()) == {3}
    mixed = random_allocation(8, [2, 3, 4], 3.25, gen)
    assert sorted(mixed.tolist()) == [3] * 6 + [4] * 2


def test_gini_against_closed_forms() -> None:
    assert gini(torch.ones(10)) == pytest.approx(0.0)
    assert gini(torch.tensor([0.0, 0.0, 0.0, 5.0])) == pytest.approx(3 / 4)
    x = torch.rand(50, generator=torch.Generator().manual_seed(1))
    pairs = (x[:, None] - x[None, :]).abs().sum() / (2 * 50 * 50 * x.mean())  # mean absolute difference form
    assert gini(x) == pytest.approx(float(pairs), abs=1e-6)


def tiny_net(seed: int = 0) -> TinyGPT:
    torch.manual_seed(seed)
    return TinyGPT(16, 32, n_layer=2, n_head=2, n_embd=32, norm="rmsnorm").double()


@pytest.mark.parametrize("mode", ["rows", "cols", "both"])
def test_reordering_keeps_the_fp_logits(mode: str) -> None:
    net = tiny_net()
    x = torch.randint(0, 32, (4, 16), generator=torch.Generator().manual_seed(0))
    before = net(x)
    gen = torch.Generator().manual_seed(1)
    sens = {k: torch.rand(p.shape, generator=gen, dtype=torch.float64) for k, p in net.named_parameters()}
    perms = reorder_channels(net, sens, mode)
    assert any(not torch.equal(p, torch.arange(len(p))) for p in perms.values())  # something moved
    assert (net(x) - before).abs().max() < 1e-5
    # the first value head's channels are sorted by the score: descending along the permuted rows
    fc = "blocks.0.mlp.fc.weight"
    score = (sens[fc].sum(1) if mode != "cols" else 0) + (sens["blocks.0.mlp.proj.weight"].sum(0) if mode != "rows" else 0)
    assert torch.all(score[perms[fc]][:-1] >= score[perms[fc]][1:])


def quantizer(**kw: object) -> ScaleBITSQuantizer:
    args = dict(fp_steps=0, net=lambda s, v: tiny_net(), input_shape=(16,), num_classes=32, calib_batches=4)
    args.update(kw)
    m = ScaleBITSQuantizer(**args)  # type: ignore[arg-type]
    gen = torch.Generator().manual_seed(2)
    for _ in range(m.calib_batches):
        x = torch.randint(0, 32, (8, 16), generator=gen)
        m.calib.append((x, (x * 3 + 1) % 32))
    return m


def test_prepare_reorders_without_changing_the_fp_model() -> None:
    m = quantizer(reorder="both")
    x = m.calib[0][0]
    before = m.net(x)
    m.prepare()
    assert (m.net(x) - before).abs().max() < 1e-5
    assert bool(m.ready) and not bool(m.done) and 0 < float(m.gini) < 1


def test_quantized_state_puts_every_tile_at_its_own_width() -> None:
    m = quantizer(reorder="none")
    alloc = torch.randint(2, 5, m.alloc.shape, generator=torch.Generator().manual_seed(3))
    state = m.quantized_state(alloc)
    params = dict(m.net.named_parameters())
    for t in m.layout:
        w = params[t.name].detach()
        for r in range(t.rows):
            for c in range(t.cols):
                bits = int(alloc[t.offset + r * t.cols + c])
                rows, cols = slice(16 * r, 16 * (r + 1)), slice(16 * c, 16 * (c + 1))
                assert torch.equal(state[t.name][rows, cols], quantize_rtn(w[rows, cols], bits, 16))


def calib_loss(m: ScaleBITSQuantizer, alloc: torch.Tensor) -> float:
    with torch.no_grad():
        return float(sum(F.cross_entropy(m.quantized_logits(x, alloc).flatten(0, 1), y.flatten()) for x, y in m.calib))


def test_delta_b_ranks_blocks_like_their_measured_loss_change() -> None:
    m = quantizer(reorder="none")
    m.prepare()
    alloc = m.alloc.clone()
    alloc[::3] = 3  # a mixed current model: some blocks at 3 bits, the rest at 4
    predicted = m.marginal_costs(alloc)
    base = calib_loss(m, alloc) / len(m.calib)
    measured = []
    blocks = list(range(0, len(alloc), 4))  # 24 of the 96 blocks, from every weight: the suite's time budget
    predicted = predicted[blocks]
    for b in blocks:
        lowered = alloc.clone()
        lowered[b] -= 1
        measured.append(calib_loss(m, lowered) / len(m.calib) - base)
    rho = spearmanr(predicted.numpy(), measured).statistic
    print(f"Spearman {rho:.3f}")
    assert rho >= 0.8, rho


def test_the_greedy_fit_meets_the_budget_and_lowers_cheap_blocks_first() -> None:
    m = quantizer(reorder="none", round_frac=0.25, budget_bits=3.0)
    m.prepare()
    while not bool(m.done):
        m.greedy_step()
    assert m.avg_bits() <= 3.0 and int(m.rounds) <= 4


def test_user_errors() -> None:
    with pytest.raises(ConfigError, match="outside"):
        quantizer(budget_bits=1.5)
    with pytest.raises(ConfigError, match="sorted"):
        quantizer(bits=[4, 2, 3])
    with pytest.raises(ConfigError, match="does not divide"):
        tile_layout(TinyGPT(16, 32, n_layer=1, n_head=2, n_embd=24), 16)
    with pytest.raises(ConfigError, match="does not divide"):
        quantizer(tile=64)  # the tiny net's width is 32
    with pytest.raises(ConfigError, match="uniform"):
        quantizer(allocation="uniform", budget_bits=2.5)
    with pytest.raises(ConfigError, match="divide"):
        quantize_rtn(torch.zeros(4, 10), 2, 4)
    with pytest.raises(ConfigError, match="fp_ckpt"):
        ScaleBITSQuantizer(fp_ckpt="/nonexistent/last.ckpt")
