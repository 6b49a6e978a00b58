"""CRAFT as a Flower server strategy (the optional ``.[flower]`` extra, ``flwr[simulation]==1.42``).

``CraftStrategy`` is Flower's message-based ``FedAvg`` (``flwr.serverapp.strategy``) whose
``aggregate_train`` replaces the weighted mean of the clients' models by this package's aggregators: it
keeps the global arrays it sent in ``configure_train``, forms ``g_i = theta - theta_i`` from every reply's
``ArrayRecord``, weights the clients by their ``num-examples`` (``weighted_by_key``), aggregates with
``craft_aggregate`` (layer groups from the state dict's names and shapes, ``default_groups``) or FedAvg,
and returns ``theta - server_lr * g``. CRAFT's reference direction is the previous round's ``g``. Only
floating-point arrays are aggregated; integer state (a BatchNorm's ``num_batches_tracked``) keeps the
global value.

``flwr`` is not a core dependency: it pulls in Ray (~300 MB) and pins older protobuf / rich / fastapi than
the rest of paperlab, so this module imports without it and ``CraftStrategy`` is only defined when it is
installed (``pip install -e '.[flower]'``); ``HAVE_FLOWER`` says which.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

import torch

from modules.craft.aggregation import craft_aggregate, fedavg_direction

try:  # flwr >= 1.21 (message API); 1.42 exposes the records from flwr.app
    try:
        from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
    except ImportError:  # pragma: no cover - older layouts
        from flwr.common import ArrayRecord, ConfigRecord, Message, MetricRecord
    from flwr.serverapp.strategy import FedAvg

    HAVE_FLOWER = True
except ImportError:  # pragma: no cover - exercised where flwr is absent
    HAVE_FLOWER = False


def flower_aggregate(
    global_state: dict[str, torch.Tensor],
    client_states: list[dict[str, torch.Tensor]],
    weights: torch.Tensor,
    aggregator: Literal["craft", "craft_global", "craft_noref", "fedavg"] = "craft",
    server_lr: float = 0.5,
    reference: dict[str, torch.Tensor] | None = None,
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """One server step on state dicts: ``(new global state, g)``; what ``CraftStrategy`` does with records.

    Independent of Flower so that it is tested everywhere; ``reference`` is the previous ``g`` (CRAFT).
    """
    keys = [k for k, v in global_state.items() if torch.is_floating_point(v)]
    updates = {k: torch.stack([global_state[k] - s[k].to(global_state[k].dtype) for s in client_states]) for k in keys}
    if aggregator == "fedavg":
        g = {k: fedavg_direction(u.reshape(len(client_states), -1), weights).reshape(u.shape[1:]) for k, u in updates.items()}
    else:
        groups = [keys] if aggregator == "craft_global" else None
        ref = None if aggregator == "craft_noref" or reference is None else {k: reference[k] for k in keys}
        g = craft_aggregate(updates, weights, ref, groups)
    new = {k: (global_state[k] - server_lr * g[k]) if k in g else global_state[k].clone() for k in global_state}
    return new, g


if HAVE_FLOWER:

    class CraftStrategy(FedAvg):
        """Flower ``FedAvg`` with CRAFT's (or FedAvg's) server step ``theta -= server_lr g``.

        Args:
            aggregator: ``craft`` (layer-wise), ``craft_global``, ``craft_noref`` or ``fedavg``.
            server_lr: the server step ``eta_s``.
            **kwargs: ``FedAvg``'s arguments (``fraction_train``, ``min_train_nodes``, ``weighted_by_key``...).
        """

        def __init__(self, aggregator: str = "craft", server_lr: float = 0.5, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            if aggregator not in ("craft", "craft_global", "craft_noref", "fedavg"):
                raise ValueError(f"aggregator must be craft, craft_global, craft_noref or fedavg, got {aggregator!r}")
            self.aggregator = aggregator
            self.server_lr = server_lr
            self.reference: dict[str, torch.Tensor] | None = None
            self._global: dict[str, torch.Tensor] | None = None

        def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Any) -> Iterable[Message]:
            self._global = arrays.to_torch_state_dict()
            return super().configure_train(server_round, arrays, config, grid)

        def aggregate_train(
            self, server_round: int, replies: Iterable[Message]
        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
            valid, _ = self._check_and_log_replies(replies, is_train=True)
            if not valid or self._global is None:
                return None, None
            contents = [msg.content for msg in valid]
            states = [content[self.arrayrecord_key].to_torch_state_dict() for content in contents]
            weights = torch.tensor(
                [float(next(iter(c.metric_records.values()))[self.weighted_by_key]) for c in contents], dtype=torch.float64
            )
            new, g = flower_aggregate(self._global, states, weights, self.aggregator, self.server_lr, self.reference)
            self.reference = g
            return ArrayRecord(new), self.train_metrics_aggr_fn(contents, self.weighted_by_key)
