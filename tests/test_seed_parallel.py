"""Seed-parallel training (``--run.seeds``, ``seed_parallel/``): each seed of a stack is the plain run of that seed.

Fast: the stack's steps against each seed's own plain steps in Python (float64: equal to rounding; float32:
the batched matmul rounds differently, about 1e-8 after one step), the zipped loaders' orders, the refusals.
Slow: plain ``fit --seed_everything s`` against the child runs of one ``fit --run.seeds`` through the CLI, in
float64 (``--trainer.precision 64-true``): float32 ReLU nets are chaotic at their kinks (a pre-activation
1e-8 from zero flips with the rounding and the runs part by 1e-4 within a step; docs/design.md, "Seed-parallel
runs"), float64 leaves them equal to 1e-15.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import torch
from lightning.fabric.utilities.seed import seed_everything

from cli_messages import run_training
from datamodules.base import BatchedTensorLoader
from datamodules.yinyang import YinYangDataModule
from errors import ConfigError
from modules.components.mlp import MLP
from modules.weight_drift import WeightDriftModel
from seed_parallel.stack import SeedStack, ZipLoader
from tests.helpers import client

REPO = Path(__file__).resolve().parents[1]


def _task(seed: int, optimizer: functools.partial) -> WeightDriftModel:
    seed_everything(seed, verbose=False)
    return WeightDriftModel(net=functools.partial(MLP, hidden=[16, 16], activation="relu"), optimizer=optimizer,
                            input_shape=(8,), num_classes=3)


def _batches(seed: int, n: int, dtype: torch.dtype) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(100 + seed)
    return [(torch.randn(12, 8, generator=gen, dtype=dtype), torch.randint(0, 3, (12,), generator=gen)) for _ in range(n)]


def _plain(seed: int, optimizer: functools.partial, batches: list, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    task = _task(seed, optimizer).to(dtype)
    opt = task.optimizer_factory(task.parameters())
    for batch in batches:
        opt.zero_grad()
        task.step(batch, "train").loss.backward()
        opt.step()
    return {k: v.detach().clone() for k, v in task.state_dict().items()}


def _stacked(seeds: list[int], optimizer: functools.partial, data: dict[int, list], dtype: torch.dtype,
             chunk_bytes: int | None = None) -> SeedStack:
    stack = SeedStack([_task(s, optimizer) for s in seeds], seeds).to(dtype)
    stack.tie()
    if chunk_bytes is not None:
        stack.chunk_bytes = chunk_bytes
    opt = stack.configure_optimizers()
    for i in range(len(data[seeds[0]])):
        batch = tuple(torch.stack([data[s][i][j] for s in seeds]) for j in range(2))
        opt.zero_grad()
        loss, _ = stack.seed_step(batch, "train")
        loss.sum().backward()
        opt.step()
    return stack


OPTIMIZERS = {
    "sgd momentum wd": functools.partial(torch.optim.SGD, lr=0.1, momentum=0.9, weight_decay=0.01),
    "adamw": functools.partial(torch.optim.AdamW, lr=0.01, weight_decay=0.1),
}


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_each_seed_of_a_stack_takes_its_own_plain_steps(name: str) -> None:
    """Own init, own data, own optimizer state, unscaled gradient: float64 agrees with the plain steps to
    rounding; a stack whose seeds' inits or data were swapped does not."""
    seeds, dtype = [3, 7, 11], torch.float64
    data = {s: _batches(s, 6, dtype) for s in seeds}
    stack = _stacked(seeds, OPTIMIZERS[name], data, dtype)
    for k, s in enumerate(seeds):
        plain = _plain(s, OPTIMIZERS[name], data[s], dtype)
        got = stack.tasks[k].state_dict()
        for key, value in plain.items():
            torch.testing.assert_close(got[key], value, rtol=0, atol=1e-12, msg=f"seed {s} {key}")
    other = _plain(seeds[1], OPTIMIZERS[name], data[seeds[0]], dtype)  # seed 7's init on seed 3's data
    assert max((stack.tasks[0].state_dict()[k] - v).abs().max() for k, v in other.items()) > 1e-3


def _saved_bytes_of_one_step(seed: int, batch: tuple[torch.Tensor, torch.Tensor]) -> int:
    """What one plain step of one seed keeps for backward (the stack's chunks are sized by it)."""
    saved = 0

    def count(t: torch.Tensor) -> torch.Tensor:
        nonlocal saved
        saved += t.numel() * t.element_size()
        return t

    task = _task(seed, OPTIMIZERS["adamw"]).double()
    with torch.autograd.graph.saved_tensors_hooks(count, lambda t: t):
        task.step(batch, "train")
    return saved


