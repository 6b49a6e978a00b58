"""ClientConflict: cosines against a hand computation, zero conflict for CRAFT, conflict for FedAvg, resume state."""

from __future__ import annotations

import functools

import lightning as L
import pytest
import torch

from callbacks.client_conflict import ClientConflict, conflict_share, cosines
from callbacks.diagnostic import Moment
from datamodules.federated import FederatedDataModule
from modules.components.mlp import MLP
from modules.craft import FederatedClassifier
from modules.protocols import ClientRound, ClientUpdates


class Stub:
    def __init__(self, record: ClientRound) -> None:
        self.record = record

    def client_round(self, batch=None) -> ClientRound:
        return self.record


def test_shares_and_cosines_by_hand() -> None:
    updates = torch.tensor([[1.0, 0.0, 1.0, 0.0], [-1.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0], [0.0, 1.0, -2.0, 0.0]])
    g = torch.tensor([1.0, 1.0, 0.5, 0.0])
    cos = cosines(updates, g)
    manual = [(u @ g / (u.norm() * g.norm())).item() if u.norm() > 0 else float("nan") for u in updates]
    torch.testing.assert_close(cos, torch.tensor(manual, dtype=torch.float64), equal_nan=True)
    rate, min_cos, count = conflict_share(cos)
    assert count == 3 and rate == pytest.approx(1 / 3) and min_cos == pytest.approx(min(manual[0], manual[1], manual[3]))
    record = ClientRound(4, updates, torch.full((4,), 0.25), g, 0.5 * g, [("a", 0, 2), ("b", 2, 4)])
    diag = ClientConflict()
    stats = diag.measure(None, Stub(record), Moment("step", 4, 0))
    # layer a (coordinates 0-1): only client 1 opposes g_a; layer b (2-3): only client 3; client 2 is zero
    assert stats["layer/a/rate"] == pytest.approx(1 / 3) and stats["layer/b/rate"] == pytest.approx(1 / 3)
    assert stats["layer_rate"] == pytest.approx(2 / 6)
    assert stats["rate"] == pytest.approx(1 / 3) and stats["step_rate"] == stats["rate"]
    assert diag.measure(None, Stub(record), Moment("step", 5, 0)) is None  # not this step's round
    assert isinstance(Stub(record), ClientUpdates)


def run_rounds(aggregator: str, server_lr: float, rounds: int = 5) -> ClientConflict:
    L.seed_everything(0)
    dm = FederatedDataModule(n_clients=10, rounds_per_epoch=rounds, partition_seed=0)
    model = FederatedClassifier(net=functools.partial(MLP, hidden=[32]), aggregator=aggregator, server_lr=server_lr, seed=0)
    diag = ClientConflict()
    L.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
              enable_model_summary=False, limit_val_batches=0, callbacks=[diag]).fit(model, dm)
    return diag


def test_craft_has_no_conflict_and_fedavg_has_some() -> None:
    craft = run_rounds("craft", 0.5)
    assert len(craft.history) == 5 and [h["step"] for h in craft.history] == [1, 2, 3, 4, 5]
    assert all(h["rate"] == 0 and h["layer_rate"] == 0 and h["min_cos"] > 0 for h in craft.history)
    fedavg = run_rounds("fedavg", 1.0)
    assert max(h["layer_rate"] for h in fedavg.history) > 0
    assert fedavg.history[-1]["rate_avg"] == pytest.approx(sum(h["rate"] for h in fedavg.history) / 5)
    state = fedavg.state_dict()
    fresh = ClientConflict()
    fresh.load_state_dict(state)
    assert fresh.totals == fedavg.totals and len(fresh.history) == 5
