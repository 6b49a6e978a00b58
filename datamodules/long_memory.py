"""Long-memory sequence tasks, generated in code (paper 002-02): delayed recall, MQAR and ARFIMA regression.

Token tasks share one vocabulary layout (``vocab_size`` 64 by default): token 0 is the query marker, then
``n_keys`` keys, ``n_values`` values, then ``n_noise`` filler tokens (default: all remaining ids). Batches are
``(tokens (B, L) uint8, targets (B, L) int8, lags (B, L) int16)``: ``targets`` is -100 except where the
model must answer (the value of the queried key), ``lags`` there is the distance the answer has to be
remembered over (0 elsewhere). Small integer dtypes keep 20k sequences of length 1100 at 88 MB; the model
casts them.

- ``DelayedRecallDataModule``: ``n_pairs`` pairs ``key value`` scattered over noise; each is queried
  ``n_queries`` times, ``QUERY key`` -> value, with the gap between the value and the query marker (the lag)
  drawn log-uniformly in ``[1, max_lag]``. Length 1100, lags up to 1024 by default.
- ``MQARDataModule``: multi-query associative recall (Zoology's MQAR): ``n_pairs`` ``key value`` pairs at
  the start, then every key queried (bare key -> its value) at random later positions among noise; length 512.
- ``ARFIMADataModule``: exact stationary Gaussian ARFIMA(0, d, 0) series ``(1 - B)^d x_t = eps_t`` (circulant
  embedding), next-step prediction: batches ``(x (B, L, 1), y (B, L), y_opt (B, L))`` with ``y`` the next
  value and ``y_opt`` the best linear prediction of it from the whole past (Durbin-Levinson), whose error is
  the floor any model can reach (validation and test only).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from scipy.special import gammaln
from torch import Tensor

from datamodules.base import BatchedTensorLoader, ChainedLoader, Split, TensorDataModule
from errors import ConfigError

QUERY = 0
IGNORE = -100


class _TokenTaskDataModule(TensorDataModule):
    """Shared vocabulary layout and splits of the token tasks (see the module docstring)."""

    def __init__(self, seq_len: int, vocab_size: int, n_keys: int, n_values: int, n_pairs: int,
                 n_train: int, n_val: int, n_test: int, data_seed: int, batch_size: int,
                 eval_batch_size: int | None, seed: int, n_noise: int | None = None) -> None:
        super().__init__(batch_size=batch_size, eval_batch_size=eval_batch_size, seed=seed)
        if min(n_keys, n_values, n_pairs, n_train, n_val, n_test) < 1:
            raise ConfigError("n_keys, n_values, n_pairs and the split sizes must be >= 1")
        if 1 + n_keys + n_values >= vocab_size:
            raise ConfigError(f"vocab_size={vocab_size} must exceed 1 + n_keys + n_values = "
                              f"{1 + n_keys + n_values} (query marker, keys, values, at least one noise token)")
        if vocab_size > 127:
            raise ConfigError(f"vocab_size={vocab_size}: these tasks store tokens as int8, so at most 127")
        if n_pairs > n_keys:
            raise ConfigError(f"n_pairs={n_pairs} needs as many distinct keys, n_keys={n_keys}")
        self.seq_len, self._vocab, self.n_keys, self.n_values = seq_len, vocab_size, n_keys, n_values
        self.n_pairs, self.n_train, self.n_val, self.n_test = n_pairs, n_train, n_val, n_test
        self.data_seed = data_seed
        spare = vocab_size - 1 - n_keys - n_values
        if n_noise is not None and not 1 <= n_noise <= spare:
            raise ConfigError(f"n_noise={n_noise} must lie in [1, {spare}] (the ids left after the marker, keys, values)")
        self.n_noise = spare if n_noise is None else n_noise

    @property
    def key_ids(self) -> tuple[int, int]:
        return 1, 1 + self.n_keys

    @property
    def value_ids(self) -> tuple[int, int]:
        return 1 + self.n_keys, 1 + self.n_keys + self.n_values

    @property
    def noise_ids(self) -> tuple[int, int]:
        lo = 1 + self.n_keys + self.n_values
        return lo, lo + self.n_noise

    @property
    def vocab_size(self) -> int:
        return self._vocab

    @property
    def num_classes(self) -> int:
        return self._vocab

    @property
    def input_shape(self) -> tuple[int, ...]:
        return (self.seq_len,)

    def _draw_tokens(self, rng: np.random.Generator, n: int,
                     seq_len: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(noise (n, L), keys (n, P) distinct per row, values (n, P))`` (``L`` defaults to ``seq_len``)."""
        lo, hi = self.noise_ids
        noise = rng.integers(lo, hi, size=(n, seq_len or self.seq_len), dtype=np.uint8)
        keys = np.argsort(rng.random((n, self.n_keys)), axis=1)[:, : self.n_pairs] + self.key_ids[0]
        values = rng.integers(*self.value_ids, size=(n, self.n_pairs))
        return noise, keys, values

    def sample(self, n: int, rng: np.random.Generator) -> tuple[Tensor, Tensor, Tensor]:
        raise NotImplementedError

    def build_splits(self) -> dict[str, Split]:
        out = {}
        for i, (name, size) in enumerate((("train", self.n_train), ("val", self.n_val), ("test", self.n_test))):
            out[name] = self.sample(size, np.random.default_rng([self.data_seed, i]))
        return out