@pytest.mark.parametrize("per_call", [1, 2])
def test_seeds_whose_activations_exceed_the_budget_run_in_chunks_and_still_take_their_plain_steps(per_call: int) -> None:
    """A stack whose activations pass ``chunk_bytes`` runs the vmapped step on a few seeds at a time (the tiny
    GPT keeps 29 MB per seed): the chunk holds as many seeds as fit the budget, measured per seed (2 of 3 seeds
    leave a chunk of one), and every seed still takes its plain steps."""
    seeds, dtype = [3, 7, 11], torch.float64
    data = {s: _batches(s, 4, dtype) for s in seeds}
    budget = _saved_bytes_of_one_step(seeds[0], data[seeds[0]][0]) * per_call + 1
    stack = _stacked(seeds, OPTIMIZERS["adamw"], data, dtype, chunk_bytes=budget)
    assert stack.chunk_size == per_call
    for k, s in enumerate(seeds):
        for key, value in _plain(s, OPTIMIZERS["adamw"], data[s], dtype).items():
            torch.testing.assert_close(stack.tasks[k].state_dict()[key], value, rtol=0, atol=1e-12, msg=f"{s} {key}")
    assert _stacked(seeds, OPTIMIZERS["adamw"], data, dtype).chunk_size is None  # the default budget: one call


def test_a_seed_whose_loss_is_nan_leaves_the_other_seeds_plain_steps_untouched() -> None:
    """A NaN in one seed's batch makes that seed's loss and parameters NaN (its run ends FAILED at the epoch
    end) and nothing else: the other seeds still take exactly their plain steps (the gradient of the summed
    loss and the foreach optimizer update never mix seeds)."""
    seeds, dtype, optimizer = [3, 7, 11], torch.float64, OPTIMIZERS["adamw"]
    data = {s: _batches(s, 4, dtype) for s in seeds}
    data[7][1][0][0, 0] = float("nan")
    stack = _stacked(seeds, optimizer, data, dtype)
    assert any(not torch.isfinite(v).all() for v in stack.tasks[1].state_dict().values())
    for k, s in ((0, 3), (2, 11)):
        for key, value in _plain(s, optimizer, data[s], dtype).items():
            torch.testing.assert_close(stack.tasks[k].state_dict()[key], value, rtol=0, atol=1e-12, msg=f"{s} {key}")


def test_a_tied_weight_is_stacked_once_and_reaches_both_of_its_places() -> None:
    """TinyGPT ties its head to its token embedding: a stack of it still takes each seed's plain steps."""
    from modules.components.tiny_gpt import TinyGPT

    net = functools.partial(TinyGPT, n_layer=1, n_head=2, n_embd=8, activation="relu", norm="rmsnorm")
    optimizer = OPTIMIZERS["adamw"]

    def task(seed: int) -> WeightDriftModel:
        seed_everything(seed, verbose=False)
        return WeightDriftModel(net=net, optimizer=optimizer, input_shape=(16,), num_classes=11).double()

    seeds = [0, 1]
    gen = torch.Generator().manual_seed(0)
    data = {s: [(torch.randint(0, 11, (4, 16), generator=gen), torch.randint(0, 11, (4, 16), generator=gen))
                for _ in range(3)] for s in seeds}
    stack = SeedStack([task(s) for s in seeds], seeds)
    opt = stack.configure_optimizers()
    for i in range(3):
        opt.zero_grad()
        loss, _ = stack.seed_step(tuple(torch.stack([data[s][i][j] for s in seeds]) for j in range(2)), "train")
        loss.sum().backward()
        opt.step()
    for k, s in enumerate(seeds):
        plain = task(s)
        plain_opt = optimizer(plain.parameters())
        for batch in data[s]:
            plain_opt.zero_grad()
            plain.step(batch, "train").loss.backward()
            plain_opt.step()
        for key, value in plain.state_dict().items():
            torch.testing.assert_close(stack.tasks[k].state_dict()[key], value, rtol=0, atol=1e-12, msg=key)


def test_float32_parts_from_the_plain_run_by_rounding_only() -> None:
    """float32: the stacked (batched) matmul rounds otherwise than one matmul, about 1e-8 after a step."""
    seeds, dtype = [0, 1], torch.float32
    data = {s: _batches(s, 1, dtype) for s in seeds}
    stack = _stacked(seeds, OPTIMIZERS["adamw"], data, dtype)
    for k, s in enumerate(seeds):
        plain = _plain(s, OPTIMIZERS["adamw"], data[s], dtype)
        worst = max((stack.tasks[k].state_dict()[key] - v).abs().max().item() for key, v in plain.items())
        assert worst < 1e-6


