"""Long-memory tasks (002-02): recall layouts, the lag law, ARFIMA's covariance and its optimal predictor."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from datamodules.long_memory import (
    QUERY,
    ARFIMADataModule,
    DelayedRecallDataModule,
    MQARDataModule,
    RecallStage,
    arfima_autocovariance,
    arfima_predictor,
    arfima_sample,
)
from errors import ConfigError


def test_delayed_recall_layout() -> None:
    dm = DelayedRecallDataModule(seq_len=400, max_lag=300, n_pairs=3, n_queries=2, n_train=200, n_val=5, n_test=5)
    dm.setup()
    tokens, targets, lags = (t.long() for t in dm.splits["train"])
    k_lo, k_hi = dm.key_ids
    n_lo, n_hi = dm.noise_ids
    for row in range(200):
        tok, tgt, lag = tokens[row], targets[row], lags[row]
        qs = (tgt != -100).nonzero().flatten()
        assert len(qs) == 6
        special = set()
        for q in qs.tolist():
            key = int(tok[q])
            assert k_lo <= key < k_hi and tok[q - 1] == QUERY
            occurrences = (tok == key).nonzero().flatten().tolist()  # the pair, then its two queries
            p = occurrences[0]
            assert len(occurrences) == 3 and q in occurrences[1:] and tok[p + 1] == tgt[q]
            assert lag[q] == (q - 1) - (p + 1) and 1 <= lag[q] <= 300
            special |= {p, p + 1, q - 1, q}
        rest = torch.tensor(sorted(set(range(400)) - special))
        assert ((tok[rest] >= n_lo) & (tok[rest] < n_hi)).all()
        assert (lag[rest] == 0).all() and (tgt[rest] == -100).all()


def test_delayed_recall_lags_are_log_uniform() -> None:
    """P(lag >= 256) = log(1025/256)/log(1025) ~ 0.2 and P(lag < 32) = log(32)/log(1025) ~ 0.5; 20k lags,
    tolerance 4 standard errors."""
    dm = DelayedRecallDataModule(n_train=5000, n_val=5, n_test=5)
    lags = dm.sample(5000, np.random.default_rng(1))[2]
    lags = lags[lags > 0].double()
    n = lags.numel()
    for frac, expect in (((lags >= 256).double().mean(), math.log(1025 / 256) / math.log(1025)),
                         ((lags < 32).double().mean(), math.log(32) / math.log(1025))):
        assert abs(frac.item() - expect) < 4 * math.sqrt(expect * (1 - expect) / n)
    assert lags.max() <= 1024 and lags.min() >= 1


def test_mqar_layout() -> None:
    dm = MQARDataModule(seq_len=128, n_pairs=8, n_train=50, n_val=5, n_test=5)
    dm.setup()
    tokens, targets, lags = (t.long() for t in dm.splits["train"])
    for row in range(50):
        tok, tgt, lag = tokens[row], targets[row], lags[row]
        pairs = {int(tok[2 * i]): (int(tok[2 * i + 1]), 2 * i + 1) for i in range(8)}
        qs = (tgt != -100).nonzero().flatten().tolist()
        assert len(qs) == 8 and min(qs) >= 16
        assert sorted(int(tok[q]) for q in qs) == sorted(pairs)
        for q in qs:
            value, pos = pairs[int(tok[q])]
            assert tgt[q] == value and lag[q] == q - pos


def test_splits_are_seeded_and_distinct() -> None:
    a = DelayedRecallDataModule(n_train=20, n_val=20, n_test=20, data_seed=3)
    b = DelayedRecallDataModule(n_train=20, n_val=20, n_test=20, data_seed=3)
    a.setup()
    b.setup()
    assert torch.equal(a.splits["train"][0], b.splits["train"][0])
    assert not torch.equal(a.splits["train"][0], a.splits["test"][0])
    assert a.vocab_size == 64 and a.input_shape == (1100,)


def test_arfima_autocovariance_closed_form() -> None:
    """gamma(k) = Gamma(1-2d) Gamma(k+d) / (Gamma(d) Gamma(1-d) Gamma(k+1-d)) (Hosking 1981)."""
    d = 0.3
    gam = arfima_autocovariance(d, 50)
    k = np.arange(50)
    lg = math.lgamma
    expect = [math.exp(lg(1 - 2 * d) + lg(j + d) - lg(d) - lg(1 - d) - lg(j + 1 - d)) for j in k]
    assert np.allclose(gam, expect, rtol=1e-12)


def test_arfima_samples_have_that_covariance() -> None:
    """E[x_0 x_k] over 4000 independent series within 4 standard errors of gamma(k)."""
    x = arfima_sample(4000, 64, 0.3, torch.Generator().manual_seed(0)).double()
    gam = arfima_autocovariance(0.3, 64)
    for k in (0, 1, 5, 30, 63):
        prod = x[:, 0] * x[:, k]
        se = prod.std().item() / math.sqrt(prod.numel())
        assert abs(prod.mean().item() - gam[k]) < 4 * se, k
    # stationarity: the variance at the end equals the variance at the start
    assert abs(x[:, -1].var().item() - gam[0]) < 4 * gam[0] * math.sqrt(2 / 4000)


def test_durbin_levinson_is_the_toeplitz_solve() -> None:
    gam = arfima_autocovariance(0.3, 30)
    phi, v = arfima_predictor(0.3, 30)
    for t in (1, 7, 29):
        big = np.array([[gam[abs(i - j)] for j in range(t)] for i in range(t)])
        coef = np.linalg.solve(big, gam[1 : t + 1][::-1])  # predicts x_t from x_0..x_{t-1}
        assert np.allclose(phi[t, :t], coef, rtol=1e-9, atol=1e-12)
        assert math.isclose(v[t], gam[0] - coef @ gam[1 : t + 1][::-1], rel_tol=1e-9)
    assert v[0] == gam[0] and np.all(np.diff(v) < 0) and v[-1] > 1.0


def test_arfima_batches_carry_the_optimal_prediction() -> None:
    """The oracle's MSE on the test series matches the mean prediction-error variance (MC, 4 SE)."""
    dm = ARFIMADataModule(seq_len=200, n_train=10, n_val=10, n_test=2000)
    dm.setup()
    x, y, y_opt = dm.splits["test"]
    assert x.shape == (2000, 200, 1) and torch.equal(x[:, 1:, 0], y[:, :-1])
    _, v = arfima_predictor(0.3, 201)
    err = (y - y_opt).double().square()
    se = err.mean(0).std().item() / math.sqrt(2000 * 200) * math.sqrt(200)  # per-position means, then pooled
    assert abs(err.mean().item() - v[1:].mean()) < 4 * max(se, 2 * math.sqrt(2 / (2000 * 200)))
    assert len(dm.splits["train"]) == 2


