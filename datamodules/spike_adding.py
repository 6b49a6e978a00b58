"""Spike adding (paper 004-05): a procedural analog of SHD-Adding, generated in code.

Ten "digit" classes, each a fixed random smooth rate map over ``n_channels`` input channels x ``digit_steps``
steps (Gaussian noise smoothed along channels and time, squashed into a spike probability per step). A digit
sample is Bernoulli spikes drawn from its class's map after a random time shift (uniform in +-``jitter`` steps)
and a time warp (time stretched by a factor from a grid of 21 evenly spaced values in ``1 +- warp``). An adding sample is two digit samples
back to back with ``gap`` silent steps between them (``2 digit_steps + gap`` = 110 steps by default); its class
is the sum of the two digits (19 classes), so a network must carry the first digit to the end.

Batches ``(x (B, T, n_channels) uint8 spikes, y (B,) long)``. The rate maps and the samples are drawn from
``data_seed`` (the same data on every run); the shuffling order follows the run's seed. The paper-scale data
(SHD, Cramer et al. 2020) is not shipped: this module is its offline stand-in.
"""

from __future__ import annotations

import torch
from torch import Tensor

from datamodules.base import Split, TensorDataModule
from errors import ConfigError

N_DIGITS = 10


def _smooth(z: Tensor, sigma: float, dim: int) -> Tensor:
    """``z`` convolved with a normalised Gaussian of width ``sigma`` along ``dim`` (zero padding)."""
    radius = max(1, int(3 * sigma))
    k = torch.exp(-0.5 * (torch.arange(-radius, radius + 1, dtype=z.dtype) / sigma) ** 2)
    k = (k / k.sum()).view(1, 1, -1)
    moved = z.movedim(dim, -1)
    flat = moved.reshape(-1, 1, moved.shape[-1])
    out = torch.nn.functional.conv1d(flat, k, padding=radius).reshape(moved.shape)
    return out.movedim(-1, dim)


def digit_rate_maps(n_channels: int, digit_steps: int, seed: int, max_rate: float = 0.4) -> Tensor:
    """The ten classes' spike probabilities per step ``(10, n_channels, digit_steps)`` in ``(0, max_rate)``: smooth
    random fields, standardised, through a sigmoid that leaves most of each map near silent and a few blobs
    active."""
    gen = torch.Generator().manual_seed(seed)
    z = torch.randn(N_DIGITS, n_channels, digit_steps, generator=gen, dtype=torch.float64)
    z = _smooth(_smooth(z, 3.0, 1), 3.0, 2)
    z = (z - z.mean((1, 2), keepdim=True)) / z.std(dim=(1, 2), keepdim=True)
    return (max_rate * torch.sigmoid(3.0 * (z - 1.0))).float()


WARP_LEVELS = 21  # the time stretch is drawn from this many evenly spaced factors in [1 - warp, 1 + warp]


def warped_maps(maps: Tensor, jitter: int, warp: float) -> Tensor:
    """Every class's map under every shift in ``[-jitter, jitter]`` and every stretch factor of the
    ``WARP_LEVELS`` grid in ``[1 - warp, 1 + warp]``: ``(10, 2 jitter + 1, WARP_LEVELS, C, S)``. Step ``t``
    reads the map at ``(t - shift) / stretch`` by linear interpolation, silent outside it."""
    steps = maps.shape[-1]
    shift = torch.arange(-jitter, jitter + 1, dtype=torch.float32)[:, None, None]
    stretch = torch.linspace(1 - warp, 1 + warp, WARP_LEVELS)[None, :, None]
    u = (torch.arange(steps, dtype=torch.float32)[None, None, :] - shift) / stretch  # (J, W, S)
    lo = u.floor()
    frac = (u - lo)[:, :, None, :]  # broadcast over channels
    padded = torch.nn.functional.pad(maps, (1, 1))  # positions -1 and S read the silent border
    i0 = (lo.long() + 1).clamp(0, steps + 1)
    i1 = (lo.long() + 2).clamp(0, steps + 1)
    return (1 - frac) * padded[:, :, i0].permute(0, 2, 3, 1, 4) + frac * padded[:, :, i1].permute(0, 2, 3, 1, 4)


