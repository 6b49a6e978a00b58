"""MonoBarrier (paper 004-14): monotone neural barrier certificates for black-box monotone systems.

Setting: x+ = f(x, w) on a box X, w in a box W, f monotone in x and w (``datamodules.monotone_systems``);
X_0 = [init_lo, init_hi]; the unsafe set X_u = {x in X: exists i, x_i >= c_i} is upper-closed. A barrier
B: X -> R that is nondecreasing and satisfies

    (C1) B <= 0 on X_0,   (C2) B > 0 on X_u,   (C3) B(x) <= 0  =>  B(f(x, w)) <= 0 for every w in W

proves that no trajectory from X_0 ever reaches X_u (its zero-sublevel set S is an invariant lower set that
holds X_0 and misses X_u).

**Why corner checks are exact.** B and f are monotone, so on a box the extremes sit at corners:
(C1) holds iff B(init_hi) <= 0; (C2) holds iff B > 0 at the n minimal unsafe points (x_lo with x_i = c_i),
since every unsafe x dominates one of them; and for a cell C = [l, u] of a partition of X, if B(l) > 0 then
no point of C is in S (each dominates l), while if B(l) <= 0 then every x in C and w in W have
f(x, w) <= f(u, w_hi), so B(f(x, w)) <= B(f(u, w_hi)): one simulator query at the upper corner decides (C3)
on the whole cell. A partition whose cells all pass proves (C3) on X. Nothing here samples: the check is the
theorem applied to finitely many float64 values of B. Each inequality carries a slack of ``CHECK_TOL``
(1e-9, conservative: a cell with B(l) <= +tol is checked, a successor must have B <= -tol) so that the
rounding of B's float64 evaluation (a few ulps of |B|, below 1e-12 here) cannot flip a verdict.

**Max-Monotone Network.** B(x) = max(max_i s_i (z_i - t_i), max_k g_k(z)), z = (x - x_lo) / (x_hi - x_lo):
the n *axis branches* (s_i > 0) have the unsafe set's own form (X_u is the zero-superlevel set of
max_i (x_i - c_i)), and K learned branches g_k, each monotone: ``pos_mlp`` (nonnegative weights through
softplus, tanh, nonnegative read-out: a branch is a soft AND of steps, the max an OR) or ``minmax`` (Sill's min over H affine maps with nonnegative slopes;
the max over groups of such mins approximates every monotone function). A max of monotone functions is
monotone. Why the axis branches: a ReLU unit with nonnegative weights that is positive at a minimal unsafe
point e_i but negative on the diagonal near the fixed point serves essentially one coordinate, so K learned
branches alone need Omega(n) hidden units to separate the n minimal unsafe points from the invariant core.

**Train and refine** (``BarrierSearch``; the task runs it under Lightning, ``certify`` in a plain loop).
Each round trains B for some steps on the hinge losses
    relu(B(init_hi) + m) + mean_i relu(m - B(p_i)) + mean_C relu(B(y_C) + m) sigma(-B(l_C) / tau)
over the queried leaf cells C (y_C = f(u_C, w_hi)), then rebuilds the partition from X with B fixed: a cell
with B(l) > 0 is excluded, otherwise its upper corner is queried (once: successors are cached by state) and
a violating cell is split along a coordinate i whose upper face leaves S (B(l + (u_i - l_i) e_i) > 0), the
lowest such index, at the first point where B turns positive along that axis (found on nested grids of B's
values to 1e-12 of the side, no query). The upper child's lower corner is then outside S, so it is excluded for free, and the
lower child's upper corner moves onto the boundary. A split that would not move the corner (no such
coordinate) cannot help: the upper child of any split keeps u and hence the violation, so the cell waits for
B to change (the next round). Each rebuild cuts every coordinate at most once along its chain of lower
children: at most n + 1 queries per round (the O(n) of the paper, here by construction of the partition;
``bisect_depth`` > 0 adds plain longest-side bisections for non-box sublevel sets, at a price in queries).
Monotonicity also answers queries from earlier ones (``BarrierSearch.implied``): a cell whose upper corner
dominates a queried state with a violating successor violates, one dominated by a queried state with a
passing successor passes; so a later round pays only for the corners that moved.
"""
from modules.mono_barrier.analysis import fit_loglog, slope_analysis
from modules.mono_barrier.nets import MaxMonotoneNet
from modules.mono_barrier.search import (
                                         CHECK_TOL,
                                         BarrierCertificate,
                                         BarrierSearch,
                                         MonotoneSystemLike,
                                         cells_tile,
                                         certify,
                                         verify,
)
from modules.mono_barrier.task import MonotoneBarrierModule

__all__ = ["CHECK_TOL", "BarrierCertificate", "BarrierSearch", "MaxMonotoneNet", "MonotoneBarrierModule",
           "MonotoneSystemLike", "cells_tile", "certify", "fit_loglog", "slope_analysis", "verify"]
