"""The bundled scikit-learn tables: sizes, disjoint seeded splits, standardisation on the training rows only."""

from __future__ import annotations

import pytest
import torch

from datamodules.sklearn_tabular import SklearnTabularDataModule, load_tabular
from errors import ConfigError


@pytest.mark.parametrize(("name", "rows", "cols"), [("breast_cancer", 569, 30), ("diabetes", 442, 10),
                                                    ("wine", 178, 13)])
def test_sizes_and_disjoint_splits(name: str, rows: int, cols: int) -> None:
    dm = SklearnTabularDataModule(dataset=name, val_fraction=0.1, test_fraction=0.2, split_seed=3)
    dm.setup()
    sizes = [dm.splits[s][0].shape[0] for s in ("train", "val", "test")]
    assert sum(sizes) == rows and dm.input_shape == (cols,)
    assert load_tabular(name)[0].shape == (rows, cols)
    x_tr = dm.splits["train"][0]
    assert torch.allclose(x_tr.mean(0), torch.zeros(cols, dtype=x_tr.dtype), atol=1e-10)
    tr_rows = torch.cat([dm.splits[s][0] for s in ("train", "val", "test")])
    assert torch.unique(tr_rows, dim=0).shape[0] == rows


def test_standardised_with_training_statistics_only() -> None:
    dm = SklearnTabularDataModule(dataset="wine", split_seed=0)
    dm.setup()
    x_tr, x_te = dm.splits["train"][0], dm.splits["test"][0]
    assert torch.allclose(x_tr.std(0), torch.ones(13, dtype=x_tr.dtype), atol=1e-10)
    assert not torch.allclose(x_te.mean(0), torch.zeros(13, dtype=x_te.dtype), atol=1e-3)


def test_regression_target_and_outputs() -> None:
    dm = SklearnTabularDataModule(dataset="diabetes")
    dm.setup()
    y = dm.splits["train"][1]
    assert y.shape[1:] == (1,) and y.dtype == torch.float64 and dm.num_classes == 1
    assert abs(float(y.mean())) < 1e-10 and abs(float(y.std()) - 1) < 1e-10
    cls = SklearnTabularDataModule(dataset="breast_cancer")
    assert cls.num_classes == 2 and cls.splits["train"][1].dtype == torch.long


def test_split_seed_changes_rows_and_same_seed_repeats() -> None:
    a, b, c = (SklearnTabularDataModule(dataset="wine", split_seed=s) for s in (0, 0, 1))
    for dm in (a, b, c):
        dm.setup()
    assert torch.equal(a.splits["test"][0], b.splits["test"][0])
    assert not torch.equal(a.splits["test"][0], c.splits["test"][0])


def test_bad_fractions_and_names() -> None:
    with pytest.raises(ConfigError, match="fractions"):
        SklearnTabularDataModule(val_fraction=0.5, test_fraction=0.5)
    with pytest.raises(ConfigError, match="dataset must be one of"):
        load_tabular("iris")  # type: ignore[arg-type]
