"""What paperlab's stack costs on top of PyTorch and on top of Lightning, per case, in one process.

For each case three contenders train the same network on the same data:
  plain     a PyTorch loop: AdamW, batches by tensor indexing, one no-grad validation pass per epoch;
  bare      Lightning with nothing of paperlab's: a minimal LightningModule, no logger, no checkpoints,
            no callbacks, no metrics;
  paperlab  ``main.PaperlabCLI`` on the case's config with every default on (MLflow logger on a sqlite file,
            config artifact and params, checkpoints, ``<monitor>_best``, NaN guard, per-stage metrics),
            progress bar and model summary off, and the config's diagnostics off (they have their own
            benchmarks).
Each is timed from the start of the first training batch to the end of training (start-up excluded), and
throughput is training samples per second. Contenders are interleaved over ``--repeats`` rounds and the
medians of the per-round ratios are printed, one line per case:

    <case>: paperlab/plain <r> paperlab/bare <r>

followed by the per-epoch cost: the median time from the end of an epoch's last training batch to the start
of the next epoch's first one (validation, checkpoint, logging), for bare Lightning and for paperlab, and the
median time of a training step (its batch's start to its end). The load average before and after is printed:
the development machine is shared, so run it when it is quiet (or at ``nice -n -10``) and compare medians.

    python bench/trainer_overhead.py --repeats 5

``--breakdown`` prints, instead of the ratios, where the difference goes: every hook's time per fit in both
stacks, from Lightning's ``SimpleProfiler`` (``python bench/trainer_overhead.py --breakdown --cases mlp-b150``).
``--fold-ab`` runs the paperlab stack against itself with ``RunBookkeeping``'s parts unfolded into entries of
their own (the stack before 2026-12-03), alternated in one process: the median step and fit of each.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F
import yaml
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.profilers import Profiler, SimpleProfiler

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from callbacks.bookkeeping import RunBookkeeping  # noqa: E402
from datamodules.text import CharTextDataModule  # noqa: E402
from datamodules.yinyang import YinYangDataModule  # noqa: E402
from lightning_cli import PaperlabCLI  # noqa: E402
from modules.components.mlp import MLP  # noqa: E402
from modules.components.tiny_gpt import TinyGPT  # noqa: E402


@dataclass
class Case:
    name: str
    config: str
    batch: int
    epochs: int
    steps_per_epoch: int | None  # None: the whole training split
    val_batches: int | None


CASES = {
    "mlp-b32": Case("mlp-b32", "configs/mlp_classifier/yinyang.yaml", 32, 3, None, None),
    "mlp-b150": Case("mlp-b150", "configs/mlp_classifier/yinyang.yaml", 150, 3, None, None),
    "gpt": Case("gpt", "configs/weight_drift/tiny_gpt_text.yaml", 64, 2, 30, 2),
}


class Timer(Callback):
    """Training time from the first batch to the end, the gaps between epochs, and each step's time (from
    its batch's start to its end: forward, backward, optimizer, the per-step hooks)."""

    def __init__(self) -> None:
        self.start: float | None = None
        self.last_end = 0.0
        self.gaps: list[float] = []
        self.steps: list[float] = []
        self.pending_gap = False
        self._batch_start = 0.0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:  # noqa: ANN001
        now = time.perf_counter()
        if self.start is None:
            self.start = now
        elif self.pending_gap:
            self.gaps.append(now - self.last_end)
        self.pending_gap = False
        self._batch_start = now

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:  # noqa: ANN001
        self.last_end = time.perf_counter()
        self.steps.append(self.last_end - self._batch_start)

    def on_train_epoch_end(self, trainer, pl_module) -> None:  # noqa: ANN001
        self.pending_gap = True

    def on_train_end(self, trainer, pl_module) -> None:  # noqa: ANN001
        self.end = time.perf_counter()
        if self.pending_gap:
            self.gaps.append(self.end - self.last_end)


def _data(case: Case) -> tuple[dict, int]:
    if case.name.startswith("gpt"):
        dm = CharTextDataModule(block_size=64, batch_size=case.batch)
    else:
        dm = YinYangDataModule(batch_size=case.batch)
    dm.setup()
    return dm.splits, dm


def _net(case: Case) -> torch.nn.Module:
    """The case config's own network (its ``model.init_args.net.init_args``), so that the three contenders
    train the same one: the GPT config moved to RMSNorm on 2026-12-01 while this file kept LayerNorm, and
    plain and bare then trained a faster network than paperlab."""
    net_args = yaml.safe_load((REPO / case.config).read_text())["model"]["init_args"]["net"]["init_args"]
    if case.name.startswith("gpt"):
        return TinyGPT(64, 128, **net_args)
    return MLP(4, 3, **net_args)


