"""Simulated reaching (paper 004-02, BeeMO): unpaired movement data plus paired neural recordings of a target session.

Behaviour is 2-D hand velocity at 20 ms bins in 1 s windows (50 bins), positions in units of the reach radius
(10 cm), velocities in radii per second:

- ``aligned`` (the task's own movements): half minimum-jerk center-out reaches to one of 8 targets on the unit
  circle, half curved reaches to the same targets around a via point (a signed sideways bulge of 0.2-0.5 radii);
  onset uniform in [0.1, 0.5] s and duration uniform in [0.4, 0.8] s, so a window holds rest, then a reach; no
  cue of the target is ever in the behaviour;
- ``random_walk`` (not task-aligned): smoothed random-walk pursuit at the same RMS velocity.

Neural data (``datamodules.neural_population``): a session has 40-120 units reading the standardised latent
``z(t) = [v(t + 100 ms), x(t), |v(t)|]`` through its own random readout (``draw_session``; a per-session gain
in [0.2, 0.4] mimics drift between sessions, and sets a Wiener filter's test R^2 near 0.55 with 25 training trials
and 0.7 with 100, near what it reaches on monkey motor cortex), so each unit's log-rate is ``b + m.v(t + 100 ms) + p.x(t) +
g|v(t)| + OU`` with random preferred directions; counts are Poisson. The target session has ``n_target_train``
training trials (the paired budget: 25-200), ``n_val`` and ``n_test`` more; ``paired_pool="all"`` adds
``n_sessions`` other sessions of ``trials_per_session`` paired trials each to the paired training pool.

Session ids: 0 is the unpaired behaviour corpus, 1..n_sessions the other paired sessions, n_sessions + 1 the
target. Each part is drawn from its own generator keyed on ``(data_seed, part)``: the target session and its
test trials are the same whatever the unpaired corpus is, so arms of one seed are paired.

Batches. Training: ``(u_session (B,), u_vel (B, T, 2), p_session (B,), p_counts (B, T, U), p_vel (B, T, 2))``,
one unpaired and one paired batch per step (the task uses the first in its behaviour-only stage, the second
after), indices drawn with replacement from ``(seed, epoch)``. Validation and test: ``(session, counts, vel)``
of the target session. ``U`` is the largest unit count in the data; smaller sessions are zero-padded (a zero
count adds nothing to a neural token).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Literal

import torch
from torch import Tensor

from datamodules.base import BatchedTensorLoader, PaperlabDataModule, ResumableLoader
from datamodules.neural_population import (
    BIN_S,
    curved_reach,
    draw_session,
    minimum_jerk,
    ou_noise,
    poisson_counts,
    random_walk_pursuit,
)
from errors import ConfigError

LAG_BINS = 5  # the neural lead: rates at t encode v(t + 100 ms)
N_TARGETS = 8
#: RMS of the aligned velocity per axis and of the position per axis (radii/s, radii), measured on 20k aligned
#: trials; they standardise the latent the units read and set the random walk's speed
V_RMS, X_RMS = 1.23, 0.41


def aligned_reaches(n: int, n_bins: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """Half center-out, half curved reaches to one of 8 targets at radius 1 (module docstring): ``(pos, vel)``,
    each ``(n, n_bins, 2)`` float64."""
    t = torch.arange(n_bins, dtype=torch.float64) * BIN_S
    angle = 2 * math.pi * torch.randint(N_TARGETS, (n,), generator=generator).double() / N_TARGETS
    end = torch.stack([angle.cos(), angle.sin()], dim=-1)
    start = torch.zeros_like(end)
    onset = 0.1 + 0.4 * torch.rand(n, generator=generator, dtype=torch.float64)
    duration = 0.4 + 0.4 * torch.rand(n, generator=generator, dtype=torch.float64)
    sign = torch.where(torch.rand(n, generator=generator) < 0.5, -1.0, 1.0).double()
    bulge = sign * (0.2 + 0.3 * torch.rand(n, generator=generator, dtype=torch.float64))
    curved = torch.rand(n, generator=generator) < 0.5
    pos, vel = minimum_jerk(start, end, onset, duration, t)
    c = curved.nonzero().squeeze(1)
    pos[c], vel[c] = curved_reach(start[c], end[c], bulge[c], onset[c], duration[c], t)
    return pos, vel


def movements(kind: Literal["aligned", "random_walk"], n: int, n_bins: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """``(pos, vel)`` of ``n`` movements of ``kind`` (module docstring)."""
    if kind == "aligned":
        return aligned_reaches(n, n_bins, generator)
    return random_walk_pursuit(n, n_bins, generator, speed=V_RMS)


def session_latent(vel: Tensor, pos: Tensor) -> Tensor:
    """What the units read, ``(n, T, 5)`` from movements ``(n, T + LAG_BINS, 2)``: ``[v(t + lag) / V_RMS, x(t) /
    X_RMS, (|v(t)| - V_RMS) / V_RMS]``."""
    steps = vel.shape[1] - LAG_BINS
    speed = vel[:, :steps].norm(dim=-1, keepdim=True)
    return torch.cat([vel[:, LAG_BINS:] / V_RMS, pos[:, :steps] / X_RMS, (speed - V_RMS) / V_RMS], dim=-1)


def record_session(
    vel: Tensor, pos: Tensor, n_units: int, generator: torch.Generator, gain: float, ou_sigma: float = 0.5,
    ou_tau_s: float = 0.1,
) -> Tensor:
    """Poisson counts ``(n, T, n_units)`` of a new session recording movements ``vel, pos (n, T + LAG_BINS, 2)``:
    log-rate ``= C z + b + OU`` with ``z = session_latent(vel, pos)``, capped at 5 spikes a bin."""
    z = session_latent(vel, pos)
    session = draw_session(n_units, 5, generator, gain=gain)
    log_rate = session.log_rates(z) + ou_noise((vel.shape[0], z.shape[1], n_units), ou_tau_s, ou_sigma, generator)
    return poisson_counts(log_rate.clamp(max=math.log(5.0)).exp(), generator)


class MixedStreamLoader(ResumableLoader):
    """One unpaired and one paired batch per step, ``steps`` steps an epoch, indices drawn with replacement from
    ``(seed, epoch)``; resumable mid-epoch; each rank takes positions ``rank, rank + world, ...`` of a batch."""

    def __init__(self, unpaired: tuple[Tensor, ...], paired: tuple[Tensor, ...], batch_size: int, steps: int,
                 seed: int = 0, rank: int = 0, world_size: int = 1) -> None:
        super().__init__()
        if batch_size < world_size:
            raise ConfigError(f"batch_size={batch_size} is smaller than the number of processes ({world_size})")
        self.unpaired, self.paired = unpaired, paired
        self.batch_size, self.steps, self.seed = batch_size, steps, seed
        self.rank, self.world_size = rank, world_size

    def __len__(self) -> int:
        return self.steps

    def batches(self, skip: int = 0) -> Iterator[tuple[Tensor, ...]]:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        iu = torch.randint(self.unpaired[0].shape[0], (self.steps, self.batch_size), generator=gen)
        ip = torch.randint(self.paired[0].shape[0], (self.steps, self.batch_size), generator=gen)
        for i in range(skip, self.steps):
            u, p = iu[i, self.rank :: self.world_size], ip[i, self.rank :: self.world_size]
            yield tuple(t[u] for t in self.unpaired) + tuple(t[p] for t in self.paired)


class SimReachDataModule(PaperlabDataModule):
    """Unpaired reaches + a paired target session (module docstring).

    Args:
        n_unpaired: unpaired behaviour trials (1k-20k in the claims).
        unpaired_kind: ``aligned`` (center-out + curved reaches, the task's own) or ``random_walk``.
        n_target_train: paired training trials of the target session (25-200).
        n_val, n_test: validation and test trials of the target session.
        paired_pool: ``target`` (stage 2 trains on the target session only) or ``all`` (plus ``n_sessions``
            other sessions of ``trials_per_session`` trials: multi-session paired data).
        n_sessions, trials_per_session: the other paired sessions (used by ``paired_pool="all"``).
        units_range: a session's number of units, drawn uniformly in this closed range.
        n_bins: bins per window (20 ms each).
        steps_per_epoch: training steps per epoch.
        batch_size: training batch (unpaired and paired each); eval_batch_size: validation and test batch.
        data_seed: seed of the simulated data; None: the run's seed.
        seed: seed of the batch order; None: the run's seed.
    """

    dataset_name = "sim_reach"

    def __init__(
        self,
        n_unpaired: int = 20_000,
        unpaired_kind: Literal["aligned", "random_walk"] = "aligned",
        n_target_train: int = 100,
        n_val: int = 100,
        n_test: int = 200,
        paired_pool: Literal["target", "all"] = "target",
        n_sessions: int = 4,
        trials_per_session: int = 200,
        units_range: tuple[int, int] = (40, 120),
        n_bins: int = 50,
        steps_per_epoch: int = 100,
        batch_size: int = 64,
        eval_batch_size: int = 200,
        data_seed: int | None = None,
        seed: int | None = None,
    ) -> None:
        super().__init__()
        if min(n_unpaired, n_target_train, n_val, n_test, n_bins, steps_per_epoch, batch_size, eval_batch_size) < 1:
            raise ConfigError("n_unpaired, n_target_train, n_val, n_test, n_bins, steps_per_epoch and the batch "
                              "sizes must be positive")
        if n_sessions < 0 or trials_per_session < 1:
            raise ConfigError(f"need n_sessions >= 0 and trials_per_session >= 1, got {n_sessions}, {trials_per_session}")
        lo, hi = units_range
        if not 1 <= lo <= hi:
            raise ConfigError(f"units_range must be (lo, hi) with 1 <= lo <= hi, got {units_range}")
        self.n_unpaired, self.unpaired_kind, self.n_target_train = n_unpaired, unpaired_kind, n_target_train
        self.n_val, self.n_test, self.paired_pool = n_val, n_test, paired_pool
        self.n_sessions, self.trials_per_session = n_sessions, trials_per_session
        self.units_range, self.n_bins, self.steps_per_epoch = (lo, hi), n_bins, steps_per_epoch
        self.batch_size, self.eval_batch_size = batch_size, eval_batch_size
        self.data_seed, self.fixed_seed = data_seed, seed
        self.parts: dict[str, tuple[Tensor, ...]] | None = None

    def _gen(self, part: int) -> torch.Generator:
        return torch.Generator().manual_seed(self.seed_or_run(self.data_seed) * 1000 + part)

    def _session(self, session_id: int, n: int, gen: torch.Generator) -> tuple[Tensor, Tensor, Tensor]:
        """``(session, counts, vel)`` of ``n`` aligned trials recorded in a fresh session."""
        pos, vel = aligned_reaches(n, self.n_bins + LAG_BINS, gen)
        lo, hi = self.units_range
        n_units = int(torch.randint(lo, hi + 1, (), generator=gen))
        gain = 0.2 + 0.2 * float(torch.rand((), generator=gen))
        counts = record_session(vel, pos, n_units, gen, gain)
        return (torch.full((n,), session_id, dtype=torch.long), counts.float(), vel[:, : self.n_bins].float())

    def setup(self, stage: str | None = None) -> None:
        if self.parts is not None:
            return
        _, u_vel = movements(self.unpaired_kind, self.n_unpaired, self.n_bins, self._gen(0))
        target_id = self.n_sessions + 1
        n_target = self.n_target_train + self.n_val + self.n_test
        sess, counts, vel = self._session(target_id, n_target, self._gen(1))
        cut = (self.n_target_train, self.n_target_train + self.n_val)
        paired = [(sess[: cut[0]], counts[: cut[0]], vel[: cut[0]])]
        if self.paired_pool == "all":
            paired += [self._session(k + 1, self.trials_per_session, self._gen(2 + k)) for k in range(self.n_sessions)]
        width = max(p[1].shape[2] for p in paired)
        pad = lambda c: torch.nn.functional.pad(c, (0, width - c.shape[2]))  # noqa: E731
        self.parts = {
            "unpaired": (torch.zeros(self.n_unpaired, dtype=torch.long), u_vel.float()),
            "paired": (torch.cat([p[0] for p in paired]), torch.cat([pad(p[1]) for p in paired]),
                       torch.cat([p[2] for p in paired])),
            "val": (sess[cut[0] : cut[1]], pad(counts[cut[0] : cut[1]]), vel[cut[0] : cut[1]]),
            "test": (sess[cut[1] :], pad(counts[cut[1] :]), vel[cut[1] :]),
        }

    def _world(self) -> tuple[int, int]:
        trainer = self.trainer
        return (0, 1) if trainer is None else (trainer.global_rank, trainer.world_size)

    def _parts(self) -> dict[str, tuple[Tensor, ...]]:
        self.setup()
        assert self.parts is not None
        return self.parts

    def train_dataloader(self) -> MixedStreamLoader:
        rank, world = self._world()
        parts = self._parts()
        return MixedStreamLoader(parts["unpaired"], parts["paired"], self.batch_size, self.steps_per_epoch,
                                 seed=self.seed_or_run(self.fixed_seed), rank=rank, world_size=world)

    def _eval(self, name: str) -> BatchedTensorLoader:
        rank, world = self._world()
        return BatchedTensorLoader(self._parts()[name], self.eval_batch_size, rank=rank, world_size=world)

    def val_dataloader(self) -> BatchedTensorLoader:
        return self._eval("val")

    def test_dataloader(self) -> BatchedTensorLoader:
        return self._eval("test")

    def predict_dataloader(self) -> BatchedTensorLoader:
        return self._eval("test")

    def paired_training_set(self) -> tuple[Tensor, Tensor, Tensor]:
        """``(session, counts, vel)`` of the target session's paired training trials (what the Wiener filter
        fits; ``modules.protocols.PairedTrainingSet``)."""
        session, counts, vel = self._parts()["paired"]
        keep = session == self.n_sessions + 1
        return session[keep], counts[keep], vel[keep]
