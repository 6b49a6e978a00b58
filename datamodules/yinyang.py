"""The Yin-Yang data set (Kriener et al. 2021), generated in code.

The generator follows the published procedure so that the same seeds give the same samples as the
reference implementation: for every sample a target class is drawn uniformly from {0, 1, 2} with
numpy's legacy ``RandomState``; points ``(x, y)`` uniform on ``[0, 2 r_big]^2`` are then drawn until one
lies inside the big circle and has the target class. Features are ``(x, y, 1 - x, 1 - y)``.
Default sizes and seeds: train 5000 (seed 42), val 1000 (seed 41), test 1000 (seed 40).
"""

from __future__ import annotations

import numpy as np
import torch

from datamodules.base import Split, TensorDataModule
from errors import ConfigError

CLASS_NAMES = ("yin", "yang", "dot")


def yinyang_class(x: np.ndarray, y: np.ndarray, r_small: float = 0.1, r_big: float = 0.5) -> np.ndarray:
    """Class of each point (0 yin, 1 yang, 2 dot), vectorised over arrays of coordinates."""
    d_right = np.hypot(x - 1.5 * r_big, y - r_big)
    d_left = np.hypot(x - 0.5 * r_big, y - r_big)
    in_dot = (d_right < r_small) | (d_left < r_small)
    yang = (d_right <= r_small) | ((d_left > r_small) & (d_left <= 0.5 * r_big)) | (
        (y > r_big) & (d_right > 0.5 * r_big)
    )
    return np.where(in_dot, 2, yang.astype(np.int64))


def generate_yinyang(size: int, seed: int, r_small: float = 0.1, r_big: float = 0.5) -> tuple[np.ndarray, np.ndarray]:
    """``size`` samples as (features (size, 4) float64, labels (size,) int64), reference-compatible."""
    if size <= 0:
        raise ConfigError(f"Yin-Yang size must be positive, got {size}")
    rng = np.random.RandomState(seed)
    xs = np.empty(size)
    ys = np.empty(size)
    labels = np.empty(size, dtype=np.int64)
    for i in range(size):
        goal = rng.randint(3)
        while True:
            x, y = rng.rand(2) * 2.0 * r_big
            if np.hypot(x - r_big, y - r_big) > r_big:
                continue
            c = int(yinyang_class(np.array(x), np.array(y), r_small, r_big))
            if c == goal:
                break
        xs[i], ys[i], labels[i] = x, y, c
    feats = np.stack([xs, ys, 1.0 - xs, 1.0 - ys], axis=1)
    return feats, labels


class YinYangDataModule(TensorDataModule):
    """Yin-Yang classification (4 features, 3 classes), generated offline.

    Args:
        train_size, val_size, test_size: samples per split (reference: 5000 / 1000 / 1000).
        seeds: numpy seeds of the train, val and test generators (reference: 42, 41, 40).
        r_small, r_big: radii of the dots and of the whole symbol.
        batch_size, eval_batch_size, seed: see ``TensorDataModule``.
    """

    dataset_name = "yinyang"

    def __init__(
        self,
        train_size: int = 5000,
        val_size: int = 1000,
        test_size: int = 1000,
        seeds: tuple[int, int, int] = (42, 41, 40),
        r_small: float = 0.1,
        r_big: float = 0.5,
        batch_size: int = 150,
        eval_batch_size: int | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__(batch_size=batch_size, eval_batch_size=eval_batch_size, seed=seed)
        for name, n in (("train_size", train_size), ("val_size", val_size), ("test_size", test_size)):
            if n <= 0:
                raise ConfigError(f"{name} must be a positive integer, got {n}")
        self.sizes = (train_size, val_size, test_size)
        self.seeds = tuple(seeds)
        self.r_small = r_small
        self.r_big = r_big

    def build_splits(self) -> dict[str, Split]:
        out: dict[str, Split] = {}
        for name, n, s in zip(("train", "val", "test"), self.sizes, self.seeds):
            x, y = generate_yinyang(n, s, self.r_small, self.r_big)
            out[name] = (torch.from_numpy(x).float(), torch.from_numpy(y))
        return out

    @property
    def input_shape(self) -> tuple[int, ...]:
        return (4,)

    @property
    def num_classes(self) -> int:
        return 3
