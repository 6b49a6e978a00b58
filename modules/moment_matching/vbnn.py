"""``DeterministicVBNN``: a mean-field Gaussian Bayesian MLP trained by a deterministic ELBO (paper 002-06).

Weights ``W_l ~ N(M_l, S_l^2)`` and biases ``b_l ~ N(m_l, s_l^2)``, independent. For one input x the pre-activation
``z = W h + b`` of a layer whose input h has moments ``(mu, Sigma)`` has

    E z = M mu + m,   Cov z = M Sigma M^T + diag(S^2 (diag Sigma + mu^2) + s^2)

(the weights are independent of h and of each other); the activation's moments come from
``activation_moments`` (``method = exact``, full covariance) or per unit (``method = diag``, every covariance
kept diagonal: the independent-unit deterministic baseline). The output layer is linear, so the predictive law of
the logits (or of the regression mean) is the Gaussian ``N(mu_f, Sigma_f)`` the method propagates.

ELBO per sample: ``E[log p(y | f)] - KL(q || p) / N_train`` with the prior ``N(0, prior_std^2)`` on every weight;
``E[log p(y | f)]`` is exact for a Gaussian likelihood (``log N(y; mu_f, sigma^2) - Sigma_f / (2 sigma^2)``, sigma
learned) and second order for a softmax (``log softmax(mu_f)_y - tr((diag p - p p^T) Sigma_f) / 2``).

Test: ``test/kl_mc`` is the mean over test inputs of ``KL(N_MC || N_method)``, the Monte Carlo predictive
(``mc_samples`` draws of the weights per input; per input the local reparameterisation is exact, since every
weight meets one input value) fitted by a Gaussian; ``test/kl_mc_exact`` and ``test/kl_mc_diag`` compare both
propagation methods on the same trained net; ``test/kl_floor`` is ``d (d + 3) / (4 N)``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal

import torch
import torch.nn.functional as F
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor, nn

from errors import ConfigError
from modules.base import PaperTask, Stage, StepOutput, WeightedMean
from modules.components.gaussian import MomentAccumulator, gaussian_kl, kl_floor
from modules.moment_matching.functional import Activation, _moments, activation_fn, activation_mean_var

VBMethod = Literal["exact", "diag"]


def _inverse_softplus(y: float) -> float:
    return y + math.log(-math.expm1(-y))


class DeterministicVBNN(PaperTask):
    """Mean-field Gaussian MLP trained by the deterministic ELBO (module docstring).

    Args:
        hidden: hidden widths.
        activation: probit, heaviside, gelu, relu or sine.
        method: ``exact`` (full covariance, exact moments) or ``diag`` (independent units) propagation, used for
            training and for ``test/kl_mc``.
        prior_std: standard deviation of the Gaussian prior on every weight and bias.
        init_std: initial posterior standard deviation, times ``1 / sqrt(fan_in)`` for weights.
        mc_samples: Monte Carlo draws per test input for the reference predictive.
        input_shape, num_classes: linked from the DataModule (``num_classes = 1``: regression).
        optimizer, lr_scheduler: for the variational parameters.
    """

    paper_id = "002-06"
    monitor = "val/nll"
    monitor_mode = "min"
    vectorizable = False  # --run.seeds: it draws random numbers during training
    summary_metrics = ("test/kl_mc", "test/kl_mc_exact", "test/kl_mc_diag", "test/kl_floor")

    def __init__(
        self,
        hidden: Sequence[int] = (32, 32),
        activation: Activation = "relu",
        method: VBMethod = "exact",
        prior_std: float = 1.0,
        init_std: float = 0.1,
        mc_samples: int = 20_000,
        input_shape: tuple[int, ...] = (30,),
        num_classes: int = 2,
        optimizer: OptimizerCallable = lambda p: torch.optim.Adam(p, lr=1e-2),
        lr_scheduler: LRSchedulerCallable | None = None,
    ) -> None:
        metrics = {k: WeightedMean() for k in ("nll", "acc", "kl_mc", "kl_mc_exact", "kl_mc_diag", "mse")}
        super().__init__(optimizer, lr_scheduler, metrics)
        if prior_std <= 0 or init_std <= 0 or mc_samples < 2 or any(h < 1 for h in hidden):
            raise ConfigError(f"need prior_std > 0, init_std > 0, mc_samples >= 2 and positive widths; got {prior_std},"
                              f" {init_std}, {mc_samples}, {list(hidden)}")
        self.activation, self.method = activation, method
        self.prior_std, self.mc_samples = prior_std, mc_samples
        self.regression = num_classes == 1
        widths = [math.prod(input_shape), *hidden, num_classes]
        self.w_mean, self.w_rho = nn.ParameterList(), nn.ParameterList()
        self.b_mean, self.b_rho = nn.ParameterList(), nn.ParameterList()
        gen = torch.Generator().manual_seed(self.run_seed)
        for n_in, n_out in zip(widths[:-1], widths[1:], strict=True):
            self.w_mean.append(nn.Parameter(torch.randn(n_out, n_in, generator=gen, dtype=torch.float64) / n_in**0.5))
            self.w_rho.append(nn.Parameter(torch.full((n_out, n_in), _inverse_softplus(init_std / n_in**0.5),
                                                      dtype=torch.float64)))
            self.b_mean.append(nn.Parameter(torch.zeros(n_out, dtype=torch.float64)))
            self.b_rho.append(nn.Parameter(torch.full((n_out,), _inverse_softplus(init_std), dtype=torch.float64)))
        self.log_noise = nn.Parameter(torch.zeros((), dtype=torch.float64))  # regression only
        self.n_train: int | None = None

    # --- the variational family -----------------------------------------------------------------------------------
    def layers(self) -> list[tuple[Tensor, Tensor, Tensor, Tensor]]:
        """``[(M, S^2, m, s^2)]`` per layer."""
        return [(m, F.softplus(r) ** 2, bm, F.softplus(br) ** 2)
                for m, r, bm, br in zip(self.w_mean, self.w_rho, self.b_mean, self.b_rho, strict=True)]

    def kl_divergence(self) -> Tensor:
        """``KL(q || p)`` summed over every weight and bias."""
        total = torch.zeros((), dtype=torch.float64, device=self.log_noise.device)
        p2 = self.prior_std**2
        for mean, var, bmean, bvar in self.layers():
            for mu, v in ((mean, var), (bmean, bvar)):
                total = total + 0.5 * (v / p2 + mu * mu / p2 - 1 - torch.log(v / p2)).sum()
        return total

    def predictive(self, x: Tensor, method: VBMethod | None = None) -> tuple[Tensor, Tensor]:
        """``(mean (B, K), cov (B, K, K))`` of the output for inputs ``x`` by ``method`` (default: the model's)."""
        method = method or self.method
        mu = x.flatten(1).double()
        cov: Tensor | None = None  # the input is deterministic
        layers = self.layers()
        for i, (m, s2, bm, bs2) in enumerate(layers):
            second = mu * mu if cov is None else mu * mu + torch.diagonal(cov, dim1=-2, dim2=-1)
            z_mean = mu @ m.T + bm
            noise = second @ s2.T + bs2
            if cov is None or method == "diag":
                var_in = torch.zeros_like(mu) if cov is None else torch.diagonal(cov, dim1=-2, dim2=-1)
                z_var = var_in @ (m * m).T + noise
                z_cov = None
            else:
                z_cov = m @ cov @ m.T + torch.diag_embed(noise)
                z_var = torch.diagonal(z_cov, dim1=-2, dim2=-1)
            if i == len(layers) - 1:
                return z_mean, z_cov if z_cov is not None else torch.diag_embed(z_var)
            if z_cov is None:  # independent units (the first layer of any method, every layer of diag)
                mu, var = activation_mean_var(z_mean, z_var, self.activation)
                cov = torch.diag_embed(var)
            else:
                mu, cov = _moments(z_mean, z_cov, self.activation)
        raise AssertionError("unreachable: the net has an output layer")

    def predictive_moments(self, batch: Any, method: str) -> tuple[Tensor, Tensor]:
        """``modules.protocols.PredictiveMoments``: the output law on a batch's inputs by ``method`` (exact, diag)
        or by Monte Carlo (``"mc"``)."""
        x = batch[0]
        if method == "mc":
            gen = torch.Generator(device=x.device).manual_seed(self.run_seed)
            return self.mc_predictive(x, gen)
        if method not in ("exact", "diag"):
            raise ConfigError(f"DeterministicVBNN propagates by 'exact' or 'diag' (or 'mc'), not {method!r}")
        return self.predictive(x, method)  # type: ignore[arg-type]

    @torch.no_grad()
    def mc_predictive(self, x: Tensor, generator: torch.Generator, chunk: int = 20_000) -> tuple[Tensor, Tensor]:
        """Monte Carlo mean and covariance of the output for each input (``mc_samples`` weight draws each)."""
        layers = self.layers()
        shift = self.predictive(x, "exact")[0]
        acc = MomentAccumulator(shift)
        done = 0
        while done < self.mc_samples:
            k = min(chunk, self.mc_samples - done)
            h = x.flatten(1).double().unsqueeze(1).expand(-1, k, -1)
            for i, (m, s2, bm, bs2) in enumerate(layers):
                z = h @ m.T + bm + torch.sqrt((h * h) @ s2.T + bs2) * torch.randn(
                    *h.shape[:2], m.shape[0], generator=generator, dtype=h.dtype, device=h.device)
                h = z if i == len(layers) - 1 else activation_fn(z, self.activation)
            acc.update(h)
            done += k
        return acc.moments()

    # --- the ELBO -----------------------------------------------------------------------------------------------------
    def expected_nll(self, mean: Tensor, cov: Tensor, y: Tensor) -> Tensor:
        """``-E[log p(y | f)]`` per sample under ``f ~ N(mean, cov)`` (exact Gaussian; second-order softmax)."""
        if self.regression:
            if y.dim() != 2 or y.shape[1] != 1:
                raise ConfigError(f"regression targets must be (N, 1), got {tuple(y.shape)}")
            var = torch.exp(2 * self.log_noise)
            err = (y.double() - mean) ** 2 + torch.diagonal(cov, dim1=-2, dim2=-1)
            return (0.5 * err / var + self.log_noise + 0.5 * math.log(2 * math.pi)).sum(-1)
        logp = torch.log_softmax(mean, -1)
        p = logp.exp()
        hess_trace = (p * torch.diagonal(cov, dim1=-2, dim2=-1)).sum(-1) - torch.einsum("bi,bij,bj->b", p, cov, p)
        return -logp.gather(-1, y.long()[:, None]).squeeze(-1) + 0.5 * hess_trace

    def on_fit_start(self) -> None:
        self.n_train = int(self.trainer.datamodule.loader("train").n)

    def step(self, batch: Any, stage: Stage) -> StepOutput:
        x, y = batch
        mean, cov = self.predictive(x)
        nll = self.expected_nll(mean, cov, y)
        loss = nll.mean()
        if stage == "train":
            loss = loss + self.kl_divergence() / (self.n_train or x.shape[0])
        n = x.shape[0]
        inputs: dict[str, Any] = {k: None for k in ("kl_mc", "kl_mc_exact", "kl_mc_diag", "mse", "acc")}
        inputs["nll"] = (nll.detach(), torch.ones_like(nll))
        if self.regression:
            inputs["mse"] = (((mean.detach() - y.double()) ** 2).sum(-1), torch.ones(n, dtype=torch.float64))
        else:
            inputs["acc"] = ((mean.detach().argmax(-1) == y).double(), torch.ones(n, dtype=torch.float64))
        if stage == "test":
            gen = torch.Generator(device=x.device).manual_seed(self.run_seed * 1_000_003 + self._test_batches)
            self._test_batches += 1
            mc = self.mc_predictive(x, gen)
            with torch.no_grad():
                kls = {m: gaussian_kl(*mc, *self.predictive(x, m)) for m in ("exact", "diag")}
            ones = torch.ones(n, dtype=torch.float64)
            inputs["kl_mc"] = (kls[self.method], ones)
            inputs["kl_mc_exact"] = (kls["exact"], ones)
            inputs["kl_mc_diag"] = (kls["diag"], ones)
        return StepOutput(loss, n=n, inputs=inputs)

    def on_test_epoch_start(self) -> None:
        self._test_batches = 0

    def extra_epoch_metrics(self, stage: Stage, values: dict[str, Tensor]) -> dict[str, Tensor]:
        if stage != "test":
            return {}
        out_dim = self.w_mean[-1].shape[0]
        return {"test/kl_floor": torch.tensor(kl_floor(out_dim, self.mc_samples))}


__all__ = ["DeterministicVBNN"]
