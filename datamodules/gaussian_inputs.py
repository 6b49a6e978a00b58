"""Random Gaussian input distributions for propagating a Gaussian through a net (paper 002-06) and random input
points for Lipschitz studies (paper 002-05).

Each sample is one input law ``N(mu, Sigma)``: ``mu ~ N(0, I_d)`` and ``Sigma = s^2 R R^T / d`` with ``R`` a
``d x d`` standard normal matrix, for every scale ``s`` in ``scales`` (so ``tr Sigma ~ s^2 d``). A batch is
``(mean (B, d), cov (B, d, d), scale (B,))``; a method that needs points uses ``mean``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch

from datamodules.base import Split, TensorDataModule
from errors import ConfigError

DEFAULT_SCALES = (0.01, 0.03, 0.1, 0.3, 1.0)


def gaussian_laws(
    n: int, dim: int, scales: Sequence[float], generator: torch.Generator, dtype: torch.dtype = torch.float64
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``n`` laws per scale, scale-major: ``(mean (n S, d), cov (n S, d, d), scale (n S,))``."""
    means, covs, ss = [], [], []
    for s in scales:
        mu = torch.randn(n, dim, generator=generator, dtype=dtype)
        r = torch.randn(n, dim, dim, generator=generator, dtype=dtype)
        means.append(mu)
        covs.append(s**2 * r @ r.transpose(1, 2) / dim)
        ss.append(torch.full((n,), float(s), dtype=dtype))
    return torch.cat(means), torch.cat(covs), torch.cat(ss)


class GaussianInputsDataModule(TensorDataModule):
    """Input laws ``N(mu, s^2 R R^T / d)`` at every scale ``s``, generated from ``data_seed`` (each split from its
    own stream, so changing one split's size leaves the others unchanged).

    Args:
        dim: input dimension d.
        scales: the input scales s.
        train_per_scale, val_per_scale, test_per_scale: laws per scale in each split.
        data_seed: seed of the generated laws.
        dtype: ``float64`` (the closed-form analyses) or ``float32``.
        batch_size, eval_batch_size, seed: see ``TensorDataModule``.
    """

    dataset_name = "gaussian_inputs"

    def __init__(
        self,
        dim: int = 32,
        scales: Sequence[float] = DEFAULT_SCALES,
        train_per_scale: int = 8,
        val_per_scale: int = 4,
        test_per_scale: int = 8,
        data_seed: int = 0,
        dtype: Literal["float32", "float64"] = "float64",
        batch_size: int = 8,
        eval_batch_size: int | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__(batch_size=batch_size, eval_batch_size=eval_batch_size, seed=seed)
        if dim <= 0:
            raise ConfigError(f"dim must be positive, got {dim}")
        if not scales or any(s <= 0 for s in scales):
            raise ConfigError(f"scales must be a non-empty list of positive numbers, got {list(scales)}")
        if min(train_per_scale, val_per_scale, test_per_scale) <= 0:
            raise ConfigError("train_per_scale, val_per_scale and test_per_scale must be positive")
        if dtype not in ("float32", "float64"):
            raise ConfigError(f"dtype must be 'float32' or 'float64', got {dtype!r}")
        self.dim = dim
        self.scales = tuple(float(s) for s in scales)
        self.per_scale = {"train": train_per_scale, "val": val_per_scale, "test": test_per_scale}
        self.data_seed = data_seed
        self.dtype = getattr(torch, dtype)

    def build_splits(self) -> dict[str, Split]:
        splits: dict[str, Split] = {}
        for k, (name, n) in enumerate(self.per_scale.items()):
            gen = torch.Generator().manual_seed(self.data_seed * 1000 + k)
            splits[name] = gaussian_laws(n, self.dim, self.scales, gen, self.dtype)
        return splits

    @property
    def input_shape(self) -> tuple[int, ...]:
        return (self.dim,)

    @property
    def num_classes(self) -> int:
        # No labels, so no size to link: an AttributeError makes hasattr() false, and the CLI skips the
        # num_classes link (as for any DataModule without that size); a net studied on these laws takes its
        # output width from its own config. (A ConfigError here failed every model, also those without
        # num_classes, because the CLI probes each linked size.)
        raise AttributeError("GaussianInputsDataModule has no labels: give the model its output width explicitly")
