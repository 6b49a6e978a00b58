"""scikit-learn's bundled tabular datasets (no download): breast_cancer (569 x 30, 2 classes), diabetes
(442 x 10, a regression target) and wine (178 x 13, 3 classes), split by a seeded permutation and standardised
with the training split's statistics only, so nothing of the validation or test rows leaks into the inputs."""

from __future__ import annotations

from typing import Literal

import torch

from datamodules.base import Split, TensorDataModule, seeded_split
from errors import ConfigError

TabularName = Literal["breast_cancer", "diabetes", "wine"]
REGRESSION: frozenset[str] = frozenset({"diabetes"})


def load_tabular(name: TabularName) -> tuple[torch.Tensor, torch.Tensor]:
    """All rows of ``name`` as float64 ``(x (n, d), y (n,))``: labels for classification, the target for diabetes."""
    from sklearn import datasets

    loaders = {"breast_cancer": datasets.load_breast_cancer, "diabetes": datasets.load_diabetes,
               "wine": datasets.load_wine}
    if name not in loaders:
        raise ConfigError(f"dataset must be one of {sorted(loaders)}, got {name!r}")
    bunch = loaders[name]()
    return torch.from_numpy(bunch.data).double(), torch.from_numpy(bunch.target).double()


def _standardise(train: torch.Tensor, *others: torch.Tensor) -> list[torch.Tensor]:
    mean = train.mean(0)
    std = train.std(0).clamp_min(1e-12)  # a constant column stays finite (zero) instead of dividing by 0
    return [(t - mean) / std for t in (train, *others)]


class SklearnTabularDataModule(TensorDataModule):
    """A bundled scikit-learn table with seeded train/val/test rows.

    Classification gives ``(x, label)`` with labels long; regression (diabetes) gives ``(x, y (n, 1))``, the
    target standardised on the training split when ``standardize_target`` (a regression net's output then
    starts at the right scale). ``num_classes`` is the number of outputs: the classes, or 1 for regression.

    Args:
        dataset: ``breast_cancer``, ``diabetes`` or ``wine``.
        val_fraction, test_fraction: fractions of the rows held out (val may be 0: then val is the test split).
        split_seed: seed of the row permutation.
        standardize_target: standardise the regression target with the training split's mean and std.
        dtype: ``float64`` for the closed-form analyses, ``float32`` for plain training.
        batch_size, eval_batch_size, seed: see ``TensorDataModule``.
    """

    dataset_name = "sklearn_tabular"

    def __init__(
        self,
        dataset: TabularName = "breast_cancer",
        val_fraction: float = 0.1,
        test_fraction: float = 0.2,
        split_seed: int = 0,
        standardize_target: bool = True,
        dtype: Literal["float32", "float64"] = "float64",
        batch_size: int = 64,
        eval_batch_size: int | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__(batch_size=batch_size, eval_batch_size=eval_batch_size, seed=seed)
        if not (0 <= val_fraction < 1 and 0 < test_fraction < 1 and val_fraction + test_fraction < 1):
            raise ConfigError(
                f"val_fraction={val_fraction} and test_fraction={test_fraction} must be fractions that leave "
                "training rows (0 <= val, 0 < test, val + test < 1)"
            )
        if dtype not in ("float32", "float64"):
            raise ConfigError(f"dtype must be 'float32' or 'float64', got {dtype!r}")
        self.dataset = dataset
        self.val_fraction = val_fraction
        self.test_fraction = test_fraction
        self.split_seed = split_seed
        self.standardize_target = standardize_target
        self.dtype = getattr(torch, dtype)
        self.dataset_name = dataset

    @property
    def is_regression(self) -> bool:
        return self.dataset in REGRESSION

    def build_splits(self) -> dict[str, Split]:
        x, y = load_tabular(self.dataset)
        n = x.shape[0]
        n_test = max(1, round(self.test_fraction * n))
        n_val = round(self.val_fraction * n)
        tr, va, te = seeded_split(n, (n - n_val - n_test, n_val, n_test), self.split_seed)
        x_tr, x_va, x_te = _standardise(x[tr], x[va], x[te])
        if self.is_regression:
            ys = [y[i][:, None] for i in (tr, va, te)]
            if self.standardize_target:
                ys = _standardise(*ys)
            y_tr, y_va, y_te = (t.to(self.dtype) for t in ys)
        else:
            y_tr, y_va, y_te = (y[i].long() for i in (tr, va, te))
        x_tr, x_va, x_te = (t.to(self.dtype) for t in (x_tr, x_va, x_te))
        splits = {"train": (x_tr, y_tr), "test": (x_te, y_te)}
        splits["val"] = (x_va, y_va) if n_val > 0 else (x_te, y_te)
        return splits

    @property
    def num_classes(self) -> int:
        if self.is_regression:
            return 1
        return int(self._split("train")[1].max().item()) + 1
