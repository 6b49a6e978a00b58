"""datamodules/signal_ladder.py: the ladder's signal sets (disjoint photo crops, the hub path), the DataModule's
batches and seed."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from datamodules.images import hub_images
from datamodules.signal_ladder import SignalLadderDataModule, ladder_signals
from errors import ConfigError


def test_ladder_signals_hold_disjoint_photo_crops():
    test, calib = ladder_signals("mixed", 32, 0, 3, 3)
    assert test.shape == calib.shape == (3, 32, 32, 1)
    for t in test[1:]:
        assert not any(torch.allclose(t, c) for c in calib)
    t2, _ = ladder_signals("mixed", 32, 1, 3, 3)
    assert not torch.equal(test, t2)


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


def test_signal_ladder_seed_follows_seed_everything():
    dm = SignalLadderDataModule(kind="procedural")
    dm.run_seed = 7  # what the CLI sets from seed_everything right after building the DataModule
    assert dm.seed == 7


def test_input_shape_leaves_the_signals_to_the_run_seed():
    """The CLI links ``input_shape`` while instantiating, before it sets ``run_seed``: reading the shape must not
    draw the signals, or every seed of a sweep would fit the signals of seed 0."""
    dm = SignalLadderDataModule(kind="procedural", size=8, n_test=2, n_calib=1, steps_per_epoch=1)
    assert dm.input_shape == (3, 8, 8, 1) and dm.splits is None
    dm.run_seed = 4
    dm.setup()
    test, calib = ladder_signals("procedural", 8, 4, 2, 1)
    assert torch.equal(dm.splits["val"][0][0], torch.cat([calib, test]))
    assert dm.input_shape == tuple(dm.splits["train"][0].shape[1:])


def test_bad_input():
    with pytest.raises(ConfigError, match="kind must be one of"):
        SignalLadderDataModule(kind="noise")
    with pytest.raises(ConfigError, match="steps_per_epoch"):
        SignalLadderDataModule(steps_per_epoch=0)


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
