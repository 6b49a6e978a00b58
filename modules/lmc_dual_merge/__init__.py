"""LMC-DM (paper 004-03): dual learning of function-preserving transforms for linear mode connectivity.

``symmetries``: the exact transforms of a TinyGPT and weight matching; ``task``: the endpoint trainer and the
aligner (see their docstrings).
"""

from modules.lmc_dual_merge.symmetries import apply_transforms, fold_norms, transform_state_dict, weight_matching
from modules.lmc_dual_merge.task import DualLMCAligner, EndpointTransform, LMCEndpoint, harden, sinkhorn

__all__ = [
    "DualLMCAligner",
    "EndpointTransform",
    "LMCEndpoint",
    "apply_transforms",
    "fold_norms",
    "harden",
    "sinkhorn",
    "transform_state_dict",
    "weight_matching",
]
