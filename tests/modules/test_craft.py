"""CRAFT (000-04): the closed form against the KKT system and the normal equations, its conflict-freeness,
FedAvg against a loop, the federated round against a naive loop, bad input, the CLI, and 2-process DDP."""

from __future__ import annotations

import copy
import functools
from pathlib import Path

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from datamodules.federated import FederatedDataModule
from errors import ConfigError
from main import cli_main
from modules.components.mlp import MLP
from modules.components.resnet import ResNet
from modules.craft import (
    FederatedClassifier,
    craft_aggregate,
    craft_direction,
    default_groups,
    fedavg_direction,
    layer_groups,
)
from modules.craft.task import round_seed
from tests.helpers import REPO, TINY, run_main, runs_of

CONFIGS = REPO / "configs" / "craft"


def unit_rows(u: torch.Tensor) -> torch.Tensor:
    return u / u.norm(dim=1, keepdim=True)


def kkt_solution(u: torch.Tensor, w: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """min |g - r|^2 s.t. U g = w from its KKT system [[I, U^T], [U, 0]] [g; lambda] = [r; w] (U full row rank)."""
    m, d = u.shape
    k = torch.zeros(d + m, d + m, dtype=torch.float64)
    k[:d, :d] = torch.eye(d, dtype=torch.float64)
    k[:d, d:] = u.T
    k[d:, :d] = u
    return torch.linalg.solve(k, torch.cat([r, w]))[:d]


# --- craft_direction ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("m,d", [(2, 3), (5, 12), (20, 200)])
def test_craft_direction_solves_the_kkt_system(m: int, d: int) -> None:
    gen = torch.Generator().manual_seed(m * d)
    updates = torch.randn(m, d, generator=gen, dtype=torch.float64) * torch.rand(m, 1, generator=gen, dtype=torch.float64) * 5
    w = torch.rand(m, generator=gen, dtype=torch.float64) + 0.1
    ref = torch.randn(d, generator=gen, dtype=torch.float64) * 3
    g = craft_direction(updates, w, ref)
    expected = kkt_solution(unit_rows(updates), w / w.sum(), ref / ref.norm())
    torch.testing.assert_close(g, expected, rtol=1e-9, atol=1e-10)
    # and with r = 0 (None, or a zero vector): the minimum-norm solution of U g = w
    g0 = craft_direction(updates, w, None)
    torch.testing.assert_close(g0, kkt_solution(unit_rows(updates), w / w.sum(), torch.zeros(d, dtype=torch.float64)))
    torch.testing.assert_close(craft_direction(updates, w, torch.zeros(d, dtype=torch.float64)), g0)


def test_craft_direction_is_conflict_free_when_feasible() -> None:
    gen = torch.Generator().manual_seed(1)
    for trial in range(20):
        m, d = int(torch.randint(2, 15, (), generator=gen)), 40
        base = torch.randn(d, generator=gen, dtype=torch.float64)
        # strongly conflicting clients: random directions, some opposed to a common one
        updates = torch.randn(m, d, generator=gen, dtype=torch.float64) + base * torch.randn(m, 1, generator=gen, dtype=torch.float64) * 3
        w = torch.rand(m, generator=gen, dtype=torch.float64) + 0.01
        g = craft_direction(updates, w, torch.randn(d, generator=gen, dtype=torch.float64))
        cos = (unit_rows(updates) @ g) / g.norm()
        assert (cos > 0).all(), (trial, cos)
        # every client's alignment is its weight: u_i . g = w_i
        torch.testing.assert_close(unit_rows(updates) @ g, w / w.sum())
    # FedAvg on the same kind of input does conflict with some client: the test can tell the two apart
    updates = torch.tensor([[1.0, 0.0, 0.0], [-0.9, 0.3, 0.0], [-0.9, 0.0, 0.3]], dtype=torch.float64)
    w = torch.tensor([0.8, 0.1, 0.1], dtype=torch.float64)
    avg = fedavg_direction(updates, w)
    assert ((updates @ avg) < 0).any()
    assert ((updates @ craft_direction(updates, w)) > 0).all()


def test_craft_direction_least_squares_when_m_exceeds_d() -> None:
    gen = torch.Generator().manual_seed(2)
    m, d = 9, 4
    updates = torch.randn(m, d, generator=gen, dtype=torch.float64)
    w = torch.rand(m, generator=gen, dtype=torch.float64) + 0.1
    ref = torch.randn(d, generator=gen, dtype=torch.float64)
    g = craft_direction(updates, w, ref)
    u, wn, r = unit_rows(updates), w / w.sum(), ref / ref.norm()
    # U has full column rank: r + v with v solving the normal equations U^T U v = U^T (w - U r)
    v = torch.linalg.solve(u.T @ u, u.T @ (wn - u @ r))
    torch.testing.assert_close(g, r + v, rtol=1e-9, atol=1e-10)
    # the residual is orthogonal to U's columns (what least squares means)
    torch.testing.assert_close(u.T @ (u @ g - wn), torch.zeros(d, dtype=torch.float64), atol=1e-10, rtol=0)


def test_craft_direction_drops_zero_rows_and_returns_a_single_row_raw() -> None:
    gen = torch.Generator().manual_seed(3)
    updates = torch.randn(4, 10, generator=gen, dtype=torch.float64)
    w = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
    with_zero = torch.cat([updates[:2], torch.zeros(1, 10, dtype=torch.float64), updates[2:]])
    w_zero = torch.tensor([0.1, 0.2, 5.0, 0.3, 0.4], dtype=torch.float64)
    # the zero client's weight is dropped and the rest renormalised
    torch.testing.assert_close(craft_direction(with_zero, w_zero), craft_direction(updates, w))
    one = torch.zeros(3, 10, dtype=torch.float64)
    one[1] = updates[0]
    torch.testing.assert_close(craft_direction(one, torch.ones(3)), updates[0])
    assert torch.equal(craft_direction(torch.zeros(3, 10), torch.ones(3)), torch.zeros(10))
    # dtype in, dtype out
    assert craft_direction(updates.float(), w.float()).dtype == torch.float32


def test_craft_direction_is_scale_free_in_the_updates_and_weights() -> None:
    gen = torch.Generator().manual_seed(4)
    updates = torch.randn(5, 30, generator=gen, dtype=torch.float64)
    w = torch.rand(5, generator=gen, dtype=torch.float64) + 0.1
    ref = torch.randn(30, generator=gen, dtype=torch.float64)
    scales = torch.tensor([0.01, 3.0, 1.0, 100.0, 0.5], dtype=torch.float64)[:, None]
    torch.testing.assert_close(craft_direction(updates * scales, 7 * w, 4 * ref), craft_direction(updates, w, ref))


# --- FedAvg and craft_aggregate -----------------------------------------------------------------------------
def test_fedavg_direction_against_a_loop() -> None:
    gen = torch.Generator().manual_seed(5)
    updates = torch.randn(6, 17, generator=gen, dtype=torch.float64)
    w = torch.rand(6, generator=gen, dtype=torch.float64)
    expected = torch.zeros(17, dtype=torch.float64)
    for i in range(6):
        expected += w[i] / w.sum() * updates[i]
    torch.testing.assert_close(fedavg_direction(updates, w), expected)


def test_craft_aggregate_solves_each_group_alone_and_global_as_one() -> None:
    gen = torch.Generator().manual_seed(6)
    m = 4
    updates = {"a.weight": torch.randn(m, 3, 5, generator=gen, dtype=torch.float64),
               "a.bias": torch.randn(m, 3, generator=gen, dtype=torch.float64),
               "b.weight": torch.randn(m, 2, 3, generator=gen, dtype=torch.float64)}
    ref = {k: torch.randn(v.shape[1:], generator=gen, dtype=torch.float64) for k, v in updates.items()}
    w = torch.rand(m, generator=gen, dtype=torch.float64) + 0.1
    out = craft_aggregate(updates, w, ref)
    assert list(out) == list(updates) and all(out[k].shape == updates[k].shape[1:] for k in out)
    a = craft_direction(torch.cat([updates["a.weight"].reshape(m, -1), updates["a.bias"]], 1), w,
                        torch.cat([ref["a.weight"].reshape(-1), ref["a.bias"]]))
    torch.testing.assert_close(out["a.weight"].reshape(-1), a[:15])
    torch.testing.assert_close(out["a.bias"], a[15:])
    torch.testing.assert_close(out["b.weight"].reshape(-1), craft_direction(updates["b.weight"].reshape(m, -1), w, ref["b.weight"].reshape(-1)))
    # CRAFT-global: one problem over every coordinate
    glob = craft_aggregate(updates, w, ref, groups=[list(updates)])
    flat = craft_direction(torch.cat([v.reshape(m, -1) for v in updates.values()], 1), w,
                           torch.cat([v.reshape(-1) for v in ref.values()]))
    torch.testing.assert_close(torch.cat([v.reshape(-1) for v in glob.values()]), flat)


def test_layer_groups_attach_norm_layers_to_the_preceding_layer() -> None:
    mlp = MLP((64,), 10, hidden=[64, 64])
    expected = [["layers.0.weight", "layers.0.bias"], ["layers.2.weight", "layers.2.bias"], ["layers.4.weight", "layers.4.bias"]]
    assert layer_groups(mlp) == expected
    resnet = ResNet((3, 32, 32), 10, blocks_per_stage=1, norm="group")
    groups = layer_groups(resnet)
    assert groups[0] == ["stem.0.weight", "stem.1.weight", "stem.1.bias"]
    assert ["stages.0.0.conv2.weight", "stages.0.0.bn2.weight", "stages.0.0.bn2.bias"] in groups
    assert ["stages.1.0.shortcut.0.weight", "stages.1.0.shortcut.1.weight", "stages.1.0.shortcut.1.bias"] in groups
    assert not any(isinstance(m, nn.BatchNorm2d) for m in resnet.modules())
    # the name/shape rule (what Flower's state dicts get) agrees with the module-type rule
    for net in (mlp, resnet):
        params = dict(net.named_parameters())
        assert default_groups(list(params), {k: tuple(p.shape) for k, p in params.items()}) == layer_groups(net)


# --- the federated round ------------------------------------------------------------------------------------
def tiny_trainer(**kw) -> L.Trainer:
    return L.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                     enable_model_summary=False, num_sanity_val_steps=0, **kw)


