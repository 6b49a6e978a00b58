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

from __future__ import annotations

import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np
import torch
import torch.nn.functional as F
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor, nn

from errors import ConfigError
from modules.base import PaperTask, Stage, StepOutput, WeightedMean

CHECK_TOL = 1e-9
GRID = 33  # points per level of the crossing search
LEVELS = 8  # 32^-8 ~ 1e-12 of the side


@runtime_checkable
class MonotoneSystemLike(Protocol):
    """What certification needs of a system (``datamodules.monotone_systems.MonotoneSystem`` has it)."""

    x_lo: Tensor
    x_hi: Tensor
    w_lo: Tensor
    w_hi: Tensor
    init_lo: Tensor
    init_hi: Tensor
    unsafe_at: Tensor

    def step(self, x: Tensor, w: Tensor) -> Tensor: ...

    def minimal_unsafe_points(self) -> Tensor: ...

    def worst_case_trajectory(self, steps: int) -> Tensor: ...


# --- the network ------------------------------------------------------------------------------------------------
class MaxMonotoneNet(nn.Module):
    """B(x) = max(axis branches, K learned monotone branches), float64, nondecreasing in every coordinate.

    Args:
        state_dim: n.
        n_branches: K learned branches.
        hidden: units per ``pos_mlp`` branch, affine maps per ``minmax`` group.
        branch: ``pos_mlp`` or ``minmax`` (module docstring).
        axis: include the n axis branches s_i (z_i - t_i).
    """

    def __init__(self, state_dim: int, n_branches: int = 8, hidden: int = 32,
                 branch: Literal["pos_mlp", "minmax"] = "pos_mlp", axis: bool = True, seed: int = 0) -> None:
        super().__init__()
        if state_dim < 1 or n_branches < 0 or hidden < 1:
            raise ConfigError(f"need state_dim >= 1, n_branches >= 0, hidden >= 1; got {state_dim}, {n_branches}, {hidden}")
        if n_branches == 0 and not axis:
            raise ConfigError("a MaxMonotoneNet needs a branch: n_branches >= 1 or axis: true")
        self.state_dim, self.n_branches, self.hidden, self.branch, self.axis = state_dim, n_branches, hidden, branch, axis
        gen = torch.Generator().manual_seed(seed)
        dd = dict(dtype=torch.float64)
        self.register_buffer("lo", torch.zeros(state_dim, **dd))
        self.register_buffer("width", torch.ones(state_dim, **dd))
        k, h, n = n_branches, hidden, state_dim
        # raw weights through softplus: nonnegative whatever the optimiser does; the 1/n keeps pre-activations
        # O(1). Each unit (affine map) starts leaning on one random coordinate (softplus(2) against softplus(-4)):
        # a min of such maps is a corner, the shape a staircase is made of; a dense start sits in a smooth
        # diagonal optimum (measured: 95 % on the staircase test against 100 %)
        w = torch.full((k, h, n), -4.0, **dd)
        w.scatter_(2, torch.randint(n, (k, h, 1), generator=gen), 2.0)
        self.w_raw = nn.Parameter(w)
        self.c = nn.Parameter(-torch.rand(k, h, generator=gen, **dd) * F.softplus(torch.tensor(2.0)).item() / n)
        self.v_raw = nn.Parameter(torch.zeros(k, h, **dd))
        self.d = nn.Parameter(torch.full((k,), -2.0, **dd))  # learned branches start below the axis branches
        self.axis_scale_raw = nn.Parameter(torch.full((n,), math.log(math.e - 1), **dd))  # softplus -> 1
        self.axis_t = nn.Parameter(torch.full((n,), 0.5, **dd))

    def set_box(self, lo: Tensor, hi: Tensor) -> None:
        """Normalise inputs to the state box X (a positive affine map: monotonicity is kept)."""
        self.lo.copy_(lo.to(torch.float64))
        self.width.copy_((hi - lo).to(torch.float64))

    def set_axis_thresholds(self, t: Tensor) -> None:
        """Axis thresholds t (n,) in normalised coordinates (where each axis branch crosses 0)."""
        with torch.no_grad():
            self.axis_t.copy_(t.to(torch.float64))

    def branches(self, x: Tensor) -> Tensor:
        """(N, n + K) every branch's value (axis branches first when present)."""
        z = (x.to(torch.float64) - self.lo) / self.width
        parts = []
        if self.axis:
            parts.append(F.softplus(self.axis_scale_raw) * (z - self.axis_t))
        if self.n_branches:
            w = F.softplus(self.w_raw) / self.state_dim
            pre = torch.einsum("khn,bn->bkh", w, z) + self.c
            if self.branch == "pos_mlp":
                # a bounded activation: with ReLU every branch would be convex, the max of them too, and its
                # sublevel set convex, which no staircase is
                v = F.softplus(self.v_raw)
                parts.append((torch.tanh(8.0 * pre) * v).sum(-1) + self.d)
            else:
                parts.append(pre.min(-1).values + self.d)
        return torch.cat(parts, 1)

    def forward(self, x: Tensor) -> Tensor:
        """B(x): (N, n) -> (N,)."""
        return self.branches(x).max(1).values


