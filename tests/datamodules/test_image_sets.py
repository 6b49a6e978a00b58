"""datamodules/image_sets.py: the image-set DataModule's splits and shapes."""

from __future__ import annotations

import pytest

from datamodules.image_sets import ImageSetDataModule
from errors import ConfigError


def test_image_set_datamodule():
    dm = ImageSetDataModule("shapes2d", train_size=20, val_size=5, test_size=5, batch_size=4)
    dm.setup()
    (x,) = next(iter(dm.train_dataloader()))
    assert x.shape == (4, 3, 32, 32) and dm.input_shape == (3, 32, 32)
    dm = ImageSetDataModule("digits", batch_size=8)
    dm.setup()
    assert dm.splits["train"][0].shape == (1437, 1, 16, 16)


def test_bad_input():
    with pytest.raises(ConfigError, match="dataset must be"):
        ImageSetDataModule("cifar")