def log_uniform_lags(rng: np.random.Generator, size: tuple[int, ...], max_lag: int) -> np.ndarray:
    """Integer lags ``floor(exp(U))``, ``U ~ Uniform(0, log(max_lag + 1))``: ``P(lag = l) ~ log(1 + 1/l)``."""
    return np.minimum(np.floor(np.exp(rng.random(size) * math.log(max_lag + 1))), max_lag).astype(np.int64)


@dataclass(frozen=True)
class RecallStage:
    """One stage of a length curriculum: ``steps`` training batches of sequences of ``seq_len`` tokens with
    lags log-uniform in ``[1, max_lag]`` (the other settings as the task's)."""

    steps: int
    seq_len: int
    max_lag: int


class DelayedRecallDataModule(_TokenTaskDataModule):
    """Delayed recall: ``key value`` pairs, each queried once after a log-uniform lag (module docstring).

    A pair at position ``p`` is ``key`` at ``p``, ``value`` at ``p + 1``; each of its ``n_queries`` queries is
    ``QUERY`` at ``p + 1 + lag`` and ``key`` at ``p + 2 + lag``, where the target is the value, with its own
    lag. The positions of all pairs and queries are distinct (a sequence that collides is redrawn, lags
    included: with several queries per pair, repeated small lags are slightly rarer than log-uniform). The value never
    reappears in the input, so every query recalls it from the pair itself.

    With a ``curriculum``, every training epoch begins with its stages in order (each ``steps`` batches of its
    own sequences, shuffled within the stage, drawn independently of the splits), then the ``n_train``
    sequences of the task itself; validation and test always use the task's length and lags.

    Args:
        seq_len: L (default 1100).
        max_lag: lags are log-uniform in ``[1, max_lag]`` (default 1024); needs ``max_lag + 3 <= seq_len``.
        n_pairs: pairs per sequence.
        n_queries: queries of every pair (answers per sequence: ``n_pairs * n_queries``).
        vocab_size, n_keys, n_values: the vocabulary (module docstring).
        n_noise: distinct filler tokens (default: every id left; 1 is a constant blank, as in Zoology's MQAR).
        n_train, n_val, n_test: sequences per split.
        data_seed: seed of the data (the splits are independent draws).
        batch_size, eval_batch_size, seed: see ``TensorDataModule``.
        curriculum: stages of shorter sequences trained on first (``RecallStage``), e.g. in YAML
            ``[{steps: 500, seq_len: 64, max_lag: 32}, {steps: 300, seq_len: 256, max_lag: 224}]``.
    """

    dataset_name = "delayed_recall"

    def __init__(
        self,
        seq_len: int = 1100,
        max_lag: int = 1024,
        n_pairs: int = 4,
        n_queries: int = 1,
        vocab_size: int = 64,
        n_keys: int = 16,
        n_values: int = 32,
        n_noise: int | None = None,
        n_train: int = 20_000,
        n_val: int = 500,
        n_test: int = 1000,
        data_seed: int = 0,
        batch_size: int = 16,
        eval_batch_size: int | None = 32,
        seed: int = 0,
        curriculum: list[RecallStage] | None = None,
    ) -> None:
        super().__init__(seq_len, vocab_size, n_keys, n_values, n_pairs, n_train, n_val, n_test, data_seed,
                         batch_size, eval_batch_size, seed, n_noise)
        if n_queries < 1:
            raise ConfigError(f"n_queries must be >= 1, got {n_queries}")
        self.n_queries = n_queries
        self._check_length(seq_len, max_lag, "")
        self.max_lag = max_lag
        self.curriculum = list(curriculum or [])
        for i, stage in enumerate(self.curriculum):
            if stage.steps < 1:
                raise ConfigError(f"curriculum stage {i}: steps must be >= 1, got {stage.steps}")
            self._check_length(stage.seq_len, stage.max_lag, f"curriculum stage {i}: ")

    def _check_length(self, seq_len: int, max_lag: int, where: str) -> None:
        if max_lag < 1 or max_lag + 3 > seq_len:
            raise ConfigError(f"{where}max_lag={max_lag} must be >= 1 and leave room for a pair and its query: "
                              f"max_lag + 3 <= seq_len={seq_len}")
        if 2 * self.n_pairs * (1 + self.n_queries) > seq_len // 2:
            raise ConfigError(f"{where}n_pairs={self.n_pairs} pairs with n_queries={self.n_queries} queries each "
                              f"need {2 * self.n_pairs * (1 + self.n_queries)} positions: too many for "
                              f"seq_len={seq_len}")

    def sample(self, n: int, rng: np.random.Generator, seq_len: int | None = None,
               max_lag: int | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """``n`` sequences: ``(tokens, targets, lags)`` (module docstring); the task's length and lags unless
        given."""
        P, Q, L = self.n_pairs, self.n_queries, seq_len or self.seq_len
        max_lag = max_lag or self.max_lag
        lags = np.zeros((n, P, Q), dtype=np.int64)
        starts = np.zeros((n, P), dtype=np.int64)
        todo = np.arange(n)
        for _ in range(10_000):
            if todo.size == 0:
                break
            lags[todo] = log_uniform_lags(rng, (todo.size, P, Q), max_lag)
            longest = lags[todo].max(-1)
            starts[todo] = np.floor(rng.random(longest.shape) * (L - 2 - longest)).astype(np.int64)
            pos = _pair_positions(starts[todo], lags[todo])
            srt = np.sort(pos, axis=1)
            todo = todo[(srt[:, 1:] == srt[:, :-1]).any(axis=1)]
        else:  # pragma: no cover - only for absurd settings, caught by the checks above in practice
            raise ConfigError(f"could not place {P} pairs and their queries in {L} positions; lower n_pairs")
        noise, keys, values = self._draw_tokens(rng, n, L)
        tokens = noise
        targets = np.full((n, L), IGNORE, dtype=np.int8)
        lag_map = np.zeros((n, L), dtype=np.int16)
        rows = np.arange(n)[:, None]
        tokens[rows, starts] = keys
        tokens[rows, starts + 1] = values
        for q in range(Q):
            lq = lags[:, :, q]
            tokens[rows, starts + 1 + lq] = QUERY
            tokens[rows, starts + 2 + lq] = keys
            targets[rows, starts + 2 + lq] = values
            lag_map[rows, starts + 2 + lq] = lq
        return torch.from_numpy(tokens), torch.from_numpy(targets), torch.from_numpy(lag_map)

    def build_splits(self) -> dict[str, Split]:
        out = super().build_splits()
        for i, stage in enumerate(self.curriculum):  # seeds 3, 4, ...: independent of the three splits
            rng = np.random.default_rng([self.data_seed, 3 + i])
            out[f"curriculum{i}"] = self.sample(stage.steps * self.batch_size, rng, stage.seq_len, stage.max_lag)
        return out

    def train_dataloader(self) -> BatchedTensorLoader | ChainedLoader:
        if not self.curriculum:
            return super().train_dataloader()
        names = [f"curriculum{i}" for i in range(len(self.curriculum))] + ["train"]
        return ChainedLoader([self.loader(name, shuffle=True, batch_size=self.batch_size) for name in names])


def _pair_positions(starts: np.ndarray, lags: np.ndarray) -> np.ndarray:
    """Every position a pair (``starts (n, P)``) and its queries (``lags (n, P, Q)``) occupy: ``(n, 2P + 2PQ)``."""
    queries = starts[:, :, None] + 1 + lags
    return np.concatenate([starts, starts + 1, queries.reshape(len(starts), -1),
                           (queries + 1).reshape(len(starts), -1)], axis=1)


class MQARDataModule(_TokenTaskDataModule):
    """Multi-query associative recall: ``n_pairs`` ``key value`` pairs first, then each key queried once at a
    random later position (bare key -> value); everything else is noise. The lag of a query is its distance
    to the value it recalls.

    Args:
        seq_len: L (default 512).
        n_pairs: key-value pairs (default 16).
        vocab_size, n_keys, n_values, n_noise, n_train, n_val, n_test, data_seed, batch_size,
            eval_batch_size, seed: see ``DelayedRecallDataModule``.
    """

    dataset_name = "mqar"

    def __init__(
        self,
        seq_len: int = 512,
        n_pairs: int = 16,
        vocab_size: int = 64,
        n_keys: int = 16,
        n_values: int = 32,
        n_noise: int | None = None,
        n_train: int = 20_000,
        n_val: int = 500,
        n_test: int = 1000,
        data_seed: int = 0,
        batch_size: int = 32,
        eval_batch_size: int | None = 64,
        seed: int = 0,
    ) -> None:
        super().__init__(seq_len, vocab_size, n_keys, n_values, n_pairs, n_train, n_val, n_test, data_seed,
                         batch_size, eval_batch_size, seed, n_noise)
        if 3 * n_pairs > seq_len:
            raise ConfigError(f"n_pairs={n_pairs} needs 3 * n_pairs <= seq_len={seq_len}")

    def sample(self, n: int, rng: np.random.Generator) -> tuple[Tensor, Tensor, Tensor]:
        P, L = self.n_pairs, self.seq_len
        noise, keys, values = self._draw_tokens(rng, n)
        tokens = noise
        rows = np.arange(n)[:, None]
        tokens[:, 0 : 2 * P : 2] = keys
        tokens[:, 1 : 2 * P : 2] = values
        # query positions: P distinct positions after the pairs, in random order of the keys
        q = np.sort(np.argpartition(rng.random((n, L - 2 * P)), P - 1, axis=1)[:, :P], axis=1) + 2 * P
        order = np.argsort(rng.random((n, P)), axis=1)
        qk, qv = keys[rows, order], values[rows, order]
        tokens[rows, q] = qk
        targets = np.full((n, L), IGNORE, dtype=np.int8)
        targets[rows, q] = qv
        lag_map = np.zeros((n, L), dtype=np.int16)
        lag_map[rows, q] = q - (2 * order + 1)
        return torch.from_numpy(tokens), torch.from_numpy(targets), torch.from_numpy(lag_map)


# --- ARFIMA(0, d, 0) -------------------------------------------------------------------------------------------
def arfima_autocovariance(d: float, n_lags: int, sigma: float = 1.0) -> np.ndarray:
    """``gamma(0..n_lags-1)`` of ARFIMA(0, d, 0) with innovation s.d. ``sigma``:
    ``gamma(0) = sigma^2 Gamma(1 - 2d) / Gamma(1 - d)^2``, ``gamma(k) = gamma(k - 1) (k - 1 + d) / (k - d)``."""
    if not -0.5 < d < 0.5:
        raise ConfigError(f"ARFIMA(0, d, 0) is stationary for -0.5 < d < 0.5, got d={d}")
    k = np.arange(1, n_lags)
    g0 = sigma**2 * math.exp(gammaln(1 - 2 * d) - 2 * gammaln(1 - d))
    return g0 * np.concatenate([[1.0], np.cumprod((k - 1 + d) / (k - d))])


def arfima_sample(n: int, length: int, d: float, generator: torch.Generator, sigma: float = 1.0) -> Tensor:
    """``(n, length)`` float32 exact stationary ARFIMA(0, d, 0) series by circulant embedding (Davies-Harte).

    The autocovariance is embedded in a circulant of size ``2 (length - 1)``; its eigenvalues are checked
    non-negative (they are for 0 <= d < 0.5), and the real and imaginary parts of one complex draw are two
    independent series.
    """
    if length < 2:
        raise ConfigError(f"length must be >= 2, got {length}")
    gam = arfima_autocovariance(d, length, sigma)
    row = np.concatenate([gam, gam[-2:0:-1]])
    m = row.size
    lam = np.fft.fft(row).real
    if lam.min() < -1e-9 * lam.max():
        raise ConfigError(f"the circulant embedding of ARFIMA(0, {d}, 0) is not non-negative definite")
    amp = torch.from_numpy(np.sqrt(np.clip(lam, 0.0, None) / m)).float()
    half = (n + 1) // 2
    z = torch.view_as_complex(torch.randn(half, m, 2, generator=generator))
    xs = torch.fft.fft(amp * z, dim=1)[:, :length]
    return torch.cat([xs.real, xs.imag])[:n].contiguous()


def arfima_predictor(d: float, length: int) -> tuple[np.ndarray, np.ndarray]:
    """The best linear one-step predictor of ARFIMA(0, d, 0) from a finite past (Durbin-Levinson).

    Returns ``(Phi (length, length), v (length,))``: the prediction of ``x_t`` from ``x_0..x_{t-1}`` is
    ``sum_j Phi[t, j] x_j`` (lower triangular, row 0 zero) and its error variance is ``v[t]`` (unit
    innovations). For this process the partial autocorrelations are ``phi_kk = d / (k - d)``.
    """
    gam = arfima_autocovariance(d, length)
    phi_mat = np.zeros((length, length))
    v = np.empty(length)
    v[0] = gam[0]
    prev = np.zeros(0)
    for t in range(1, length):
        pk = d / (t - d)
        cur = np.empty(t)
        cur[:-1] = prev - pk * prev[::-1]
        cur[-1] = pk
        v[t] = v[t - 1] * (1 - pk * pk)
        phi_mat[t, :t] = cur[::-1]  # cur[j-1] multiplies x_{t-j}
        prev = cur
    return phi_mat, v


class ARFIMADataModule(TensorDataModule):
    """Next-step prediction of ARFIMA(0, d, 0) series (module docstring).

    Batches ``(x (B, L, 1), y (B, L), y_opt (B, L))`` float32: ``x`` the series' first ``L`` values, ``y`` the
    same shifted by one (``y_t = x_{t+1}``), ``y_opt`` the Durbin-Levinson prediction of ``y_t`` from
    ``x_0..x_t`` (validation and test batches only; training batches are ``(x, y)``).

    Args:
        d: the fractional differencing order (long memory for 0 < d < 0.5; default 0.3).
        seq_len: L, the model's input length (series of L + 1 values are drawn).
        sigma: innovation standard deviation.
        n_train, n_val, n_test: series per split.
        data_seed, batch_size, eval_batch_size, seed: see ``DelayedRecallDataModule``.
    """

    dataset_name = "arfima"

    def __init__(
        self,
        d: float = 0.3,
        seq_len: int = 1100,
        sigma: float = 1.0,
        n_train: int = 20_000,
        n_val: int = 500,
        n_test: int = 1000,
        data_seed: int = 0,
        batch_size: int = 16,
        eval_batch_size: int | None = 32,
        seed: int = 0,
    ) -> None:
        super().__init__(batch_size=batch_size, eval_batch_size=eval_batch_size, seed=seed)
        if not 0 <= d < 0.5:
            raise ConfigError(f"d must lie in [0, 0.5) (stationary, non-negative memory), got {d}")
        if seq_len < 2 or sigma <= 0 or min(n_train, n_val, n_test) < 1:
            raise ConfigError("seq_len >= 2, sigma > 0 and split sizes >= 1 are required")
        self.d, self.seq_len, self.sigma = d, seq_len, sigma
        self.n_train, self.n_val, self.n_test, self.data_seed = n_train, n_val, n_test, data_seed

    @property
    def input_shape(self) -> tuple[int, ...]:
        return (self.seq_len, 1)

    @property
    def num_classes(self) -> int:  # a regression: one output per step
        return 1

    def build_splits(self) -> dict[str, Split]:
        phi, _ = arfima_predictor(self.d, self.seq_len + 1)
        phi_t = torch.from_numpy(phi[1:, :-1].T.copy()).float()  # predicts x_{t+1} from x_0..x_t
        out = {}
        for i, (name, size) in enumerate((("train", self.n_train), ("val", self.n_val), ("test", self.n_test))):
            gen = torch.Generator().manual_seed(self.data_seed * 1000 + i)
            series = arfima_sample(size, self.seq_len + 1, self.d, gen, self.sigma)
            x, y = series[:, :-1], series[:, 1:]
            if name == "train":  # the oracle is an evaluation reference: no (N, L) x (L, L) product here
                out[name] = (x[..., None].contiguous(), y.contiguous())
            else:
                out[name] = (x[..., None].contiguous(), y.contiguous(), (x @ phi_t).contiguous())
        return out
