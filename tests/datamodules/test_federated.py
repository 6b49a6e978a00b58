"""FederatedDataModule: clients' local train/val/test splits, the global test set as their union, loaders."""

from __future__ import annotations

import pytest
import torch

from datamodules.federated import FederatedDataModule
from errors import ConfigError


def test_local_splits_and_global_test_union() -> None:
    dm = FederatedDataModule(n_clients=20, alpha=0.1, min_size=10, val_fraction=0.1, partition_seed=3)
    dm.setup()
    x, y, offsets = dm.splits["train"]
    xv, yv, cv = dm.splits["val"]
    xt, yt, ct = dm.splits["test"]
    assert offsets[0] == 0 and offsets[-1] == len(y) and len(offsets) == 21
    assert len(y) + len(yv) + len(yt) == 1797  # every digit once
    assert torch.equal(torch.unique(ct), torch.arange(20)) and torch.equal(torch.unique(cv), torch.arange(20))
    for c in range(20):
        n_train = int(offsets[c + 1] - offsets[c])
        n_val, n_test = int((cv == c).sum()), int((ct == c).sum())
        n = n_train + n_val + n_test
        assert n >= 10 and n_test == max(1, round(0.2 * n))  # the 80/20 local train/test split
        assert n_val == max(1, round(0.1 * (n - n_test)))
    # Dirichlet(0.1) label skew: most clients are dominated by one or two classes
    top = [torch.bincount(y[offsets[c] : offsets[c + 1]], minlength=10).max() / (offsets[c + 1] - offsets[c]) for c in range(20)]
    assert torch.stack(top).median() > 0.5
    # the train batch is the whole federation, for every rank
    batches = list(dm.train_dataloader())
    assert len(batches) == dm.rounds_per_epoch and batches[0][2] is offsets
    assert sum(len(b[1]) for b in dm.test_dataloader()) == len(yt)


def test_val_fraction_zero_validates_on_the_local_test_sets() -> None:
    dm = FederatedDataModule(n_clients=5, val_fraction=0.0, partition_seed=0)
    dm.setup()
    assert dm.splits["val"] is dm.splits["test"]


def test_partition_seed_follows_seed_everything() -> None:
    dm = FederatedDataModule()
    dm.run_seed = 5  # what the CLI sets from seed_everything
    assert dm.partition_seed == 5
    assert FederatedDataModule(partition_seed=2).partition_seed == 2


@pytest.mark.parametrize("kwargs,match", [({"alpha": 0.0}, "alpha"), ({"min_size": 2}, "min_size"),
                                          ({"test_fraction": 1.0}, "test_fraction"), ({"n_clients": 0}, "n_clients")])
def test_bad_arguments(kwargs: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        FederatedDataModule(**kwargs)


def test_unreachable_min_size_is_reported_at_setup() -> None:
    dm = FederatedDataModule(n_clients=200, min_size=10)
    with pytest.raises(ConfigError, match="unreachable"):
        dm.setup()