# --- partitions, checks ---------------------------------------------------------------------------------------
@dataclass
class BarrierCertificate:
    """What ``certify`` returns. If ``certified``: ``barrier`` is monotone, B(init_hi) <= 0, B > 0 at the minimal
    unsafe points, the cells ``[cells_lo, cells_hi]`` (C, n) tile X, and every cell with B(cells_lo) <= 0 has
    B(f(cells_hi, w_hi)) <= 0. ``queries``: states passed to ``system.step``."""

    certified: bool
    barrier: nn.Module
    cells_lo: Tensor
    cells_hi: Tensor
    queries: int
    rounds: int = 0
    violations: int = 0
    seconds: float = 0.0


@torch.no_grad()
def _value(barrier: nn.Module, x: Tensor) -> Tensor:
    return barrier(x.to(torch.float64))


def verify(system: MonotoneSystemLike, barrier: nn.Module, cells_lo: Tensor, cells_hi: Tensor) -> dict[str, float]:
    """The exact check of (C1)-(C3) on a partition (module docstring), with its own queries of ``system.step``
    (one per cell with B(l) <= tol). Returns {certified, violations, cells, checked, init_ok, unsafe_ok}."""
    b_init = float(_value(barrier, system.init_hi[None])[0])
    p = system.minimal_unsafe_points()
    b_unsafe = _value(barrier, p) if len(p) else torch.ones(1, dtype=torch.float64)
    meets = _value(barrier, cells_lo) <= CHECK_TOL
    checked = int(meets.sum())
    bad = 0
    if checked:
        up = cells_hi[meets]
        succ = system.step(up, system.w_hi.expand(len(up), -1))
        bad = int((_value(barrier, succ) > -CHECK_TOL).sum())
    init_ok, unsafe_ok = b_init <= -CHECK_TOL, bool((b_unsafe > CHECK_TOL).all())
    violations = bad + (not init_ok) + int((b_unsafe <= CHECK_TOL).sum())
    return {"certified": float(violations == 0), "violations": float(violations), "cells": float(len(cells_lo)),
            "checked": float(checked), "init_ok": float(init_ok), "unsafe_ok": float(unsafe_ok)}


def cells_tile(cells_lo: Tensor, cells_hi: Tensor, x_lo: Tensor, x_hi: Tensor) -> bool:
    """Whether the boxes tile X: inside X, pairwise disjoint interiors, and volumes summing to X's (exact up to
    float64 rounding of the volume sum). O(C^2 n): for tests and ``test`` runs, not the search."""
    if not bool(((cells_lo >= x_lo) & (cells_hi <= x_hi) & (cells_lo < cells_hi)).all()):
        return False
    width = x_hi - x_lo
    vol = ((cells_hi - cells_lo) / width).prod(1)
    if abs(float(vol.sum()) - 1.0) > 1e-9:
        return False
    for a in range(len(cells_lo)):
        overlap = (torch.minimum(cells_hi[a], cells_hi[a + 1:]) > torch.maximum(cells_lo[a], cells_lo[a + 1:])).all(1)
        if bool(overlap.any()):
            return False
    return True


