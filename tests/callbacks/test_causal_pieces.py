"""CausalPieceCounter: exact counts against a naive per-sample frozenset loop, ReLU linear regions,
hashing, DDP union, logging, the piece maps' ids, bad input."""

from __future__ import annotations

import functools
import math

import lightning as L
import pytest
import torch
from lightning.pytorch.loggers import Logger
from torch import nn

from callbacks.causal_pieces import (
    CausalPieceCounter,
    count_pieces,
    line_piece_counts,
    pack_bits,
    piece_ids,
)
from callbacks.diagnostic import Schedule
from datamodules.spike_encoding import SpikeYinYangDataModule
from modules.causal_pieces import CausalPiecesSNN
from modules.components.mlp import MLP
from tests.helpers import CleanDistributedExit


def naive_piece_count(pairs, mode: str) -> tuple[int, list[int]]:
    """Per sample, per layer, per neuron a frozenset causal set; count distinct tuples in a Python set."""
    keys, layer_sets = naive_piece_keys(pairs, mode)
    return len(set(keys)), [len(s) for s in layer_sets]


def naive_piece_keys(pairs, mode: str) -> tuple[list[tuple], list[set]]:
    """Every sample's piece as a tuple of per-layer frozensets of (neuron, causal set), and the per-layer sets."""
    pieces, layer_sets = [], [set() for _ in pairs]
    pairs = [(p.tolist(), q.tolist()) for p, q in pairs]
    for b in range(len(pairs[0][0])):
        t_last = pairs[-1][1][b]
        relevant = [j for j, t in enumerate(t_last) if math.isfinite(t)]
        key = [None] * len(pairs)
        for l in range(len(pairs) - 1, -1, -1):
            t_pre, t_post = pairs[l][0][b], pairs[l][1][b]
            cols = relevant if mode == "path" else [j for j, t in enumerate(t_post) if math.isfinite(t)]
            sets = {j: frozenset(i for i, ti in enumerate(t_pre) if ti < t_post[j]) for j in cols}
            key[l] = frozenset(sets.items())
            layer_sets[l].add(key[l])
            if l > 0:
                n_prev = len(pairs[l - 1][1][b])
                relevant = sorted({i for s in sets.values() for i in s if i < n_prev})
        pieces.append(tuple(key))
    return pieces, layer_sets


@pytest.fixture(scope="module")
def yy():
    dm = SpikeYinYangDataModule(train_size=800, val_size=50, test_size=50)
    dm.setup()
    return dm.splits["train"]


def _toy_snn() -> CausalPiecesSNN:
    return CausalPiecesSNN(
        hidden_sizes=[12, 6],
        init_mean=[1.0, 0.8, 0.5],
        init_std=[0.8, 0.8, 0.8],
        max_missing=[0.3, 0.3, 0.0],
        init_seed=0,
    )


@pytest.fixture(scope="module")
def naive_counts(yy) -> dict[str, tuple[int, list[int]]]:
    """The naive loop's count of the toy network on ``yy``, per mode: the reference of both piece keys."""
    pairs = _toy_snn().spike_times((yy[0],))
    return {mode: naive_piece_count(pairs, mode) for mode in ("path", "full")}


@pytest.mark.parametrize("mode", ["path", "full"])
@pytest.mark.parametrize("key", ["exact", "hash128"])
def test_snn_count_matches_naive_loop(yy, naive_counts, mode, key):
    x, _ = yy
    model = _toy_snn()
    ref, ref_layers = naive_counts[mode]
    res = count_pieces(model, [(x[i : i + 128],) for i in range(0, 800, 128)], mode=mode, key=key)
    assert 20 < res.count < 800, "the toy network should neither collapse nor saturate"
    assert res.count == ref and res.layer_distinct == ref_layers
    assert res.samples == 800 and res.fraction == ref / 800
    assert 0 < res.entropy <= math.log2(res.count) + 1e-9
    assert int(res.counts.sum()) == 800


@pytest.mark.parametrize("mode", ["path", "full"])
def test_line_pieces_match_a_naive_walk_along_each_segment(yy, mode):
    """Pieces along segments between samples: 1 + the number of consecutive points whose naive piece keys
    differ, segment by segment; inputs that do not spike at one end switch at the midpoint."""
    x, _ = yy
    model = CausalPiecesSNN(hidden_sizes=[12], init_mean=[1.0, 0.5], init_std=[0.8, 0.8], init_seed=0)
    starts, ends = x[:6].clone(), x[6:12].clone()
    starts[0, 1] = math.inf  # one input silent at the start of segment 0 only
    got = line_piece_counts(model, starts, ends, points=50, mode=mode)
    for p in range(6):
        pts = []
        for s in torch.linspace(0, 1, 50, dtype=torch.float64).tolist():
            pt = (1 - s) * starts[p] + s * ends[p]
            pt[~torch.isfinite(starts[p])] = (starts[p] if s < 0.5 else ends[p])[~torch.isfinite(starts[p])]
            pts.append(pt)
        keys, _ = naive_piece_keys(model.spike_times((torch.stack(pts),)), mode)
        assert int(got[p]) == 1 + sum(a != b for a, b in zip(keys[:-1], keys[1:]))
    assert got.min() >= 2 and got.max() < 50  # neither constant nor a new piece at every point
    with pytest.raises(ValueError, match="line_points"):
        line_piece_counts(model, starts, ends, points=1)