@pytest.mark.parametrize("data", ["shared", "per seed"])
def test_zipped_loaders_give_each_seed_its_own_order_and_resume_each(data: str) -> None:
    """Shared tensors (seed-independent data) take the one-gather path; per-seed copies the general one."""
    x = torch.arange(10.0).unsqueeze(1)
    loaders = [BatchedTensorLoader((x if data == "shared" else x.clone(),), 4, shuffle=True, seed=s) for s in (0, 1)]
    zip_loader = ZipLoader(loaders)
    assert (zip_loader._shared_tensors() is not None) == (data == "shared")
    zipped = list(zip_loader)
    assert len(zipped) == 3
    alone = {s: [b[0] for b in BatchedTensorLoader((x,), 4, shuffle=True, seed=s)] for s in (0, 1)}
    for k, s in enumerate((0, 1)):
        for got, want in zip(zipped, alone[s], strict=True):
            assert torch.equal(got[0][k], want)
    # a resume within epoch 1 after its first batch: each seed skips that batch and counts on from it
    for loader in loaders:
        loader.load_state_dict({"epoch": 1, "consumed": 1})
    zip_loader.set_epoch(1)
    resumed = list(zip_loader)
    for k, s in enumerate((0, 1)):
        epoch1 = BatchedTensorLoader((x,), 4, shuffle=True, seed=s)
        epoch1.sampler.set_epoch(1)
        assert [b[0][k].tolist() for b in resumed] == [b[0].tolist() for b in list(epoch1)[1:]]
    assert all(loader.state_dict() == {"epoch": 1, "consumed": 3} for loader in loaders)


def test_a_torch_dataloader_shuffles_from_its_own_seeds_generator() -> None:
    """A ``DataLoader`` draws its order from torch's global generator: each seed gets its own state back."""
    from torch.utils.data import DataLoader, TensorDataset

    data = TensorDataset(torch.arange(12.0))
    states = []
    for s in (0, 1):
        torch.manual_seed(s)
        states.append(torch.get_rng_state())
    zipped = [b[0] for b in ZipLoader([DataLoader(data, batch_size=4, shuffle=True) for _ in (0, 1)], states)]
    for k, s in enumerate((0, 1)):
        torch.manual_seed(s)
        alone = [b[0] for b in DataLoader(data, batch_size=4, shuffle=True)]
        assert all(torch.equal(z[k], a) for z, a in zip(zipped, alone, strict=True))
    assert not all(torch.equal(z[0], z[1]) for z in zipped)


def test_a_task_that_is_not_vectorizable_is_refused_in_one_line() -> None:
    class NotPure(WeightDriftModel):
        vectorizable = False

    seed_everything(0, verbose=False)
    task = NotPure(net=functools.partial(MLP, hidden=[4]), input_shape=(8,), num_classes=3)
    with pytest.raises(ConfigError, match="NotPure is not vectorizable.*one after another"):
        SeedStack([task, task], [0, 1])


def test_seeds_with_a_diagnostic_or_another_command_are_refused(paperlab_tmp: Path, capsys: pytest.CaptureFixture) -> None:
    config = str(REPO / "configs/weight_drift/random_mlp_relu.yaml")
    assert run_training(["fit", "--config", config, "--run.seeds", "[0,1]"]) == 2
    assert "WeightDrift" in capsys.readouterr().err