def test_one_fedavg_round_equals_the_weighted_mean_of_naively_trained_clients() -> None:
    torch.manual_seed(0)
    dm = FederatedDataModule(n_clients=4, rounds_per_epoch=1, partition_seed=0)
    net = functools.partial(MLP, hidden=[16])
    model = FederatedClassifier(net=net, aggregator="fedavg", server_lr=1.0, seed=7, local_epochs=2,
                                client_batch_size=8, client_lr_decay=0.5)
    start = copy.deepcopy(model.net)
    tiny_trainer(max_epochs=1, limit_val_batches=0).fit(model, dm)
    x, y, offsets = dm.splits["train"]
    sizes = (offsets[1:] - offsets[:-1]).double()
    expected = {k: torch.zeros_like(v) for k, v in start.state_dict().items()}
    for c in range(4):
        client = copy.deepcopy(start)
        opt = torch.optim.SGD(client.parameters(), lr=0.05 * 0.5**0)  # round 0
        xc, yc = x[offsets[c] : offsets[c + 1]], y[offsets[c] : offsets[c + 1]]
        gen = torch.Generator().manual_seed(round_seed(7, 0, c))
        for _ in range(2):
            for idx in torch.randperm(len(yc), generator=gen).split(8):
                opt.zero_grad()
                F.cross_entropy(client(xc[idx]), yc[idx]).backward()
                opt.step()
        for k, v in client.state_dict().items():
            expected[k] += sizes[c].item() / sizes.sum().item() * v
    for k, v in model.net.state_dict().items():
        torch.testing.assert_close(v, expected[k], rtol=1e-5, atol=1e-6)


