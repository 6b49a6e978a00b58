"""Client conflict (paper 000-04, CRAFT): how many clients does the server's update work against?

After every federated round the server moved along an aggregate ``g``; client ``i`` wanted ``g_i``. The
client is *in conflict* when ``cos(g, g_i) < 0``: to first order the round increased that client's loss
(its update is a descent direction of its local objective). Logged as ``diag/client_conflict/<key>``:

- ``rate``: the share of the round's clients with ``cos(g, g_i) < 0`` over the whole model, and ``min_cos``
  the smallest of those cosines;
- ``layer_rate``: the share of (client, layer group) pairs with ``cos(g_q, g_iq) < 0``, ``layer_min_cos``
  their minimum, and per group ``layer/<name>/rate``;
- ``step_rate``: ``rate`` for the move the server actually made (with FedAvgM's momentum it differs from
  ``g``);
- ``rate_avg``, ``layer_rate_avg``: running means of ``rate`` and ``layer_rate`` over the measured rounds
  (what a run's summary reports: the MLflow table shows a metric's last value);
- ``agg_norm``: ``|g|``.

CRAFT's layer-wise constraints ``U_q g_q = w`` make every per-layer cosine ``w_i / |g_q| > 0`` when they
are feasible (``m <= d_q`` and full row rank), so its rates are 0 by construction; FedAvg's are not.
Clients (or layers) with a zero update are left out of the shares. Under DDP every rank holds the same
gathered updates, so nothing is reduced.
"""

from __future__ import annotations

from typing import Any, Literal

import lightning as L
import torch
from torch import Tensor

from callbacks.diagnostic import Diagnostic, Moment, Schedule
from modules.protocols import ClientUpdates
from tracking.figures import new_figure


def cosines(updates: Tensor, direction: Tensor) -> Tensor:
    """``cos(direction, updates[i])`` for every row (NaN where a row or the direction is zero), float64."""
    u, g = updates.double(), direction.double()
    denom = u.norm(dim=1) * g.norm()
    cos = (u @ g) / denom
    return torch.where(denom > 0, cos, torch.full_like(cos, float("nan")))


def conflict_share(cos: Tensor) -> tuple[float, float, int]:
    """``(share of cos < 0, min cos, count)`` over the defined (non-NaN) cosines."""
    ok = cos[~torch.isnan(cos)]
    if ok.numel() == 0:
        return float("nan"), float("nan"), 0
    return float((ok < 0).double().mean()), float(ok.min()), int(ok.numel())


class ClientConflict(Diagnostic):
    """Share of clients whose update the round's aggregate opposes (model-wide and per layer group).

    Args:
        schedule: when to measure (default: after every round).
        per_layer: also log ``layer/<name>/rate`` for every layer group.
        if_unsupported, plot, max_history: see ``Diagnostic``.
    """
    name = "client_conflict"
    requires = (ClientUpdates,)

    def __init__(
        self,
        schedule: Schedule = Schedule(at_fit_start=False, every_n_steps=1),
        per_layer: bool = True,
        if_unsupported: Literal["error", "skip"] = "error",
        plot: bool = True,
        max_history: int = 10_000,
    ) -> None:
        super().__init__(schedule, if_unsupported, plot, max_history)
        self.per_layer = per_layer
        self.totals = {"rate": 0.0, "layer_rate": 0.0, "n": 0.0}

    def measure(self, trainer: L.Trainer, pl_module: L.LightningModule, moment: Moment) -> dict[str, Any] | None:
        record = pl_module.client_round(moment.batch)  # type: ignore[attr-defined]
        if record is None or record.round != moment.step:
            return None  # no round yet, or not the round that produced this step
        rate, min_cos, _ = conflict_share(cosines(record.updates, record.aggregate))
        step_rate, _, _ = conflict_share(cosines(record.updates, record.step))
        out: dict[str, Any] = {"rate": rate, "min_cos": min_cos, "step_rate": step_rate,
                               "agg_norm": float(record.aggregate.double().norm())}
        layer_cos = []
        for name, a, b in record.groups:
            cos = cosines(record.updates[:, a:b], record.aggregate[a:b])
            layer_cos.append(cos)
            if self.per_layer:
                out[f"layer/{name}/rate"] = conflict_share(cos)[0]
        if layer_cos:
            out["layer_rate"], out["layer_min_cos"], _ = conflict_share(torch.cat(layer_cos))
        return out

    def finalize(self, stats: dict[str, Any]) -> dict[str, float]:
        values = {k: float(v) for k, v in stats.items()}
        if values["rate"] == values["rate"]:  # not NaN
            self.totals["n"] += 1
            self.totals["rate"] += values["rate"]
            self.totals["layer_rate"] += values.get("layer_rate", 0.0)
        if self.totals["n"]:
            values["rate_avg"] = self.totals["rate"] / self.totals["n"]
            values["layer_rate_avg"] = self.totals["layer_rate"] / self.totals["n"]
        return values

    def extra_state(self) -> dict[str, Any]:
        return {"totals": dict(self.totals)}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        self.totals = dict(state.get("totals", self.totals))

    def figure(self) -> Any | None:

        steps = [h["step"] for h in self.history]
        fig, ax = new_figure(figsize=(6, 3.5))
        for key, label in (("rate", "model"), ("layer_rate", "(client, layer) pairs"), ("step_rate", "server step")):
            ax.plot(steps, [h.get(key, float("nan")) for h in self.history], label=label)
        ax.set_xlabel("round")
        ax.set_ylabel("share with cos(g, g_i) < 0")
        ax.set_ylim(-0.02, 1.02)
        ax.legend()
        ax.set_title("client conflict")
        fig.tight_layout()
        return fig
