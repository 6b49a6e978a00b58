"""datamodules/signals.py: determinism, ranges, the photos' grayscale crops, phantoms, shapes2d, the hub path,
the DataModules."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from datamodules.signals import (
    ImageSetDataModule,
    SignalLadderDataModule,
    digits_images,
    ellipse_phantom,
    hub_images,
    ladder_signals,
    procedural_field,
    sample_image,
    shapes2d,
)
from errors import ConfigError


def test_procedural_fields_are_seeded_and_in_range():
    a, b, c = procedural_field(64, 1), procedural_field(64, 1), procedural_field(64, 2)
    assert a.shape == (64, 64, 1) and torch.equal(a, b) and not torch.equal(a, c)
    assert float(a.min()) == 0.0 and float(a.max()) == pytest.approx(1.0)
    assert procedural_field(32, 0, channels=3).shape == (32, 32, 3)


def test_procedural_spectra_differ_between_seeds():
    """The share of energy above 8 cycles differs across seeds (Dirichlet-weighted smooth/waves/edges)."""
    shares = []
    for s in range(6):
        f = procedural_field(64, s)[..., 0].double()
        spec = torch.fft.fft2(f - f.mean()).abs() ** 2
        k = torch.fft.fftfreq(64) * 64
        r = torch.sqrt(k[:, None] ** 2 + k[None] ** 2)
        shares.append(float(spec[r > 8].sum() / spec.sum()))
    assert max(shares) > 2 * min(shares), shares


def test_sample_image_is_the_luma_of_the_crop():
    from datamodules.signals import _photo

    rgb = _photo("flower") / 255  # the decoded JPEG (scikit-learn's load_sample_image, cached)
    ref = rgb[10:266, 20:276] @ np.array([0.299, 0.587, 0.114])
    out = sample_image("flower", size=256, crop=256, offset=(10, 20))
    assert out.shape == (256, 256, 1)
    assert np.allclose(out[..., 0].numpy(), ref, atol=1e-6)
    half = sample_image("flower", size=128, crop=256, offset=(10, 20))[..., 0].numpy()
    assert np.allclose(half, ref.reshape(128, 2, 128, 2).mean((1, 3)), atol=1e-6)  # area resampling


def test_ladder_signals_hold_disjoint_photo_crops():
    test, calib = ladder_signals("mixed", 32, 0, 3, 3)
    assert test.shape == calib.shape == (3, 32, 32, 1)
    for t in test[1:]:
        assert not any(torch.allclose(t, c) for c in calib)
    t2, _ = ladder_signals("mixed", 32, 1, 3, 3)
    assert not torch.equal(test, t2)


def test_phantoms_differ_by_seed_but_keep_the_head():
    p0, p1 = ellipse_phantom(64, 0), ellipse_phantom(64, 1)
    assert p0.shape == (64, 64, 1) and float(p0.max()) == 1.0
    assert not torch.equal(p0, p1)
    c = (torch.arange(64) + 0.5) / 64 * 2 - 1
    yy, xx = torch.meshgrid(c, c, indexing="ij")
    outside = (xx / 0.69) ** 2 + (yy / 0.92) ** 2 > 1.0001  # the skull (not jittered) bounds the head
    assert float(p1[..., 0][outside].abs().max()) == 0.0


def test_shapes2d_images():
    x = shapes2d(64, 32, seed=0)
    assert x.shape == (64, 3, 32, 32) and float(x.min()) >= 0 and float(x.max()) <= 1
    assert torch.equal(x, shapes2d(64, 32, seed=0)) and not torch.equal(x, shapes2d(64, 32, seed=1))
    # the painted shapes make some pixels differ from the smooth background by a jump
    jumps = (x[..., 1:, :] - x[..., :-1, :]).abs().amax(dim=(1, 2, 3))
    assert (jumps > 0.1).float().mean() > 0.8


def test_digits_images():
    x = digits_images(16)
    assert x.shape == (1797, 1, 16, 16) and 0 <= float(x.min()) and float(x.max()) <= 1


def test_signal_ladder_datamodule_batches():
    dm = SignalLadderDataModule(kind="procedural", size=16, n_test=2, n_calib=1, steps_per_epoch=5, seed=3)
    dm.setup()
    batches = list(dm.train_dataloader())
    assert len(batches) == 5
    sig, calib = batches[0]
    assert sig.shape == (1, 3, 16, 16, 1) and calib.tolist() == [[True, False, False]]
    assert dm.input_shape == (3, 16, 16, 1)
    (vsig, _), = list(dm.val_dataloader())
    assert torch.equal(vsig, sig)


def test_signal_ladder_seed_follows_seed_everything(monkeypatch):
    monkeypatch.setenv("PL_GLOBAL_SEED", "7")
    assert SignalLadderDataModule(kind="procedural").seed == 7


def test_image_set_datamodule():
    dm = ImageSetDataModule("shapes2d", train_size=20, val_size=5, test_size=5, batch_size=4)
    dm.setup()
    (x,) = next(iter(dm.train_dataloader()))
    assert x.shape == (4, 3, 32, 32) and dm.input_shape == (3, 32, 32)
    dm = ImageSetDataModule("digits", batch_size=8)
    dm.setup()
    assert dm.splits["train"][0].shape == (1437, 1, 16, 16)


def test_bad_input():
    with pytest.raises(ConfigError, match="kind must be one of"):
        SignalLadderDataModule(kind="noise")
    with pytest.raises(ConfigError, match="sample image must be one of"):
        sample_image("lena")
    with pytest.raises(ConfigError, match="crop must be"):
        sample_image("china", crop=500)
    with pytest.raises(ConfigError, match="steps_per_epoch"):
        SignalLadderDataModule(steps_per_epoch=0)
    with pytest.raises(ConfigError, match="dataset must be"):
        ImageSetDataModule("cifar")


class _FakeHubSet:
    """What ``datasets`` returns for an image set: a column of PIL images."""

    def __init__(self, images):
        self.column_names = ["image"]
        self._images = images

    def __getitem__(self, key):
        assert key == "image"
        return self._images


def test_hub_images_are_grayscale_centre_crops(monkeypatch):
    from PIL import Image

    import datamodules.hub

    rgb = np.zeros((6, 10, 3), dtype=np.uint8)
    rgb[:, 2:8] = (255, 0, 0)  # the centred 6 x 6 square is pure red, the rest black
    monkeypatch.setattr(datamodules.hub, "load_hub_dataset", lambda *a, **k: _FakeHubSet([Image.fromarray(rgb)] * 3))
    out = hub_images("some/images", size=3)
    assert out.shape == (3, 3, 3, 1)
    assert torch.allclose(out, torch.full_like(out, 0.299), atol=1e-6)  # the luma of red, no black border
    test, calib = ladder_signals("hub", 3, seed=0, n_test=2, n_calib=1, hub_id="some/images")
    assert test.shape == (2, 3, 3, 1) and calib.shape == (1, 3, 3, 1)
    with pytest.raises(ConfigError, match="holds 3 images"):
        ladder_signals("hub", 3, seed=0, n_test=3, n_calib=1, hub_id="some/images")


def test_hub_signals_offline_name_the_embedded_default(paperlab_tmp):
    # paperlab_tmp sets HF_HUB_OFFLINE / HF_DATASETS_OFFLINE: the hub is unreachable
    dm = SignalLadderDataModule(kind="hub", size=16, n_test=1, n_calib=1, seed=0)
    with pytest.raises(Exception, match="Use the embedded default instead: configs/compression_error/grid_ladder.yaml"):
        dm.setup()
