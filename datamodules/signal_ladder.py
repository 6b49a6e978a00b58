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
    sample_image_shape,
)
from errors import ConfigError

SignalKind = Literal["procedural", "images", "mixed", "phantom", "hub"]


#: the photo crops' side in the photo's pixels (resampled to the signal size)
PHOTO_CROP = 256


def ladder_sources(kind: SignalKind, seed: int, n_test: int, n_calib: int,
                   n_hub: int | None = None) -> tuple[list[str], list[str]]:
    """The sources of one ladder run's test and calibration signals, as labels ``(test, calib)``:
    ``procedural:<field seed>``, ``phantom:<seed>``, ``<photo>@<row>,<col>`` (a 256-crop of one of
    ``SAMPLE_IMAGES`` at that corner) or ``hub:<index>``.

    Test and calibration signals never share a source (no field seed, phantom, photo or hub image on both
    sides), and every source changes with ``seed``: the field and phantom seeds are ``1000 seed + i`` (test)
    and ``1000 seed + 500 + i`` (calibration); of the three photos, calibration gets at most one,
    ``SAMPLE_IMAGES[seed % 3]``, and test at most the two others, each crop at a seeded corner; the hub
    images are split by a seeded permutation of the ``n_hub`` images. A calibration signal is therefore never a part of a test signal's
    photo, and the seeds of a sweep are replications over sources, not the same photos re-cropped.
    """
    if n_test < 1 or n_calib < 0:
        raise ConfigError(f"need n_test >= 1 and n_calib >= 0, got {n_test}, {n_calib}")
    if kind == "procedural" or kind == "phantom":
        return ([f"{kind}:{1000 * seed + i}" for i in range(n_test)],
                [f"{kind}:{1000 * seed + 500 + i}" for i in range(n_calib)])
    if kind == "hub":
        if n_hub is None or n_test + n_calib > n_hub:
            raise ConfigError(f"the hub set holds {n_hub} images; n_test + n_calib = {n_test + n_calib}")
        order = torch.randperm(n_hub, generator=torch.Generator().manual_seed(int(seed))).tolist()
        return [f"hub:{i}" for i in order[n_calib : n_calib + n_test]], [f"hub:{i}" for i in order[:n_calib]]
    if kind not in ("images", "mixed"):
        raise ConfigError(f"kind must be one of procedural, images, mixed, phantom, hub; got {kind!r}")
    # the calibration photo rotates with the seed (seeds 0, 1, 2 hold each photo out once); the test photos'
    # order and every crop's corner are seeded
    k = len(SAMPLE_IMAGES)
    gen = torch.Generator().manual_seed(int(seed) * 31 + 5)
    others = [SAMPLE_IMAGES[(seed + 1 + i) % k] for i in torch.randperm(k - 1, generator=gen).tolist()]
    photos = [*others, SAMPLE_IMAGES[seed % k]]
    crops = []
    for name in photos:
        h, w = sample_image_shape(name)
        row = int(torch.randint(0, h - PHOTO_CROP + 1, (), generator=gen))
        col = int(torch.randint(0, w - PHOTO_CROP + 1, (), generator=gen))
        crops.append(f"{name}@{row},{col}")
    n_tp = min(2, n_test)
    n_cp = min(len(crops) - n_tp, n_calib)
    test_photos, calib_photos = crops[:n_tp], crops[n_tp : n_tp + n_cp]
    test_fields = [f"procedural:{1000 * seed + i}" for i in range(n_test - n_tp)]
    calib_fields = [f"procedural:{1000 * seed + 500 + i}" for i in range(n_calib - n_cp)]
    if kind == "images":
        return test_photos + test_fields, calib_photos + calib_fields
    return test_fields + test_photos, calib_fields + calib_photos


def _source_signal(label: str, size: int, hub: Tensor | None) -> Tensor:
    name, _, arg = label.partition(":") if ":" in label else label.partition("@")
    if name == "procedural":
        return procedural_field(size, int(arg))
    if name == "phantom":
        return ellipse_phantom(size, int(arg))
    if name == "hub":
        assert hub is not None
        return hub[int(arg)]
    row, col = (int(v) for v in arg.split(","))
    return sample_image(name, size, PHOTO_CROP, (row, col))


def ladder_signals(kind: SignalKind, size: int, seed: int, n_test: int, n_calib: int,
                   hub_id: str = KODAK_HUB_ID) -> tuple[Tensor, Tensor]:
    """The test and calibration signals of one ladder run: ``(test (n_test, H, W, 1), calib (n_calib, ...))``,
    from the sources ``ladder_sources`` names (disjoint between test and calibration, new with every seed).

    - ``procedural``: procedural fields; ``phantom``: ellipse phantoms;
    - ``images``: the photos' crops first (two test, one calibration), topped up with procedural fields;
    - ``mixed``: procedural fields first, then the photos' crops (test: n_test - 2 fields + two photos;
      calibration: n_calib - 1 fields + the third photo);
    - ``hub``: images of the hub set ``hub_id`` (``hub_images``), a seeded permutation split into
      calibration and test images (paper scale: Kodak at 256 x 256).
    """
    if n_test < 1 or n_calib < 0:
        raise ConfigError(f"need n_test >= 1 and n_calib >= 0, got {n_test}, {n_calib}")
    hub = hub_images(hub_id, size) if kind == "hub" else None
    if hub is not None and n_test + n_calib > len(hub):
        raise ConfigError(f"{hub_id!r} holds {len(hub)} images; n_test + n_calib = {n_test + n_calib}")
    test_src, calib_src = ladder_sources(kind, seed, n_test, n_calib, None if hub is None else len(hub))
    test = torch.stack([_source_signal(lab, size, hub) for lab in test_src])
    calib = (torch.stack([_source_signal(lab, size, hub) for lab in calib_src]) if calib_src
             else torch.zeros(0, size, size, 1))
    return test, calib


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


__all__ = ["PHOTO_CROP", "SignalKind", "SignalLadderDataModule", "ladder_signals", "ladder_sources"]
