"""The noise-corrected spread of client accuracies (000-04, issue 20): Monte Carlo against known true accuracies,
the bootstrap against a naive loop, and ``ClientAccuracy`` against a hand computation."""

from __future__ import annotations

import math

import pytest
import torch

from modules.components.metrics import between_group_variance, noise_corrected_spread
from modules.craft.task import ClientAccuracy


def simulate(p: torch.Tensor, n: torch.Tensor, reps: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``reps`` replicate experiments: client ``i`` answers ``Binomial(n_i, p_i)`` test samples right.
    Returns the corrected variances and the observed (ddof 1) variances, one per replicate."""
    gen = torch.Generator().manual_seed(seed)
    counts = torch.binomial(n.double().expand(reps, -1), p.double().expand(reps, -1), generator=gen)
    corrected = between_group_variance(counts, n.double().expand(reps, -1))
    observed = (counts / n).var(dim=1, correction=1)
    return corrected, observed


def within_mc_error(estimates: torch.Tensor, truth: float, z: float = 4.0) -> bool:
    se = estimates.std().item() / math.sqrt(len(estimates))
    return abs(estimates.mean().item() - truth) < z * se


@pytest.mark.parametrize("sizes", ["large", "small"])
def test_corrected_variance_is_unbiased_for_the_true_between_client_variance(sizes: str) -> None:
    """Known true accuracies, binomial test sets: the estimate averages to the true accuracies' variance.
    Small test sets (3-12 samples) make the exact ``n - 1`` form matter, not only the correction."""
    gen = torch.Generator().manual_seed(1)
    k = 20
    p = 0.7 + 0.29 * torch.rand(k, generator=gen, dtype=torch.float64)
    n = torch.randint(50, 81, (k,), generator=gen) if sizes == "large" else torch.randint(3, 13, (k,), generator=gen)
    truth = p.var(correction=1).item()
    corrected, observed = simulate(p, n, reps=20000, seed=2)
    assert within_mc_error(corrected, truth), (corrected.mean().item(), truth)
    # the test can tell: the uncorrected variance is biased upwards by far more than the Monte Carlo error
    assert not within_mc_error(observed, truth)


def test_equal_true_accuracies_give_a_spread_near_zero() -> None:
    """All clients at 0.9 with 50 test samples: the observed std is pure test-set noise (~0.042)."""
    k, reps = 20, 20000
    p, n = torch.full((k,), 0.9, dtype=torch.float64), torch.full((k,), 50)
    corrected, observed = simulate(p, n, reps=reps, seed=3)
    assert within_mc_error(corrected, 0.0)
    assert observed.sqrt().mean().item() == pytest.approx(math.sqrt(0.9 * 0.1 / 50), rel=0.05)
    # clipped at 0 about half of the time; the clipped spread is a few times smaller than the observed std
    clipped = corrected.clamp_min(0).sqrt()
    assert 0.35 < (corrected <= 0).double().mean().item() < 0.65
    assert clipped.mean().item() < 0.4 * observed.sqrt().mean().item()


def test_bootstrap_interval_against_a_naive_loop() -> None:
    gen = torch.Generator().manual_seed(4)
    k, n_boot = 12, 300
    total = torch.randint(40, 70, (k,), generator=gen).double()
    correct = torch.binomial(total, 0.6 + 0.35 * torch.rand(k, generator=gen, dtype=torch.float64), generator=gen)
    spread, lo, hi = noise_corrected_spread(correct, total, n_boot=n_boot, level=0.9, seed=7)
    assert spread.item() == pytest.approx(max(0.0, between_group_variance(correct, total).item()) ** 0.5)
    # the same resamples by hand: one row of client indices per resample, estimate, clip, root, quantiles
    rows = torch.randint(0, k, (n_boot, k), generator=torch.Generator().manual_seed(7))
    boot = sorted(max(0.0, between_group_variance(correct[r], total[r]).item()) ** 0.5 for r in rows)

    def quantile(q: float) -> float:  # linear interpolation between order statistics, as numpy's default
        pos = q * (n_boot - 1)
        i = int(pos)
        return boot[i] + (pos - i) * (boot[min(i + 1, n_boot - 1)] - boot[i])

    assert lo.item() == pytest.approx(quantile(0.05), rel=1e-9)
    assert hi.item() == pytest.approx(quantile(0.95), rel=1e-9)
    assert lo <= spread <= hi
    # seeded: the same counts give the same interval; another seed another one
    assert torch.equal(
        torch.stack(noise_corrected_spread(correct, total, n_boot=n_boot, level=0.9, seed=7)),
        torch.stack((spread, lo, hi)),
    )
    assert not torch.equal(noise_corrected_spread(correct, total, n_boot=n_boot, level=0.9, seed=8)[1], lo)


def test_bad_counts_are_rejected() -> None:
    with pytest.raises(ValueError, match="at least 2"):
        between_group_variance(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 5.0]))
    with pytest.raises(ValueError, match="k >= 2"):
        between_group_variance(torch.tensor([1.0]), torch.tensor([5.0]))
    # one set of groups or many at once: the same estimates
    c, n = torch.tensor([[3.0, 4.0, 9.0], [1.0, 5.0, 2.0]]), torch.tensor([[5.0, 6.0, 10.0], [4.0, 5.0, 3.0]])
    torch.testing.assert_close(
        between_group_variance(c, n), torch.stack([between_group_variance(c[i], n[i]) for i in range(2)])
    )


def test_client_accuracy_against_a_hand_computation() -> None:
    metric = ClientAccuracy()
    # 20 clients with accuracies 0.05, 0.10, ..., 1.0 (20 samples each), then one client with a single sample
    client = torch.arange(20).repeat_interleave(20)
    correct_per = torch.arange(1, 21)
    preds = torch.cat([torch.cat([torch.ones(k), torch.zeros(20 - k)]) for k in correct_per.tolist()]).long()
    metric.update(preds, torch.ones_like(preds), client)
    metric.update(torch.ones(1, dtype=torch.long), torch.ones(1, dtype=torch.long), torch.tensor([20]))
    out = metric.compute()
    acc = [k / 20 for k in range(1, 21)]
    all_acc = [*acc, 1.0]
    mean = sum(all_acc) / 21
    assert out["mean"].item() == pytest.approx(mean)
    assert out["std"].item() == pytest.approx((sum((a - mean) ** 2 for a in all_acc) / 21) ** 0.5, rel=1e-6)
    assert out["worst10"].item() == pytest.approx((0.05 + 0.10 + 0.15) / 3)
    # the corrected spread leaves out the one-sample client: 20 clients, ddof 1, p (1 - p) / 19
    m20 = sum(acc) / 20
    observed = sum((a - m20) ** 2 for a in acc) / 19
    noise = sum(a * (1 - a) / 19 for a in acc) / 20
    assert out["var_corrected"].item() == pytest.approx(observed - noise, rel=1e-6)
    assert out["noise_std"].item() == pytest.approx(noise**0.5, rel=1e-6)
    assert out["spread_corrected"].item() == pytest.approx((observed - noise) ** 0.5, rel=1e-6)
    assert out["spread_corrected_lo"] <= out["spread_corrected"] <= out["spread_corrected_hi"]