def test_craft_round_keeps_every_client_aligned_and_stores_the_reference() -> None:
    torch.manual_seed(0)
    dm = FederatedDataModule(n_clients=6, rounds_per_epoch=2, partition_seed=1)
    model = FederatedClassifier(net=functools.partial(MLP, hidden=[16]), aggregator="craft", server_lr=0.3, seed=0)
    tiny_trainer(max_epochs=1, limit_val_batches=0).fit(model, dm)
    rnd = model.client_round()
    assert rnd.round == 2 and rnd.updates.shape == (6, model.n_params)
    for _name, a, b in rnd.groups:
        torch.testing.assert_close(unit_rows(rnd.updates[:, a:b].double()) @ rnd.aggregate[a:b].double(),
                                   rnd.weights.double(), rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(model.reference, rnd.aggregate)
    torch.testing.assert_close(rnd.step, 0.3 * rnd.aggregate, rtol=1e-5, atol=1e-7)


def test_partial_participation_is_seeded_by_round_only() -> None:
    model = FederatedClassifier(clients_per_round=5, seed=3)
    a, b = model.select_clients(4, 20), model.select_clients(4, 20)
    assert torch.equal(a, b) and len(a) == 5 and torch.equal(a, a.sort().values)
    assert not torch.equal(a, model.select_clients(5, 20))


# --- bad input ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("weights", [torch.tensor([1.0, -1.0, 1.0]), torch.zeros(3), torch.ones(2),
                                     torch.tensor([1.0, float("nan"), 1.0])])
