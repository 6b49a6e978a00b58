"""CRAFT (paper 000-04): conflict-resolved, closed-form, layer-wise server aggregation for non-IID federated
learning (Wang, Liu, Thuerey, arXiv 2605.21317).

- ``craft_direction``, ``craft_aggregate``, ``fedavg_direction``, ``layer_groups``: the aggregation maths
  (``modules/craft/aggregation.py``);
- ``FederatedClassifier``: the federated training task, one Lightning step per round (``task.py``);
- ``CraftStrategy``: the same aggregation as a Flower strategy, when ``flwr`` is installed (``flower.py``,
  the ``.[flower]`` extra).
"""

from modules.craft.aggregation import (
    craft_aggregate,
    craft_direction,
    default_groups,
    fedavg_direction,
    layer_groups,
)
from modules.craft.task import ClientAccuracy, FederatedClassifier

__all__ = [
    "ClientAccuracy",
    "FederatedClassifier",
    "craft_aggregate",
    "craft_direction",
    "default_groups",
    "fedavg_direction",
    "layer_groups",
]
