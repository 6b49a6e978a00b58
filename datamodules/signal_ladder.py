"""The signal sets of a compression ladder (paper 000-13): ``SignalLadderDataModule``, a fixed set of test and
calibration signals, the same batch every step (what a signal-fitting ladder trains on), drawn by
``ladder_signals`` from the sources of ``datamodules.images``. Signals are ``(H, W, C)`` in [0, 1].
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from datamodules.base import Split, TensorDataModule
from datamodules.images import (
    KODAK_HUB_ID,
    SAMPLE_IMAGES,
    ellipse_phantom,
    hub_images,
    procedural_field,
    require_pillow,
    sample_image,
)
from errors import ConfigError

SignalKind = Literal["procedural", "images", "mixed", "phantom", "hub"]


def _image_crops(seed: int, size: int) -> dict[str, list[Tensor]]:
    """Two disjoint 256-crops of each photo (left and right halves of the 640-pixel width; rows seeded):
    which one is the test signal and which the calibration signal is seeded too."""
    gen = torch.Generator().manual_seed(int(seed) * 31 + 5)
    out: dict[str, list[Tensor]] = {"test": [], "calib": []}
    for name in SAMPLE_IMAGES:
        row = int(torch.randint(0, 427 - 256 + 1, (), generator=gen))
        crops = [sample_image(name, size, 256, (row, 0)), sample_image(name, size, 256, (row, 640 - 256))]
        first = int(torch.randint(0, 2, (), generator=gen))
        out["test"].append(crops[first])
        out["calib"].append(crops[1 - first])
    return out


def ladder_signals(kind: SignalKind, size: int, seed: int, n_test: int, n_calib: int,
                   hub_id: str = KODAK_HUB_ID) -> tuple[Tensor, Tensor]:
    """The test and calibration signals of one ladder run: ``(test (n_test, H, W, 1), calib (n_calib, ...))``.

    - ``procedural``: fields of seeds ``1000 seed + i`` (test) and ``1000 seed + 500 + i`` (calibration);
    - ``phantom``: the same with ``ellipse_phantom``;
    - ``images``: the two photos (one crop each for test, the disjoint other crop for calibration), topped
      up with procedural fields when more signals are asked for;
    - ``mixed``: procedural fields first, then the two photos' crops (test: n_test - 2 procedural + the
      two test crops; calibration: n_calib - 2 procedural + the two calibration crops);
    - ``hub``: images of the hub set ``hub_id`` (``hub_images``), a seeded permutation split into
      calibration and test images (paper scale: Kodak at 256 x 256).
    """
    if n_test < 1 or n_calib < 0:
        raise ConfigError(f"need n_test >= 1 and n_calib >= 0, got {n_test}, {n_calib}")

    def proc(i: int) -> Tensor:
        return procedural_field(size, 1000 * seed + i)

    if kind == "procedural":
        return (torch.stack([proc(i) for i in range(n_test)]),
                torch.stack([proc(500 + i) for i in range(n_calib)]) if n_calib else torch.zeros(0, size, size, 1))
    if kind == "phantom":
        ph = [ellipse_phantom(size, 1000 * seed + i) for i in range(n_test)]
        pc = [ellipse_phantom(size, 1000 * seed + 500 + i) for i in range(n_calib)]
        return torch.stack(ph), torch.stack(pc) if pc else torch.zeros(0, size, size, 1)
    if kind == "hub":
        imgs = hub_images(hub_id, size)
        if n_test + n_calib > len(imgs):
            raise ConfigError(f"{hub_id!r} holds {len(imgs)} images; n_test + n_calib = {n_test + n_calib}")
        order = torch.randperm(len(imgs), generator=torch.Generator().manual_seed(int(seed)))
        return imgs[order[n_calib : n_calib + n_test]], imgs[order[:n_calib]]
    if kind not in ("images", "mixed"):
        raise ConfigError(f"kind must be one of procedural, images, mixed, phantom, hub; got {kind!r}")
    crops = _image_crops(seed, size)
    if kind == "images":
        test = crops["test"][:n_test] + [proc(i) for i in range(max(0, n_test - 2))]
        calib = crops["calib"][:n_calib] + [proc(500 + i) for i in range(max(0, n_calib - 2))]
    else:
        test = [proc(i) for i in range(max(0, n_test - 2))] + crops["test"][: min(2, n_test)]
        calib = [proc(500 + i) for i in range(max(0, n_calib - 2))] + crops["calib"][: min(2, n_calib)]
    return torch.stack(test), torch.stack(calib) if calib else torch.zeros(0, size, size, 1)


class SignalLadderDataModule(TensorDataModule):
    """A fixed set of signals for a signal-fitting ladder: every batch is the whole set.

    One batch is ``(signals (1, S, H, W, 1), calib (1, S) bool)``: the ``n_calib`` calibration signals
    (held out: the model reads their ground truth to calibrate a constant) then the ``n_test`` test signals
    (whose ground truth is only used to score the prediction). The train split repeats that batch
    ``steps_per_epoch`` times, so one epoch is ``steps_per_epoch`` optimiser steps on the full signals
    (full-batch fitting); val and test are the batch once. ``input_shape`` is ``(S, H, W, 1)``.

    Args:
        kind: ``procedural``, ``images`` (scikit-learn's photos; needs Pillow), ``mixed`` (both),
            ``phantom`` (ellipse phantoms, for the MRI/CT analogs) or ``hub`` (the paper-scale natural
            images ``hub_id`` from the Hugging Face hub; fails offline naming the embedded default). See
            ``ladder_signals``.
        size: side H = W of every signal (photos are 256-crops resampled to it).
        n_test, n_calib: how many test and calibration signals.
        steps_per_epoch: optimiser steps per epoch.
        seed: seed of the signals; None: the run's seed (``run_seed``, the command's ``seed_everything``, read
            at setup; so a sweep's ``seeds:`` draws new signals), 0 outside the CLI unless ``run_seed`` is set.
        hub_id: the hub image set for ``kind: hub`` (default: the 24 Kodak photos).
    """

    dataset_name = "signals2d"

    def __init__(
        self,
        kind: SignalKind = "mixed",
        size: int = 128,
        n_test: int = 3,
        n_calib: int = 3,
        steps_per_epoch: int = 300,
        seed: int | None = None,
        hub_id: str = KODAK_HUB_ID,
    ) -> None:
        # seed None stays None here: ``self.seed`` resolves it to the run's seed (``seed_or_run``) when the
        # signals are built at setup, after the CLI has set ``run_seed``
        super().__init__(batch_size=1, seed=seed)
        if kind not in ("procedural", "images", "mixed", "phantom", "hub"):
            raise ConfigError(f"kind must be one of procedural, images, mixed, phantom, hub; got {kind!r}")
        if size < 4:
            raise ConfigError(f"size must be at least 4, got {size}")
        if steps_per_epoch < 1:
            raise ConfigError(f"steps_per_epoch must be positive, got {steps_per_epoch}")
        if n_test < 1 or n_calib < 0:
            raise ConfigError(f"need n_test >= 1 and n_calib >= 0, got {n_test}, {n_calib}")
        if kind in ("images", "mixed", "hub"):
            require_pillow()
        self.kind, self.size, self.n_test, self.n_calib, self.hub_id = kind, size, n_test, n_calib, hub_id
        self.steps_per_epoch = steps_per_epoch
        self.dataset_name = f"signals2d_{kind}"

    def signals(self) -> tuple[Tensor, Tensor]:
        """``(signals (S, H, W, 1), calib (S,) bool)``: calibration signals first."""
        test, calib = ladder_signals(self.kind, self.size, self.seed, self.n_test, self.n_calib, self.hub_id)
        sig = torch.cat([calib, test])
        mask = torch.cat([torch.ones(len(calib), dtype=torch.bool), torch.zeros(len(test), dtype=torch.bool)])
        return sig, mask

    def build_splits(self) -> dict[str, Split]:
        sig, mask = self.signals()
        one = (sig[None], mask[None])
        train = (sig[None].expand(self.steps_per_epoch, *sig.shape), mask[None].expand(self.steps_per_epoch, -1))
        return {"train": train, "val": one, "test": one}

    @property
    def input_shape(self) -> tuple[int, ...]:
        """``(S, H, W, 1)`` from the arguments. The CLI links it into the model while instantiating, before it
        sets ``run_seed``: building the signals to read their shape would draw them from seed 0 and keep them."""
        return (self.n_calib + self.n_test, self.size, self.size, 1)

    @property
    def num_classes(self) -> int:  # no classes: keeps the generic link from reading the calibration mask
        return 0


__all__ = ["SignalKind", "SignalLadderDataModule", "ladder_signals"]
