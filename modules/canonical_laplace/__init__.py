"""gamma-canonical empirical-Bayes Laplace for ReLU networks (paper 004-10): the canonical representative of a
ReLU scale orbit, the full-GGN Laplace evidence, and the tasks that compare standard and canonical EB-Laplace over
function-preserving rescalings (``functional.py``: the maths; ``task.py``: the LightningModules)."""

from modules.canonical_laplace.functional import (
    LaplaceFit,
    gamma_canonicalize,
    ggn,
    jacobians,
    laplace_log_evidence,
    log_scale_vector,
)
from modules.canonical_laplace.task import ReLUMLPClassifier, ReLUMLPRegressor

__all__ = [
    "LaplaceFit",
    "ReLUMLPClassifier",
    "ReLUMLPRegressor",
    "gamma_canonicalize",
    "ggn",
    "jacobians",
    "laplace_log_evidence",
    "log_scale_vector",
]