class BarrierSearch:
    """The train-and-refine state of one certification (module docstring): the barrier, the query cache, the
    queried leaf cells (training data) and the current partition.

    Args:
        system: a ``MonotoneSystemLike``.
        barrier: a ``MaxMonotoneNet`` (its box and axis thresholds are set here).
        margin: m of the hinge losses.
        tau: the temperature of sigma(-B(l) / tau).
        max_queries: the query budget (None: 10 n); a rebuild stops querying at the budget.
        bisect_depth: plain longest-side bisections allowed per cell when no coordinate can be cut.
    """

    def __init__(self, system: MonotoneSystemLike, barrier: MaxMonotoneNet, margin: float = 1e-2, tau: float = 0.05,
                 max_queries: int | None = None, bisect_depth: int = 0) -> None:
        if not isinstance(system, MonotoneSystemLike):
            raise ConfigError(f"{type(system).__name__} is not a monotone system (datamodules.monotone_systems)")
        if barrier.state_dim != len(system.x_lo):
            raise ConfigError(f"the barrier has state_dim {barrier.state_dim}, the system n = {len(system.x_lo)}")
        if margin <= 0 or tau <= 0:
            raise ConfigError(f"margin and tau must be > 0, got {margin}, {tau}")
        self.system, self.barrier, self.margin, self.tau = system, barrier, margin, tau
        n = len(system.x_lo)
        self.max_queries = 10 * n if max_queries is None else int(max_queries)
        self.bisect_depth = bisect_depth
        barrier.set_box(system.x_lo, system.x_hi)
        # axis branches start halfway between X_0 and the unsafe face: C1 and C2 hold from the start
        width = system.x_hi - system.x_lo
        z0 = (system.init_hi - system.x_lo) / width
        zu = ((system.unsafe_at - system.x_lo) / width).clamp(max=2.0)
        barrier.set_axis_thresholds(0.5 * (z0 + zu))
        self.unsafe_points = system.minimal_unsafe_points()
        self.cache: dict[bytes, Tensor] = {}
        self.queries = 0
        # every queried state, its successor f(u, w_hi) and B there (refreshed each rebuild), for ``implied``
        self.q_states = torch.zeros(0, n, dtype=torch.float64)
        self.q_succ = torch.zeros(0, n, dtype=torch.float64)
        self.q_value = torch.zeros(0, dtype=torch.float64)
        self.data_lo = torch.zeros(0, n, dtype=torch.float64)
        self.data_succ = torch.zeros(0, n, dtype=torch.float64)
        self.cells_lo = system.x_lo[None].clone()
        self.cells_hi = system.x_hi[None].clone()
        self.rounds = 0
        self.violations = -1
        self.certified = False
        self.history: list[dict[str, float]] = []

    # --- the loss ---------------------------------------------------------------------------------------------
    def loss(self) -> Tensor:
        b = self.barrier
        m = self.margin
        loss = F.relu(b(self.system.init_hi[None]) + m).sum()
        if len(self.unsafe_points):
            loss = loss + F.relu(m - b(self.unsafe_points)).mean()
        if len(self.data_lo):
            gate = torch.sigmoid(-b(self.data_lo) / self.tau)
            loss = loss + (F.relu(b(self.data_succ) + m) * gate).mean()
        return loss

    # --- queries ----------------------------------------------------------------------------------------------
    def successor(self, u: Tensor) -> Tensor:
        """f(u, w_hi), cached: a state is queried (counted) once."""
        key = u.numpy().tobytes()
        hit = self.cache.get(key)
        if hit is None:
            hit = self.system.step(u[None], self.system.w_hi[None])[0]
            self.cache[key] = hit
            self.queries += 1
            self.q_states = torch.cat([self.q_states, u[None]])
            self.q_succ = torch.cat([self.q_succ, hit[None]])
            self.q_value = torch.cat([self.q_value, _value(self.barrier, hit[None])])
        return hit

    def implied(self, u: Tensor) -> tuple[bool, Tensor] | None:
        """The verdict on f(u, w_hi) that monotonicity gives from earlier queries, without a query: a queried
        u' <= u whose successor violates (B(f(u')) > -tol, and f(u) >= f(u')) means u fails; a queried u' >= u
        whose successor passes (B(f(u')) <= -tol, and f(u) <= f(u')) means u passes. Returns (passes, the
        successor bound f(u')) or None."""
        if not len(self.q_states):
            return None
        bad = (self.q_value > -CHECK_TOL) & (self.q_states <= u).all(1)
        if bool(bad.any()):
            return False, self.q_succ[int(bad.nonzero()[0])]
        good = (self.q_value <= -CHECK_TOL) & (self.q_states >= u).all(1)
        if bool(good.any()):
            return True, self.q_succ[int(good.nonzero()[0])]
        return None

    # --- refinement -------------------------------------------------------------------------------------------
    def _crossing(self, l: Tensor, u: Tensor, i: int) -> float:
        """The first point s in (l_i, u_i] where B(l + (s - l_i) e_i) > tol, to 1e-12 of the side (grid levels)."""
        a, b = float(l[i]), float(u[i])
        for _ in range(LEVELS):
            s = torch.linspace(a, b, GRID, dtype=torch.float64)
            pts = l[None].repeat(GRID, 1)
            pts[:, i] = s
            pos = (_value(self.barrier, pts) > CHECK_TOL).nonzero()
            k = int(pos[0]) if len(pos) else GRID - 1
            if k == 0:
                return a
            a, b = float(s[k - 1]), float(s[k])
        return b

    def _split(self, l: Tensor, u: Tensor) -> tuple[int, float] | None:
        """The lowest coordinate i whose upper face leaves S and whose crossing moves u_i (by more than 1e-9 of
        X's side: a crossing found again on a cut face is no progress), with that crossing; or None. A fixed
        order keeps the chains of successive rounds aligned, so ``implied`` answers most of a rebuild."""
        n = len(l)
        side = self.system.x_hi - self.system.x_lo
        # the face point just below u_i: outside S there means the crossing moves u_i (one batched call)
        faces = l[None].repeat(n, 1)
        faces[torch.arange(n), torch.arange(n)] = torch.maximum(l, u - 1e-8 * side)
        out = (_value(self.barrier, faces) > CHECK_TOL).nonzero().flatten().tolist()
        for i in out:
            s = self._crossing(l, u, i)
            if float(l[i]) < s < float(u[i]) - 1e-9 * float(side[i]):
                return i, s
        return None

    @torch.no_grad()
    def refine(self) -> dict[str, float]:
        """Check C1 and C2, then rebuild the partition from X with B fixed; returns this round's record."""
        self.rounds += 1
        start_queries = self.queries
        sys_ = self.system
        b_init = float(_value(self.barrier, sys_.init_hi[None])[0])
        b_unsafe = _value(self.barrier, self.unsafe_points)
        pre = int(b_init > -CHECK_TOL) + int((b_unsafe <= CHECK_TOL).sum())
        leaves_lo, leaves_hi, new_lo, new_succ = [], [], [], []
        violating = 0
        if len(self.q_succ):
            self.q_value = _value(self.barrier, self.q_succ)
        if pre == 0:  # a rebuild costs queries: only worth it once C1 and C2 hold
            queue: list[tuple[Tensor, Tensor, int]] = [(sys_.x_lo.clone(), sys_.x_hi.clone(), 0)]
            while queue:
                l, u, depth = queue.pop()
                if float(_value(self.barrier, l[None])[0]) > CHECK_TOL:
                    leaves_lo.append(l), leaves_hi.append(u)
                    continue
                known = self.implied(u)
                if known is None and self.queries >= self.max_queries:
                    leaves_lo.append(l), leaves_hi.append(u)
                    violating += 1  # unchecked counts as violating
                    continue
                if known is None:
                    y = self.successor(u)
                    passes = float(_value(self.barrier, y[None])[0]) <= -CHECK_TOL
                else:
                    passes, y = known
                if passes:
                    leaves_lo.append(l), leaves_hi.append(u)
                    new_lo.append(l), new_succ.append(y)
                    continue
                split = self._split(l, u)
                if split is None and depth < self.bisect_depth:
                    rel = (u - l) / (sys_.x_hi - sys_.x_lo)
                    i = int(rel.argmax())
                    split = (i, float(0.5 * (l[i] + u[i])))
                    depth += 1
                if split is None:
                    leaves_lo.append(l), leaves_hi.append(u)
                    new_lo.append(l), new_succ.append(y)
                    violating += 1
                    continue
                i, s = split
                upper_lo, lower_hi = l.clone(), u.clone()
                upper_lo[i], lower_hi[i] = s, s
                queue.append((upper_lo, u, depth))
                queue.append((l, lower_hi, depth))
            self.cells_lo, self.cells_hi = torch.stack(leaves_lo), torch.stack(leaves_hi)
        if new_lo:
            self.data_lo = torch.cat([self.data_lo, torch.stack(new_lo)])
            self.data_succ = torch.cat([self.data_succ, torch.stack(new_succ)])
        self.violations = pre + violating
        self.certified = self.violations == 0
        record = {"round": float(self.rounds), "certified": float(self.certified), "violations": float(self.violations),
                  "cells": float(len(self.cells_lo)), "queries": float(self.queries),
                  "round_queries": float(self.queries - start_queries)}
        self.history.append(record)
        return record

    def exhausted(self) -> bool:
        return self.queries >= self.max_queries

    def state(self) -> dict[str, Any]:
        return {"queries": self.queries, "rounds": self.rounds, "violations": self.violations,
                "certified": self.certified, "data_lo": self.data_lo, "data_succ": self.data_succ,
                "cells_lo": self.cells_lo, "cells_hi": self.cells_hi, "history": list(self.history),
                "cache": dict(self.cache), "q_states": self.q_states, "q_succ": self.q_succ, "q_value": self.q_value}

    def load(self, state: dict[str, Any]) -> None:
        for k, v in state.items():
            setattr(self, k, v)


