"""CD scaling (paper 000-12): what a repeated ("derived") token is worth relative to a fresh one.

Compute-Data scaling keeps the Chinchilla law ``L = E + A / N^alpha + B / D^beta`` but counts effective data
``D_eff = U + U R* (1 - e^(-R / R*))`` for U unique tokens seen ``R + 1`` times, with a token-effectiveness that
depends on the model (``R* = c0 N^(-a) (U / N)^b``) instead of Muennighoff's constant R*. ``task.py`` trains one
grid point (``CDScalingLM``); ``laws.py`` fits the laws over the anchors and repeat sweeps and logs the result
(``python -m modules.cd_scaling fit-laws --anchors anchors --repeat repeat``). The fitters are the shared
``modules.components.scaling_laws``.
"""

from modules.cd_scaling.laws import LawsResult, ScalingRun, analyse, fit_laws
from modules.cd_scaling.task import CDScalingLM, cd_lm, non_embedding_params, warmup_cosine
from modules.components.scaling_laws import fit_chinchilla, fit_effectiveness

__all__ = [
    "CDScalingLM",
    "LawsResult",
    "ScalingRun",
    "analyse",
    "cd_lm",
    "fit_chinchilla",
    "fit_effectiveness",
    "fit_laws",
    "non_embedding_params",
    "warmup_cosine",
]
