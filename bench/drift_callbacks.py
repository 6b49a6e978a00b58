"""Overhead of the WeightDrift and ActivationStats callbacks at their default cadence (target <= 5%).

Two measurements, both printed:

- attribution (robust on a shared machine): one ``Trainer.fit`` with the callbacks, every callback hook and
  every forward hook they install wrapped in a timer; overhead = time inside the callbacks / the rest of
  the fit time. Both terms come from the same run, so load from other processes scales them alike.
- A/B: ``Trainer.fit`` with and without the callbacks, arms alternated, fastest repeat of each; the ratio
  is only meaningful on a quiet machine.

Validation runs in every arm (ActivationStats measures on its first eval batches).

    python bench/drift_callbacks.py              # MLP on random data and the tiny GPT on CPython text
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import lightning as L
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from callbacks.activation_stats import ActivationStats  # noqa: E402
from callbacks.diagnostic import Schedule  # noqa: E402
from callbacks.weight_drift import WeightDrift  # noqa: E402
from datamodules.random_gaussian import RandomGaussianDataModule  # noqa: E402
from datamodules.text import CharTextDataModule  # noqa: E402
from modules.components.mlp import MLP  # noqa: E402
from modules.components.tiny_gpt import TinyGPT  # noqa: E402
from modules.weight_drift import WeightDriftModel  # noqa: E402

HOOKS = (
    "on_fit_start",
    "on_fit_end",
    "on_train_batch_start",
    "on_train_batch_end",
    "on_before_optimizer_step",
    "on_validation_batch_start",
    "on_validation_batch_end",
    "on_validation_epoch_end",
)


class CallbackClock:
    """Accumulates the wall time spent inside the wrapped callbacks (outermost calls only)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._depth = 0

    def wrap(self, fn):
        def timed(*args, **kwargs):
            self._depth += 1
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self._depth -= 1
                if self._depth == 0:
                    self.seconds += time.perf_counter() - t

        return timed

    def instrument(self, cb):
        for name in HOOKS:
            setattr(cb, name, self.wrap(getattr(cb, name)))
        if isinstance(cb, ActivationStats):  # its forward pre-hooks run inside the model's forward
            make_hook = cb._hook
            cb._hook = lambda layer: self.wrap(make_hook(layer))
        return cb


def fit_seconds(make_model, dm, steps: int, callbacks: list) -> float:
    torch.manual_seed(0)
    model = make_model()
    trainer = L.Trainer(
        max_steps=steps,
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        devices=1,
        val_check_interval=100,
        check_val_every_n_epoch=None,
        limit_val_batches=2,
        num_sanity_val_steps=0,
    )
    t = time.perf_counter()
    trainer.fit(model, dm)
    return time.perf_counter() - t


def bench(name: str, make_model, dm, steps: int, repeats: int) -> None:
    dm.setup()
    arms = {
        "none": lambda: [],
        "default": lambda: [
            WeightDrift(),
            ActivationStats(),
        ],  # every 50 steps; 2 eval batches per validation
        "dense": lambda: [
            WeightDrift(schedule=Schedule(every_n_steps=10)),
            ActivationStats(schedule=Schedule(at_fit_start=False, at_validation=True, every_n_steps=10)),
        ],
    }
    best = dict.fromkeys(arms, float("inf"))
    fit_seconds(make_model, dm, 20, [])  # warm-up (imports, allocator)
    for _ in range(repeats):
        for arm, cbs in arms.items():
            best[arm] = min(best[arm], fit_seconds(make_model, dm, steps, cbs()))
    base = best["none"]
    print(
        f"{name}: {steps} steps. A/B best of {repeats}: no callbacks {base:.2f} s; "
        f"default cadence {best['default']:.2f} s (x{best['default'] / base:.3f}); "
        f"every 10 steps {best['dense']:.2f} s (x{best['dense'] / base:.3f})",
        flush=True,
    )
    for arm in ("default", "dense"):
        clock = CallbackClock()
        total = fit_seconds(make_model, dm, steps, [clock.instrument(cb) for cb in arms[arm]()])
        rest = total - clock.seconds
        print(
            f"  attribution, {arm}: {clock.seconds:.3f} s in the callbacks / {rest:.2f} s the rest "
            f"= {100 * clock.seconds / rest:.2f}% overhead",
            flush=True,
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    text = CharTextDataModule(batch_size=32)
    text.setup("fit")
    bench(
        "MLP 64-256x3-10, random Gaussian, batch 128",
        lambda: WeightDriftModel(
            net=lambda s, n: MLP(s, n, hidden=[256, 256, 256], activation="relu", init="kaiming"),
            input_shape=(64,), num_classes=10,
            optimizer=lambda p: torch.optim.AdamW(p, lr=1e-3, betas=(0.9, 0.95), weight_decay=0.0),
        ),
        RandomGaussianDataModule(),
        500,
        args.repeats,
    )
    bench(
        "tiny GPT 3x3x48, CPython text, batch 32x64",
        lambda: WeightDriftModel(
            net=lambda s, n: TinyGPT(s, n, activation="relu", norm="rmsnorm"),
            input_shape=(64,), num_classes=text.vocab_size,
            optimizer=lambda p: torch.optim.AdamW(p, lr=3e-3, betas=(0.9, 0.95), weight_decay=0.0),
        ),
        text,
        200,
        args.repeats,
    )


if __name__ == "__main__":
    main()