def digit_samples(variants: Tensor, classes: Tensor, gen: torch.Generator) -> Tensor:
    """Spikes ``(n, C, S)`` (uint8) of digits ``classes (n,)``: each a random shift and stretch of its class's
    map (``variants`` from ``warped_maps``), then Bernoulli per channel and step."""
    n = classes.numel()
    n_shift, n_warp = variants.shape[1], variants.shape[2]
    flat = variants.reshape(-1, *variants.shape[3:])
    pick = (classes * n_shift + torch.randint(0, n_shift, (n,), generator=gen)) * n_warp
    pick = pick + torch.randint(0, n_warp, (n,), generator=gen)
    rate = flat.index_select(0, pick)
    return (torch.rand(rate.shape, generator=gen) < rate).to(torch.uint8)


def adding_samples(
    maps: Tensor, n: int, gap: int, jitter: int, warp: float, seed: int, chunk: int = 4096
) -> tuple[Tensor, Tensor]:
    """``n`` adding samples ``(x (n, 2 S + gap, C) uint8, y (n,) long)``, y = first digit + second digit."""
    gen = torch.Generator().manual_seed(seed)
    variants = warped_maps(maps, jitter, warp)
    n_ch, steps = maps.shape[1], maps.shape[2]
    x = torch.zeros(n, 2 * steps + gap, n_ch, dtype=torch.uint8)
    pairs = torch.randint(0, N_DIGITS, (n, 2), generator=gen)
    for start in range(0, n, chunk):  # chunks bound the float rates' memory
        sl = slice(start, min(n, start + chunk))
        x[sl, :steps] = digit_samples(variants, pairs[sl, 0], gen).transpose(1, 2)
        x[sl, steps + gap:] = digit_samples(variants, pairs[sl, 1], gen).transpose(1, 2)
    return x, pairs.sum(1)


class SpikeAddingDataModule(TensorDataModule):
    """Spike adding, the SHD-Adding analog (module docstring): 19 classes, ``(T, n_channels)`` spike inputs.

    Args:
        n_channels: input channels (70, as the spec's SHD-Adding analog).
        digit_steps: steps per digit (50; the sample is ``2 digit_steps + gap`` long).
        gap: silent steps between the two digits.
        n_train, n_val, n_test: samples per split (the spec: 20k train, 2k test).
        jitter: the largest time shift of a digit, in steps.
        warp: the largest relative time stretch of a digit.
        max_rate: the largest spike probability per channel and step.
        data_seed: seed of the rate maps and the samples (fixed across runs).
        batch_size, eval_batch_size, seed: see ``TensorDataModule`` (seed None: the run's seed).
    """

    dataset_name = "spike_adding"

    def __init__(
        self,
        n_channels: int = 70,
        digit_steps: int = 50,
        gap: int = 10,
        n_train: int = 20_000,
        n_val: int = 1_000,
        n_test: int = 2_000,
        jitter: int = 3,
        warp: float = 0.1,
        max_rate: float = 0.4,
        data_seed: int = 0,
        batch_size: int = 64,
        eval_batch_size: int | None = None,
        seed: int | None = None,
    ) -> None:
        super().__init__(batch_size=batch_size, eval_batch_size=eval_batch_size, seed=seed)
        if min(n_channels, digit_steps, n_train, n_val, n_test) < 1 or gap < 0 or jitter < 0:
            raise ConfigError("n_channels, digit_steps and the split sizes must be >= 1, gap and jitter >= 0; got "
                              f"{n_channels}, {digit_steps}, {n_train}/{n_val}/{n_test}, gap {gap}, jitter {jitter}")
        if not 0 <= warp < 1 or not 0 < max_rate <= 1:
            raise ConfigError(f"warp must be in [0, 1) and max_rate in (0, 1], got warp={warp}, max_rate={max_rate}")
        self.n_channels, self.digit_steps, self.gap = n_channels, digit_steps, gap
        self.n_train, self.n_val, self.n_test = n_train, n_val, n_test
        self.jitter, self.warp, self.max_rate, self.data_seed = jitter, warp, max_rate, data_seed

    def build_splits(self) -> dict[str, Split]:
        maps = digit_rate_maps(self.n_channels, self.digit_steps, self.data_seed, self.max_rate)
        out: dict[str, Split] = {}
        for i, (name, n) in enumerate((("train", self.n_train), ("val", self.n_val), ("test", self.n_test))):
            # one seed per split, far from the others' and from the maps'
            seed = (self.data_seed * 1_000_003 + 7919 * (i + 1)) % (2**63 - 1)
            out[name] = adding_samples(maps, n, self.gap, self.jitter, self.warp, seed)
        return out

    @property
    def input_shape(self) -> tuple[int, ...]:
        return (2 * self.digit_steps + self.gap, self.n_channels)

    @property
    def num_classes(self) -> int:
        return 2 * N_DIGITS - 1
