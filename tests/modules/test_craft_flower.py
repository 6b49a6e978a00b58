"""CRAFT as a Flower strategy: the state-dict step everywhere; the strategy under Flower's simulation runtime
only where the optional ``.[flower]`` extra (flwr[simulation]) is installed."""

from __future__ import annotations

import pytest
import torch

from modules.craft import craft_aggregate
from modules.craft.flower import HAVE_FLOWER, flower_aggregate


def test_flower_step_is_craft_on_float_arrays_and_keeps_integer_state() -> None:
    gen = torch.Generator().manual_seed(0)
    theta = {"fc.weight": torch.randn(3, 4, generator=gen), "fc.bias": torch.randn(3, generator=gen),
             "bn.num_batches_tracked": torch.tensor(5)}
    clients = [{k: (v + 0.1 * torch.randn(v.shape, generator=gen) if v.is_floating_point() else v + 1)
                for k, v in theta.items()} for _ in range(3)]
    w = torch.tensor([10.0, 20.0, 30.0])
    new, g = flower_aggregate(theta, clients, w, "craft", server_lr=0.5)
    updates = {k: torch.stack([theta[k] - c[k] for c in clients]) for k in ("fc.weight", "fc.bias")}
    expected = craft_aggregate(updates, w)
    for k in expected:
        torch.testing.assert_close(g[k], expected[k])
        torch.testing.assert_close(new[k], theta[k] - 0.5 * expected[k])
    assert torch.equal(new["bn.num_batches_tracked"], theta["bn.num_batches_tracked"])
    avg, _ = flower_aggregate(theta, clients, w, "fedavg", server_lr=1.0)
    mean = sum(wi / w.sum() * c["fc.bias"] for wi, c in zip(w, clients))
    torch.testing.assert_close(avg["fc.bias"], mean)


@pytest.mark.skipif(not HAVE_FLOWER, reason="the optional Flower extra is not installed (pip install -e '.[flower]')")
def test_craft_strategy_under_the_flower_simulation_runtime() -> None:
    from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp
    from flwr.serverapp import Grid, ServerApp
    from flwr.simulation import run_simulation

    from modules.components.mlp import MLP
    from modules.craft.flower import CraftStrategy

    def client_data(pid: int) -> tuple[torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(pid)
        x = torch.randn(40, 4, generator=gen) + pid
        return x, (x.sum(1) > 2 * pid).long()

    client_app = ClientApp()

    @client_app.train()
    def train(msg: Message, context: Context) -> Message:
        net = MLP((4,), 2, hidden=[8])
        net.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        x, y = client_data(int(context.node_config["partition-id"]))
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        for _ in range(5):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(net(x), y).backward()
            opt.step()
        content = RecordDict({"arrays": ArrayRecord(net.state_dict()), "metrics": MetricRecord({"num-examples": len(y)})})
        return Message(content=content, reply_to=msg)

    out: dict = {}
    server_app = ServerApp()
    init = MLP((4,), 2, hidden=[8])

    @server_app.main()
    def main(grid: Grid, context: Context) -> None:
        strategy = CraftStrategy(server_lr=0.2, fraction_evaluate=0.0, min_train_nodes=3, min_available_nodes=3)
        out["result"] = strategy.start(grid=grid, initial_arrays=ArrayRecord(init.state_dict()), num_rounds=2)
        out["strategy"] = strategy

    run_simulation(server_app=server_app, client_app=client_app, num_supernodes=3,
                   backend_config={"client_resources": {"num_cpus": 1}})
    final = out["result"].arrays.to_torch_state_dict()
    assert out["strategy"].reference is not None
    moved = sum((final[k] - v).abs().sum() for k, v in init.state_dict().items())
    assert torch.isfinite(moved) and moved > 0
