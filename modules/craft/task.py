"""``FederatedClassifier``: federated training of a classifier, one Lightning step = one communication round.

Round ``t`` (manual optimisation): the server holds ``theta_t``; each participating client ``i`` starts from
it and runs ``local_epochs`` epochs of minibatch training on its own data (the configured client optimizer,
plain SGD by default, learning rate ``lr * client_lr_decay^t``, batch ``client_batch_size``; FedProx adds
``prox_mu / 2 |theta_i - theta_t|^2`` to the local loss), ending at ``theta_i``. The server aggregates the
updates ``g_i = theta_t - theta_i`` with weights ``w_i`` proportional to the clients' training-set sizes
and steps ``theta_{t+1} = theta_t - eta_s g`` (``eta_s = server_lr``; FedAvgM puts heavy-ball momentum on
``g``). Aggregators:

- ``craft``: layer-wise CRAFT, ``g_q = r_q + pinv(U_q) (w - U_q r_q)`` per layer group ``q``, with the
  reference ``r_q`` the previous round's aggregate (unit length; 0 in the first round);
- ``craft_global``: one CRAFT problem for the whole model;
- ``craft_noref``: layer-wise with ``r = 0`` always (the minimum-norm conflict-free update);
- ``fedavg``: ``g = sum_i w_i g_i``; ``fedavgm``: the same with server momentum; ``fedprox``: FedAvg
  aggregation of proximally regularised clients.

Every client's randomness (its minibatch order) is seeded by ``(seed, round, client)`` and the round's
client sample by ``(seed, round)``, so the result does not depend on how clients are spread over
processes: under DDP each rank trains ``selected[rank::world]``, the updates are all-gathered in the
round's client order, and every rank aggregates the same matrix identically.
"""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Callable
from typing import Any, Literal

import torch
import torch.nn.functional as F
from lightning.pytorch.cli import OptimizerCallable
from torch import Tensor, nn
from torch.nn.utils import parameters_to_vector
from torchmetrics import Metric
from torchmetrics.utilities import dim_zero_cat

from errors import ConfigError
from modules.base import PaperTask, Stage, StepOutput
from modules.components.metrics import Accuracy, between_group_variance, noise_corrected_spread
from modules.components.mlp import MLP
from modules.craft.aggregation import craft_aggregate, fedavg_direction, layer_groups
from modules.protocols import ClientRound

Aggregator = Literal["craft", "craft_global", "craft_noref", "fedavg", "fedavgm", "fedprox"]
NetFactory = Callable[[tuple[int, ...], int], nn.Module]
CRAFT_VARIANTS = ("craft", "craft_global", "craft_noref")


def client_sgd(params: Any) -> torch.optim.Optimizer:
    """The clients' default local optimizer: plain SGD at learning rate 0.05 (decayed per round by the task)."""
    return torch.optim.SGD(params, lr=0.05)


def round_seed(seed: int, rnd: int, client: int = -1) -> int:
    """A seed for ``(seed, round, client)`` (``client = -1``: the round's client sample)."""
    return ((seed * 1_000_003 + rnd) * 1_000_033 + client + 1) % (2**63 - 1)


