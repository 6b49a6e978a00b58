"""``SyntheticSpikesDataModule``: the embedded default of the spike-tokenizer benchmark (paper 002-08).

Six "sessions" record one shared latent dynamical system, a standardised 3-D Lorenz trajectory ``z_t`` (each
trial its own segment of the attractor), each through its own random readout of 80-150 units:
``log lambda = C_s z + b_s`` (``datamodules.neural_population.draw_session``), Poisson counts in 20 ms bins,
``n_trials`` trials of ``n_bins`` bins (400 x 1 s by default). Behaviour is a nonlinear 2-D map of the latent,
``(tanh(z_2), sin(z_3))`` (a stand-in for hand velocity). The last ``n_heldout`` sessions are held out from the
tokenizer's training (new units: cross-instance generalisation); the last of them runs ``speedup`` times faster
(the "other species / area" shift). Optional OU noise on the log rates (``ou_sigma``) makes the rates drift within
a trial.

Units are padded to ``max_units`` (150) slots with a unit mask. A batch is the tuple
``(counts (B, T, U), unit_mask (B, U) bool, session (B,) long, behaviour (B, T, 2), latents (B, T, 3),
rates (B, T, U))``, float32 except the mask and session.

Splits: every session's trials are split 80/10/10 into train/val/test. The training loader holds the training
sessions' train trials only; val their val trials; test every session's test trials (held-out ones included).
``probe_split()`` gives every session's train trials: the probes of the test stage are fitted on them.
"""

from __future__ import annotations

import torch
from torch import Tensor

from datamodules.base import Split, TensorDataModule, seeded_split
from datamodules.neural_population import draw_session, lorenz_latents, ou_noise, poisson_counts
from errors import ConfigError

LATENT_DIM = 3
BEHAVIOUR_DIM = 2


def behaviour_of(latents: Tensor) -> Tensor:
    """The 2-D behaviour of latents ``(..., 3)``: ``(tanh(z_2), sin(z_3))``."""
    return torch.stack([torch.tanh(latents[..., 1]), torch.sin(latents[..., 2])], dim=-1)


