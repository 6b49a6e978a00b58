"""SyntheticSpikesDataModule (002-08): sessions, splits and held-out sessions as documented; counts against their
rates (Monte Carlo, tolerances in standard errors); behaviour against its closed form."""

from __future__ import annotations

import pytest
import torch

from datamodules.synthetic_spikes import SyntheticSpikesDataModule, behaviour_of
from errors import ConfigError


@pytest.fixture(scope="module")
def dm() -> SyntheticSpikesDataModule:
    data = SyntheticSpikesDataModule(n_sessions=4, n_heldout=2, n_trials=20, n_bins=30, units_range=(20, 40),
                                     data_seed=3, batch_size=8)
    data.setup()
    return data


def test_splits_sessions_and_shapes(dm: SyntheticSpikesDataModule) -> None:
    assert dm.splits is not None
    counts, mask, session, behaviour, latents, rates = dm.splits["train"]
    assert counts.shape == (2 * 16, 30, 40) and mask.shape == (32, 40) and behaviour.shape == (32, 30, 2)
    assert set(session.tolist()) == {0, 1}  # held-out sessions never reach the tokenizer's training
    assert set(dm.splits["val"][2].tolist()) == {0, 1}
    assert set(dm.splits["test"][2].tolist()) == {0, 1, 2, 3}
    probe = dm.probe_split()
    assert set(probe[2].tolist()) == {0, 1, 2, 3} and probe[0].shape[0] == 4 * 16
    # every session's units: a prefix of the slots, 20-40 of them, the padded slots silent
    for s in range(4):
        m = probe[1][probe[2] == s]
        n = int(m[0].sum())
        assert 20 <= n <= 40 and (m == m[0]).all() and m[0, :n].all()
        assert (probe[0][probe[2] == s][..., n:] == 0).all()
    assert dm.input_shape == (30, 40) and dm.num_classes == 2
    assert torch.allclose(behaviour, behaviour_of(latents))


def test_behaviour_is_the_documented_map() -> None:
    z = torch.tensor([[0.3, -1.2, 2.0]])
    assert torch.allclose(behaviour_of(z), torch.tensor([[torch.tanh(torch.tensor(-1.2)), torch.sin(torch.tensor(2.0))]]))


def test_counts_have_the_rates_as_mean_and_variance(dm: SyntheticSpikesDataModule) -> None:
    counts, mask, _, _, _, rates = dm.probe_split()
    valid = mask[:, None, :].expand_as(counts)
    resid = (counts - rates)[valid].double()
    n = resid.numel()
    assert abs(resid.mean()) < 4 * (rates[valid].double().mean() / n) ** 0.5
    # E[(c - lambda)^2] = lambda for Poisson counts
    excess = resid.pow(2) - rates[valid].double()
    assert abs(excess.mean()) < 4 * excess.std() / n**0.5


def test_the_fast_session_moves_faster(dm: SyntheticSpikesDataModule) -> None:
    latents, session = dm.probe_split()[4], dm.probe_split()[2]
    speed = [float(latents[session == s].diff(dim=1).norm(dim=-1).mean()) for s in range(4)]
    assert speed[3] > 1.5 * max(speed[:3])


def test_the_data_is_a_function_of_its_seed() -> None:
    a = SyntheticSpikesDataModule(n_sessions=2, n_heldout=1, n_trials=10, n_bins=5, data_seed=1).simulate()
    b = SyntheticSpikesDataModule(n_sessions=2, n_heldout=1, n_trials=10, n_bins=5, data_seed=1).simulate()
    c = SyntheticSpikesDataModule(n_sessions=2, n_heldout=1, n_trials=10, n_bins=5, data_seed=2).simulate()
    assert torch.equal(a[1][0], b[1][0]) and not torch.equal(a[1][0], c[1][0])


def test_bad_arguments() -> None:
    with pytest.raises(ConfigError, match="held-out"):
        SyntheticSpikesDataModule(n_sessions=2, n_heldout=2)
    with pytest.raises(ConfigError, match="n_trials"):
        SyntheticSpikesDataModule(n_trials=5)
    with pytest.raises(ConfigError, match="units_range"):
        SyntheticSpikesDataModule(units_range=(50, 10))
