"""Spike-time encodings for time-to-first-spike networks (paper 000-01).

Every feature value ``v`` in ``[0, 1]`` becomes one input spike time (units of tau_s):

* Yin-Yang (Goeltz et al. 2021): ``t = t_early + v (t_late - t_early)`` for the four features
  ``(x, y, 1 - x, 1 - y)``, defaults 0.15..2.0, plus bias spikes at fixed times (default one at 0.9).
* Images (digits, Fashion-MNIST, EuroSAT): bright pixels spike early,
  ``t = t_early + (1 - v)(t_late - t_early)``; pixels with ``v < v_min`` do not spike (``inf``) when
  ``v_min`` is set; bias spikes are appended likewise.

Batches are ``(t (B, N_in + n_bias) float64, y long)``. Yin-Yang and digits are embedded (generated in code,
shipped with scikit-learn); Fashion-MNIST and EuroSAT come from the Hugging Face hub through
``datamodules.hub.load_hub_dataset`` and fail offline with a message naming the embedded default.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch
from torch import Tensor

from datamodules.base import Split, TensorDataModule, seeded_split
from datamodules.digits import DigitsDataModule
from datamodules.hub import load_hub_dataset
from datamodules.yinyang import YinYangDataModule, yinyang_class
from errors import ConfigError


def encode_linear(
    v: Tensor,
    t_early: float,
    t_late: float,
    bias_times: Sequence[float] = (),
    bright_early: bool = False,
    v_min: float | None = None,
) -> Tensor:
    """Feature values ``v`` (B, F) in [0, 1] -> spike times (B, F + len(bias_times)) in float64."""
    if t_late <= t_early:
        raise ConfigError(f"t_late must exceed t_early, got t_early={t_early}, t_late={t_late}")
    v = v.to(torch.float64).flatten(1)
    if torch.isnan(v).any():
        raise ConfigError("feature values contain NaN: clean the data before encoding it as spike times")
    frac = 1.0 - v if bright_early else v
    t = t_early + frac.clamp(0.0, 1.0) * (t_late - t_early)
    if v_min is not None:
        t = torch.where(v < v_min, torch.full_like(t, float("inf")), t)
    if len(bias_times):
        t = torch.cat([t, torch.tensor(list(bias_times), dtype=t.dtype).expand(t.shape[0], -1)], dim=1)
    return t


_YINYANG_CACHE: dict[tuple, dict[str, Split]] = {}


class SpikeYinYangDataModule(YinYangDataModule):
    """Yin-Yang as spike times ``0.15..2.0`` (units of tau_s) plus bias spikes.

    Args:
        t_early, t_late: spike times of feature values 0 and 1.
        bias_times: times of the bias spikes appended to every sample.
        train_size, val_size, test_size, seeds, r_small, r_big, batch_size, eval_batch_size, seed:
            see ``YinYangDataModule``.
    """

    dataset_name = "yinyang_spikes"

    def __init__(
        self,
        t_early: float = 0.15,
        t_late: float = 2.0,
        bias_times: Sequence[float] = (0.9,),
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
        super().__init__(train_size, val_size, test_size, seeds, r_small, r_big, batch_size, eval_batch_size, seed)
        if t_late <= t_early:
            raise ConfigError(f"t_late must exceed t_early, got t_early={t_early}, t_late={t_late}")
        self.t_early, self.t_late, self.bias_times = t_early, t_late, tuple(bias_times)

    def encode(self, features: Tensor) -> Tensor:
        """Features ``(x, y, 1 - x, 1 - y)`` -> spike times (with bias spikes)."""
        return encode_linear(features, self.t_early, self.t_late, self.bias_times)

    def build_splits(self) -> dict[str, Split]:
        # The rejection sampler loops in Python (~1 s for 7000 samples); a sweep run in process, or a fit
        # followed by its test, builds the same splits again, so they are generated once per process.
        key = (self.sizes, self.seeds, self.r_small, self.r_big)
        if key not in _YINYANG_CACHE:
            _YINYANG_CACHE.clear()
            _YINYANG_CACHE[key] = super().build_splits()
        return {k: (self.encode(x), y.clone()) for k, (x, y) in _YINYANG_CACHE[key].items()}

    @property
    def input_shape(self) -> tuple[int, ...]:
        return (4 + len(self.bias_times),)

    def plane_grid(self, resolution: int = 200) -> tuple[Tensor, Tensor, Tensor]:
        """``ProvidesPlaneGrid`` (piece-map figures): points ``(G, 2)`` of the plane inside the symbol, their
        encoded inputs ``(G, N_in)`` and their classes ``(G,)``."""
        lin = torch.linspace(0.0, 2 * self.r_big, resolution, dtype=torch.float64)
        gx, gy = torch.meshgrid(lin, lin, indexing="xy")
        pts = torch.stack([gx.flatten(), gy.flatten()], 1)
        inside = torch.hypot(pts[:, 0] - self.r_big, pts[:, 1] - self.r_big) <= self.r_big
        pts = pts[inside]
        feats = torch.cat([pts, 1.0 - pts], dim=1)
        cls = torch.from_numpy(yinyang_class(pts[:, 0].numpy(), pts[:, 1].numpy(), self.r_small, self.r_big))
        return pts, self.encode(feats), cls


class SpikeDigitsDataModule(DigitsDataModule):
    """scikit-learn's 8x8 digits as spike times (bright pixels early) plus bias spikes.

    Args:
        t_early, t_late: spike times of the brightest and the darkest pixel.
        bias_times: times of the bias spikes appended to every sample.
        v_min: pixels below this value do not spike (``None``: every pixel spikes).
        val_size, test_size, split_seed, batch_size, eval_batch_size, seed: see ``DigitsDataModule``.
    """

    dataset_name = "digits_spikes"

    def __init__(
        self,
        t_early: float = 0.15,
        t_late: float = 2.0,
        bias_times: Sequence[float] = (0.9,),
        v_min: float | None = None,
        val_size: int = 270,
        test_size: int = 360,
        split_seed: int = 0,
        batch_size: int = 64,
        eval_batch_size: int | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__(val_size, test_size, split_seed, False, batch_size, eval_batch_size, seed)
        if t_late <= t_early:
            raise ConfigError(f"t_late must exceed t_early, got t_early={t_early}, t_late={t_late}")
        self.t_early, self.t_late, self.bias_times, self.v_min = t_early, t_late, tuple(bias_times), v_min

    def build_splits(self) -> dict[str, Split]:
        return {
            k: (encode_linear(x, self.t_early, self.t_late, self.bias_times, True, self.v_min), y)
            for k, (x, y) in super().build_splits().items()
        }

    @property
    def input_shape(self) -> tuple[int, ...]:
        return (64 + len(self.bias_times),)


class _HubSpikeImages(TensorDataModule):
    """Hub image classification sets as spike times; subclasses set the hub id and image handling."""

    hub_id = ""
    hub_config: str | None = None
    embedded_default = "configs/causal_pieces/digits.yaml (scikit-learn digits, offline)"

    def __init__(
        self,
        t_early: float = 0.15,
        t_late: float = 2.0,
        bias_times: Sequence[float] = (0.9,),
        v_min: float | None = None,
        downsample: int = 1,
        grayscale: bool = True,
        val_size: int = 5000,
        split_seed: int = 0,
        batch_size: int = 100,
        eval_batch_size: int | None = 1000,
        seed: int = 0,
    ) -> None:
        super().__init__(batch_size=batch_size, eval_batch_size=eval_batch_size, seed=seed)
        if t_late <= t_early:
            raise ConfigError(f"t_late must exceed t_early, got t_early={t_early}, t_late={t_late}")
        if downsample < 1:
            raise ConfigError(f"downsample must be a positive integer factor, got {downsample}")
        self.t_early, self.t_late, self.bias_times, self.v_min = t_early, t_late, tuple(bias_times), v_min
        self.downsample, self.grayscale, self.val_size, self.split_seed = (
            downsample,
            grayscale,
            val_size,
            split_seed,
        )

    def _images(self, ds) -> tuple[Tensor, Tensor]:
        """A hub split -> (images (N, C, H, W) in [0, 1], labels (N,))."""
        img_key = "image" if "image" in ds.column_names else ds.column_names[0]
        lab_key = "label" if "label" in ds.column_names else ds.column_names[-1]
        arr = np.stack([np.asarray(im, dtype=np.float32) for im in ds[img_key]]) / 255.0
        x = torch.from_numpy(arr)
        x = x[:, None] if x.dim() == 3 else x.permute(0, 3, 1, 2)
        if self.grayscale and x.shape[1] == 3:
            x = (x * torch.tensor([0.299, 0.587, 0.114]).view(1, 3, 1, 1)).sum(1, keepdim=True)
        if self.downsample > 1:
            x = torch.nn.functional.avg_pool2d(x, self.downsample)
        return x, torch.as_tensor(np.asarray(ds[lab_key]), dtype=torch.long)

    def _encode(self, x: Tensor) -> Tensor:
        return encode_linear(x, self.t_early, self.t_late, self.bias_times, True, self.v_min).float()

    def _hub(self, split: str | None = None):
        return load_hub_dataset(self.hub_id, self.embedded_default, self.hub_config, split=split)

    def _train_val(self, x: Tensor, y: Tensor) -> dict[str, Split]:
        n = x.shape[0]
        if not 0 < self.val_size < n:
            raise ConfigError(f"val_size={self.val_size} must leave training samples out of {n}")
        tr, va = seeded_split(n, (n - self.val_size, self.val_size), self.split_seed)
        return {"train": (self._encode(x[tr]), y[tr]), "val": (self._encode(x[va]), y[va])}


class SpikeFashionMNISTDataModule(_HubSpikeImages):
    """Fashion-MNIST (hub ``zalando-datasets/fashion_mnist``, 60k/10k 28x28, 10 classes) as spike times.

    Spike times are stored as float32 to halve memory; the network casts them to float64.
    Args: see the module docstring; ``val_size`` samples of the training set are held out for validation.
    """

    dataset_name = "fashion_mnist_spikes"
    hub_id = "zalando-datasets/fashion_mnist"

    def build_splits(self) -> dict[str, Split]:
        xtr, ytr = self._images(self._hub("train"))
        xte, yte = self._images(self._hub("test"))
        out = self._train_val(xtr, ytr)
        out["test"] = (self._encode(xte), yte)
        return out

    @property
    def input_shape(self) -> tuple[int, ...]:
        return ((28 // self.downsample) ** 2 + len(self.bias_times),)

    @property
    def num_classes(self) -> int:
        return 10


class SpikeEuroSATDataModule(_HubSpikeImages):
    """EuroSAT RGB (hub ``blanchon/EuroSAT_RGB``, 27k 64x64 patches, 10 classes) as spike times.

    Defaults: grayscale, 4x average-pooled to 16x16 (256 inputs); a seeded 80/10/10 split when the hub
    copy has a single split. Args: see the module docstring and ``SpikeFashionMNISTDataModule``.
    """

    dataset_name = "eurosat_spikes"
    hub_id = "blanchon/EuroSAT_RGB"

    def __init__(
        self,
        t_early: float = 0.15,
        t_late: float = 2.0,
        bias_times: Sequence[float] = (0.9,),
        v_min: float | None = None,
        downsample: int = 4,
        grayscale: bool = True,
        val_size: int = 2700,
        test_size: int = 2700,
        split_seed: int = 0,
        batch_size: int = 100,
        eval_batch_size: int | None = 1000,
        seed: int = 0,
    ) -> None:
        super().__init__(
            t_early,
            t_late,
            bias_times,
            v_min,
            downsample,
            grayscale,
            val_size,
            split_seed,
            batch_size,
            eval_batch_size,
            seed,
        )
        self.test_size = test_size

    def build_splits(self) -> dict[str, Split]:
        ds = self._hub()
        splits = dict(ds) if isinstance(ds, Mapping) else {"train": ds}  # a DatasetDict is a dict
        if {"train", "test"} <= set(splits):
            xtr, ytr = self._images(splits["train"])
            xte, yte = self._images(splits["test"])
        else:
            x, y = self._images(next(iter(splits.values())))
            tr, te = seeded_split(x.shape[0], (x.shape[0] - self.test_size, self.test_size), self.split_seed + 1)
            xtr, ytr, xte, yte = x[tr], y[tr], x[te], y[te]
        out = self._train_val(xtr, ytr)
        out["test"] = (self._encode(xte), yte)
        return out

    @property
    def input_shape(self) -> tuple[int, ...]:
        side = 64 // self.downsample
        return (side * side * (1 if self.grayscale else 3) + len(self.bias_times),)

    @property
    def num_classes(self) -> int:
        return 10