@pytest.mark.parametrize(
    ("cls", "kwargs", "match"),
    [
        (DelayedRecallDataModule, {"max_lag": 1200}, "max_lag"),
        (DelayedRecallDataModule, {"vocab_size": 40}, "vocab_size"),
        (DelayedRecallDataModule, {"n_pairs": 20}, "n_pairs"),
        (DelayedRecallDataModule, {"curriculum": [RecallStage(10, 64, 62)]}, "curriculum stage 0: max_lag"),
        (DelayedRecallDataModule, {"curriculum": [RecallStage(10, 64, 32), RecallStage(0, 128, 64)]},
         "curriculum stage 1: steps"),
        (DelayedRecallDataModule, {"n_pairs": 4, "n_queries": 4, "curriculum": [RecallStage(10, 64, 32)]},
         "curriculum stage 0: n_pairs"),
        (MQARDataModule, {"seq_len": 40}, "n_pairs"),
        (ARFIMADataModule, {"d": 0.5}, "d must"),
        (ARFIMADataModule, {"d": -0.1}, "d must"),
    ],
)
def test_bad_settings_are_refused(cls, kwargs, match) -> None:
    with pytest.raises(ConfigError, match=match):
        cls(**kwargs)


def test_arfima_headroom_is_small() -> None:
    """Why a 5 % MSE gap is hard on ARFIMA(0, 0.3, 0): the best predictor from the last p values has error
    variance v_p = gamma(0) prod_k (1 - phi_kk^2); with p = 1 it is 7.5 % above the innovation variance 1,
    with p = 5 only 1.7 %, and the exact predictor from 1100 values is within 0.1 % of 1."""
    _, v = arfima_predictor(0.3, 1101)
    assert 1.07 < v[1] < 1.08 and 1.015 < v[5] < 1.02 and 1.0 < v[1100] < 1.001
    assert math.isclose(arfima_autocovariance(0.3, 1)[0], math.gamma(0.4) / math.gamma(0.7) ** 2, rel_tol=1e-12)