def _loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def _samples(case: Case, n_train: int) -> int:
    per_epoch = case.steps_per_epoch * case.batch if case.steps_per_epoch else n_train
    return case.epochs * per_epoch


def plain_loop(case: Case, splits: dict, seed: int) -> float:
    torch.manual_seed(seed)
    x, y = splits["train"]
    xv, yv = splits["val"]
    net = _net(case)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    start = time.perf_counter()
    for epoch in range(case.epochs):
        net.train()
        order = torch.randperm(len(x), generator=torch.Generator().manual_seed(epoch)).split(case.batch)
        for idx in order[: case.steps_per_epoch]:
            loss = _loss(net(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
        net.eval()
        with torch.no_grad():
            batches = list(zip(xv.split(case.batch), yv.split(case.batch)))[: case.val_batches]
            _ = sum(float((net(xb).argmax(-1) == yb).float().mean()) for xb, yb in batches)
    return _samples(case, len(x)) / (time.perf_counter() - start)


class _Bare(L.LightningModule):
    def __init__(self, net: torch.nn.Module) -> None:
        super().__init__()
        self.net = net

    def training_step(self, batch, batch_idx):  # noqa: ANN001, ANN201
        x, y = batch
        return _loss(self.net(x), y)

    def validation_step(self, batch, batch_idx) -> None:  # noqa: ANN001
        x, y = batch
        (self.net(x).argmax(-1) == y).float().mean()

    def configure_optimizers(self):  # noqa: ANN201
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def _limits(case: Case) -> dict:
    out: dict = {}
    if case.steps_per_epoch:
        out["limit_train_batches"] = case.steps_per_epoch
    if case.val_batches:
        out["limit_val_batches"] = case.val_batches
    return out


def bare_lightning(
    case: Case, dm: L.LightningDataModule, n_train: int, profiler: Profiler | None = None
) -> tuple[float, Timer]:
    trainer = L.Trainer(max_epochs=case.epochs, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0, profiler=profiler, **_limits(case))
    timer = Timer()
    trainer.callbacks.append(timer)
    trainer.fit(_Bare(_net(case)), dm)
    return _samples(case, n_train) / (timer.end - timer.start), timer


def paperlab_stack(
    case: Case, workdir: Path, run: int, n_train: int, profiler: Profiler | None = None, unfold: bool = False
) -> tuple[float, Timer]:
    os.chdir(workdir)
    limits = [a for k, v in _limits(case).items() for a in (f"--trainer.{k}", str(v))]
    cli = PaperlabCLI(
        args=["--config", str(REPO / case.config), "--trainer.max_epochs", str(case.epochs), "--trainer.max_steps",
              "-1", "--trainer.val_check_interval", "1.0", "--trainer.check_val_every_n_epoch", "1",
              "--data.init_args.batch_size", str(case.batch), "--trainer.enable_progress_bar", "false",
              "--trainer.enable_model_summary", "false", "--trainer.num_sanity_val_steps", "0",
              "--run.name", f"bench-{case.name}-{run}", "--trainer.callbacks", "[]", *limits],
        run=False,
    )
    if unfold:  # RunBookkeeping's parts as entries of their own, as before 2026-12-03 (--fold-ab)
        callbacks = cli.trainer.callbacks
        i = next(i for i, c in enumerate(callbacks) if isinstance(c, RunBookkeeping))
        callbacks[i:i + 1] = callbacks[i].parts
    timer = Timer()
    cli.trainer.callbacks.append(timer)
    if profiler is not None:  # a chosen profiler is kept by the project's callbacks (callbacks/profiler.py)
        cli.trainer.profiler = profiler
    cli.trainer.fit(cli.model, cli.datamodule)
    return _samples(case, n_train) / (timer.end - timer.start), timer


def breakdown(case: Case, dm: L.LightningDataModule, workdir: Path, n_train: int, repeats: int) -> None:
    """Where paperlab's extra time goes: Lightning's ``SimpleProfiler`` times every hook call (each callback's,
    the module's, the loops' own actions) in both stacks; printed per fit, the actions whose total differs by
    more than 0.5 ms, largest first. The profiler's own cost (a few microseconds per call) is in both stacks."""
    totals: dict[str, dict[str, list[float]]] = {"bare": {}, "paperlab": {}}
    for r in range(repeats):
        for stack in ("paperlab", "bare"):
            profiler = SimpleProfiler()
            if stack == "bare":
                bare_lightning(case, dm, n_train, profiler)
            else:
                paperlab_stack(case, workdir, 1000 + r, n_train, profiler)
            for action, durations in profiler.recorded_durations.items():
                if action.endswith((".setup", ".prepare_data", ".configure_optimizers", ".on_fit_start")):
                    continue  # before the first batch: outside the timed window
                # one name per hook in both stacks: the task's class and a callback's state key dropped
                action = re.sub(r"\{.*\}", "", re.sub(r"^\[LightningModule\]\w+\.", "[LightningModule]task.", action))
                totals[stack].setdefault(action, []).append(sum(durations))
    ms = {stack: {a: 1e3 * statistics.median(v) for a, v in t.items()} for stack, t in totals.items()}
    rows = [(a, ms["bare"].get(a, 0.0), ms["paperlab"].get(a, 0.0)) for a in set(ms["bare"]) | set(ms["paperlab"])]
    rows = [r for r in rows if abs(r[2] - r[1]) > 0.5 and not r[0].startswith(("run_training", "[_TrainingEpochLoop"))]
    print(f"{case.name}: per fit ({case.epochs} epochs), median of {repeats}, ms: bare / paperlab / difference")
    for action, b, p in sorted(rows, key=lambda r: -(r[2] - r[1])):
        print(f"  {b:8.1f} {p:8.1f} {p - b:+8.1f}  {action}")


def fold_ab(case: Case, workdir: Path, n_train: int, repeats: int) -> None:
    """The paperlab stack as it is against the same stack with ``RunBookkeeping``'s parts unfolded into
    entries of their own, alternated in one process: what the fold saves, without the noise of two trees."""
    steps: dict[bool, list[float]] = {False: [], True: []}
    fits: dict[bool, list[float]] = {False: [], True: []}
    for r in range(repeats):
        for unfold in ((False, True) if r % 2 == 0 else (True, False)):
            _, timer = paperlab_stack(case, workdir, 2000 + 2 * r + unfold, n_train, unfold=unfold)
            steps[unfold] += timer.steps
            fits[unfold].append(timer.end - timer.start)
    med = {u: 1e6 * statistics.median(v) for u, v in steps.items()}
    fit = {u: 1e3 * statistics.median(v) for u, v in fits.items()}
    print(f"{case.name}: median step folded {med[False]:.1f} us, unfolded {med[True]:.1f} us "
          f"({med[True] - med[False]:+.1f} us); median fit {fit[False]:.1f} / {fit[True]:.1f} ms; "
          f"unfolded/folded time {statistics.median(b / a for a, b in zip(fits[False], fits[True], strict=True)):.3f}",
          flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--breakdown", action="store_true",
                        help="instead of the ratios: each stack's time per hook (Lightning's SimpleProfiler)")
    parser.add_argument("--fold-ab", action="store_true",
                        help="instead of the ratios: the paperlab stack against itself with RunBookkeeping unfolded")
    args = parser.parse_args()
    sys.argv = sys.argv[:1]  # the CLI gets its arguments from `args=`; Lightning warns when argv has others
    torch.set_num_threads(args.threads)
    workdir = Path(tempfile.mkdtemp(prefix="paperlab-bench-"))
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{workdir / 'mlflow.db'}"
    os.environ.setdefault("CI", "1")
    for name in ("lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel("ERROR")
    print(f"torch threads: {torch.get_num_threads()}, repeats: {args.repeats}, load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    for name in args.cases:
        case = CASES[name]
        splits, dm = _data(case)
        n_train = len(splits["train"][0])
        if args.breakdown:
            breakdown(case, dm, workdir, n_train, args.repeats)
            continue
        if args.fold_ab:
            fold_ab(case, workdir, n_train, args.repeats)
            continue
        vs_plain, vs_bare, gaps_bare, gaps_ours, steps_bare, steps_ours = [], [], [], [], [], []
        for r in range(args.repeats):
            plain = plain_loop(case, splits, seed=r)
            ours, t_ours = paperlab_stack(case, workdir, r, n_train)
            bare, t_bare = bare_lightning(case, dm, n_train)
            vs_plain.append(ours / plain)
            vs_bare.append(ours / bare)
            gaps_ours += t_ours.gaps
            gaps_bare += t_bare.gaps
            steps_ours += t_ours.steps
            steps_bare += t_bare.steps
        print(f"{name}: paperlab/plain {statistics.median(vs_plain):.2f} paperlab/bare {statistics.median(vs_bare):.2f}"
              f"  (ranges {min(vs_plain):.2f}-{max(vs_plain):.2f}, {min(vs_bare):.2f}-{max(vs_bare):.2f})", flush=True)
        print(f"{name}: per-epoch cost bare {1e3 * statistics.median(gaps_bare):.1f} ms, paperlab "
              f"{1e3 * statistics.median(gaps_ours):.1f} ms; per step bare {1e3 * statistics.median(steps_bare):.3f} "
              f"ms, paperlab {1e3 * statistics.median(steps_ours):.3f} ms", flush=True)

    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
