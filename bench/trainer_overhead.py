"""Throughput of paperlab's full default stack against a plain PyTorch loop, same MLP, same Yin-Yang data.

(a) plain loop: AdamW on the MLP, a fresh permutation per epoch, batches by tensor indexing, one
    no-grad validation pass per epoch;
(b) paperlab: ``main.PaperlabCLI`` on configs/mlp_classifier/yinyang.yaml with everything on (MLflow
    logger on a sqlite file, config artifact and params, checkpoints, best-metric, NaN guard), progress
    bar off. Timed from ``on_train_start`` to ``on_train_end``, so start-up (imports, MLflow schema
    creation, sanity check) is excluded from both.

The machine is shared and noisy: (a) and (b) are interleaved for ``--repeats`` rounds and the median
ratio (b)/(a) of samples per second is reported, per batch size.

    python bench/trainer_overhead.py --repeats 5 --epochs 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import Callback

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from datamodules.yinyang import YinYangDataModule  # noqa: E402
from main import PaperlabCLI  # noqa: E402
from modules.components.mlp import MLP  # noqa: E402

CONFIG = REPO / "configs/mlp_classifier/yinyang.yaml"


class TrainTimer(Callback):
    def on_train_start(self, trainer, pl_module) -> None:  # noqa: ANN001
        self.start = time.perf_counter()

    def on_train_end(self, trainer, pl_module) -> None:  # noqa: ANN001
        self.seconds = time.perf_counter() - self.start


def plain_loop(data: dict, batch_size: int, epochs: int, seed: int) -> float:
    torch.manual_seed(seed)
    x, y = data["train"]
    xv, yv = data["val"]
    net = MLP(4, [64, 64], 3)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
    start = time.perf_counter()
    for epoch in range(epochs):
        net.train()
        order = torch.randperm(len(x), generator=torch.Generator().manual_seed(epoch))
        for idx in order.split(batch_size):
            loss = F.cross_entropy(net(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
        net.eval()
        with torch.no_grad():
            correct = sum((net(xb).argmax(-1) == yb).sum() for xb, yb in zip(xv.split(batch_size), yv.split(batch_size)))
        _ = float(correct) / len(xv)
    return epochs * len(x) / (time.perf_counter() - start)


class _BareMLP(__import__("lightning").LightningModule):
    """The same MLP in the lightest Lightning form: no self.log, no metrics, no callbacks, no logger."""

    def __init__(self) -> None:
        super().__init__()
        self.net = MLP(4, [64, 64], 3)

    def training_step(self, batch, batch_idx):  # noqa: ANN001, ANN201
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def validation_step(self, batch, batch_idx) -> None:  # noqa: ANN001
        x, y = batch
        (self.net(x).argmax(-1) == y).sum()

    def configure_optimizers(self):  # noqa: ANN201
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


def bare_lightning(dm: YinYangDataModule, batch_size: int, epochs: int) -> float:
    import lightning as L

    dm.batch_size = dm.eval_batch_size = batch_size
    trainer = L.Trainer(max_epochs=epochs, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0)
    timer = TrainTimer()
    trainer.callbacks.append(timer)
    trainer.fit(_BareMLP(), dm)
    return epochs * 5000 / timer.seconds


ABLATIONS = {
    "no MLflow logger": ["--trainer.logger", "false"],
    "no checkpointing": ["--trainer.enable_checkpointing", "false"],
    "no logger, no checkpointing": ["--trainer.logger", "false", "--trainer.enable_checkpointing", "false"],
}


def paperlab_stack(batch_size: int, epochs: int, workdir: Path, run: int, extra: list[str] | None = None) -> float:
    os.chdir(workdir)
    cli = PaperlabCLI(
        args=["--config", str(CONFIG), "--trainer.max_epochs", str(epochs), "--data.init_args.batch_size",
              str(batch_size), "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
              "--run.name", f"bench-b{batch_size}-{run}", *(extra or [])],
        run=False,
    )
    timer = TrainTimer()
    cli.trainer.callbacks.append(timer)
    cli.trainer.fit(cli.model, cli.datamodule)
    return epochs * 5000 / timer.seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[32, 150])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--ablate", action="store_true",
                        help="also time the paperlab stack without the MLflow logger and/or checkpointing")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dm = YinYangDataModule()
    dm.setup()
    workdir = Path(tempfile.mkdtemp(prefix="paperlab-bench-"))
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{workdir / 'mlflow.db'}"
    os.environ.setdefault("CI", "1")
    import lightning.pytorch as pl

    pl_logger = __import__("logging").getLogger("lightning.pytorch")
    pl_logger.setLevel("ERROR")
    _ = pl
    print(f"torch threads: {torch.get_num_threads()}, epochs per run: {args.epochs}, repeats: {args.repeats}")
    for batch in args.batch_sizes:
        plain, bare, stack, ratios, bare_ratios = [], [], [], [], []
        for r in range(args.repeats):
            a = plain_loop(dm.splits, batch, args.epochs, seed=r)
            b = paperlab_stack(batch, args.epochs, workdir, r)
            c = bare_lightning(dm, batch, args.epochs)
            plain.append(a)
            stack.append(b)
            bare.append(c)
            ratios.append(b / a)
            bare_ratios.append(c / a)
        print(
            f"batch {batch:4d}: plain {statistics.median(plain):7.0f} samples/s | paperlab "
            f"{statistics.median(stack):7.0f} samples/s, ratio (b)/(a) median {statistics.median(ratios):.3f} "
            f"(min {min(ratios):.3f}, max {max(ratios):.3f}) | bare Lightning {statistics.median(bare):7.0f} "
            f"samples/s, ratio {statistics.median(bare_ratios):.3f}"
        )
        if args.ablate:
            for name, extra in ABLATIONS.items():
                rs = [paperlab_stack(batch, args.epochs, workdir, 100 + r, extra) / plain_loop(dm.splits, batch, args.epochs, r)
                      for r in range(args.repeats)]
                print(f"            paperlab, {name}: ratio median {statistics.median(rs):.3f}")


if __name__ == "__main__":
    main()