def certify(system: MonotoneSystemLike, n_branches: int = 8, hidden: int = 32, margin: float = 1e-2,
            max_queries: int | None = None, max_rounds: int = 50, seed: int = 0,
            branch: Literal["pos_mlp", "minmax"] = "pos_mlp", steps_per_round: int = 50, lr: float = 1e-2,
            bisect_depth: int = 0) -> BarrierCertificate:
    """Train and refine a Max-Monotone barrier for ``system`` (module docstring) until every check passes, the
    query budget (default 10 n) is spent, or ``max_rounds`` rounds have run."""
    start = time.perf_counter()
    torch.manual_seed(seed)
    net = MaxMonotoneNet(len(system.x_lo), n_branches, hidden, branch, seed=seed)
    search = BarrierSearch(system, net, margin, max_queries=max_queries, bisect_depth=bisect_depth)
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    for _ in range(max_rounds):
        for _ in range(steps_per_round):
            opt.zero_grad()
            loss = search.loss()
            if float(loss.detach()) == 0.0:
                break
            loss.backward()
            opt.step()
        search.refine()
        if search.certified or search.exhausted():
            break
    return BarrierCertificate(search.certified, net, search.cells_lo, search.cells_hi, search.queries,
                              search.rounds, search.violations, time.perf_counter() - start)


