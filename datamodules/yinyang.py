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
    """``size`` samples as (features (size, 4) float64, labels (size,) int64), reference-compatible.

    The reference draws from one legacy ``RandomState(seed)`` stream, sample by sample: ``randint(3)`` (one
    32-bit word, masked to 2 bits, redrawn while it is 3), then ``rand(2)`` (two doubles of two words each)
    until a point is accepted. Calling numpy once per draw cost about half a millisecond a sample, so the
    same word stream is drawn in one block instead (the MT19937 state of ``RandomState(seed)``), every
    possible point (at every word offset) is classified at once with the same numpy functions, and only the
    walk through the stream (where each goal draw and each accepted point sits) stays a Python loop.
    ``tests/datamodules/test_yinyang.py`` checks the samples against a literal per-draw transcription.
    """
    if size <= 0:
        raise ConfigError(f"Yin-Yang size must be positive, got {size}")
    n_words = 36 * size + 256  # ~30 words a sample on average; a longer stream is drawn if this runs out
    while True:
        found = _walk_stream(size, seed, n_words, r_small, r_big)
        if found is not None:
            break
        n_words *= 2
    xs, ys, labels = found
    feats = np.stack([xs, ys, 1.0 - xs, 1.0 - ys], axis=1)
    return feats, labels


def _walk_stream(
    size: int, seed: int, n_words: int, r_small: float, r_big: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The reference's samples from the first ``n_words`` words of its stream; None if they are too few."""
    bits = np.random.MT19937()
    bits.state = np.random.RandomState(seed).get_state(legacy=False)
    words = bits.random_raw(n_words)
    # the double of rand() starting at word i (numpy's legacy 53-bit construction from two words)
    u = ((words[:-1] >> 5).astype(np.float64) * 67108864.0 + (words[1:] >> 6)) / 9007199254740992.0
    coord = u * 2.0 * r_big
    x, y = coord[:-2], coord[2:]  # a point drawn at word i: x from words i, i+1 and y from words i+2, i+3
    inside = ~(np.hypot(x - r_big, y - r_big) > r_big)
    cls = yinyang_class(x, y, r_small, r_big)
    n_points = len(x)
    never = np.iinfo(np.int64).max
    # next_ok[g][i]: the first point at i, i + 4, i + 8, ... (the draws that follow a rejected point) that is
    # inside the symbol and of class g
    next_ok = np.empty((3, n_points), dtype=np.int64)
    index = np.arange(n_points)
    for goal in range(3):
        at = np.where(inside & (cls == goal), index, never)
        for r in range(4):
            next_ok[goal, r::4] = np.minimum.accumulate(at[r::4][::-1])[::-1]
    goal_bits = (words & 3).astype(np.uint8).tobytes()  # bytes: the loop reads a few thousand of them
    pos = np.empty(size, dtype=np.int64)
    labels = np.empty(size, dtype=np.int64)
    i = 0
    for k in range(size):
        while i < n_points and goal_bits[i] == 3:  # randint(3)'s masked rejection
            i += 1
        if i + 1 >= n_points:
            return None
        goal = goal_bits[i]
        j = int(next_ok[goal, i + 1])
        if j == never:
            return None
        pos[k], labels[k] = j, goal
        i = j + 4
    return x[pos], y[pos], labels


class YinYangDataModule(TensorDataModule):
    """Yin-Yang classification (4 features, 3 classes), generated offline.

    Args:
        train_size, val_size, test_size: samples per split (reference: 5000 / 1000 / 1000).
        seeds: numpy seeds of the train, val and test generators (reference: 42, 41, 40).
        r_small, r_big: radii of the dots and of the whole symbol.
        batch_size, eval_batch_size, seed: see ``TensorDataModule``.
    """

    dataset_name = "yinyang"
    splits_follow_run_seed = False  # generated from its own numpy seeds

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
