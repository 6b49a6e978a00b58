"""The exact corner checks and the train-and-refine search of MonoBarrier (package docstring)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from errors import ConfigError
from modules.mono_barrier.nets import MaxMonotoneNet

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