class ClientAccuracy(Metric):
    """Per-client accuracy of the global model on ``(preds, target, client)``: mean, spread and worst 10 %.

    - ``mean``: the mean of the clients' accuracies; ``std`` their population standard deviation, which
      includes each client's test-set sampling noise;
    - ``noise_std``: the part of that spread the test sets alone explain, ``sqrt(mean p_i (1 - p_i) / (n_i - 1))``;
    - ``var_corrected``: the between-client variance of the true accuracies, observed variance minus that
      noise (``modules.components.metrics.between_group_variance``; unclipped, so that it averages without
      bias over runs), and ``spread_corrected`` its square root clipped at 0, with ``spread_corrected_lo`` /
      ``_hi`` a 95 % bootstrap interval over clients (2000 resamples, seed ``boot_seed``);
    - ``worst10``: the mean accuracy of the ``ceil(n / 10)`` clients with the lowest accuracy.

    Clients without evaluation samples are left out; clients with a single sample are left out of the
    corrected spread (one sample says nothing about its own noise; the federated test sets have at least
    ``client_test_size`` samples, so this only happens on small local validation sets). Samples are gathered
    across DDP ranks before the per-client counts are taken.
    """

    full_state_update = False
    higher_is_better = True

    def __init__(self, boot_seed: int = 0) -> None:
        super().__init__()
        self.boot_seed = boot_seed
        self.add_state("client", default=[], dist_reduce_fx="cat")
        self.add_state("correct", default=[], dist_reduce_fx="cat")

    def update(self, preds: Tensor, target: Tensor, client: Tensor) -> None:
        self.client.append(client.long().reshape(-1))
        self.correct.append((preds == target).long().reshape(-1))

    def counts(self) -> tuple[Tensor, Tensor]:
        """``(correct, total)`` of every client that has samples, in client order (float64)."""
        client, correct = dim_zero_cat(self.client), dim_zero_cat(self.correct)
        n = int(client.max()) + 1
        total = torch.bincount(client, minlength=n).double()
        hits = torch.bincount(client, weights=correct.double(), minlength=n)
        has = total > 0
        return hits[has], total[has]

    def per_client(self) -> Tensor:
        """Accuracy of every client that has samples, in client order."""
        hits, total = self.counts()
        return hits / total

    def compute(self) -> dict[str, Tensor]:
        hits, total = self.counts()
        acc = hits / total
        k = max(1, math.ceil(0.1 * acc.numel()))
        out = {
            "mean": acc.mean(),
            "std": acc.std(unbiased=False),
            "worst10": acc.sort().values[:k].mean(),
        }
        usable = total >= 2
        if int(usable.sum()) >= 2:
            h, n = hits[usable], total[usable]
            p = h / n
            out["noise_std"] = (p * (1 - p) / (n - 1)).mean().sqrt()
            out["var_corrected"] = between_group_variance(h, n)
            spread, lo, hi = noise_corrected_spread(h, n, seed=self.boot_seed)
            out |= {"spread_corrected": spread, "spread_corrected_lo": lo, "spread_corrected_hi": hi}
        return {key: value.float() for key, value in out.items()}