def test_test_and_predict_with_seeds_evaluate_each_seeds_run(paperlab_tmp: Path, capsys: pytest.CaptureFixture,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    tiny = ["--config", str(REPO / "configs/mlp_classifier/yinyang.yaml"), "--trainer.max_epochs", "1",
            "--trainer.limit_train_batches", "2", "--trainer.limit_test_batches", "2", "--data.train_size", "200",
            "--data.val_size", "100", "--data.test_size", "100", "--run.name", "ev"]
    builds = []
    build_splits = YinYangDataModule.build_splits
    monkeypatch.setattr(YinYangDataModule, "build_splits", lambda dm: builds.append(dm) or build_splits(dm))
    assert run_training(["fit", *tiny, "--run.seeds", "[0,1]"]) == 0
    assert len(builds) == 1  # seed-independent data: one build shared by the seeds (datamodules.base.shared_splits)
    assert run_training(["test", *tiny, "--run.seeds", "[0,1]", "--ckpt_path", "best"]) == 0
    assert run_training(["predict", *tiny, "--run.seeds", "[1]", "--ckpt_path", "last"]) == 0
    out = capsys.readouterr().out
    assert "paperlab test finished: mlp_classifier / ev s0" in out and "ev s1" in out
    runs = {r.info.run_name: r for r in client().search_runs(
        [client().get_experiment_by_name("mlp_classifier").experiment_id])}
    assert set(runs) == {"ev seeds", "ev s0", "ev s1"}  # the tests logged into the seeds' runs, none of their own
    assert all("test/acc" in runs[f"ev s{s}"].data.metrics for s in (0, 1))
    folders = paperlab_tmp / "checkpoints/mlp_classifier"
    assert (folders / "ev_s1/predictions.pt").is_file() and not (folders / "ev_s0/predictions.pt").exists()
    # a seed without a run of its own fails in one line naming it; the other seeds are evaluated all the same
    assert run_training(["validate", *tiny, "--run.seeds", "[0,7]", "--ckpt_path", "best"]) != 0
    captured = capsys.readouterr()
    assert "paperlab validate finished: mlp_classifier / ev s0" in captured.out
    assert "validate failed for seed(s) 7 of 2" in captured.err


# --- through the CLI: the child runs are the plain runs ------------------------------------------------------
CASES = {
    "yinyang": ("configs/mlp_classifier/yinyang.yaml", "mlp_classifier",
                ["--trainer.max_epochs", "2", "--data.seed", "null"]),
    "drift random mlp sgd": ("configs/weight_drift/random_mlp_relu.yaml", "weight_drift",
                             ["--trainer.callbacks=[]", "--trainer.max_steps", "120", "--trainer.val_check_interval", "40"]),
    "drift digits mlp adamw": ("configs/weight_drift/digits_mlp.yaml", "weight_drift",
                               ["--trainer.callbacks=[]", "--trainer.max_epochs", "2", "--data.seed", "null"]),
    "flip lipschitz probe": ("configs/flip_lipschitz/digits.yaml", "flip_lipschitz",
                             ["--trainer.callbacks=[]", "--trainer.max_epochs", "2", "--data.seed", "null"]),
    "canonical laplace classifier": ("configs/canonical_laplace/breast_cancer.yaml", "canonical_laplace",
                                     ["--trainer.callbacks=[]", "--trainer.max_epochs", "40"]),
}


def _history(run: object, key: str) -> list[tuple[int, float]]:
    return [(m.step, m.value) for m in sorted(client().get_metric_history(run.info.run_id, key), key=lambda m: m.step)]


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_each_child_run_equals_the_plain_fit_of_its_seed(case: str, paperlab_tmp: Path) -> None:
    config, experiment, extra = CASES[case]
    extra = [*extra, "--trainer.precision", "64-true"]
    seeds = [0, 1, 2]
    for s in seeds:
        assert run_training(["fit", "--config", str(REPO / config), "--seed_everything", str(s),
                             "--run.name", f"plain {s}", *extra]) == 0
    assert run_training(["fit", "--config", str(REPO / config), "--run.seeds", json.dumps(seeds),
                         "--run.name", "stack", *extra]) == 0
    c = client()
    exp = c.get_experiment_by_name(experiment)
    runs = {r.info.run_name: r for r in c.search_runs([exp.experiment_id])}
    parent = runs["stack seeds"]
    assert parent.data.tags["sweep.role"] == "parent"
    for s in seeds:
        plain, child = runs[f"plain {s}"], runs[f"stack s{s}"]
        assert child.info.status == "FINISHED"
        assert child.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert child.data.params["seed_everything"] == str(s)
        for tag in ("paper_id", "method", "dataset", "strategy", "devices", "accelerator", "stage.fit", "git_commit"):
            assert child.data.tags.get(tag) == plain.data.tags.get(tag), tag
        differ = {k for k in plain.data.params.keys() | child.data.params.keys()
                  if plain.data.params.get(k) != child.data.params.get(k)}
        assert differ <= {"run.name"}, differ
        assert set(child.data.metrics) == set(plain.data.metrics)
        assert {"val/loss", "train/loss"} <= set(plain.data.metrics)
        assert any(k.endswith("_best") for k in plain.data.metrics)  # <monitor>_best
        for key in plain.data.metrics:  # every metric's history, step by step
            want, got = _history(plain, key), _history(child, key)
            assert [st for st, _ in got] == [st for st, _ in want], key
            for (_, a), (_, b) in zip(want, got, strict=True):
                assert abs(a - b) <= 1e-5 * abs(a), (s, key, a, b)
        weights = {}
        for name in ("plain", "stack"):
            folder = paperlab_tmp / "checkpoints" / experiment / (f"plain_{s}" if name == "plain" else f"stack_s{s}")
            weights[name] = torch.load(folder / "last.ckpt", weights_only=False)["state_dict"]
        for key, value in weights["plain"].items():
            assert (weights["stack"][key] - value).abs().max() <= 1e-5 * max(1.0, value.abs().max()), (s, key)
    # a child's checkpoint is a plain run's: test --ckpt_path best logs into that child run
    assert run_training(["test", "--config", str(REPO / config), *extra, "--ckpt_path", "best",
                         "--run.name", "stack s1"]) == 0
    assert "test/loss" in c.get_run(runs["stack s1"].info.run_id).data.metrics


def test_a_resumed_seed_parallel_fit_continues_its_runs_as_the_uninterrupted_fit(paperlab_tmp: Path) -> None:
    """Two epochs, then ``--ckpt_path last`` to a third, against three epochs at once: the same runs continued
    (the parent's and each seed's), the same metric histories, best values and final weights."""
    base = ["--config", str(REPO / "configs/mlp_classifier/yinyang.yaml"), "--run.seeds", "[0,1]",
            "--data.train_size", "300", "--data.val_size", "200"]
    assert run_training(["fit", *base, "--trainer.max_epochs", "3", "--run.name", "whole"]) == 0
    assert run_training(["fit", *base, "--trainer.max_epochs", "2", "--run.name", "cut"]) == 0
    before = {r.info.run_name: r.info.run_id for r in client().search_runs(
        [client().get_experiment_by_name("mlp_classifier").experiment_id])}
    assert run_training(["fit", *base, "--trainer.max_epochs", "3", "--run.name", "cut", "--ckpt_path", "last"]) == 0
    runs = {r.info.run_name: r for r in client().search_runs(
        [client().get_experiment_by_name("mlp_classifier").experiment_id])}
    assert {n: r.info.run_id for n, r in runs.items()} == before  # continued, none new
    assert runs["cut s1"].data.params["trainer.max_epochs"] == "2"  # the run's params stay; the change is a tag
    folders = paperlab_tmp / "checkpoints/mlp_classifier"
    for seed in (0, 1):
        whole, cut = runs[f"whole s{seed}"], runs[f"cut s{seed}"]
        assert cut.info.status == "FINISHED" and cut.data.tags["param_changed.trainer.max_epochs"] == "3"
        assert set(whole.data.metrics) == set(cut.data.metrics)
        for key in ("val/loss", "val/acc", "train/loss", "val/acc_best"):
            assert _history(whole, key) == _history(cut, key), (seed, key)
        a = torch.load(folders / f"whole_s{seed}/last.ckpt", weights_only=True)["state_dict"]
        b = torch.load(folders / f"cut_s{seed}/last.ckpt", weights_only=True)["state_dict"]
        assert a.keys() == b.keys(), (a.keys(), b.keys())
        assert all(torch.equal(a[k], b[k]) for k in a), {k: float((a[k] - b[k]).abs().max()) for k in a}
        best = sorted(p.name for p in (folders / f"cut_s{seed}").glob("best-epoch*.ckpt"))
        assert best == sorted(p.name for p in (folders / f"whole_s{seed}").glob("best-epoch*.ckpt"))
    assert run_training(["fit", *base, "--run.name", "cut", "--ckpt_path", "best"]) == 2


def test_the_seeds_unwritten_metrics_travel_in_the_checkpoint_and_reach_their_runs_on_resume(paperlab_tmp: Path) -> None:
    """What ``LastCheckpoint`` stores of a stack (``unflushed``) and hands back on resume (``replay``): each
    seed's metrics not yet in the store, routed back to that seed's run, even before its logger exists."""
    from seed_parallel.outputs import SeedRunsLogger
    from tracking.mlflow_logger import default_tracking_uri

    uri = default_tracking_uri()
    first = SeedRunsLogger([0, 1], experiment_name="e", run_name="p seeds", tracking_uri=uri, flush_every_s=3600)
    first.open_children({0: "p s0", 1: "p s1"}, {0: {}, 1: {}}, {0: {}, 1: {}}, {0: "a: 1", 1: "a: 1"},
                        {0: paperlab_tmp / "s0", 1: paperlab_tmp / "s1"})
    first._opened.result()
    first.log_metrics({"s0/val/loss": 0.5, "s1/val/loss": 0.25, "epoch": 0.0}, step=7)
    rows = first.unflushed()
    assert sorted(r[0] for r in rows) == ["s0/epoch", "s0/val/loss", "s1/epoch", "s1/val/loss"]
    ids = {s: first.children[s].run_id for s in (0, 1)}
    first._shared.shutdown()  # a kill -9: nothing written, the rows live on in the checkpoint only

    resumed = SeedRunsLogger([0, 1], experiment_name="e", tracking_uri=uri, run_id=first.run_id)
    resumed.replay(rows)  # Lightning restores callbacks before on_fit_start opens the children
    resumed.resume_children(ids)
    resumed.open_children({0: "p s0", 1: "p s1"}, {0: {}, 1: {}}, {0: {}, 1: {}}, {0: "a: 1", 1: "a: 1"},
                          {0: paperlab_tmp / "s0", 1: paperlab_tmp / "s1"})
    resumed.finalize("success")
    for seed, value in ((0, 0.5), (1, 0.25)):
        assert [(m.step, m.value) for m in client().get_metric_history(ids[seed], "val/loss")] == [(7, value)]
    assert client().get_run(first.run_id).data.metrics == {}


# --- rows: arms of optimizer hyperparameters x seeds in one stack (--run.rows) ---------------------------------
ARMS = [(functools.partial(torch.optim.AdamW, lr=0.01, weight_decay=0.1), 3),
        (functools.partial(torch.optim.AdamW, lr=0.01, weight_decay=0.1), 7),
        (functools.partial(torch.optim.AdamW, lr=0.002, weight_decay=0.1), 3),
        (functools.partial(torch.optim.AdamW, lr=0.01, weight_decay=0.0), 7)]


def _rows_stack(arms: list, data: dict[int, list], dtype: torch.dtype, steps: range,
                stack: SeedStack | None = None, opt: torch.optim.Optimizer | None = None) -> tuple[SeedStack, object]:
    """A stack of rows (optimizer, seed) stepped as Lightning steps it: zero_grad, backward, the hook, step."""
    if stack is None:
        stack = SeedStack([_task(s, o) for o, s in arms], list(range(len(arms))),
                          rows=[f"{o.keywords} s{s}" for o, s in arms]).to(dtype)
        stack.tie()
        opt = stack.configure_optimizers()
    for i in steps:
        batch = tuple(torch.stack([data[s][i][j] for _, s in arms]) for j in range(2))
        opt.zero_grad()
        loss, _ = stack.seed_step(batch, "train")
        loss.sum().backward()
        stack.on_before_optimizer_step(opt)
        opt.step()
    return stack, opt


def test_rows_that_differ_in_their_optimizers_hyperparameters_each_take_their_plain_steps() -> None:
    """Two seeds x (lr, weight decay) arms: one param group per row, each row equal to its plain run; the
    same rows with two learning rates swapped are not."""
    dtype = torch.float64
    data = {s: _batches(s, 5, dtype) for s in (3, 7)}
    stack, opt = _rows_stack(ARMS, data, dtype, range(5))
    # rows 0 and 1 agree: one group (one block); rows 2 and 3 each differ from their neighbour
    assert stack.row_blocks == [(0, 2), (2, 3), (3, 4)] and [g["lr"] for g in opt.param_groups] == [0.01, 0.002, 0.01]
    for k, (optimizer, s) in enumerate(ARMS):
        for key, value in _plain(s, optimizer, data[s], dtype).items():
            torch.testing.assert_close(stack.tasks[k].state_dict()[key], value, rtol=0, atol=1e-12, msg=f"{k} {key}")
    swapped = [ARMS[2], ARMS[1], ARMS[0], ARMS[3]]  # rows 0 and 2 (seed 3) with each other's learning rate
    other, _ = _rows_stack([(o, s) for (o, _), (_, s) in zip(swapped, ARMS, strict=True)], data, dtype, range(5))
    plain = _plain(3, ARMS[0][0], data[3], dtype)
    assert max((other.tasks[0].state_dict()[k] - v).abs().max() for k, v in plain.items()) > 1e-4


def test_rows_with_sgd_momentum_arms_take_their_plain_steps_and_one_optimizer_keeps_one_group() -> None:
    dtype = torch.float64
    arms = [(functools.partial(torch.optim.SGD, lr=0.1, momentum=m), 3) for m in (0.0, 0.9)]
    data = {3: _batches(3, 4, dtype)}
    stack, opt = _rows_stack(arms, data, dtype, range(4))
    assert [g["momentum"] for g in opt.param_groups] == [0.0, 0.9]
    for k, (optimizer, s) in enumerate(arms):
        for key, value in _plain(s, optimizer, data[s], dtype).items():
            torch.testing.assert_close(stack.tasks[k].state_dict()[key], value, rtol=0, atol=1e-12, msg=f"{k} {key}")
    same = SeedStack([_task(s, OPTIMIZERS["adamw"]) for s in (3, 7)], [0, 1], rows=["a", "b"])
    assert len(same.configure_optimizers().param_groups) == 1 and not same.row_params  # the seeds-only path


def test_rows_with_optimizers_of_different_classes_are_refused_in_one_line() -> None:
    stack = SeedStack([_task(0, OPTIMIZERS["adamw"]), _task(1, OPTIMIZERS["sgd momentum wd"])], [0, 1], rows=["a", "b"])
    with pytest.raises(ConfigError, match=r"--run.rows cannot.*optimizers are of different classes \(AdamW, SGD\).*one after another"):
        stack.configure_optimizers()


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)` before")  # built after the steps
def test_a_rows_optimizer_state_and_schedule_round_trip_through_a_checkpoint() -> None:
    """The per-row groups' state (Adam's moments, each group's rate under a StepLR) saved after 3 steps and
    loaded into a fresh stack of the same rows: equal state, and the next 2 steps equal the uninterrupted 5."""
    dtype = torch.float64
    data = {s: _batches(s, 5, dtype) for s in (3, 7)}
    whole, _ = _rows_stack(ARMS, data, dtype, range(5))
    cut, opt = _rows_stack(ARMS, data, dtype, range(3))
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    scheduler.step()
    saved = {"opt": opt.state_dict(), "sched": scheduler.state_dict(), "weights": cut.state_dict(),
             "ckpt": {}}
    cut.on_save_checkpoint(saved["ckpt"])
    fresh = SeedStack([_task(s, o) for o, s in ARMS], list(range(4)), rows=[f"{o.keywords} s{s}" for o, s in ARMS])
    fresh = fresh.to(dtype)
    fresh.on_load_checkpoint(saved["ckpt"])
    fresh.load_state_dict(saved["weights"])
    fresh.tie()
    opt2 = fresh.configure_optimizers()
    sched2 = torch.optim.lr_scheduler.StepLR(opt2, step_size=1, gamma=0.5)
    opt2.load_state_dict(saved["opt"])
    sched2.load_state_dict(saved["sched"])
    assert [g["lr"] for g in opt2.param_groups] == [g["lr"] for g in opt.param_groups] == [0.005, 0.001, 0.005]
    for a, b in zip(opt.state_dict()["state"].values(), opt2.state_dict()["state"].values(), strict=True):
        assert all(torch.equal(a[n], b[n]) for n in a)
    for g in (opt.param_groups, opt2.param_groups):
        for group, lr in zip(g, [0.01, 0.002, 0.01], strict=True):
            group["lr"] = lr  # back to the uninterrupted run's rates, for the comparison of the steps
    _rows_stack(ARMS, data, dtype, range(3, 5), fresh, opt2)
    for k in range(4):
        for key, value in whole.tasks[k].state_dict().items():
            torch.testing.assert_close(fresh.tasks[k].state_dict()[key], value, rtol=0, atol=1e-12, msg=f"{k} {key}")
    other = SeedStack([_task(s, o) for o, s in ARMS], list(range(4)), rows=["x", "y", "z", "w"])
    with pytest.raises(ConfigError, match="the checkpoint holds the rows"):
        other.on_load_checkpoint(saved["ckpt"])


LR = "model.init_args.optimizer.init_args.lr"
WD = "model.init_args.optimizer.init_args.weight_decay"
TINY_YINYANG = ["--config", str(REPO / "configs/mlp_classifier/yinyang.yaml"), "--trainer.max_epochs", "2",
                "--data.train_size", "300", "--data.val_size", "200", "--trainer.precision", "64-true"]


@pytest.mark.slow
def test_each_row_of_a_stack_of_arms_equals_the_plain_fit_of_its_seed_and_hyperparameters(paperlab_tmp: Path) -> None:
    """2 learning rates x 2 seeds of the reference MLP (AdamW, StepLR), and an arm of its own weight decay, in
    one ``fit --run.rows``: each row's run equals the plain fit of its seed and hyperparameters (params, metric
    histories, final weights)."""
    arms = [({LR: 0.01}, 0), ({LR: 0.01}, 1), ({LR: 0.03}, 0), ({LR: 0.03}, 1), ({LR: 0.01, WD: 0.5}, 1)]
    for i, (overrides, seed) in enumerate(arms):
        flags = [a for k, v in overrides.items() for a in (f"--{k}", str(v))]
        assert run_training(["fit", *TINY_YINYANG, *flags, "--seed_everything", str(seed), "--run.name", f"plain {i}"]) == 0
    rows = [{"seed": seed, "overrides": overrides} for overrides, seed in arms]
    assert run_training(["fit", *TINY_YINYANG, "--run.rows", json.dumps(rows), "--run.name", "arms"]) == 0
    c = client()
    runs = {r.info.run_name: r for r in c.search_runs([c.get_experiment_by_name("mlp_classifier").experiment_id])}
    names = ["arms lr=0.01 s0", "arms lr=0.01 s1", "arms lr=0.03 s0", "arms lr=0.03 s1", "arms lr=0.01 weight_decay=0.5 s1"]
    assert set(runs) == {f"plain {i}" for i in range(5)} | set(names) | {"arms seeds"}
    for i, name in enumerate(names):
        plain, child = runs[f"plain {i}"], runs[name]
        assert child.info.status == "FINISHED"
        assert child.data.tags["mlflow.parentRunId"] == runs["arms seeds"].info.run_id
        assert child.data.params[LR] == str(arms[i][0][LR]) and child.data.params["seed_everything"] == str(arms[i][1])
        differ = {k for k in plain.data.params.keys() | child.data.params.keys()
                  if plain.data.params.get(k) != child.data.params.get(k)}
        assert not differ, differ
        assert set(child.data.metrics) == set(plain.data.metrics)
        for key in plain.data.metrics:
            want, got = _history(plain, key), _history(child, key)
            assert [st for st, _ in got] == [st for st, _ in want], key
            for (_, a), (_, b) in zip(want, got, strict=True):
                assert abs(a - b) <= 1e-5 * abs(a), (name, key, a, b)
        folders = paperlab_tmp / "checkpoints/mlp_classifier"
        a = torch.load(folders / f"plain_{i}/last.ckpt", weights_only=False)["state_dict"]
        b = torch.load(folders / name.replace(" ", "_") / "last.ckpt", weights_only=False)["state_dict"]
        for key, value in a.items():
            assert (b[key] - value).abs().max() <= 1e-5 * max(1.0, value.abs().max()), (name, key)


@pytest.mark.parametrize(("rows", "message"), [
    ([{"seed": 0}, {"seed": 1, "overrides": {"model.init_args.net.init_args.activation": "tanh"}}],
     "row 1 sets 'model.init_args.net.init_args.activation', which is not a hyperparameter of the config's optimizer"),
    # the same check, other inputs: slow, to keep the default suite's added time small
    pytest.param([{"seed": 0}, {"seed": 1, "overrides": {"model.init_args.optimizer.init_args.nesterov": True}}],
                 "row 1 sets 'model.init_args.optimizer.init_args.nesterov', which is not", marks=pytest.mark.slow),
    pytest.param([{"seed": 0}, {"seed": 0}], "names two rows' runs alike", marks=pytest.mark.slow),
])
def test_rows_that_differ_in_anything_but_their_optimizers_hyperparameters_are_refused(
        rows: list, message: str, paperlab_tmp: Path, capsys: pytest.CaptureFixture) -> None:
    assert run_training(["fit", *TINY_YINYANG, "--run.rows", json.dumps(rows)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and message in err[0] and "traceback" in err[1], err


def test_rows_whose_optimizer_classes_differ_are_refused_naming_the_key(paperlab_tmp: Path, capsys: pytest.CaptureFixture,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A row's resolved config may differ from the first row's in the optimizer's hyperparameters only: a
    different class (here through a stack whose second row's config was built otherwise) is one line."""
    from lightning_cli import PaperlabCLI

    seed_config = PaperlabCLI._seed_config

    def other_class(cli: PaperlabCLI, key: int) -> object:
        config = seed_config(cli, key)
        if key == 1:
            config["fit.model.init_args.optimizer.class_path"] = "torch.optim.Adam"
        return config

    monkeypatch.setattr(PaperlabCLI, "_seed_config", other_class)
    assert run_training(["fit", *TINY_YINYANG, "--run.rows", json.dumps([{"seed": 0}, {"seed": 1}])]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    # the option keeps its dashes (cli_messages.clean_error drops jsonargparse's bullets only)
    assert err[0].startswith("error: --run.rows cannot train these rows in one process: row 1 differs from row 0 "
                             "in model.init_args.optimizer.class_path (a different optimizer class)"), err


def test_a_row_whose_loss_is_nan_leaves_the_other_rows_plain_steps_untouched() -> None:
    dtype = torch.float64
    data = {s: _batches(s, 4, dtype) for s in (3, 7)}
    data[7][1][0][0, 0] = float("nan")  # rows 1 and 3 (seed 7) go NaN, rows 0 and 2 (seed 3) must not notice
    stack, _ = _rows_stack(ARMS, data, dtype, range(4))
    assert all(any(not torch.isfinite(v).all() for v in stack.tasks[k].state_dict().values()) for k in (1, 3))
    for k in (0, 2):
        optimizer, s = ARMS[k]
        for key, value in _plain(s, optimizer, data[s], dtype).items():
            torch.testing.assert_close(stack.tasks[k].state_dict()[key], value, rtol=0, atol=1e-12, msg=f"{k} {key}")


@pytest.mark.slow
def test_a_resumed_stack_of_arms_continues_its_runs_as_the_uninterrupted_fit(paperlab_tmp: Path) -> None:
    """Rows of two learning rates (their groups' Adam state and StepLR rates in the stack's last.ckpt): two
    epochs, then ``--ckpt_path last`` to a third, equal bit for bit to three epochs at once."""
    rows = json.dumps([{"seed": 0, "overrides": {LR: 0.01}}, {"seed": 0, "overrides": {LR: 0.03}}])
    base = ["--config", str(REPO / "configs/mlp_classifier/yinyang.yaml"), "--run.rows", rows,
            "--data.train_size", "300", "--data.val_size", "200",
            "--model.lr_scheduler.init_args.step_size", "1"]  # the rates change at every epoch end
    assert run_training(["fit", *base, "--trainer.max_epochs", "3", "--run.name", "whole"]) == 0
    assert run_training(["fit", *base, "--trainer.max_epochs", "2", "--run.name", "cut"]) == 0
    assert run_training(["fit", *base, "--trainer.max_epochs", "3", "--run.name", "cut", "--ckpt_path", "last"]) == 0
    runs = {r.info.run_name: r for r in client().search_runs(
        [client().get_experiment_by_name("mlp_classifier").experiment_id])}
    folders = paperlab_tmp / "checkpoints/mlp_classifier"
    for arm in ("lr=0.01 s0", "lr=0.03 s0"):
        whole, cut = runs[f"whole {arm}"], runs[f"cut {arm}"]
        assert cut.info.status == "FINISHED"
        for key in ("val/loss", "train/loss", "val/acc_best"):
            assert _history(whole, key) == _history(cut, key), (arm, key)
        a = torch.load(folders / f"whole_{arm.replace(' ', '_')}/last.ckpt", weights_only=True)["state_dict"]
        b = torch.load(folders / f"cut_{arm.replace(' ', '_')}/last.ckpt", weights_only=True)["state_dict"]
        assert all(torch.equal(a[k], b[k]) for k in a), arm
    state = torch.load(folders / "cut_seeds/last.ckpt", weights_only=False)
    assert [g["lr"] for g in state["optimizer_states"][0]["param_groups"]] == [0.01 * 0.5**3, 0.03 * 0.5**3]