# --- the task ---------------------------------------------------------------------------------------------------
class MonotoneBarrierModule(PaperTask):
    """Train-and-refine certification of a monotone system under Lightning: one epoch = ``refine_every``
    rounds' training steps of B on the barrier hinge losses, then a rebuild of the partition (queries);
    training stops once certified or out of budget. ``test`` re-checks the final certificate with its own
    queries (``verify``), checks that its cells tile X (``test/tiles``; ``test/certified`` needs both), and
    simulates the worst-case trajectory from init_hi under w_hi (``test/sim_unsafe`` = 1 if it reaches X_u within
    ``sim_steps`` steps: a concrete unsafe trajectory, since it is one).

    Args:
        num_features: n (linked from ``MonotoneSystemDataModule``).
        n_branches, hidden, branch: the ``MaxMonotoneNet``.
        margin: m of the hinge losses.
        refine_every: training epochs between rebuilds.
        max_queries: the query budget (None: 10 n).
        bisect_depth: plain bisections per cell when no cut helps (``BarrierSearch``).
        sim_steps: the length of the worst-case simulation at ``test``.
        seed: the network's initialisation seed; None: the run's seed.
    """

    paper_id = "004-14"
    monitor = "train/violations"
    monitor_mode = "min"

    def __init__(
        self,
        num_features: int = 100,
        n_branches: int = 8,
        hidden: int = 32,
        branch: Literal["pos_mlp", "minmax"] = "pos_mlp",
        margin: float = 1e-2,
        refine_every: int = 1,
        max_queries: int | None = None,
        bisect_depth: int = 0,
        sim_steps: int = 500,
        seed: int | None = None,
        optimizer: OptimizerCallable = lambda p: torch.optim.Adam(p, lr=1e-2),
        lr_scheduler: LRSchedulerCallable | None = None,
    ) -> None:
        super().__init__(optimizer, lr_scheduler, metrics={"certified": WeightedMean(), "violations": WeightedMean(),
                                                            "tiles": WeightedMean(), "sim_unsafe": WeightedMean()})
        if refine_every < 1:
            raise ConfigError(f"refine_every must be >= 1, got {refine_every}")
        self.refine_every, self.max_queries, self.bisect_depth, self.sim_steps = refine_every, max_queries, bisect_depth, sim_steps
        self.margin = margin
        self.net = MaxMonotoneNet(num_features, n_branches, hidden, branch, seed=self.seed_or_run(seed))
        self.search: BarrierSearch | None = None
        self._pending_search: dict[str, Any] | None = None
        self._start = time.perf_counter()
        self.seconds = 0.0
        self.last_report: dict[str, float] = {}

    def setup(self, stage: str) -> None:
        if self.search is not None:
            return
        dm = getattr(self.trainer, "datamodule", None)
        system = getattr(dm, "system", None)
        if not isinstance(system, MonotoneSystemLike):
            raise ConfigError(f"{type(self).__name__} needs a monotone system: "
                              "data.class_path: datamodules.monotone_systems.MonotoneSystemDataModule")
        self.search = BarrierSearch(system, self.net, self.margin, max_queries=self.max_queries,
                                    bisect_depth=self.bisect_depth)
        if self._pending_search is not None:
            self.search.load(self._pending_search)
            self._pending_search = None

    def on_fit_start(self) -> None:
        self._start = time.perf_counter()

    def step(self, batch: Any, stage: Stage) -> StepOutput:
        assert self.search is not None
        one = torch.ones((), dtype=torch.float64)
        if stage == "train":
            loss = self.search.loss()
            if self.search.certified:  # the certificate's B must not move after its check
                loss = loss * 0.0
            return StepOutput(loss, n=1, inputs={k: None for k in ("certified", "violations", "tiles", "sim_unsafe")})
        sys_ = self.search.system
        report = verify(sys_, self.net, self.search.cells_lo, self.search.cells_hi)
        tiles = cells_tile(self.search.cells_lo, self.search.cells_hi, sys_.x_lo, sys_.x_hi)
        traj = sys_.worst_case_trajectory(self.sim_steps)
        unsafe = bool((traj >= sys_.unsafe_at).any())
        certified = report["certified"] * float(tiles)
        return StepOutput(one * report["violations"], n=1, inputs={
            "certified": (one * certified, 1), "violations": (one * report["violations"], 1),
            "tiles": (one * float(tiles), 1), "sim_unsafe": (one * float(unsafe), 1)})

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        assert self.search is not None
        last = batch_idx + 1 == self.trainer.num_training_batches
        if last and (self.trainer.current_epoch + 1) % self.refine_every == 0 and not self.search.certified:
            self.search.refine()
            self.seconds = time.perf_counter() - self._start
            if self.search.certified or self.search.exhausted():
                self.trainer.should_stop = True
        super().on_train_batch_end(outputs, batch, batch_idx)  # the epoch's metrics, after this round's rebuild

    def extra_epoch_metrics(self, stage: Stage, values: dict[str, Tensor]) -> dict[str, Tensor]:
        if stage != "train" or self.search is None:
            return {}
        return {f"train/{k}": torch.tensor(float(v)) for k, v in self.certificate_report().items()}

    def certificate_report(self) -> dict[str, float]:
        """``modules.protocols.CertificateReport``: the search's state after its last rebuild."""
        s = self.search
        if s is None:
            return {}
        return {"certified": float(s.certified), "violations": float(max(s.violations, 0)),
                "cells": float(len(s.cells_lo)), "queries": float(s.queries), "rounds": float(s.rounds),
                "seconds": float(self.seconds), "queries_per_dim": s.queries / len(s.system.x_lo)}

    def extra_state(self) -> dict[str, Any]:
        return {"search": self.search.state() if self.search is not None else None, "seconds": self.seconds}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        self.seconds = float(state.get("seconds", 0.0))
        search = state.get("search")
        if search is None:
            return
        if self.search is None:
            self._pending_search = search
        else:
            self.search.load(search)


