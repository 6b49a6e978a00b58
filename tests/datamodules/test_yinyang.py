"""Yin-Yang: the same seeds give the reference implementation's samples; balance; features; splits."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from datamodules.yinyang import YinYangDataModule, _walk_stream, generate_yinyang


def _reference_yinyang(size: int, seed: int, r_small: float = 0.1, r_big: float = 0.5):
    """An independent, literal scalar transcription of the published procedure (global numpy RNG)."""
    np.random.seed(seed)
    vals, labels = [], []
    for _ in range(size):
        goal = np.random.randint(3)
        while True:
            x, y = np.random.rand(2) * 2.0 * r_big
            if np.sqrt((x - r_big) ** 2 + (y - r_big) ** 2) > r_big:
                continue
            d_right = np.sqrt((x - 1.5 * r_big) ** 2 + (y - r_big) ** 2)
            d_left = np.sqrt((x - 0.5 * r_big) ** 2 + (y - r_big) ** 2)
            yin = d_right <= r_small or (r_small < d_left <= 0.5 * r_big) or (y > r_big and d_right > 0.5 * r_big)
            c = 2 if (d_right < r_small or d_left < r_small) else int(yin)
            if c == goal:
                break
        vals.append([x, y, 1 - x, 1 - y])
        labels.append(c)
    return np.array(vals), np.array(labels)


@pytest.mark.parametrize("seed", [42, 41, 40, 7])
def test_matches_reference_procedure(seed: int) -> None:
    x, y = generate_yinyang(400, seed)
    rx, ry = _reference_yinyang(400, seed)
    np.testing.assert_array_equal(x, rx)
    np.testing.assert_array_equal(y, ry)


@pytest.mark.parametrize("size", [1, 2, 37])
def test_small_sizes_match_reference_procedure(size: int) -> None:
    x, y = generate_yinyang(size, 3)
    rx, ry = _reference_yinyang(size, 3)
    np.testing.assert_array_equal(x, rx)
    np.testing.assert_array_equal(y, ry)


def test_a_too_short_word_stream_is_detected() -> None:
    """The block of words drawn at once may run out: the walk says so (then a longer block is drawn)."""
    assert _walk_stream(200, 42, 64, 0.1, 0.5) is None
    xs, ys, labels = _walk_stream(200, 42, 200 * 36, 0.1, 0.5)
    rx, ry = _reference_yinyang(200, 42)
    np.testing.assert_array_equal(np.stack([xs, ys], axis=1), rx[:, :2])
    np.testing.assert_array_equal(labels, ry)


@pytest.mark.slow  # the reference loop takes about 5 s for the 7000 samples
def test_default_splits_match_reference_procedure() -> None:
    for size, seed in ((5000, 42), (1000, 41), (1000, 40)):
        x, y = generate_yinyang(size, seed)
        rx, ry = _reference_yinyang(size, seed)
        np.testing.assert_array_equal(x, rx)
        np.testing.assert_array_equal(y, ry)


def test_determinism_balance_and_features() -> None:
    x1, y1 = generate_yinyang(3000, 42)
    x2, y2 = generate_yinyang(3000, 42)
    np.testing.assert_array_equal(x1, x2)
    np.testing.assert_array_equal(y1, y2)
    x3, _ = generate_yinyang(3000, 43)
    assert not np.array_equal(x1, x3)
    counts = np.bincount(y1, minlength=3) / len(y1)
    assert np.all(np.abs(counts - 1 / 3) < 0.03), counts  # rejection sampling keeps the classes balanced
    np.testing.assert_allclose(x1[:, 2], 1 - x1[:, 0])
    np.testing.assert_allclose(x1[:, 3], 1 - x1[:, 1])
    assert np.all(np.hypot(x1[:, 0] - 0.5, x1[:, 1] - 0.5) <= 0.5)


def test_datamodule_splits_sizes_and_seeds() -> None:
    dm = YinYangDataModule(train_size=500, val_size=100, test_size=100)
    dm.setup("fit")
    assert [dm.splits[s][0].shape for s in ("train", "val", "test")] == [(500, 4), (100, 4), (100, 4)]
    x_ref, _ = generate_yinyang(100, 40)
    assert torch.allclose(dm.splits["test"][0], torch.from_numpy(x_ref).float())
    assert dm.num_features == 4 and dm.num_classes == 3


@pytest.mark.parametrize("kwargs", [{"train_size": 0}, {"batch_size": 0}, {"eval_batch_size": -1}])
def test_bad_sizes(kwargs: dict) -> None:
    with pytest.raises(ValueError, match="positive"):
        YinYangDataModule(**kwargs)
