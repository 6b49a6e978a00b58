"""``SpikeTokenizerAE``: one tokenizer trained on reconstruction only, evaluated on every axis at test time.

Training and validation: the masked Poisson NLL of the counts (``exp(l) - c l`` per valid unit and bin, mean)
plus the tokenizer's own term (the VQ commitment). Nothing else reaches the tokenizer.

The test stage freezes it. Before the test batches it tokenizes every session's *training* trials
(``probe_split()`` of the DataModule: training and held-out sessions); each test batch is tokenized clean, with
``dropout_frac`` of the units silenced and with spikes jittered by one bin. At the end, per session:

- reconstruction: ``bits_per_spike`` of the reconstructed rates on the test trials (and of the true rates,
  ``oracle_bits_per_spike``: a tokenizer above it reconstructs noise);
- decoding: a ridge probe tokens -> behaviour fitted on the training trials, R^2 on the test trials
  (``decoding_r2``); the supervised reference is the same probe on raw counts with ``wiener_lags`` causal lags
  (a Wiener filter), ``decode_r2_ratio`` = decode / supervised;
- encoding: ridge behaviour -> tokens, R^2 of the z-scored tokens;
- latent structure: ``linear_cka`` of tokens and the true Lorenz latents;
- firing statistics: Poisson samples of the reconstruction vs the data: mean |Fano factor difference| and mean
  |pairwise correlation difference| over units;
- robustness: the clean probe's R^2 on the silenced and the jittered tokens;
- compression: tokens per second and bits per second of the token stream; for discrete tokens the perplexity of
  the codes used on the test trials.

Training sessions' values are averaged as ``test/<name>``; held-out sessions' (new units) as
``test/heldout_<name>``, the fast one alone as ``test/fast_<name>``; ``heldout_decode_drop`` and
``heldout_bits_drop`` are training minus held-out. Single-neuron tokens ``(U, D)`` per bin reach the probes
through a PCA of the training tokens to ``probe_dims_per_unit`` dimensions per unit, so that a probe has
``U x k`` inputs (~600) instead of ``U x D`` (~10,000).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor

from errors import ConfigError
from modules.base import PaperTask, Stage, StepOutput, default_optimizer
from modules.components.neural_metrics import bits_per_spike, decoding_r2, lagged_counts, linear_cka
from modules.components.vector_quantizer import codebook_perplexity
from modules.spike_tokenizers.probes import (
    RidgeProbe,
    drop_units,
    fano_factors,
    jitter_spikes,
    pairwise_correlations,
    pca_basis,
)
from modules.spike_tokenizers.tokenizers import Kind, build_tokenizer, token_bits_per_second

CHUNK = 16  # trials per tokenizer call when gathering features (bounds the (B, T, U, D) single-neuron tokens)
BASIS_TRIALS = 64  # training trials whose tokens fix the PCA of single-neuron tokens (~300k tokens)


@runtime_checkable
class ProvidesProbeSplit(Protocol):
    """What the test stage needs of its DataModule (``datamodules.synthetic_spikes``): every session's training
    trials and how many sessions the tokenizer trained on (the first ones)."""

    n_train_sessions: int

    def probe_split(self) -> tuple[Tensor, ...]: ...


def poisson_nll(log_rates: Tensor, counts: Tensor, mask: Tensor) -> Tensor:
    """Mean of ``exp(l) - c l`` over the valid units (``mask (B, U)``) of every bin: the Poisson NLL up to
    ``log c!``."""
    per = log_rates.exp() - counts * log_rates
    weights = mask[:, None, :].to(per.dtype).expand_as(per)
    return (per * weights).sum() / weights.sum().clamp_min(1.0)


class SpikeTokenizerAE(PaperTask):
    """A spike tokenizer T1-T5 trained on Poisson-NLL reconstruction (see the module docstring).

    Args:
        kind: ``count`` (T1), ``patch`` (T2), ``pop_ae`` (T3), ``vqvae`` (T4), ``event`` (T5).
        d_token: D, the width of a token.
        codebook_size: K of the VQ-VAE's codebook.
        patch_len: bins per patch (None: 8 for ``patch``, 4 for ``vqvae``).
        hidden: hidden width of the population tokenizers' MLPs.
        window: bins per window of the event tokenizer.
        n_latents: latent queries per window of the event tokenizer.
        beta: VQ commitment weight.
        probe_alphas: ridge penalties the probes choose from.
        probe_dims_per_unit: k, PCA dimensions per unit of single-neuron tokens for the probes.
        wiener_lags: causal lags of the supervised Wiener filter on counts.
        dropout_frac: fraction of units silenced on the robustness axis.
        input_shape: ``(bins, unit slots)``, linked from the DataModule.
        optimizer, lr_scheduler: see ``PaperTask``.
    """

    paper_id = "002-08"
    monitor = "val/loss"
    monitor_mode = "min"
    vectorizable = False  # --run.seeds: it draws random numbers during training
    summary_metrics = ("test/bits_per_spike", "test/decode_r2", "test/supervised_r2", "test/heldout_decode_r2")

    def __init__(
        self,
        kind: Kind = "vqvae",
        d_token: int = 64,
        codebook_size: int = 512,
        patch_len: int | None = None,
        hidden: int = 128,
        window: int = 5,
        n_latents: int = 1,
        beta: float = 0.25,
        probe_alphas: tuple[float, ...] = (0.1, 1.0, 10.0, 100.0, 1000.0),
        probe_dims_per_unit: int = 4,
        wiener_lags: int = 5,
        dropout_frac: float = 0.2,
        input_shape: tuple[int, ...] = (50, 150),
        optimizer: OptimizerCallable = default_optimizer,
        lr_scheduler: LRSchedulerCallable | None = None,
    ) -> None:
        super().__init__(optimizer, lr_scheduler)
        if len(input_shape) != 2:
            raise ConfigError(f"input_shape must be (bins, units), got {input_shape}: use datamodules.synthetic_spikes")
        if min(d_token, hidden, window, n_latents, codebook_size) < 1 or (patch_len is not None and patch_len < 1):
            raise ConfigError("d_token, hidden, window, n_latents, codebook_size and patch_len must be >= 1")
        if not 1 <= probe_dims_per_unit <= d_token:
            raise ConfigError(f"probe_dims_per_unit must lie in [1, d_token={d_token}], got {probe_dims_per_unit}")
        if not 0.0 <= dropout_frac < 1.0:
            raise ConfigError(f"dropout_frac must lie in [0, 1), got {dropout_frac}")
        self.kind, self.n_bins, self.max_units = kind, int(input_shape[0]), int(input_shape[1])
        self.d_token, self.codebook_size, self.patch_len = d_token, codebook_size, patch_len
        self.window, self.n_latents = window, n_latents
        self.probe_alphas, self.k, self.wiener_lags, self.dropout_frac = probe_alphas, probe_dims_per_unit, wiener_lags, dropout_frac
        self.tokenizer = build_tokenizer(kind, self.max_units, d_token, codebook_size, patch_len, hidden, window,
                                         n_latents, beta)
        self.basis: Tensor | None = None
        self.n_train_sessions = 0
        self._probe: dict[str, Tensor] = {}
        self._test: dict[str, list[Tensor]] = {}

    @property
    def per_neuron(self) -> bool:
        return bool(self.tokenizer.per_neuron)

    def forward(self, counts: Tensor, mask: Tensor) -> Tensor:
        """Log rates ``(B, T, U)`` reconstructed from the tokens of ``counts``."""
        return self.tokenizer(counts, mask, with_features=False).log_rates

    def step(self, batch: Any, stage: Stage) -> StepOutput:
        counts, mask = batch[0], batch[1]
        out = self.tokenizer(counts, mask, with_features=False)
        nll = poisson_nll(out.log_rates, counts, mask)
        if stage == "test":
            self._collect_test(batch, out.log_rates, out.codes)
        return StepOutput(nll + out.aux_loss, n=int(counts.shape[0]))

    # --- modules.protocols.CodebookCounts --------------------------------------------------------------------
    def codebook_counts(self, batch: Any) -> Tensor:
        """How often each code is used on ``batch``: ``(K,)`` (8 count ids for T1, K for T4; empty for
        continuous tokens)."""
        size = {"count": 8, "vqvae": self.codebook_size}.get(self.kind, 0)
        if size == 0:
            return torch.zeros(0, dtype=torch.long)
        with torch.no_grad():
            codes = self.tokenizer(batch[0], batch[1], with_features=False).codes
        assert codes is not None
        return torch.bincount(codes.flatten().cpu(), minlength=size)

    # --- the test stage ----------------------------------------------------------------------------------------
    @torch.no_grad()
    def features(self, counts: Tensor, mask: Tensor) -> Tensor:
        """The probes' view of the tokens: ``(n, T, F)``, single-neuron tokens projected on ``basis``."""
        parts = []
        for lo in range(0, counts.shape[0], CHUNK):
            c, m = counts[lo : lo + CHUNK].to(self.device), mask[lo : lo + CHUNK].to(self.device)
            f = self.tokenizer(c, m, with_features=True).features
            if self.per_neuron:
                assert self.basis is not None
                f = (f @ self.basis) * m[:, None, :, None].to(f.dtype)
                f = f.flatten(2)
            parts.append(f.float().cpu())
        return torch.cat(parts)

    @torch.no_grad()
    def _fit_basis(self, counts: Tensor, mask: Tensor) -> None:
        """PCA of the single-neuron tokens of the training sessions' valid units."""
        d = self.d_token
        total, outer, n = torch.zeros(d), torch.zeros(d, d), 0
        for lo in range(0, counts.shape[0], CHUNK):
            c, m = counts[lo : lo + CHUNK].to(self.device), mask[lo : lo + CHUNK].to(self.device)
            f = self.tokenizer(c, m, with_features=True).features
            valid = f[m[:, None, :].expand(f.shape[:3])].cpu()
            total += valid.sum(0)
            outer += valid.T @ valid
            n += valid.shape[0]
        mean = total / n
        self.basis = pca_basis(outer / n - mean[:, None] * mean[None, :], self.k).float().to(self.device)

    def on_test_start(self) -> None:
        dm = getattr(self.trainer, "datamodule", None)
        if not isinstance(dm, ProvidesProbeSplit):
            raise ConfigError(f"{type(self).__name__} tests on multi-session spike data: "
                              "data.class_path: datamodules.synthetic_spikes.SyntheticSpikesDataModule")
        counts, mask, session, behaviour, latents, _ = dm.probe_split()
        self.n_train_sessions = int(dm.n_train_sessions)
        if self.per_neuron:
            train = session < self.n_train_sessions
            pick = torch.randperm(int(train.sum()), generator=torch.Generator().manual_seed(0))[:BASIS_TRIALS]
            self._fit_basis(counts[train][pick], mask[train][pick])
        self._probe = {"features": self.features(counts, mask), "counts": counts, "session": session,
                       "behaviour": behaviour}
        self._test = {}
        self._gen = torch.Generator().manual_seed(self.seed_or_run(None) + 1)

    def _collect_test(self, batch: Any, log_rates: Tensor, codes: Tensor | None) -> None:
        counts, mask, session, behaviour, latents, rates = (t.cpu() for t in batch)
        keep = {
            "counts": counts, "mask": mask, "session": session, "behaviour": behaviour, "latents": latents,
            "rates": rates, "log_rates": log_rates.float().cpu(), "features": self.features(counts, mask),
            "dropped": self.features(drop_units(counts, mask, self.dropout_frac, self._gen), mask),
            "jittered": self.features(jitter_spikes(counts, self._gen), mask),
        }
        if codes is not None:
            keep["codes"] = codes.flatten().cpu()
        for key, value in keep.items():
            self._test.setdefault(key, []).append(value)

    def _session_values(self, s: int, test: dict[str, Tensor]) -> dict[str, float]:
        pick = test["session"] == s
        units = test["mask"][pick][0]
        counts, rates = test["counts"][pick][..., units], test["rates"][pick][..., units]
        recon = test["log_rates"][pick][..., units].exp().clamp_min(1e-9)
        behaviour, feats = test["behaviour"][pick], test["features"][pick]
        tr = self._probe["session"] == s
        tr_feats, tr_behaviour = self._probe["features"][tr], self._probe["behaviour"][tr]
        tr_counts = self._probe["counts"][tr][..., units]
        probe = RidgeProbe(self.probe_alphas).fit(tr_feats, tr_behaviour)
        wiener = RidgeProbe(self.probe_alphas).fit(lagged_counts(tr_counts, self.wiener_lags), tr_behaviour)
        encoder = RidgeProbe(self.probe_alphas).fit(tr_behaviour, (tr_feats - probe.mean) / probe.std)
        sampled = torch.poisson(recon, generator=self._gen)
        flat_feats = feats.reshape(-1, feats.shape[-1])
        return {
            "bits_per_spike": float(bits_per_spike(recon.double(), counts.double())),
            "oracle_bits_per_spike": float(bits_per_spike(rates.double().clamp_min(1e-9), counts.double())),
            "decode_r2": float(decoding_r2(probe.predict(feats), behaviour)),
            "supervised_r2": float(decoding_r2(wiener.predict(lagged_counts(counts, self.wiener_lags)), behaviour)),
            "encode_r2": float(decoding_r2(encoder.predict(behaviour), (feats - probe.mean) / probe.std)),
            "latent_cka": float(linear_cka(flat_feats.double(), test["latents"][pick].reshape(-1, 3).double())),
            "fano_error": float((fano_factors(sampled) - fano_factors(counts)).abs().mean()),
            "corr_error": float((pairwise_correlations(sampled) - pairwise_correlations(counts)).abs().mean()),
            "dropout_r2": float(decoding_r2(probe.predict(test["dropped"][pick]), behaviour)),
            "jitter_r2": float(decoding_r2(probe.predict(test["jittered"][pick]), behaviour)),
            "n_units": float(units.sum()),
        }

    def extra_epoch_metrics(self, stage: Stage, values: dict[str, Tensor]) -> dict[str, Tensor]:
        if stage != "test" or not self._test:
            return {}
        test = {k: torch.cat(v) for k, v in self._test.items()}
        self._test = {}
        present = sorted(int(s) for s in test["session"].unique())
        per = {s: self._session_values(s, test) for s in present}
        train = [s for s in present if s < self.n_train_sessions]
        held = [s for s in present if s >= self.n_train_sessions]
        out: dict[str, float] = {}
        for prefix, group in (("", train), ("heldout_", held), ("fast_", held[-1:])):
            for key in per[present[0]] if group else ():
                out[prefix + key] = sum(per[s][key] for s in group) / len(group)
        if train:
            out["decode_r2_ratio"] = out["decode_r2"] / out["supervised_r2"] if out["supervised_r2"] > 0 else float("nan")
            if held:
                out["heldout_decode_drop"] = out["decode_r2"] - out["heldout_decode_r2"]
                out["heldout_bits_drop"] = out["bits_per_spike"] - out["heldout_bits_per_spike"]
            tokens_s, bits = token_bits_per_second(self.kind, round(out["n_units"]), self.d_token, self.codebook_size,
                                                   self.patch_len, self.window, self.n_latents)
            out["tokens_per_s"], out["token_bits_per_s"] = tokens_s, tokens_s * bits
        if "codes" in test:
            out["codebook_perplexity"] = codebook_perplexity(torch.bincount(test["codes"]))
        return {f"test/{k}": torch.tensor(v) for k, v in out.items()}


__all__ = ["ProvidesProbeSplit", "SpikeTokenizerAE", "poisson_nll"]