# --- analysis over runs: python -m modules.mono_barrier slope --sweep scaling ------------------------------------
def fit_loglog(n: Sequence[float], q: Sequence[float]) -> dict[str, float]:
    """Least-squares fit of log q = a + k log n over the runs: the slope k, its 95 % interval (t quantile over
    runs - 2 degrees of freedom), a, and R^2."""
    from scipy import stats

    x, y = np.log(np.asarray(n, dtype=float)), np.log(np.asarray(q, dtype=float))
    if len(x) < 3 or np.ptp(x) == 0:
        raise ConfigError(f"a slope needs runs at 2 or more values of n and 3 or more runs, got {len(x)}")
    res = stats.linregress(x, y)
    half = float(stats.t.ppf(0.975, len(x) - 2) * res.stderr)
    return {"slope": float(res.slope), "slope_lo": float(res.slope) - half, "slope_hi": float(res.slope) + half,
            "intercept": float(res.intercept), "r2": float(res.rvalue**2), "runs": float(len(x))}


def slope_analysis(sweep: str, metric: str = "diag/certificate/queries", tracking_uri: str | None = None,
                   experiment: str = "mono_barrier") -> dict[str, float]:
    """Read the FINISHED certified child runs of sweep ``sweep`` (newest per run name), fit the log-log slope of
    ``metric`` against ``data.init_args.n`` and log it as a run ``slope <sweep>`` of the experiment (params: the
    sweep, its parent run, the metric; metrics: the fit; table: the runs used)."""
    import mlflow

    from tracking.uri import default_tracking_uri

    client = mlflow.MlflowClient(tracking_uri or default_tracking_uri())
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        raise ConfigError(f"no MLflow experiment {experiment!r}: run the sweep first")
    parents = client.search_runs([exp.experiment_id], f"tags.`sweep.name` = '{sweep}' and tags.`sweep.role` = 'parent'",
                                 order_by=["attributes.start_time DESC"])
    if not parents:
        raise ConfigError(f"no sweep {sweep!r} in experiment {experiment!r}: run "
                          f"python main.py sweep --config configs/mono_barrier/{sweep}_sweep.yaml --workers 2")
    parent = parents[0]
    children = client.search_runs([exp.experiment_id], f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'",
                                  order_by=["attributes.start_time DESC"])
    rows: dict[str, dict[str, float]] = {}
    for run in children:
        name = run.data.tags.get("mlflow.runName", run.info.run_id)
        if run.info.status != "FINISHED" or name in rows or metric not in run.data.metrics:
            continue
        n = run.data.params.get("data.init_args.n")
        if n is None:
            continue
        rows[name] = {"n": float(n), metric.rsplit("/", 1)[-1]: float(run.data.metrics[metric]),
                      "certified": float(run.data.metrics.get("diag/certificate/certified", float("nan"))),
                      "seed": float(run.data.params.get("seed_everything", "nan"))}
    used = [r for r in rows.values() if r["certified"] == 1.0]
    key = metric.rsplit("/", 1)[-1]
    fit = fit_loglog([r["n"] for r in used], [r[key] for r in used])
    fit["uncertified_runs"] = float(len(rows) - len(used))
    with mlflow.start_run(experiment_id=exp.experiment_id, run_name=f"slope {sweep}") as run:
        mlflow.set_tags({"analysis": "slope", "paper": MonotoneBarrierModule.paper_id, "method": experiment})
        mlflow.log_params({"sweep": sweep, "sweep_parent": parent.info.run_id, "metric": metric, "x": "data.init_args.n"})
        mlflow.log_metrics({f"slope/{k}": v for k, v in fit.items()})
        mlflow.log_table({k: [r[k] for r in sorted(used, key=lambda r: (r["n"], r["seed"]))] for k in ("n", "seed", key)},
                         artifact_file="tables/slope_runs.json")
        fit["run_id"] = run.info.run_id  # type: ignore[assignment]
    return fit


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m modules.mono_barrier")
    sub = parser.add_subparsers(dest="analysis", required=True)
    p = sub.add_parser("slope", help="log-log slope of queries against n over a sweep's runs, logged as a run")
    p.add_argument("--sweep", default="scaling")
    p.add_argument("--metric", default="diag/certificate/queries")
    args = parser.parse_args(argv)
    try:
        fit = slope_analysis(args.sweep, args.metric)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"log-log slope of {args.metric} against n over {int(fit['runs'])} certified runs of sweep {args.sweep!r}: "
          f"{fit['slope']:.4g} [{fit['slope_lo']:.4g}, {fit['slope_hi']:.4g}] (95 %), R^2 {fit['r2']:.4f}, "
          f"{int(fit['uncertified_runs'])} uncertified runs left out; MLflow run {fit['run_id']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