def test_bad_weights_are_one_clear_error(weights: torch.Tensor) -> None:
    with pytest.raises(ConfigError, match="weights"):
        craft_direction(torch.randn(3, 5), weights)
    with pytest.raises(ConfigError, match="weights"):
        fedavg_direction(torch.randn(3, 5), weights)


def test_nan_updates_name_the_client() -> None:
    updates = torch.randn(3, 5)
    updates[1, 2] = float("nan")
    with pytest.raises(ConfigError, match=r"client update\(s\) \[1\]"):
        craft_direction(updates, torch.ones(3))
    with pytest.raises(ConfigError, match="NaN"):
        craft_aggregate({"w": updates}, torch.ones(3))


def test_bad_groups_and_shapes() -> None:
    updates = {"a.w": torch.randn(2, 3), "b.w": torch.randn(2, 4)}
    with pytest.raises(ConfigError, match="missing"):
        craft_aggregate(updates, torch.ones(2), groups=[["a.w"]])
    with pytest.raises(ConfigError, match="two|groups 0 and 1"):
        craft_aggregate(updates, torch.ones(2), groups=[["a.w", "b.w"], ["b.w"]])
    with pytest.raises(ConfigError, match="reference"):
        craft_aggregate(updates, torch.ones(2), reference={"a.w": torch.zeros(3)})
    with pytest.raises(ConfigError, match="matrix"):
        craft_direction(torch.randn(5), torch.ones(5))


def test_clients_per_round_above_n_clients_fails_at_the_first_round() -> None:
    dm = FederatedDataModule(n_clients=4, rounds_per_epoch=1, partition_seed=0)
    model = FederatedClassifier(clients_per_round=5)
    with pytest.raises(ConfigError, match="clients_per_round=5 exceeds the 4 clients"):
        tiny_trainer(max_epochs=1, limit_val_batches=0).fit(model, dm)
    with pytest.raises(ConfigError, match="clients_per_round"):
        FederatedClassifier(clients_per_round=0)
    with pytest.raises(ConfigError, match="aggregator"):
        FederatedClassifier(aggregator="fedsgd")


