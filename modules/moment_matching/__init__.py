"""Exact Gaussian moment matching through feedforward and residual layers (paper 002-06).

``functional``: the closed forms (``activation_moments``, ``residual_layer_moments``, ``bvn_cdf``); ``nets``: random
residual nets and the propagation methods (exact, linearize, diag, unscented) with their Monte Carlo reference;
``study``: ``MomentPropagationStudy``; ``vbnn``: ``DeterministicVBNN``.
"""

from modules.moment_matching.functional import (
    ACTIVATIONS,
    activation_mean_var,
    activation_moments,
    bvn_cdf,
    residual_layer_moments,
)
from modules.moment_matching.nets import METHODS, ResidualNet, mc_moments, propagate
from modules.moment_matching.study import MomentPropagationStudy
from modules.moment_matching.vbnn import DeterministicVBNN

__all__ = [
    "ACTIVATIONS", "METHODS", "DeterministicVBNN", "MomentPropagationStudy", "ResidualNet", "activation_mean_var", "activation_moments",
    "bvn_cdf", "mc_moments", "propagate", "residual_layer_moments",
]