class SyntheticSpikesDataModule(TensorDataModule):
    """Multi-session Poisson populations reading one Lorenz latent (see the module docstring).

    Args:
        n_sessions: sessions in all (held-out ones included).
        n_heldout: the last sessions kept out of the tokenizer's training (>= 1); the last one is the fast one.
        n_trials: trials per session.
        n_bins: 20 ms bins per trial (50 = 1 s).
        units_range: each session's number of units is drawn uniformly in this range (inclusive).
        gain: standard deviation of each unit's log-rate modulation by the latent.
        mean_rate_hz: range of the units' baseline firing rates.
        time_per_bin: Lorenz time per bin (the dynamics' speed).
        speedup: the last held-out session's dynamics run this many times faster.
        ou_sigma, ou_tau_s: Ornstein-Uhlenbeck noise on the log rates (0: none).
        data_seed: seed of the simulated data; None: the run's seed.
        batch_size, eval_batch_size, seed: see ``TensorDataModule``.
    """

    dataset_name = "synthetic_spikes"

    def __init__(
        self,
        n_sessions: int = 6,
        n_heldout: int = 2,
        n_trials: int = 400,
        n_bins: int = 50,
        units_range: tuple[int, int] = (80, 150),
        gain: float = 1.0,
        mean_rate_hz: tuple[float, float] = (5.0, 20.0),
        time_per_bin: float = 0.01,
        speedup: float = 2.0,
        ou_sigma: float = 0.0,
        ou_tau_s: float = 0.2,
        data_seed: int | None = None,
        batch_size: int = 32,
        eval_batch_size: int | None = 128,
        seed: int | None = None,
    ) -> None:
        super().__init__(batch_size, eval_batch_size, seed)
        if n_heldout < 1 or n_sessions - n_heldout < 1:
            raise ConfigError(f"need at least one training and one held-out session, got n_sessions={n_sessions}, "
                              f"n_heldout={n_heldout}")
        if n_trials < 10:
            raise ConfigError(f"n_trials must be >= 10 (80/10/10 splits), got {n_trials}")
        if not 1 <= units_range[0] <= units_range[1]:
            raise ConfigError(f"units_range must be (lo, hi) with 1 <= lo <= hi, got {units_range}")
        if n_bins < 1 or time_per_bin <= 0 or speedup <= 0:
            raise ConfigError("n_bins, time_per_bin and speedup must be positive")
        self.n_sessions, self.n_heldout, self.n_trials, self.n_bins = n_sessions, n_heldout, n_trials, n_bins
        self.units_range, self.gain, self.mean_rate_hz = (int(units_range[0]), int(units_range[1])), gain, mean_rate_hz
        self.time_per_bin, self.speedup, self.ou_sigma, self.ou_tau_s = time_per_bin, speedup, ou_sigma, ou_tau_s
        self.data_seed = data_seed
        self.probe: Split | None = None

    @property
    def max_units(self) -> int:
        """Unit slots of a batch (the largest session's size)."""
        return self.units_range[1]

    @property
    def n_train_sessions(self) -> int:
        return self.n_sessions - self.n_heldout

    def simulate(self) -> list[Split]:
        """Every session's trials: ``(counts, unit_mask, session, behaviour, latents, rates)`` per session."""
        gen = torch.Generator().manual_seed(self.seed_or_run(self.data_seed))
        lo, hi = self.units_range
        out = []
        # one integration for the sessions at the common speed (the RK4 loop, not the trials, is the cost)
        common = lorenz_latents(self.n_trials * (self.n_sessions - 1), self.n_bins, gen, self.time_per_bin)
        fast = lorenz_latents(self.n_trials, self.n_bins, gen, self.time_per_bin * self.speedup)
        latents = [*common.split(self.n_trials), fast]
        for s in range(self.n_sessions):
            z = latents[s]
            n_units = int(torch.randint(lo, hi + 1, (1,), generator=gen))
            sess = draw_session(n_units, LATENT_DIM, gen, gain=self.gain, mean_rate_hz=self.mean_rate_hz)
            log_rates = sess.log_rates(z)
            if self.ou_sigma > 0:
                log_rates = log_rates + ou_noise(tuple(log_rates.shape), self.ou_tau_s, self.ou_sigma, gen)
            rates = log_rates.exp()
            counts = poisson_counts(rates, gen)
            pad = self.max_units - n_units
            mask = torch.zeros(self.n_trials, self.max_units, dtype=torch.bool)
            mask[:, :n_units] = True
            out.append((
                torch.nn.functional.pad(counts, (0, pad)).float(), mask,
                torch.full((self.n_trials,), s, dtype=torch.long), behaviour_of(z).float(), z.float(),
                torch.nn.functional.pad(rates, (0, pad)).float(),
            ))
        return out

    def build_splits(self) -> dict[str, Split]:
        sessions = self.simulate()
        n_val = n_test = max(1, self.n_trials // 10)
        parts: dict[str, list[Split]] = {"train": [], "val": [], "test": [], "probe": []}
        for s, tensors in enumerate(sessions):
            tr, va, te = seeded_split(self.n_trials, [self.n_trials - n_val - n_test, n_val, n_test],
                                      self.seed_or_run(self.data_seed) * 7919 + s)
            parts["probe"].append(tuple(t[tr] for t in tensors))
            parts["test"].append(tuple(t[te] for t in tensors))
            if s < self.n_train_sessions:
                parts["train"].append(tuple(t[tr] for t in tensors))
                parts["val"].append(tuple(t[va] for t in tensors))
        splits = {k: tuple(torch.cat(col) for col in zip(*v)) for k, v in parts.items()}
        self.probe = splits.pop("probe")
        return splits

    def probe_split(self) -> Split:
        """Every session's training trials (held-out sessions included), for the test stage's probes."""
        self.setup()
        assert self.probe is not None
        return self.probe

    @property
    def input_shape(self) -> tuple[int, ...]:
        return (self.n_bins, self.max_units)

    @property
    def num_classes(self) -> int:
        return BEHAVIOUR_DIM


__all__ = ["SyntheticSpikesDataModule", "behaviour_of"]