# --- CLI and DDP --------------------------------------------------------------------------------------------
@pytest.mark.slow  # the same fit + test is tests/test_cli.py's smoke run of craft, which checks these metrics too
def test_fit_and_test_through_the_cli(paperlab_tmp: Path) -> None:
    config = str(CONFIGS / "digits_craft.yaml")
    assert cli_main(["fit", "--config", config, *TINY]) == 0
    assert cli_main(["test", "--config", config, *TINY, "--ckpt_path", "last"]) == 0
    (run,) = runs_of("craft")
    metrics = run.data.metrics
    assert {"test/acc", "test/client_acc_mean", "test/client_acc_std", "test/client_acc_worst10", "test/client_acc_noise_std",
            "test/client_acc_var_corrected", "test/client_acc_spread_corrected", "test/client_acc_spread_corrected_lo",
            "test/client_acc_spread_corrected_hi"} <= set(metrics)
    assert metrics["diag/client_conflict/rate"] == 0.0 and metrics["diag/client_conflict/layer_rate_avg"] == 0.0
    assert run.data.tags["paper_id"] == "000-04" and run.data.tags["dataset"] == "digits"


@pytest.mark.slow  # two spawned gloo processes through the CLI: 30-60 s on 2 cores
def test_two_gloo_processes_equal_one_process_after_three_rounds(paperlab_tmp: Path) -> None:
    """Ranks split each round's clients (7 of 20: an uneven split) and all-gather the updates."""
    config = str(CONFIGS / "digits_craft.yaml")
    common = ["--trainer.max_epochs", "1", "--trainer.limit_train_batches", "3", "--trainer.limit_val_batches", "0",
              "--trainer.num_sanity_val_steps", "0", "--model.init_args.clients_per_round", "7"]
    assert cli_main(["fit", "--config", config, *common, "--run.name", "single"]) == 0
    proc = run_main(["fit", "--config", config, "--trainer", str(REPO / "configs/trainer/ddp_cpu.yaml"), *common,
                     "--run.name", "ddp"], cwd=paperlab_tmp)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ckpt = {name: torch.load(paperlab_tmp / "checkpoints/craft" / name / "last.ckpt", weights_only=False)
            for name in ("single", "ddp")}
    assert ckpt["ddp"]["global_step"] == ckpt["single"]["global_step"] == 3
    single, ddp = ckpt["single"]["state_dict"], ckpt["ddp"]["state_dict"]
    assert single.keys() == ddp.keys()
    for key in single:
        torch.testing.assert_close(ddp[key], single[key], rtol=0, atol=1e-6, msg=key)
    runs = {r.info.run_name: r for r in runs_of("craft")}
    assert runs["ddp"].data.tags["strategy"] == "DDPStrategy"


# --- the claims (100 rounds, 3 seeds, the tuned server_lr of each config) -----------------------------------
def fit_test(config: str, seed: int) -> dict[str, float]:
    name = f"{Path(config).stem}-s{seed}"
    args = ["--config", str(CONFIGS / config), "--seed_everything", str(seed), "--run.name", name]
    assert cli_main(["fit", *args]) == 0
    assert cli_main(["test", *args, "--ckpt_path", "best"]) == 0
    (run,) = [r for r in runs_of("craft") if r.info.run_name == name]
    return run.data.metrics


@pytest.mark.slow
def test_claims_on_federated_digits(paperlab_tmp: Path) -> None:
    """CRAFT vs FedAvg on conflicts, and the noise-corrected client-accuracy spread every run reports."""
    seeds = (0, 1, 2, 3)
    res = {c: [fit_test(f"digits_{c}.yaml", s) for s in seeds] for c in ("craft", "fedavg", "fedavgm")}

    def mean(c: str, key: str) -> float:
        return sum(m[key] for m in res[c]) / len(seeds)

    assert mean("craft", "diag/client_conflict/rate_avg") == 0.0
    assert mean("craft", "diag/client_conflict/layer_rate_avg") == 0.0
    assert mean("fedavg", "diag/client_conflict/rate_avg") > 0.0
    for runs in res.values():
        for m in runs:
            assert m["test/client_acc_noise_std"] > 0
            lo, mid, hi = (m[f"test/client_acc_spread_corrected{k}"] for k in ("_lo", "", "_hi"))
            assert lo <= mid <= hi
            assert mid == pytest.approx(max(0.0, m["test/client_acc_var_corrected"]) ** 0.5, rel=1e-4, abs=1e-6)
