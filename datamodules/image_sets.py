"""Image sets for INR hypernetworks: ``ImageSetDataModule`` (``shapes2d``, scikit-learn's digits or a hub image
set, from ``datamodules.images``) as ``(images (B, C, H, W),)`` batches in [0, 1].
"""

from __future__ import annotations

import functools
from typing import Literal

import numpy as np
import torch
from torch import Tensor

from datamodules.base import Split, TensorDataModule, seeded_split
from datamodules.images import area_resize, digits_images, require_pillow, shapes2d
from errors import ConfigError


@functools.lru_cache(maxsize=6)
def _shapes2d_cached(n: int, size: int, seed: int) -> Tensor:
    """``shapes2d(n, size, seed)`` generated once per process (a fit and the test after it, or several
    experiments on the same images, share it; 10,000 images take seconds). Callers must not modify it."""
    return shapes2d(n, size, seed)


ImageSet = Literal["shapes2d", "digits", "hub"]
IMAGESET_HUB_ID = "nielsr/CelebA-faces"  # CelebA's aligned faces (178 x 218 RGB), column "image"; not verified
IMAGESET_HUB_DEFAULT = "configs/attn_hyper_inr/shapes2d.yaml (shapes2d, generated in code)"


class ImageSetDataModule(TensorDataModule):
    """Image sets for INR hypernetworks: batches ``(images (B, C, H, W),)`` in [0, 1].

    Args:
        dataset: ``shapes2d`` (RGB, generated: ``train_size``/``val_size``/``test_size`` images, seeds
            ``split_seed``, ``+1``, ``+2``), ``digits`` (scikit-learn's digits upsampled to ``size``,
            grayscale; a seeded 1,437 / 180 / 180 split of the 1,797) or ``hub`` (the paper-scale path: the
            first ``train_size + val_size + test_size`` images of the hub set ``hub_id``, RGB, centre-cropped
            and resized to ``size``, a seeded split; fails offline naming the embedded default).
        size: image side (by default 32 for shapes2d, 16 for digits, 64 for hub).
        train_size, val_size, test_size: split sizes for shapes2d.
        split_seed: seed of the generated images (shapes2d) or of the split (digits, hub).
        hub_id: the hub image set of ``dataset: hub`` (its ``image`` column, split ``train``).
        batch_size, eval_batch_size, seed: see ``TensorDataModule``.
    """

    dataset_name = "images"

    def __init__(
        self,
        dataset: ImageSet = "shapes2d",
        size: int | None = None,
        train_size: int = 10_000,
        val_size: int = 500,
        test_size: int = 1_000,
        split_seed: int = 0,
        batch_size: int = 32,
        eval_batch_size: int | None = 256,
        seed: int = 0,
        hub_id: str = IMAGESET_HUB_ID,
    ) -> None:
        super().__init__(batch_size=batch_size, eval_batch_size=eval_batch_size, seed=seed)
        if dataset not in ("shapes2d", "digits", "hub"):
            raise ConfigError(f"dataset must be shapes2d, digits or hub, got {dataset!r}")
        if min(train_size, val_size, test_size) < 1:
            raise ConfigError("train_size, val_size and test_size must be positive")
        self.dataset = dataset
        self.size = size if size is not None else {"shapes2d": 32, "digits": 16, "hub": 64}[dataset]
        if self.size < 4:
            raise ConfigError(f"size must be at least 4, got {self.size}")
        self.train_size, self.val_size, self.test_size = train_size, val_size, test_size
        self.split_seed = split_seed
        self.hub_id = hub_id
        self.dataset_name = dataset

    def _hub_images(self) -> Tensor:
        """The first ``train + val + test`` images of ``hub_id`` as ``(N, 3, size, size)`` in [0, 1]."""
        from datamodules.hub import load_hub_dataset

        require_pillow()
        n = self.train_size + self.val_size + self.test_size
        ds = load_hub_dataset(self.hub_id, IMAGESET_HUB_DEFAULT, split="train")
        if "image" not in ds.column_names or len(ds) < n:
            raise ConfigError(f"hub set {self.hub_id!r} needs an 'image' column and {n} images "
                              f"(has {ds.column_names}, {len(ds)})")
        out = []
        for img in ds.select(range(n))["image"]:
            rgb = torch.tensor(np.asarray(img.convert("RGB"), dtype=np.float64)) / 255.0
            h, w = rgb.shape[:2]
            c = min(h, w)
            crop = rgb[(h - c) // 2 : (h - c) // 2 + c, (w - c) // 2 : (w - c) // 2 + c]
            out.append(area_resize(crop, self.size).permute(2, 0, 1).float().clamp(0, 1))
        return torch.stack(out)

    def build_splits(self) -> dict[str, Split]:
        if self.dataset == "hub":
            x = self._hub_images()
            tr, va, te = seeded_split(x.shape[0], (self.train_size, self.val_size, self.test_size), self.split_seed)
            return {"train": (x[tr],), "val": (x[va],), "test": (x[te],)}
        if self.dataset == "shapes2d":
            s = self.split_seed
            return {
                "train": (_shapes2d_cached(self.train_size, self.size, 3 * s),),
                "val": (_shapes2d_cached(self.val_size, self.size, 3 * s + 1),),
                "test": (_shapes2d_cached(self.test_size, self.size, 3 * s + 2),),
            }
        x = digits_images(self.size)
        tr, va, te = seeded_split(x.shape[0], (1437, 180, 180), self.split_seed)
        return {"train": (x[tr],), "val": (x[va],), "test": (x[te],)}

    @property
    def input_shape(self) -> tuple[int, ...]:
        return (1 if self.dataset == "digits" else 3, self.size, self.size)

    @property
    def num_classes(self) -> int:
        return 0


__all__ = ["ImageSet", "ImageSetDataModule"]