def test_path_mode_ignores_irrelevant_neurons():
    """Two samples that differ only in a hidden neuron outside the output's causal path: one piece in path
    mode, two in full mode."""
    t_in = torch.tensor([[0.1, 1.0], [0.1, 2.0]], dtype=torch.float64)
    h = torch.tensor([[0.5, 1.5], [0.5, 1.5]], dtype=torch.float64)  # hidden 1's set: {0, 1} vs {0}
    out = torch.tensor([[0.9], [0.9]], dtype=torch.float64)  # output caused only by hidden neuron 0

    class Fixed(nn.Module):
        def spike_times(self, batch):
            return [(t_in, h), (h, out)]

    assert count_pieces(Fixed(), [None], mode="path").count == 1
    assert count_pieces(Fixed(), [None], mode="full").count == 2


def test_relu_linear_regions_match_naive_loop():
    torch.manual_seed(0)
    mlp = MLP(2, 3, [8, 8])
    x = torch.rand(3000, 2) * 4 - 2
    ref = set()
    with torch.no_grad():
        for xi in x:
            h, pattern = xi, []
            for layer in mlp.layers:
                if isinstance(layer, nn.ReLU):
                    pattern.append(tuple((h > 0).tolist()))
                h = layer(h)
            ref.add(tuple(pattern))
    res = count_pieces(mlp, [(x[i : i + 500], None) for i in range(0, 3000, 500)])
    assert res.count == len(ref) > 10 and res.relevant_mean is None


def test_activation_patterns_protocol_and_missing_protocol():
    class Patterns(nn.Module):
        def activation_patterns(self, batch):
            return [batch[0] > 0.5]

    x = torch.tensor([[0.1, 0.9], [0.2, 0.8], [0.9, 0.9]])
    assert count_pieces(Patterns(), [(x,)]).count == 2
    with pytest.raises(ValueError, match="spike_times"):
        count_pieces(nn.Sequential(nn.Linear(2, 2), nn.Tanh()), [(x,)])


def test_empty_split_and_bad_arguments():
    model = CausalPiecesSNN(hidden_sizes=[4], init_seed=0)
    with pytest.raises(ValueError, match="no samples"):
        count_pieces(model, [])
    with pytest.raises(ValueError, match="mode"):
        CausalPieceCounter(mode="partial")
    with pytest.raises(ValueError, match="key"):
        CausalPieceCounter(key="md5")


def test_auto_key_switches_to_hash_with_the_same_count(yy):
    x, _ = yy
    model = CausalPiecesSNN(hidden_sizes=[30], init_seed=1)
    batches = [(x[i : i + 100],) for i in range(0, 800, 100)]
    exact = count_pieces(model, batches, key="exact")
    auto = count_pieces(model, batches, key="auto", max_exact_bytes=5000)  # switches after a few batches
    assert auto.count == exact.count and auto.layer_distinct == exact.layer_distinct
    assert auto.keys.shape[1] == 2 and exact.keys.shape[1] == 3 + 2  # two 64-bit hashes vs 150 + 90 bits in words


def test_pack_bits_roundtrip():
    bits = torch.rand(7, 13) > 0.5
    packed = pack_bits(bits)
    unpacked = ((packed[:, :, None] >> torch.arange(8, dtype=torch.uint8)) & 1).flatten(1)[:, :13].bool()
    assert packed.shape == (7, 8) and torch.equal(unpacked, bits) and not packed[:, 2:].any()


class _Capture(Logger):
    def __init__(self):
        super().__init__()
        self.metrics: list[tuple[int, dict]] = []

    name = "capture"
    version = 0

    def log_metrics(self, metrics, step=None):
        self.metrics.append((step, dict(metrics)))

    def log_hyperparams(self, params, *args, **kwargs):
        pass


