"""Gaussian inputs with random labels: data that carries no signal (paper 000-09's data-independence check).

``x ~ N(0, I_d)``, ``y ~ Uniform{0, ..., n_classes - 1}`` independent of ``x``. Anything a network's weights
do systematically on this data comes from the architecture and the optimiser, not from the data.
"""

from __future__ import annotations

import torch

from datamodules.base import Split, TensorDataModule
from errors import ConfigError


class RandomGaussianDataModule(TensorDataModule):
    """Random Gaussian inputs and uniformly random labels, generated from ``data_seed``.

    Args:
        in_dim: input dimension d.
        n_classes: number of label classes.
        train_size, val_size, test_size: samples per split.
        image_shape: return x as (1, s, s) images (``in_dim`` must be a square s^2) for ResNet/ViT.
        data_seed: seed of the generated data.
        batch_size, eval_batch_size, seed: see ``TensorDataModule``.
    """

    dataset_name = "random_gaussian"

    def __init__(
        self,
        in_dim: int = 64,
        n_classes: int = 10,
        train_size: int = 8192,
        val_size: int = 2048,
        test_size: int = 2048,
        image_shape: bool = False,
        data_seed: int = 0,
        batch_size: int = 128,
        eval_batch_size: int | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__(batch_size=batch_size, eval_batch_size=eval_batch_size, seed=seed)
        if in_dim <= 0 or n_classes < 2 or min(train_size, val_size, test_size) <= 0:
            raise ConfigError(
                f"need in_dim > 0, n_classes >= 2 and positive split sizes; got in_dim={in_dim}, "
                f"n_classes={n_classes}, sizes={(train_size, val_size, test_size)}"
            )
        side = round(in_dim**0.5)
        if image_shape and side * side != in_dim:
            raise ConfigError(f"image_shape=True needs a square in_dim (for example 64), got {in_dim}")
        self.in_dim = in_dim
        self.n_classes = n_classes
        self.sizes = (train_size, val_size, test_size)
        self.image_shape = image_shape
        self.data_seed = data_seed

    def build_splits(self) -> dict[str, Split]:
        gen = torch.Generator().manual_seed(self.data_seed)
        n = sum(self.sizes)
        x = torch.randn(n, self.in_dim, generator=gen)
        y = torch.randint(0, self.n_classes, (n,), generator=gen)
        if self.image_shape:
            side = round(self.in_dim**0.5)
            x = x.view(n, 1, side, side)
        out, start = {}, 0
        for name, size in zip(("train", "val", "test"), self.sizes):
            out[name] = (x[start : start + size], y[start : start + size])
            start += size
        return out

    @property
    def input_shape(self) -> tuple[int, ...]:
        side = round(self.in_dim**0.5)
        return (1, side, side) if self.image_shape else (self.in_dim,)

    @property
    def num_classes(self) -> int:
        return self.n_classes
