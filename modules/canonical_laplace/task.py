"""The tasks of paper 004-10: a ReLU MLP trained to its MAP (full batch), then, at ``test``, standard and
gamma-canonical empirical-Bayes Laplace over random function-preserving rescalings of it.

``test`` logs, over ``n_rescalings`` rescalings with log alpha ~ U(-a, a) per hidden neuron:

- ``test/standard/log_delta_spread`` (std of log delta*), ``test/standard/pred_std_spread`` (max / min of the mean
  test predictive std), ``test/standard/log_evidence_spread`` (max - min log Z*, nats);
- per gamma of ``gamma_grid``, ``test/canonical/g<gamma>/rel_spread_{log_evidence,delta,pred_std}``
  ((max - min) / |mean|), their maximum over gamma ``test/canonical/max_rel_spread_*``, and
  ``test/canonical/g<gamma>/no_jacobian_log_evidence_spread``: the same evidence written in the original
  coordinates without the log|det D| term, which is not invariant;
- ``test/max_abs_pred_diff``: max |f_rescaled(x) - f(x)| over the test inputs (the function check);
- the evidence-selected (gamma*, delta*) of the trained net and its test NLL against standard EB's:
  ``test/selected/{gamma,delta,log_evidence,nll}``, ``test/standard/{delta,log_evidence,nll,pred_std}``,
  ``test/nll_gain`` (standard NLL - selected NLL: > 0 when the selected gamma predicts better).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor

from errors import ConfigError
from modules.base import PaperTask, Stage, StepOutput
from modules.canonical_laplace.functional import (
    MAX_FULL_GGN_PARAMS,
    LaplaceFit,
    Likelihood,
    gamma_canonicalize,
)
from modules.components.metrics import Accuracy
from modules.components.mlp import MLP
from modules.components.mlp_analysis import rescale_hidden


def default_optimizer(params: Any) -> torch.optim.Optimizer:
    # a small L2 term (the MAP's prior) keeps the weights finite where the data leave directions free
    return torch.optim.Adam(params, lr=1e-2, weight_decay=1e-4)


def _spread(values: Sequence[float]) -> float:
    """(max - min) / |mean|: the relative variation across rescalings."""
    t = torch.tensor(values, dtype=torch.float64)
    return float((t.max() - t.min()) / t.mean().abs().clamp_min(1e-300))


def _gamma_key(gamma: float) -> str:
    return f"g{gamma:g}"


class _LaplaceStudy(PaperTask, abstract=True):
    """A ReLU ``MLP`` at its MAP, analysed by EB-Laplace at ``test`` (see the module docstring).

    Args:
        hidden: hidden widths of the ReLU MLP (the full GGN needs at most 5000 parameters).
        n_rescalings: random rescalings of the trained net compared at ``test``.
        log_alpha_range: a; log alpha ~ U(-a, a) for every hidden neuron.
        gamma_grid: the gammas of the canonical family, each in [0, 1].
        sigma_noise: Gaussian likelihood's noise std; None: the RMS of the MAP's training residuals.
        rescale_seed: seed of the rescalings; None: the run's seed.
        input_shape, num_classes: linked from the DataModule (num_classes: outputs).
        optimizer, lr_scheduler: see ``PaperTask``.
    """

    paper_id = "004-10"
    monitor = "val/loss"
    monitor_mode = "min"
    likelihood: ClassVar[Likelihood]

    def __init__(
        self,
        hidden: Sequence[int] = (32, 32),
        n_rescalings: int = 20,
        log_alpha_range: float = 2.0,
        gamma_grid: Sequence[float] = (0.0, 0.25, 0.5, 0.75, 1.0),
        sigma_noise: float | None = None,
        rescale_seed: int | None = None,
        input_shape: tuple[int, ...] = (10,),
        num_classes: int = 1,
        optimizer: OptimizerCallable = default_optimizer,
        lr_scheduler: LRSchedulerCallable | None = None,
    ) -> None:
        metrics = {"acc": Accuracy()} if self.likelihood == "categorical" else {}
        super().__init__(optimizer, lr_scheduler, metrics=metrics)
        if n_rescalings < 2:
            raise ConfigError(f"n_rescalings must be >= 2 (a spread needs two), got {n_rescalings}")
        if not log_alpha_range > 0:
            raise ConfigError(f"log_alpha_range must be > 0, got {log_alpha_range}")
        if not gamma_grid or any(not 0.0 <= g <= 1.0 for g in gamma_grid):
            raise ConfigError(f"gamma_grid must be a non-empty list of gammas in [0, 1], got {list(gamma_grid)}")
        if sigma_noise is not None and not sigma_noise > 0:
            raise ConfigError(f"sigma_noise must be > 0 (or null: fitted from the residuals), got {sigma_noise}")
        if self.likelihood == "categorical" and num_classes < 2:
            raise ConfigError(f"a classifier needs >= 2 classes, got num_classes={num_classes}")
        self.net = MLP(input_shape, num_classes, hidden=list(hidden), activation="relu").double()
        n_params = sum(p.numel() for p in self.net.parameters())
        if n_params > MAX_FULL_GGN_PARAMS:
            raise ConfigError(f"the MLP has {n_params} parameters; the full GGN is limited to {MAX_FULL_GGN_PARAMS}: "
                              "use narrower model.hidden")
        self.n_rescalings = n_rescalings
        self.log_alpha_range = float(log_alpha_range)
        self.gamma_grid = [float(g) for g in gamma_grid]
        self.sigma_noise = sigma_noise
        self.rescale_seed = rescale_seed
        self._test_batches: list[tuple[Tensor, Tensor]] = []

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x.to(torch.float64))

    def loss_fn(self, f: Tensor, y: Tensor) -> Tensor:
        raise NotImplementedError

    def step(self, batch: tuple[Tensor, Tensor], stage: Stage) -> StepOutput:
        x, y = batch
        f = self(x)
        if stage == "test":
            self._test_batches.append((x.detach(), y.detach()))
        if self.likelihood == "categorical":
            return StepOutput(F.cross_entropy(f, y), preds=f.argmax(-1), target=y)
        return StepOutput(F.mse_loss(f, y.to(f.dtype).reshape(f.shape)), n=len(y))

    # --- the Laplace analysis ---------------------------------------------------------------------------------
    def _noise(self, x: Tensor, y: Tensor) -> float:
        if self.likelihood == "categorical":
            return 1.0
        if self.sigma_noise is not None:
            return float(self.sigma_noise)
        with torch.no_grad():
            return float((self.net(x) - y.reshape(len(y), -1)).square().mean().sqrt())

    def _fit(self, net: MLP, x: Tensor, y: Tensor, sigma: float) -> LaplaceFit:
        return LaplaceFit.at(net, x, y, self.likelihood, sigma)

    def laplace_evidence(self, batch: tuple[Tensor, Tensor]) -> dict[str, float]:
        """``modules.protocols.LaplaceEvidenceSource``: on ``batch`` (the training set, full batch), log Z(delta*)
        and log delta* of standard EB and of every gamma of the grid."""
        x, y = (t.to(self.device) for t in batch)
        x = x.to(torch.float64)
        sigma = self._noise(x, y)
        out: dict[str, float] = {}
        nets = [("standard", self.net)] + [(_gamma_key(g), gamma_canonicalize(self.net, g)[0]) for g in self.gamma_grid]
        for name, net in nets:
            fit = self._fit(net, x, y, sigma)
            delta = fit.optimal_delta()
            out[f"{name}/log_evidence"] = fit.log_evidence(delta)
            out[f"{name}/log_delta"] = math.log(delta)
        return out

    def _training_split(self) -> tuple[Tensor, Tensor]:
        # the DataModule's training loader, read whole (the order does not change a sum over samples)
        batches = list(self.trainer.datamodule.train_dataloader())
        x = torch.cat([b[0] for b in batches]).to(self.device, torch.float64)
        y = torch.cat([b[1] for b in batches]).to(self.device)
        return x, y

    def _evaluate(self, net: MLP, x: Tensor, y: Tensor, x_te: Tensor, y_te: Tensor, sigma: float
                  ) -> dict[str, float]:
        fit = self._fit(net, x, y, sigma)
        delta = fit.optimal_delta()
        f, var = fit.predictive_variance(x_te, delta)
        return {"log_evidence": fit.log_evidence(delta), "delta": delta, "log_delta": math.log(delta),
                "pred_std": float(var.clamp_min(0).sqrt().mean()), "nll": fit.predictive_nll(f, var, y_te)}

    def rescaling_study(self, x: Tensor, y: Tensor, x_te: Tensor, y_te: Tensor) -> dict[str, float]:
        """Every ``test/...`` value of the module docstring (without the prefix)."""
        sigma = self._noise(x, y)
        gen = torch.Generator().manual_seed(self.seed_or_run(self.rescale_seed))
        widths = [m.out_features for m in self.net.layers if isinstance(m, torch.nn.Linear)][:-1]
        base = self.net.eval()
        with torch.no_grad():
            f_base = base(x_te)
        out: dict[str, float] = {}
        original = self._evaluate(base, x, y, x_te, y_te, sigma)
        for key in ("log_evidence", "delta", "nll", "pred_std"):
            out[f"standard/{key}"] = original[key]
        std_rows: list[dict[str, float]] = []
        can_rows: dict[float, list[dict[str, float]]] = {g: [] for g in self.gamma_grid}
        no_jac: dict[float, list[float]] = {g: [] for g in self.gamma_grid}
        max_diff = 0.0
        a = self.log_alpha_range
        for _ in range(self.n_rescalings):
            log_alpha = [(torch.rand(w, generator=gen, dtype=torch.float64) * 2 - 1) * a for w in widths]
            net = rescale_hidden(base, log_alpha)
            with torch.no_grad():
                max_diff = max(max_diff, float((net(x_te) - f_base).abs().max()))
            std_rows.append(self._evaluate(net, x, y, x_te, y_te, sigma))
            for g in self.gamma_grid:
                canonical, log_scale = gamma_canonicalize(net, g)
                row = self._evaluate(canonical, x, y, x_te, y_te, sigma)
                can_rows[g].append(row)
                no_jac[g].append(row["log_evidence"] - float(log_scale.sum()))  # minus log|det D|
        log_deltas = torch.tensor([r["log_delta"] for r in std_rows], dtype=torch.float64)
        pred_std = [r["pred_std"] for r in std_rows]
        evid = [r["log_evidence"] for r in std_rows]
        out["standard/log_delta_spread"] = float(log_deltas.std())
        out["standard/pred_std_spread"] = max(pred_std) / min(pred_std)
        out["standard/log_evidence_spread"] = max(evid) - min(evid)
        best: tuple[float, float] | None = None
        for g, rows in can_rows.items():
            k = f"canonical/{_gamma_key(g)}"
            for q in ("log_evidence", "delta", "pred_std"):
                out[f"{k}/rel_spread_{q}"] = _spread([r[q] for r in rows])
            out[f"{k}/no_jacobian_log_evidence_spread"] = max(no_jac[g]) - min(no_jac[g])
            at_original = self._evaluate(gamma_canonicalize(base, g)[0], x, y, x_te, y_te, sigma)
            for q in ("log_evidence", "delta", "nll"):
                out[f"{k}/{q}"] = at_original[q]
            if best is None or at_original["log_evidence"] > best[1]:
                best = (g, at_original["log_evidence"])
        for q in ("log_evidence", "delta", "pred_std"):
            out[f"canonical/max_rel_spread_{q}"] = max(out[f"canonical/{_gamma_key(g)}/rel_spread_{q}"]
                                                      for g in self.gamma_grid)
        assert best is not None
        g_star = best[0]
        out["selected/gamma"] = g_star
        for q in ("log_evidence", "delta", "nll"):
            out[f"selected/{q}"] = out[f"canonical/{_gamma_key(g_star)}/{q}"]
        out["nll_gain"] = out["standard/nll"] - out["selected/nll"]
        out["max_abs_pred_diff"] = max_diff
        return out

    def on_test_epoch_start(self) -> None:
        self._test_batches = []

    def on_test_epoch_end(self) -> None:
        if self._test_batches:
            x_te = torch.cat([b[0] for b in self._test_batches]).to(torch.float64)
            y_te = torch.cat([b[1] for b in self._test_batches])
            x, y = self._training_split()
            values = self.rescaling_study(x, y, x_te, y_te)
            self.log_dict({f"test/{k}": v for k, v in values.items()}, on_epoch=True, batch_size=1)
            self._test_batches = []
        super().on_test_epoch_end()


class ReLUMLPRegressor(_LaplaceStudy):
    """Regression (Gaussian likelihood, targets ``(N, 1)``) with a ReLU MLP; see ``_LaplaceStudy``."""

    vectorizable = False  # --run.seeds: not checked yet under torch.func.vmap (its targets are (N, 1) floats)

    likelihood = "gaussian"


class ReLUMLPClassifier(_LaplaceStudy):
    """Classification (categorical likelihood, integer labels) with a ReLU MLP; see ``_LaplaceStudy``."""

    vectorizable = True  # a pure step; the Laplace evidence and the rescalings run at test time, on one seed's run

    likelihood = "categorical"