class FederatedClassifier(PaperTask):
    """Federated classification with CRAFT or a baseline aggregator (see the module docstring).

    Args:
        net: the task network, ``net(input_shape, num_classes)`` (default: MLP 64-64, ReLU).
        aggregator: ``craft`` (layer-wise), ``craft_global``, ``craft_noref`` (r = 0), ``fedavg``,
            ``fedavgm`` (server momentum) or ``fedprox``.
        server_lr: the server step ``eta_s`` in ``theta -= eta_s g``. CRAFT's ``g`` has about unit norm per
            layer group, FedAvg's the size of a client update: tune it per aggregator.
        server_momentum: FedAvgM's momentum ``beta`` (``v = beta v + g``, ``theta -= eta_s v``).
        prox_mu: FedProx's proximal weight ``mu``.
        clients_per_round: clients sampled per round (None: all).
        local_epochs: local epochs ``E`` per round.
        client_batch_size: local minibatch size.
        client_lr_decay: the client learning rate is ``lr * client_lr_decay^t`` in round ``t``.
        seed: seed of the clients' minibatch orders and the client sampling (None: ``seed_everything``).
        input_shape, num_classes: linked from the DataModule.
        optimizer: the clients' local optimizer (built afresh for every client and round).
    """

    paper_id = "000-04"
    monitor = "val/acc"
    monitor_mode = "max"
    vectorizable = False  # --run.seeds: it optimises manually (automatic_optimization = False)

    def __init__(
        self,
        net: NetFactory = functools.partial(MLP, hidden=[64, 64], activation="relu"),
        aggregator: Aggregator = "craft",
        server_lr: float = 2.0,
        server_momentum: float = 0.9,
        prox_mu: float = 0.01,
        clients_per_round: int | None = None,
        local_epochs: int = 1,
        client_batch_size: int = 20,
        client_lr_decay: float = 0.999,
        seed: int | None = None,
        input_shape: tuple[int, ...] = (64,),
        num_classes: int = 10,
        optimizer: OptimizerCallable = client_sgd,
    ) -> None:
        super().__init__(optimizer, None, metrics={"acc": Accuracy(), "client_acc": ClientAccuracy()})
        if not server_lr > 0:
            raise ConfigError(f"server_lr must be positive, got {server_lr}")
        if not 0 <= server_momentum < 1:
            raise ConfigError(f"server_momentum must lie in [0, 1), got {server_momentum}")
        if prox_mu < 0:
            raise ConfigError(f"prox_mu must be >= 0, got {prox_mu}")
        if clients_per_round is not None and clients_per_round < 1:
            raise ConfigError(f"clients_per_round must be at least 1 (or null for all clients), got {clients_per_round}")
        if local_epochs < 1 or client_batch_size < 1:
            raise ConfigError(f"local_epochs and client_batch_size must be positive, got {local_epochs}, {client_batch_size}")
        if not 0 < client_lr_decay <= 1:
            raise ConfigError(f"client_lr_decay must lie in (0, 1], got {client_lr_decay}")
        self.automatic_optimization = False
        self.aggregator = aggregator
        self.server_lr = server_lr
        self.server_momentum = server_momentum
        self.prox_mu = prox_mu
        self.clients_per_round = clients_per_round
        self.local_epochs = local_epochs
        self.client_batch_size = client_batch_size
        self.client_lr_decay = client_lr_decay
        self.fixed_seed = seed
        self.net = net(tuple(input_shape), num_classes)
        self.shapes = {n: tuple(p.shape) for n, p in self.net.named_parameters()}
        names = list(self.shapes)
        self.layers = layer_groups(self.net)  # the architecture's layer groups (reported per round)
        self.groups = [names] if aggregator == "craft_global" else self.layers  # solved together
        offsets, start = {}, 0
        for n in names:
            offsets[n] = (start, start + math.prod(self.shapes[n]))
            start = offsets[n][1]
        self.offsets = offsets
        self.n_params = start
        # CRAFT's reference direction r (the previous aggregate), part of the checkpoint
        self.register_buffer("reference", torch.zeros(self.n_params))
        self._round: ClientRound | None = None
        self._worker: nn.Module | None = None

    # --- evaluation ---------------------------------------------------------------------------------------
    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def step(self, batch: Any, stage: Stage) -> StepOutput:
        if stage == "train":
            return self.federated_round(batch)
        x, y, client = batch
        logits = self.net(x)
        preds = logits.argmax(-1)
        return StepOutput(F.cross_entropy(logits, y), preds=preds, target=y,
                          inputs={"client_acc": (preds, y, client)})

    # --- one round ----------------------------------------------------------------------------------------
    def select_clients(self, rnd: int, n_clients: int) -> Tensor:
        """The round's participants, sorted: all clients, or ``clients_per_round`` drawn by ``(seed, round)``."""
        m = self.clients_per_round or n_clients
        if m > n_clients:
            raise ConfigError(f"clients_per_round={m} exceeds the {n_clients} clients of the data; lower it")
        if m == n_clients:
            return torch.arange(n_clients)
        gen = torch.Generator().manual_seed(round_seed(self.seed_or_run(self.fixed_seed), rnd))
        return torch.randperm(n_clients, generator=gen)[:m].sort().values

    def worker(self) -> nn.Module:
        """The network a client trains (a copy of ``net``, not a submodule: no checkpoint or DDP sees it)."""
        if self._worker is None:
            object.__setattr__(self, "_worker", copy.deepcopy(self.net))
        assert self._worker is not None
        return self._worker

    def local_train(self, theta: Tensor, x: Tensor, y: Tensor, rnd: int, client: int) -> tuple[Tensor, Tensor]:
        """Client ``client``'s local training in round ``rnd`` from ``theta``: ``(theta_i, mean local loss)``."""
        net = self.worker()
        params = list(net.parameters())
        with torch.no_grad():  # copy into the worker (vector_to_parameters would alias theta's storage)
            for p, (a, b) in zip(params, self.offsets.values()):
                p.copy_(theta[a:b].view_as(p))
        net.train()
        anchor = [p.detach().clone() for p in params] if self.aggregator == "fedprox" else []
        opt = self.optimizer_factory(params)
        for group in opt.param_groups:
            group["lr"] = group["lr"] * self.client_lr_decay**rnd
        gen = torch.Generator().manual_seed(round_seed(self.seed_or_run(self.fixed_seed), rnd, client))
        total = torch.zeros((), dtype=torch.float64, device=theta.device)
        count = 0
        for _ in range(self.local_epochs):
            for idx in torch.randperm(len(y), generator=gen).split(self.client_batch_size):
                idx = idx.to(x.device)
                loss = F.cross_entropy(net(x[idx]), y[idx])
                total += loss.detach().double() * len(idx)
                count += len(idx)
                if anchor:
                    loss = loss + 0.5 * self.prox_mu * sum(((p - a) ** 2).sum() for p, a in zip(params, anchor))
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
        return parameters_to_vector(params).detach(), total / count

    def _gather(self, local: Tensor, losses: Tensor, m: int, world: int) -> tuple[Tensor, Tensor]:
        """All-gather every rank's client rows and put them back in the round's client order."""
        k = math.ceil(m / world)
        pad = local.new_zeros(k, self.n_params + 1)
        pad[: len(local), : self.n_params] = local
        pad[: len(local), self.n_params] = losses.to(local.dtype)
        full = self.all_gather(pad)  # (world, k, P + 1); client j of the round sits at rank j % world, row j // world
        rows = torch.stack([full[j % world, j // world] for j in range(m)])
        return rows[:, : self.n_params], rows[:, self.n_params].double()

    def as_dict(self, flat: Tensor) -> dict[str, Tensor]:
        """A flat ``(..., P)`` tensor as ``{name: (..., *shape)}`` views."""
        lead = flat.shape[:-1]
        return {n: flat[..., a:b].reshape(*lead, *self.shapes[n]) for n, (a, b) in self.offsets.items()}

    def as_flat(self, parts: dict[str, Tensor]) -> Tensor:
        return torch.cat([parts[n].reshape(-1) for n in self.offsets])

    def aggregate(self, updates: Tensor, weights: Tensor) -> Tensor:
        """The round's direction ``g (P,)`` from the updates ``(m, P)`` and weights ``(m,)``."""
        if self.aggregator not in CRAFT_VARIANTS:
            return fedavg_direction(updates, weights)
        use_ref = self.aggregator != "craft_noref"
        reference = self.as_dict(self.reference) if use_ref else None
        g = self.as_flat(craft_aggregate(self.as_dict(updates), weights, reference, self.groups))
        self.reference.copy_(g)
        return g

    def federated_round(self, batch: tuple[Tensor, Tensor, Tensor]) -> StepOutput:
        x, y, offsets = batch
        rnd = self.trainer.global_step
        selected = self.select_clients(rnd, len(offsets) - 1)
        rank, world = self.trainer.global_rank, self.trainer.world_size
        theta = parameters_to_vector(self.net.parameters()).detach().clone()
        rows, losses = [], []
        for c in selected[rank::world].tolist():
            a, b = int(offsets[c]), int(offsets[c + 1])
            theta_c, loss_c = self.local_train(theta, x[a:b], y[a:b], rnd, c)
            rows.append(theta - theta_c)
            losses.append(loss_c)
        local = torch.stack(rows) if rows else theta.new_zeros(0, self.n_params)
        local_losses = torch.stack(losses) if losses else theta.new_zeros(0, dtype=torch.float64)
        if world > 1:
            updates, client_losses = self._gather(local, local_losses, len(selected), world)
        else:
            updates, client_losses = local, local_losses
        sizes = (offsets[1:] - offsets[:-1])[selected.to(offsets.device)].double()
        weights = (sizes / sizes.sum()).to(updates.device)
        g = self.aggregate(updates, weights)
        opt = self.optimizers()
        for p, part in zip(self.net.parameters(), self.as_dict(g).values()):
            p.grad = part.to(p.dtype).clone()
        opt.step()
        opt.zero_grad(set_to_none=True)
        moved = theta - parameters_to_vector(self.net.parameters()).detach()
        groups = [(self.group_name(gr), self.offsets[gr[0]][0], self.offsets[gr[-1]][1]) for gr in self.layers]
        self._round = ClientRound(rnd + 1, updates, weights, g, moved, groups)
        return StepOutput((client_losses * weights.double()).sum().float(), n=1)

    @staticmethod
    def group_name(group: list[str]) -> str:
        """A layer group's name: its first parameter's module (the groups' coordinates are contiguous)."""
        return group[0].rpartition(".")[0] or group[0]

    def client_round(self, batch: Any = None) -> ClientRound | None:
        """``modules.protocols.ClientUpdates``: the last round's updates and aggregate."""
        return self._round

    def configure_optimizers(self) -> torch.optim.Optimizer:
        """The *server* optimizer (manual optimisation): SGD at ``server_lr`` on ``g``, with momentum for FedAvgM.
        The configured ``optimizer`` is the clients' and is built in ``local_train``."""
        momentum = self.server_momentum if self.aggregator == "fedavgm" else 0.0
        return torch.optim.SGD(self.net.parameters(), lr=self.server_lr, momentum=momentum)