def test_callback_logs_at_fit_start_and_every_n_epochs():
    dm = SpikeYinYangDataModule(train_size=300, val_size=30, test_size=30, batch_size=100)
    model = CausalPiecesSNN(hidden_sizes=[10], init_seed=0)
    cb = CausalPieceCounter(schedule=Schedule(every_n_epochs=2), piece_map=False)
    logger = _Capture()
    trainer = L.Trainer(
        max_epochs=4,
        logger=logger,
        callbacks=[cb],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
    )
    dm.setup()
    expected = count_pieces(model, [dm.splits["train"]]).count
    trainer.fit(model, dm)
    logged = [m for _, m in logger.metrics if "diag/causal_pieces/count" in m]
    assert len(logged) == 3 and len(cb.history) == 3  # fit start, epochs 2 and 4
    assert logged[0]["diag/causal_pieces/count"] == expected
    assert {
        "diag/causal_pieces/fraction",
        "diag/causal_pieces/entropy",
        "diag/causal_pieces/layer0_distinct_sets",
        "diag/causal_pieces/layer1_distinct_sets",
    } <= set(logged[0])
    assert any("diag/causal_pieces/count_init" in m for _, m in logger.metrics)
    assert model.training  # the counter restores train mode
    restored = CausalPieceCounter()
    restored.load_state_dict(cb.state_dict())
    assert restored.history == cb.history


def test_a_path_and_a_full_counter_log_under_their_own_keys_with_line_pieces():
    dm = SpikeYinYangDataModule(train_size=200, val_size=20, test_size=20, batch_size=100)
    model = CausalPiecesSNN(hidden_sizes=[10], init_seed=0)
    path = CausalPieceCounter(schedule=Schedule(every_n_epochs=1), piece_map=False, lines=5, line_points=40)
    full = CausalPieceCounter(schedule=Schedule(every_n_epochs=0), mode="full", piece_map=False)
    logger = _Capture()
    dm.setup()
    x = dm.splits["train"][0]
    expected = {"count": count_pieces(model, [(x,)]).count, "full": count_pieces(model, [(x,)], mode="full").count}
    L.Trainer(max_epochs=1, logger=logger, callbacks=[path, full], enable_checkpointing=False,
              enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0).fit(model, dm)
    first = {k: v for _, m in logger.metrics for k, v in m.items() if k.startswith("diag/")}
    assert path.state_key != full.state_key
    assert path.history[0]["count_init"] == expected["count"] and full.history[0]["full/count_init"] == expected["full"]
    assert expected["full"] >= expected["count"]  # full mode also keys off-path neurons
    assert not any(k.endswith(("_sum", "_n")) for k in first)
    # the segments are pairs of the first 10 training samples in the (seeded) training order
    assert "diag/causal_pieces/line_pieces_init" in first and "diag/causal_pieces/full/count_init" in first
    assert path.history[0]["line_pieces_init"] == path.history[0]["line_pieces"] >= 1


@pytest.mark.parametrize("mode", ["path", "full"])
def test_piece_map_ids_partition_the_inputs_as_the_naive_keys_do(yy, mode):
    """``piece_ids`` (the piece maps' colouring): two inputs share an id exactly when their naive piece keys
    are equal. The figures themselves are checked in the method's smoke fit (tests/test_cli.py)."""
    x = yy[0][:300]
    model = _toy_snn()
    keys, _ = naive_piece_keys(model.spike_times((x,)), mode)
    ids = piece_ids(model, x, mode).tolist()
    assert len(ids) == 300 and len(set(ids)) == len(set(keys)) > 5
    first_of = {}
    for i, key in zip(ids, keys):
        assert first_of.setdefault(key, i) == i, "two inputs with one naive key got different ids"


def test_ddp_count_is_the_union_over_ranks(tmp_path):
    """2 forked CPU processes (ddp_fork: spawned ones re-import torch and Lightning, ~10 s; the suite runs
    torch on one thread, so forking is safe): each rank sees half of every batch; the count is that of the
    union."""
    dm = SpikeYinYangDataModule(train_size=240, val_size=20, test_size=20, batch_size=60)
    # a picklable optimizer instead of the default (a lambda, for the CLI), so that ddp_spawn works too
    model = CausalPiecesSNN(hidden_sizes=[6], init_seed=0, optimizer=functools.partial(torch.optim.Adam, lr=5e-3),
                            lr_scheduler=None)
    dm.setup()
    single = count_pieces(model, [dm.splits["train"]]).count
    cb = CausalPieceCounter(schedule=Schedule(every_n_epochs=0), piece_map=False)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp_fork",
        max_epochs=1,
        limit_train_batches=1,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[cb, CleanDistributedExit()],
        default_root_dir=tmp_path,
    )
    trainer.fit(model, SpikeYinYangDataModule(train_size=240, val_size=20, test_size=20, batch_size=60))
    x = dm.splits["train"][0]
    halves = count_pieces(model, [(x[0::2],)]).count + count_pieces(model, [(x[1::2],)]).count
    assert 1 < single < halves  # the ranks' pieces overlap: a sum of per-rank counts would be wrong
    assert trainer.callback_metrics["diag/causal_pieces/count_init"].item() == single
    assert trainer.callback_metrics["diag/causal_pieces/fraction"].item() == pytest.approx(single / 240)
