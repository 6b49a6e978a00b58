"""Per-sample gradient statistics: the estimator behind ``callbacks.gradient_variance``.

``stats`` holds the additive sufficient statistics (they sum across ranks), ``per_sample`` the reference
(``torch.func`` vmap) and micro-batch-loop implementations, ``hooks`` the fast path for linear layers,
embeddings and norms, and ``estimator`` the automatic choice between them.
"""

from modules.components.grad_variance.estimator import (
    GradientVarianceEstimator,
    estimate_gradient_variance,
    per_sample_gradients,
)
from modules.components.grad_variance.stats import GradStats, PerSampleGrads, estimates, finalize

__all__ = [
    "GradStats",
    "GradientVarianceEstimator",
    "PerSampleGrads",
    "estimate_gradient_variance",
    "estimates",
    "finalize",
    "per_sample_gradients",
]
