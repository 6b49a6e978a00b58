"""Spike tokenizer benchmark (paper 002-08): the VQ layer, the tokenizers and the probes against independent
references (naive loops, brute force, torch's and numpy's own estimators)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.stats import entropy

from errors import ConfigError
from modules.components.neural_metrics import lagged_counts
from modules.components.vector_quantizer import EMAVectorQuantizer, codebook_perplexity
from modules.spike_tokenizers import SpikeTokenizerAE, build_tokenizer, poisson_nll, token_bits_per_second
from modules.spike_tokenizers.probes import (
    RidgeProbe,
    drop_units,
    fano_factors,
    jitter_spikes,
    pairwise_correlations,
    pca_basis,
)
from modules.spike_tokenizers.tokenizers import _patches, _unpatch, rotary

KINDS = ("count", "patch", "pop_ae", "vqvae", "event")


def _counts(b: int = 3, t: int = 10, u: int = 7, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    counts = torch.poisson(torch.full((b, t, u), 0.8), generator=gen)
    mask = torch.ones(b, u, dtype=torch.bool)
    mask[:, -2:] = False
    return counts * mask[:, None, :], mask


# --- the vector quantiser -----------------------------------------------------------------------------------------


def test_vq_assigns_the_nearest_code_like_a_brute_force_search() -> None:
    vq = EMAVectorQuantizer(16, 5).eval()
    z = torch.randn(40, 5, generator=torch.Generator().manual_seed(1))
    brute = torch.tensor([min(range(16), key=lambda k: float(((zi - vq.codebook[k]) ** 2).sum())) for zi in z])
    assert torch.equal(vq.assign(z), brute)


def test_vq_ema_update_matches_a_naive_loop_and_is_k_means_at_zero_decay() -> None:
    gen = torch.Generator().manual_seed(2)
    vq = EMAVectorQuantizer(6, 3, decay=0.9, eps=1e-5, dead_threshold=0.0)
    z = torch.randn(50, 3, generator=gen, dtype=torch.float32)
    codes = vq.assign(z)
    size0, sum0 = vq.cluster_size.clone(), vq.embed_sum.clone()
    vq.ema_update(z, codes)
    for k in range(6):
        members = z[codes == k]
        n_k = 0.9 * size0[k] + 0.1 * len(members)
        s_k = 0.9 * sum0[k] + 0.1 * members.sum(0)
        assert torch.allclose(vq.cluster_size[k], n_k)
        total = 0.9 * size0.sum() + 0.1 * 50
        smoothed = (n_k + 1e-5) / (total + 6e-5) * total
        assert torch.allclose(vq.codebook[k], s_k / smoothed, atol=1e-5)
    # decay 0, no smoothing: one Lloyd step (each used code moves to its cluster's mean)
    km = EMAVectorQuantizer(6, 3, decay=0.0, eps=0.0, dead_threshold=0.0)
    codes = km.assign(z)
    km.ema_update(z, codes)
    for k in codes.unique():
        assert torch.allclose(km.codebook[k], z[codes == k].mean(0), atol=1e-5)


def test_vq_straight_through_gradient_commitment_and_data_init() -> None:
    vq = EMAVectorQuantizer(8, 4, beta=0.25)
    z = torch.randn(20, 4, requires_grad=True)
    z_q, codes, commitment = vq(z)
    assert bool(vq.initialised)  # the first training call puts the codes on the batch
    e = vq.codebook[codes]
    (z_q * torch.arange(4.0)).sum().backward()
    assert torch.allclose(z.grad, torch.arange(4.0).expand(20, 4))  # identity through the quantiser
    vq.eval()
    z_q, codes, commitment = vq(z.detach())
    e = vq.codebook[codes]
    assert torch.allclose(z_q, e, atol=1e-6)
    assert torch.allclose(commitment, 0.25 * ((z.detach() - e) ** 2).mean())


def test_vq_resets_dead_codes_onto_batch_vectors() -> None:
    vq = EMAVectorQuantizer(4, 2, decay=0.5, dead_threshold=0.3)
    vq.init_from(torch.tensor([[0.0, 0.0], [10.0, 10.0], [20.0, 20.0], [30.0, 30.0]]))  # in a random order
    z = torch.randn(32, 2, generator=torch.Generator().manual_seed(3)) * 0.1  # all near the code at the origin
    used = int(vq.assign(z[:1]))
    vq.ema_update(z, vq.assign(z))
    vq.ema_update(z, vq.assign(z))  # unused codes' usage: 1 -> 0.5 -> 0.25 < 0.3
    assert int(vq.resets) == 3
    for k in set(range(4)) - {used}:
        assert any(torch.allclose(vq.codebook[k], zi) for zi in z)


def test_codebook_perplexity_against_scipy_entropy() -> None:
    counts = torch.tensor([5, 0, 3, 9, 1])
    assert math.isclose(codebook_perplexity(counts), math.exp(entropy(counts.numpy())), rel_tol=1e-12)
    assert codebook_perplexity(torch.full((7,), 3)) == pytest.approx(7.0)
    assert codebook_perplexity(torch.tensor([0, 4, 0])) == pytest.approx(1.0)
    assert codebook_perplexity(torch.zeros(3, dtype=torch.long)) == 0.0


def test_vq_refuses_bad_shapes() -> None:
    with pytest.raises(ConfigError, match="codebook_size"):
        EMAVectorQuantizer(0, 4)
    with pytest.raises(ConfigError, match="decay"):
        EMAVectorQuantizer(4, 4, decay=1.0)
    with pytest.raises(ConfigError, match=r"\(N, 4\)"):
        EMAVectorQuantizer(4, 4)(torch.zeros(3, 5))


# --- tokenizers ---------------------------------------------------------------------------------------------------


def test_poisson_nll_against_torch_on_the_valid_units() -> None:
    counts, mask = _counts()
    log_rates = torch.randn(counts.shape, generator=torch.Generator().manual_seed(4))
    valid = mask[:, None, :].expand_as(counts)
    ref = torch.nn.functional.poisson_nll_loss(log_rates[valid], counts[valid], log_input=True, full=False)
    assert torch.allclose(poisson_nll(log_rates, counts, mask), ref)


@pytest.mark.parametrize("kind", KINDS)
def test_every_tokenizer_reconstructs_every_bin_and_ignores_padded_slots(kind: str) -> None:
    torch.manual_seed(0)
    counts, mask = _counts(t=10, u=7)
    tok = build_tokenizer(kind, 7, 8, 16, None, 16, 3, 2, 0.25).eval()
    out = tok(counts, mask)
    assert out.log_rates.shape == counts.shape
    per_neuron = kind in ("count", "patch")
    assert out.features.shape[:2] == (3, 10) and (out.features.dim() == 4) == per_neuron
    assert (out.codes is not None) == (kind in ("count", "vqvae"))
    if kind in ("count", "patch", "event"):  # slot-wise or attention-masked: a padded slot is never read
        noisy = counts.clone()
        noisy[:, :, -2:] = 5.0
        again = tok(noisy, mask)
        assert torch.allclose(again.log_rates[..., :-2], out.log_rates[..., :-2], atol=1e-5)


def test_count_tokenizer_table_equals_running_the_head_on_every_token() -> None:
    torch.manual_seed(0)
    counts, mask = _counts(u=5)
    counts[0, 0, 0] = 12.0  # clipped to the last id
    tok = build_tokenizer("count", 5, 8, 16, None, 16, 3, 1, 0.25)
    out = tok(counts, mask)
    for b, t, u in [(0, 0, 0), (1, 3, 2), (2, 9, 4)]:
        c = int(min(counts[b, t, u], 7))
        token = tok.count_emb.weight[c] + tok.unit_emb.weight[u]
        assert torch.allclose(out.features[b, t, u], token)
        assert torch.allclose(out.log_rates[b, t, u], tok.head(token)[0])


def test_patches_round_trip_and_pad_the_tail() -> None:
    x = torch.arange(2 * 10 * 3, dtype=torch.float32).view(2, 10, 3)
    p = _patches(x, 4)
    assert p.shape == (2, 3, 3, 4)
    assert torch.equal(p[1, 1, 2], x[1, 4:8, 2])
    assert torch.equal(p[0, 2, 0, 2:], torch.zeros(2))
    assert torch.equal(_unpatch(p, 10), x)


def test_rotary_is_a_rotation_whose_inner_products_depend_on_the_offset_only() -> None:
    gen = torch.Generator().manual_seed(5)
    q, k = torch.randn(8, generator=gen, dtype=torch.float64), torch.randn(8, generator=gen, dtype=torch.float64)
    pos = torch.tensor(3.0, dtype=torch.float64)
    assert torch.allclose(rotary(q, pos).norm(), q.norm())
    a = rotary(q, torch.tensor(5.0)) @ rotary(k, torch.tensor(2.0))
    b = rotary(q, torch.tensor(9.0)) @ rotary(k, torch.tensor(6.0))
    assert torch.allclose(a, b)


def test_token_bits_per_second() -> None:
    assert token_bits_per_second("count", 100, 64, 512, None, 5, 1) == (5000.0, 3.0)
    assert token_bits_per_second("vqvae", 100, 64, 512, None, 5, 1) == (12.5, 9.0)
    assert token_bits_per_second("pop_ae", 100, 64, 512, None, 5, 1) == (50.0, 2048.0)
    assert token_bits_per_second("patch", 100, 16, 512, 5, 5, 1) == (1000.0, 512.0)
    assert token_bits_per_second("event", 100, 64, 512, None, 5, 2) == (20.0, 2048.0)


def test_task_refuses_bad_arguments() -> None:
    with pytest.raises(ConfigError, match="input_shape"):
        SpikeTokenizerAE(input_shape=(50,))
    with pytest.raises(ConfigError, match="probe_dims_per_unit"):
        SpikeTokenizerAE(kind="count", d_token=8, probe_dims_per_unit=9)
    with pytest.raises(ConfigError, match="kind must be one of"):
        SpikeTokenizerAE(kind="bpe")  # type: ignore[arg-type]


# --- probes and measures ------------------------------------------------------------------------------------------


def test_lagged_matches_a_naive_loop() -> None:
    counts, _ = _counts(b=2, t=6, u=3)
    out = lagged_counts(counts, 3)
    for b in range(2):
        for t in range(6):
            for lag in range(3):
                want = counts[b, t - lag] if t - lag >= 0 else torch.zeros(3)
                assert torch.equal(out[b, t, lag * 3 : lag * 3 + 3], want)


def test_fano_and_pairwise_correlations_against_numpy() -> None:
    counts, _ = _counts(b=4, t=20, u=5, seed=6)
    flat = counts.reshape(-1, 5).double().numpy()
    live = flat.mean(0) > 0
    fano = np.zeros(5)
    fano[live] = flat[:, live].var(0, ddof=1) / flat[:, live].mean(0)
    got = fano_factors(counts).double().numpy()
    np.testing.assert_allclose(got[live], fano[live], rtol=1e-5)
    assert (got[~live] == 0).all()
    corr = np.corrcoef(flat[:, live].T)
    iu = np.triu_indices(int(live.sum()), 1)
    np.testing.assert_allclose(pairwise_correlations(counts[..., torch.from_numpy(live)]).numpy(), corr[iu], atol=1e-10)


def test_pca_basis_spans_the_leading_directions() -> None:
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(2000, 4, generator=gen, dtype=torch.float64) * torch.tensor([5.0, 0.1, 2.0, 0.2])
    basis = pca_basis(torch.cov(x.T), 2)
    assert torch.allclose(basis.abs(), torch.tensor([[1.0, 0], [0, 0], [0, 1.0], [0, 0]], dtype=torch.float64), atol=0.05)


def test_ridge_probe_chooses_the_penalty_that_scores_best_on_held_back_trials() -> None:
    gen = torch.Generator().manual_seed(8)
    x = torch.randn(30, 10, 6, generator=gen, dtype=torch.float64)
    y = x[..., :2] @ torch.tensor([[1.0, 0.5], [-0.5, 1.0]], dtype=torch.float64) + 0.3 * torch.randn(
        30, 10, 2, generator=gen, dtype=torch.float64)
    alphas = (1e-3, 1e2, 1e6)
    probe = RidgeProbe(alphas).fit(x, y)
    scores = {}
    for a in alphas:
        scores[a] = float(((RidgeProbe((a,)).fit(x[:24], y[:24]).predict(x[24:]) - y[24:]) ** 2).sum())
    assert probe.alpha == min(scores, key=scores.__getitem__)
    assert probe.alpha != 1e6


def test_perturbations_drop_and_jitter() -> None:
    counts, mask = _counts(b=2, t=8, u=7, seed=9)
    gen = torch.Generator().manual_seed(0)
    dropped = drop_units(counts, mask, 0.5, gen)
    silent = (dropped.sum(1) == 0) & (counts.sum(1) > 0)
    assert silent.any() and torch.equal(dropped[~silent[:, None, :].expand_as(counts)], counts[~silent[:, None, :].expand_as(counts)])
    jittered = jitter_spikes(counts, torch.Generator().manual_seed(1))
    for b in range(2):
        for u in range(7):
            shifts = [s for s in (-1, 0, 1) if torch.equal(jittered[b, :, u], counts[b, (torch.arange(8) - s).clamp(0, 7), u])]
            assert shifts


# --- analyses over runs -------------------------------------------------------------------------------------------


def test_t_interval_against_scipy() -> None:
    from scipy import stats

    from modules.spike_tokenizers.analysis import t_interval

    values = [0.3, 0.1, 0.25, 0.4]
    mean, lo, hi = t_interval(values)
    ref = stats.t.interval(0.95, 3, loc=np.mean(values), scale=stats.sem(values))
    assert mean == pytest.approx(np.mean(values)) and (lo, hi) == pytest.approx(ref)


def test_dissociation_pairs_and_population_contrast_by_hand() -> None:
    from modules.spike_tokenizers.analysis import dissociation_pairs, population_contrast

    def run(bits: float, r2: float) -> dict[str, float]:
        return {"test/bits_per_spike": bits, "test/decode_r2": r2, "drop": bits}

    table = {"a": {0: run(2.0, 0.5), 1: run(2.1, 0.6)}, "b": {0: run(1.0, 0.8), 1: run(1.2, 0.8)},
             "c": {0: run(0.5, 0.9), 1: run(0.4, 0.7)}}
    rows = dissociation_pairs(table)
    assert {(r["better_reconstructor"], r["better_decoder"]) for r in rows} == {("a", "b"), ("a", "c"), ("b", "c")}
    top = rows[0]
    assert (top["better_reconstructor"], top["better_decoder"]) == ("a", "b")
    assert top["decode_gap"] == pytest.approx(0.25) and top["bits_gain"] == pytest.approx(0.95)
    c = population_contrast(table, {"a": "count", "b": "vqvae", "c": "event"}, "drop")
    # seed 0: (1.0 + 0.5) / 2 - 2.0 = -1.25; seed 1: (1.2 + 0.4) / 2 - 2.1 = -1.3
    assert c["diff"] == pytest.approx(-1.275) and c["seeds"] == 2.0
