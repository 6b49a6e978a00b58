"""Attention hypernetwork for INRs that unrolls the INR's optimisation steps in token space (paper 004-01).

A hypernetwork reads an image and outputs the weights ``theta = {(W_l, b_l)}`` of a small coordinate MLP
(the INR) ``f_theta(gamma(x))``, with ``gamma`` random Fourier features, so that ``f_theta`` renders the
image, in one forward pass (no test-time optimisation). The paper's point: an optimisation-oriented
hypernetwork should mirror the chain rule of one gradient step on the INR, and doing so with attention over
*output-neuron tokens* costs a number of parameters independent of the INR's width W, where the MLP
instantiation (an MLP from ``flatten(W_l, G_l)`` to ``Delta W_l``) costs O(W^4).

The room:

- ``functional``: ``inr_chain_rule_step`` (one gradient step on a batch of INRs, by the chain rule),
  ``mlp_opt_parameter_count``, ``psnr``, ``mean_colour_psnr``, ``step_weights``;
- ``hyper_inr_net``: ``HyperINRNet``, what the three hypernetworks share (the INR, its rendering, the input
  checks), ``PatchTokens`` (data tokens) and ``center_tokens``;
- ``attn_opt``: ``AttnOptHyperINR`` (ours, the wiring inferred: output-neuron tokens, a K-step rollout of
  five shared cross-attentions, a bilinear readout);
- ``trans_inr``: ``TransINRBaseline`` (Chen & Wang 2022: one pass of self-attention over data and column
  tokens);
- ``mlp_opt``: ``MLPOptStepBaseline`` (K true chain-rule steps whose update is an MLP of ``(W_l, G_l)``);
- ``task``: ``HyperINRTask``, which builds any of them as a task network ``net(input_shape, out_dim)`` from
  the data's image shape and trains it on image batches ``(images (B, C, H, W),)``, logging the PSNR of the
  last step and of every rollout step.
"""

from modules.attn_hyper_inr.attn_opt import AttnOptHyperINR
from modules.attn_hyper_inr.functional import (
    INRParams,
    inr_chain_rule_step,
    mean_colour_psnr,
    mlp_opt_parameter_count,
    psnr,
    step_weights,
)
from modules.attn_hyper_inr.hyper_inr_net import HyperINRNet, PatchTokens
from modules.attn_hyper_inr.mlp_opt import MLP_OPT_MAX_WIDTH, MLPOptStepBaseline
from modules.attn_hyper_inr.task import PAPER_ID, HyperINRFactory, HyperINRTask
from modules.attn_hyper_inr.trans_inr import TransINRBaseline
from modules.components.metrics import count_parameters

__all__ = [
    "MLP_OPT_MAX_WIDTH",
    "PAPER_ID",
    "AttnOptHyperINR",
    "HyperINRFactory",
    "HyperINRNet",
    "HyperINRTask",
    "INRParams",
    "MLPOptStepBaseline",
    "PatchTokens",
    "TransINRBaseline",
    "count_parameters",
    "inr_chain_rule_step",
    "mean_colour_psnr",
    "mlp_opt_parameter_count",
    "psnr",
    "step_weights",
]
