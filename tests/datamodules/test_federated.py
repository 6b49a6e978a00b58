"""FederatedDataModule: clients' local train/val splits, test sets drawn from a held-out pool, loaders."""

from __future__ import annotations

import pytest
import torch

from datamodules.federated import FederatedDataModule
from errors import ConfigError


def test_local_splits_test_pool_and_global_test_union() -> None:
    dm = FederatedDataModule(n_clients=20, alpha=0.1, min_size=10, val_fraction=0.1, partition_seed=3)
    dm.setup()
    x, y, offsets = dm.splits["train"]
    xv, yv, cv = dm.splits["val"]
    xt, yt, ct = dm.splits["test"]
    assert offsets[0] == 0 and offsets[-1] == len(y) and len(offsets) == 21
    pool, idx = dm.pool_indices, dm.indices
    # every digit once: in a client's train or val part, or in the test pool (30 % of every class)
    assert len(y) + len(yv) + len(pool) == 1797
    assert len(torch.unique(torch.cat([idx["train"], idx["val"], pool]))) == 1797
    digits_y = torch.cat([y, yv])  # the clients' labels; the pool's per-class share is 30 %
    for c in range(10):
        n_pool = int((dm_labels(dm)[pool] == c).sum())
        assert n_pool == round(0.3 * (n_pool + int((digits_y == c).sum())))
    # the test sets come from the pool only: disjoint from every client's training and validation data
    assert set(idx["test"].tolist()) <= set(pool.tolist())
    assert not set(idx["test"].tolist()) & (set(idx["train"].tolist()) | set(idx["val"].tolist()))
    assert torch.equal(torch.bincount(ct), torch.full((20,), 50))
    assert torch.equal(torch.unique(cv), torch.arange(20))
    for c in range(20):
        n_train = int(offsets[c + 1] - offsets[c])
        n_val = int((cv == c).sum())
        assert n_train + n_val >= 10 and n_val == max(1, round(0.1 * (n_train + n_val)))
        # a client is tested only on labels it holds
        own = set(torch.cat([y[offsets[c] : offsets[c + 1]], yv[cv == c]]).tolist())
        assert set(yt[ct == c].tolist()) <= own
    # Dirichlet(0.1) label skew: most clients are dominated by one or two classes
    top = [torch.bincount(y[offsets[c] : offsets[c + 1]], minlength=10).max() / (offsets[c + 1] - offsets[c]) for c in range(20)]
    assert torch.stack(top).median() > 0.5
    # the train batch is the whole federation, for every rank
    batches = list(dm.train_dataloader())
    assert len(batches) == dm.rounds_per_epoch and batches[0][2] is offsets
    assert sum(len(b[1]) for b in dm.test_dataloader()) == len(yt) == 1000


def dm_labels(dm: FederatedDataModule) -> torch.Tensor:
    return dm.load_source()[1]


def test_client_test_draws_follow_the_client_label_distribution() -> None:
    """Against the definition: class frequencies pi(c), and uniform over the pool samples of a class."""
    dm = FederatedDataModule(client_test_size=40_000)
    pool_labels = torch.tensor([0, 0, 1, 1, 1, 1, 2, 3, 3, 3])
    client = torch.tensor([0] * 6 + [1] * 3 + [3] * 1)  # pi = (0.6, 0.3, 0, 0.1)
    draws = dm.client_test(client, pool_labels, torch.Generator().manual_seed(0))
    freq = torch.bincount(draws, minlength=10).double() / len(draws)
    expected = torch.tensor([0.3, 0.3, 0.075, 0.075, 0.075, 0.075, 0.0, 0.1 / 3, 0.1 / 3, 0.1 / 3], dtype=torch.float64)
    torch.testing.assert_close(freq, expected, atol=0.006, rtol=0)  # 4 binomial standard errors at n = 40000


def test_val_fraction_zero_validates_on_the_local_test_sets() -> None:
    dm = FederatedDataModule(n_clients=5, val_fraction=0.0, partition_seed=0)
    dm.setup()
    assert dm.splits["val"] is dm.splits["test"]


def test_partition_seed_follows_seed_everything() -> None:
    dm = FederatedDataModule()
    dm.run_seed = 5  # what the CLI sets from seed_everything
    assert dm.partition_seed == 5
    assert FederatedDataModule(partition_seed=2).partition_seed == 2


@pytest.mark.parametrize("kwargs,match", [({"alpha": 0.0}, "alpha"), ({"min_size": 1}, "min_size"),
                                          ({"test_pool_fraction": 1.0}, "test_pool_fraction"), ({"n_clients": 0}, "n_clients"),
                                          ({"client_test_size": 1}, "client_test_size")])
def test_bad_arguments(kwargs: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        FederatedDataModule(**kwargs)


def test_unreachable_min_size_is_reported_at_setup() -> None:
    dm = FederatedDataModule(n_clients=200, min_size=10)
    with pytest.raises(ConfigError, match="unreachable"):
        dm.setup()