def test_curriculum_stages_come_first_in_order_then_the_task() -> None:
    """Every epoch: stage 0's batches (length 64, lags <= 32), stage 1's (128, <= 100), then the task's own
    training split; each stage's sequences once, in a seeded order that changes with the epoch."""
    stages = [RecallStage(steps=3, seq_len=64, max_lag=32), RecallStage(steps=2, seq_len=128, max_lag=100)]
    dm = DelayedRecallDataModule(seq_len=400, max_lag=300, n_pairs=1, n_queries=4, n_train=40, n_val=5, n_test=5,
                                 batch_size=8, curriculum=stages)
    loader = dm.train_dataloader()
    assert len(loader) == 3 + 2 + 5
    epochs = []
    for epoch in (0, 1):
        loader.sampler.set_epoch(epoch)
        batches = list(loader)
        assert [b[0].shape for b in batches] == [(8, 64)] * 3 + [(8, 128)] * 2 + [(8, 400)] * 5
        for (_tokens, targets, lags), top in zip(batches, [32] * 3 + [100] * 2 + [300] * 5):
            answered = targets != -100
            assert answered.sum() == 4 * 8 and 1 <= lags[answered].min() and lags[answered].max() <= top
        stage0 = torch.cat([b[0] for b in batches[:3]])
        assert sorted(map(tuple, stage0.tolist())) == sorted(map(tuple, dm.splits["curriculum0"][0].tolist()))
        epochs.append(batches)
    assert not torch.equal(epochs[0][0][0], epochs[1][0][0])  # reshuffled within the stage
    assert dm.val_dataloader().tensors[0].shape[1] == 400 and dm.input_shape == (400,)
    plain = DelayedRecallDataModule(seq_len=400, max_lag=300, n_pairs=1, n_queries=4, n_train=40, n_val=5, n_test=5)
    plain.setup()
    dm.setup()
    assert torch.equal(plain.splits["train"][0], dm.splits["train"][0])  # the stages leave the task's data alone


def test_curriculum_resumes_mid_epoch_across_a_stage_boundary() -> None:
    stages = [RecallStage(steps=3, seq_len=64, max_lag=32)]
    kw = dict(seq_len=200, max_lag=150, n_pairs=1, n_train=32, n_val=4, n_test=4, batch_size=8, curriculum=stages)
    whole = [b[0] for b in DelayedRecallDataModule(**kw).train_dataloader()]
    for consumed in (2, 3, 5):
        loader = DelayedRecallDataModule(**kw).train_dataloader()
        loader.load_state_dict({"epoch": 0, "consumed": consumed})
        rest = [b[0] for b in loader]
        assert len(rest) == len(whole) - consumed
        assert all(torch.equal(a, b) for a, b in zip(rest, whole[consumed:]))
        assert loader.state_dict() == {"epoch": 0, "consumed": len(whole)}
