"""ResidualCAN / Cauchy co-design (paper 000-02): Cauchy activations, robust residual losses and a dense
local-basis residual for low-dimensional scientific learning (PINNs and score learning).

PINN (``CauchyPINN``). A task network ``u`` (``net``) is trained on fresh collocation points ``x ~ U[-1, 1]``
every step to minimise

    L = mean_i rho(r(x_i)) + w_bc * mean_b (u(x_b) - g_b)^2,

with ``r`` the PDE residual and ``rho`` an L2, L1, Huber or Cauchy penalty
(``rho_c(r) = (c^2/2) log(1 + (r/c)^2)``, ``modules.components.pde``). PDEs (all with closed-form ``u*``):

- ``allen_cahn``: ``eps^2 u'' + u - u^3 = 0``, ``u(+-1) = tanh(+-1/(sqrt 2 eps))``, ``u* = tanh(x/(sqrt 2 eps))``;
- ``poisson``: ``u'' = f``, ``u* = sin(pi x) + 0.25 sin(4 pi x)`` (a boundary check away from layers);
- ``burgers``: steady viscous ``eps u'' - u u' = 0``, ``u* = -tanh(x / (2 eps))``.

Networks (``net``, a class path with its ``init_args``, without the sizes): ``ResidualCAN``
(``u = MLP_CauchyAct(x) + s sum_j softmax(a)_j (b1_j (x - c_j) + b2_j) / ((x - c_j)^2 + d_j^2)``, 32
grid-initialised centres, ``s = 0.1`` at init; ``basis`` swaps the Cauchy nodes for Gaussian bumps or removes
them, ``activation`` swaps the main path's CauchyAct), ``MLP`` (any ``activation``), ``RBFKAN``
(``modules.components.local_basis``), and this method's baselines ``SirenNet`` (sine layers, first-layer
frequency ``w0``) and ``FourierFeatureNet`` (random Fourier features of scale ``sigma`` into an MLP)
(``modules.residual_can.nets``).

Score learning (``CauchyScoreNet``). The OU process ``dx = -x dt + sqrt(2) dW`` carries a Gaussian mixture
``p_0`` to ``p_t``; a network ``s(x, t)`` learns ``grad log p_t`` with

- ``dsm``: denoising score matching, ``E ||sigma_t s(x_t, t) + z||^2``, ``x_t = e^{-t} x_0 + sigma_t z``,
  ``sigma_t^2 = 1 - e^{-2t}`` (weight ``lambda(t) = sigma_t^2``);
- ``fp_pde``: the score Fokker-Planck residual ``d_t s - grad_x(div s + |s|^2 + x . s)`` (zero for the exact
  score, ``score_fp_residual``) at ``(x_t, t)`` plus the initial condition ``|s(x_0, 0) - grad log p_0(x_0)|^2``.

Files: ``functional.py`` (``allen_cahn_residual(u, x, eps)``, ``score_fp_residual(score, x, t)``), ``nets.py``
(the SIREN and Fourier-feature baselines), ``tasks.py`` (the two tasks), ``figures.py`` (the PINN's test figure).
"""

from modules.residual_can.figures import solution_figure
from modules.residual_can.functional import allen_cahn_residual, score_fp_residual
from modules.residual_can.nets import FourierFeatureNet, SirenNet
from modules.residual_can.tasks import CauchyPINN, CauchyScoreNet

__all__ = [
    "CauchyPINN",
    "CauchyScoreNet",
    "FourierFeatureNet",
    "SirenNet",
    "allen_cahn_residual",
    "score_fp_residual",
    "solution_figure",
]
