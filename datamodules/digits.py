"""scikit-learn's bundled 8x8 digits (1797 images, 10 classes): the offline stand-in for image data."""

from __future__ import annotations

import torch

from datamodules.base import Split, TensorDataModule, seeded_split
from errors import ConfigError


def load_digits_tensors() -> tuple[torch.Tensor, torch.Tensor]:
    """All 1797 digits as (images (1797, 64) in [0, 1], labels (1797,))."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = torch.from_numpy(bunch.data).float() / 16.0
    y = torch.from_numpy(bunch.target).long()
    return x, y


class DigitsDataModule(TensorDataModule):
    """8x8 digits, pixel values scaled to [0, 1], with a seeded train/val/test split.

    Args:
        val_size, test_size: samples held out (the rest trains).
        split_seed: seed of the split permutation.
        image_shape: return images as (1, 8, 8) for convolutional models instead of flat 64-vectors.
        batch_size, eval_batch_size, seed: see ``TensorDataModule``.
    """

    dataset_name = "digits"

    def __init__(
        self,
        val_size: int = 270,
        test_size: int = 360,
        split_seed: int = 0,
        image_shape: bool = False,
        batch_size: int = 64,
        eval_batch_size: int | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__(batch_size=batch_size, eval_batch_size=eval_batch_size, seed=seed)
        if val_size <= 0 or test_size <= 0 or val_size + test_size >= 1797:
            raise ConfigError(
                f"val_size={val_size} and test_size={test_size} must be positive and leave training samples "
                "out of the 1797 digits"
            )
        self.val_size = val_size
        self.test_size = test_size
        self.split_seed = split_seed
        self.image_shape = image_shape

    def build_splits(self) -> dict[str, Split]:
        x, y = load_digits_tensors()
        if self.image_shape:
            x = x.view(-1, 1, 8, 8)
        n_train = x.shape[0] - self.val_size - self.test_size
        tr, va, te = seeded_split(x.shape[0], (n_train, self.val_size, self.test_size), self.split_seed)
        return {"train": (x[tr], y[tr]), "val": (x[va], y[va]), "test": (x[te], y[te])}

    @property
    def input_shape(self) -> tuple[int, ...]:
        return (1, 8, 8) if self.image_shape else (64,)

    @property
    def num_classes(self) -> int:
        return 10
