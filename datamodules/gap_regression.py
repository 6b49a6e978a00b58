"""One-dimensional regression with a gap (paper 004-10's predictive-band example): training inputs uniform on
[-3, -1] U [1, 3], y = sin(2x) + N(0, noise^2); the test inputs are uniform on [-test_extent, test_extent], so the
test NLL and the predictive std include the gap and the extrapolation, where a Laplace posterior's uncertainty
should grow. Generated from ``data_seed`` alone (each split from its own stream)."""

from __future__ import annotations

from typing import Literal

import torch

from datamodules.base import Split, TensorDataModule
from errors import ConfigError


def gap_inputs(n: int, generator: torch.Generator, dtype: torch.dtype) -> torch.Tensor:
    """``n`` points uniform on [-3, -1] U [1, 3], ``(n, 1)``."""
    mag = 1.0 + 2.0 * torch.rand(n, 1, generator=generator, dtype=dtype)
    sign = torch.where(torch.rand(n, 1, generator=generator, dtype=dtype) < 0.5, -1.0, 1.0).to(dtype)
    return sign * mag


class GapRegressionDataModule(TensorDataModule):
    """``(x (n, 1), y (n, 1))`` with y = sin(2x) + noise; train and val on the two intervals, test across them.

    Args:
        n_train, n_val, n_test: samples per split.
        noise: the noise std (0.1 in the paper's spec).
        test_extent: test inputs uniform on [-test_extent, test_extent].
        data_seed: seed of the generated data.
        dtype: ``float64`` (the Laplace analysis) or ``float32``.
        batch_size, eval_batch_size, seed: see ``TensorDataModule``.
    """

    dataset_name = "gap_regression"

    def __init__(
        self,
        n_train: int = 200,
        n_val: int = 50,
        n_test: int = 400,
        noise: float = 0.1,
        test_extent: float = 4.0,
        data_seed: int = 0,
        dtype: Literal["float32", "float64"] = "float64",
        batch_size: int = 200,
        eval_batch_size: int | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__(batch_size=batch_size, eval_batch_size=eval_batch_size, seed=seed)
        if min(n_train, n_val, n_test) <= 0:
            raise ConfigError(f"n_train, n_val and n_test must be positive, got {n_train}, {n_val}, {n_test}")
        if noise < 0 or not test_extent > 0:
            raise ConfigError(f"noise must be >= 0 and test_extent > 0, got {noise}, {test_extent}")
        if dtype not in ("float32", "float64"):
            raise ConfigError(f"dtype must be 'float32' or 'float64', got {dtype!r}")
        self.sizes = {"train": n_train, "val": n_val, "test": n_test}
        self.noise = noise
        self.test_extent = test_extent
        self.data_seed = data_seed
        self.dtype = getattr(torch, dtype)

    def build_splits(self) -> dict[str, Split]:
        splits: dict[str, Split] = {}
        for k, (name, n) in enumerate(self.sizes.items()):
            gen = torch.Generator().manual_seed(self.data_seed * 1000 + k)
            if name == "test":
                x = (2 * torch.rand(n, 1, generator=gen, dtype=self.dtype) - 1) * self.test_extent
            else:
                x = gap_inputs(n, gen, self.dtype)
            y = torch.sin(2 * x) + self.noise * torch.randn(n, 1, generator=gen, dtype=self.dtype)
            splits[name] = (x, y)
        return splits

    @property
    def num_classes(self) -> int:
        # regression: the number of outputs
        return 1
