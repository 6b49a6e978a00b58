"""datamodules/images.py: determinism, ranges, the photos' grayscale crops, phantoms, shapes2d, digits."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from datamodules.images import digits_images, ellipse_phantom, procedural_field, sample_image, shapes2d
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
    from datamodules.images import _photo

    rgb = _photo("flower") / 255  # the decoded JPEG (scikit-learn's load_sample_image, cached)
    ref = rgb[10:266, 20:276] @ np.array([0.299, 0.587, 0.114])
    out = sample_image("flower", size=256, crop=256, offset=(10, 20))
    assert out.shape == (256, 256, 1)
    assert np.allclose(out[..., 0].numpy(), ref, atol=1e-6)
    half = sample_image("flower", size=128, crop=256, offset=(10, 20))[..., 0].numpy()
    assert np.allclose(half, ref.reshape(128, 2, 128, 2).mean((1, 3)), atol=1e-6)  # area resampling


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


def test_bad_input():
    with pytest.raises(ConfigError, match="sample image must be one of"):
        sample_image("lena")
    with pytest.raises(ConfigError, match="crop must be"):
        sample_image("china", crop=500)
