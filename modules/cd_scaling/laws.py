"""``fit_laws``: the CD-scaling analysis over two sweeps logged in MLflow (``python -m modules.cd_scaling fit-laws``).

1. The anchors sweep (one epoch, D = U, over a grid of N and U) fixes the Chinchilla law
   ``L = E + A / N^alpha + B / D^beta`` (``fit_chinchilla``).
2. The repeat sweep (U unique tokens seen ``epochs`` times) measures what repeated tokens are worth: each run's
   final validation loss, inverted through the law, gives the fresh-token count that would reach it,
   ``D_eff = (B / (L - E - A / N^alpha))^(1 / beta)``, and its mean effectiveness
   ``eta_bar = (D_eff - U) / (D - U)`` (the spec's measurement, per run and averaged per cell of N, U, epochs).
3. Both effective-data forms are fitted to the repeat runs with the law fixed: Muennighoff's constant R* and
   the CD reading ``R* = c0 N^(-a) (U / N)^b`` (``fit_effectiveness``); their rmse of log L says which fits.

The loss of a run is its final (last logged) ``val/loss``, not the best: a repeated run that overfits is worth
what it ends at. N, U and D are ``TokenAccounting``'s, what the run did rather than what its config asked.
The result is a run ``fit_laws`` in the experiment: the constants, both forms' rmse, per-cell eta_bar and the
claim's counts as metrics, the per-run and per-cell tables and two figures as artifacts.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from errors import ConfigError
from modules.components.scaling_laws import ChinchillaLaw, EffectivenessLaw, fit_chinchilla, fit_effectiveness
from modules.components.stats import summarize
from tracking.figures import new_figure

EXPERIMENT = "cd_scaling"
LOSS = "val/loss"
BUDGET = "diag/token_accounting/"
SWEEP_HINT = {
    "anchors": "python main.py sweep --config configs/cd_scaling/anchors_sweep.yaml --workers 2",
    "repeat": "python main.py sweep --config configs/cd_scaling/repeat_sweep.yaml --workers 2",
}


@dataclass(frozen=True)
class ScalingRun:
    """One finished run: its name, N, U, D and final validation loss."""
    name: str
    N: float
    U: float
    D: float
    L: float

    @property
    def epochs(self) -> int:
        return round(self.D / self.U)


@dataclass
class LawsResult:
    """What ``fit_laws`` found (and logged as the run ``run_id``)."""
    law: ChinchillaLaw
    cd: EffectivenessLaw
    constant: EffectivenessLaw
    anchors: list[ScalingRun]
    repeat: list[ScalingRun]
    runs: list[dict[str, Any]] = field(default_factory=list)  # per repeat run: eta measured and fitted
    cells: list[dict[str, Any]] = field(default_factory=list)  # per (N, U, epochs): the means
    claims: dict[str, float] = field(default_factory=dict)
    run_id: str | None = None


def sweep_runs(client: Any, experiment: str, sweep: str) -> tuple[str, list[ScalingRun]]:
    """The sweep's parent run id and its FINISHED children (the newest run of each point)."""
    from tracking.analysis_run import finished_sweep_runs

    parent_id, children = finished_sweep_runs(client, experiment, sweep)
    out: dict[str, ScalingRun] = {}
    for run in children:
        name = run.info.run_name or run.info.run_id
        m = run.data.metrics
        missing = [k for k in (LOSS, BUDGET + "n_params", BUDGET + "unique", BUDGET + "seen") if k not in m]
        if missing:
            raise ConfigError(
                f"run {name!r} of sweep '{sweep}' has no {', '.join(missing)}; its config needs the "
                "callbacks.token_accounting.TokenAccounting callback (configs/cd_scaling/base.yaml has it)"
            )
        out[name] = ScalingRun(name, m[BUDGET + "n_params"], m[BUDGET + "unique"], m[BUDGET + "seen"], m[LOSS])
    if not out:
        raise ConfigError(f"sweep '{sweep}' has no FINISHED runs; rerun it: {SWEEP_HINT.get(sweep, 'python main.py sweep ...')}")
    return parent_id, sorted(out.values(), key=lambda r: (r.N, r.U, r.D))


def _arrays(runs: list[ScalingRun]) -> tuple[np.ndarray, ...]:
    return tuple(np.array([getattr(r, k) for r in runs], dtype=np.float64) for k in ("N", "U", "D", "L"))


def analyse(anchors: list[ScalingRun], repeat: list[ScalingRun]) -> LawsResult:
    """Fit the law on ``anchors``, both effectiveness forms on ``repeat``; eta_bar per run and cell, the claim's counts."""
    bad = [r.name for r in anchors if r.epochs != 1]
    if bad:
        raise ConfigError(f"anchor runs {bad} trained more than one epoch (D > U); anchors are 1-epoch runs (trainer.max_epochs: 1)")
    short = [r.name for r in repeat if r.D < r.U]
    if short:
        raise ConfigError(f"runs {short} saw fewer tokens D than unique tokens U; every run needs D >= U (epochs >= 1)")
    n_a, _, d_a, l_a = _arrays(anchors)
    law = fit_chinchilla(n_a, d_a, l_a)
    n_r, u_r, d_r, l_r = _arrays(repeat)
    cd = fit_effectiveness(n_r, u_r, d_r, l_r, law, form="cd")
    constant = fit_effectiveness(n_r, u_r, d_r, l_r, law, form="constant")

    d_eff = law.effective_tokens(l_r, n_r)
    with np.errstate(divide="ignore", invalid="ignore"):
        eta_meas = np.where(d_r > u_r, (d_eff - u_r) / (d_r - u_r), np.nan)
    eta_cd, eta_const = cd.eta_bar(n_r, u_r, d_r), constant.eta_bar(n_r, u_r, d_r)
    rows = [
        {
            "run": r.name, "N": r.N, "U": r.U, "D": r.D, "epochs": r.epochs, "val_loss": r.L,
            "D_eff": float(d_eff[i]), "eta_bar": float(eta_meas[i]), "eta_bar_cd": float(eta_cd[i]),
            "eta_bar_constant": float(eta_const[i]),
        }
        for i, r in enumerate(repeat)
    ]
    groups: dict[tuple[float, float, int], list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        groups[(row["N"], row["U"], row["epochs"])].append(row)
    cells = []
    for (n, u, ep), members in sorted(groups.items()):
        cell: dict[str, Any] = {"N": n, "U": u, "epochs": ep, "runs": len(members)}
        for key in ("val_loss", "D_eff", "eta_bar_cd"):
            cell[key] = float(np.mean([m[key] for m in members]))  # NaN when a run is below the law's floor
        # the measured eta_bar: its mean and its seeds' spread (through the one law: the law's own error is not in it)
        cell["eta_bar"], cell["eta_bar_std"], cell["eta_bar_lo"], cell["eta_bar_hi"] = summarize(
            [m["eta_bar"] for m in members])
        cells.append(cell)
    result = LawsResult(law, cd, constant, anchors, repeat, rows, cells)
    result.claims = claims(cells, cd.rmse, constant.rmse)
    return result


def claims(cells: list[dict[str, Any]], rmse_cd: float, rmse_constant: float) -> dict[str, float]:
    """The issue's claim as counts over the cells' measured eta_bar (NaN cells count as failures)."""
    eta = {(c["N"], c["U"], c["epochs"]): c["eta_bar"] for c in cells}
    sizes = sorted({k[0] for k in eta})
    uniques = sorted({k[1] for k in eta})
    epochs = sorted({k[2] for k in eta})
    finite = [v for v in eta.values() if math.isfinite(v)]
    out: dict[str, float] = {
        "cells": float(len(eta)),
        "cells_defined": float(len(finite)),
        "cells_eta_below_1": float(sum(v < 1 for v in finite)),
        # cells whose 95 % interval over seeds lies below 1 (NaN bounds, e.g. one seed, do not count)
        "cells_eta_interval_below_1": float(sum(c.get("eta_bar_hi", math.nan) < 1 for c in cells)),
    }
    # falling with epochs, and the last epoch count below half the first, per (N, U)
    lo, hi = epochs[0], epochs[-1]
    falling = lower_last = halved = pairs = 0
    for n in sizes:
        for u in uniques:
            series = [eta.get((n, u, e), math.nan) for e in epochs]
            pairs += 1
            falling += all(b < a for a, b in zip(series, series[1:]))
            lower_last += series[-1] < series[0]
            halved += series[-1] < 0.5 * series[0]
    last_below_1 = sum(c.get("eta_bar_hi", math.nan) < 1 for c in cells if c["epochs"] == hi)
    out.update({"pairs_NU": float(pairs), "pairs_falling_with_epochs": float(falling),
                f"pairs_eta{hi}_below_eta{lo}": float(lower_last),
                f"pairs_eta{hi}_below_half_eta{lo}": float(halved),
                f"cells_eta{hi}_interval_below_1": float(last_below_1)})
    # lower at the largest N than at the smallest, per (U, epochs)
    small, large = sizes[0], sizes[-1]
    lower = sum(eta.get((large, u, e), math.nan) < eta.get((small, u, e), math.nan) for u in uniques for e in epochs)
    out.update({"cells_U_epochs": float(len(uniques) * len(epochs)), "cells_lower_at_largest_N": float(lower)})
    out["rmse_reduction_cd_vs_constant"] = 1.0 - rmse_cd / rmse_constant if rmse_constant > 0 else math.nan
    return out


def figures(result: LawsResult) -> dict[str, Any]:
    """``loss_vs_tokens``: every run's final loss against D per N with the fitted law (anchors: fresh tokens;
    repeat: the cd form); ``eta_bar``: measured eta_bar per cell against epochs, one line per (N, U)."""
    import matplotlib

    out = {}
    fig, ax = new_figure(figsize=(6.4, 4.2))
    sizes = sorted({r.N for r in result.anchors} | {r.N for r in result.repeat})
    colors = matplotlib.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, n in enumerate(sizes):
        c = colors[i % len(colors)]
        a = [r for r in result.anchors if r.N == n]
        if a:
            ax.scatter([r.D for r in a], [r.L for r in a], color=c, marker="o", label=f"N={n:.0f} 1 epoch")
            grid = np.geomspace(min(r.D for r in a), max(r.D for r in result.repeat + a), 50)
            ax.plot(grid, result.law.predict(np.full_like(grid, n), grid), color=c, lw=0.8)
        for u in sorted({r.U for r in result.repeat if r.N == n}):
            rep = sorted((r for r in result.repeat if r.N == n and r.U == u), key=lambda r: r.D)
            ax.scatter([r.D for r in rep], [r.L for r in rep], color=c, marker="x")
            grid = np.geomspace(u, max(r.D for r in rep), 50)
            ax.plot(grid, result.cd.predict(np.full_like(grid, n), np.full_like(grid, u), grid), color=c, ls="--", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("tokens seen D")
    ax.set_ylabel("final val/loss (nats)")
    ax.set_title("o: 1 epoch (law), x: repeated U (dashed: cd form)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    out["figures/loss_vs_tokens.png"] = fig

    fig, ax = new_figure(figsize=(6.4, 4.2))
    for i, n in enumerate(sizes):
        for j, u in enumerate(sorted({c["U"] for c in result.cells})):
            cells = [c for c in result.cells if c["N"] == n and c["U"] == u]
            if cells:
                ax.plot([c["epochs"] for c in cells], [c["eta_bar"] for c in cells], marker="o", color=colors[i % len(colors)],
                        ls=("-", "--", ":")[j % 3], label=f"N={n:.0f} U={u:.0f}")
    ax.axhline(1.0, color="grey", lw=0.5)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("epochs D / U")
    ax.set_ylabel("eta_bar = (D_eff - U) / (D - U)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    out["figures/eta_bar.png"] = fig
    return out


def log_result(client: Any, experiment: str, result: LawsResult, params: dict[str, str]) -> str:
    """Log ``result`` as a FINISHED run ``fit_laws`` of ``experiment``; returns its run id."""
    from tracking.analysis_run import analysis_run, log_metrics
    from tracking.tables import table_csv

    tags = {"paper_id": "000-12", "method": "cd_scaling", "analysis": "fit_laws"}
    with analysis_run(client, experiment, "fit_laws", tags, params) as run_id:
        metrics: dict[str, float] = {f"law/{k}": v for k, v in result.law.params.items()}
        metrics["law/rmse"] = result.law.rmse
        metrics.update({f"cd/{k}": v for k, v in result.cd.params.items()})
        metrics.update({"cd/rmse": result.cd.rmse, "constant/R_star": result.constant.c0, "constant/rmse": result.constant.rmse})
        for c in result.cells:
            key = f"N{c['N']:.0f}_U{c['U']:.0f}_ep{c['epochs']}"
            metrics[f"eta_bar/{key}"] = c["eta_bar"]
            metrics[f"eta_bar_cd/{key}"] = c["eta_bar_cd"]
        metrics.update({f"claim/{k}": v for k, v in result.claims.items()})
        log_metrics(client, run_id, metrics)
        client.log_text(run_id, table_csv(result.runs), "tables/runs.csv")
        client.log_text(run_id, table_csv(result.cells), "tables/cells.csv")
        for path, fig in figures(result).items():
            client.log_figure(run_id, fig, path)
    return run_id


def fit_laws(anchors: str = "anchors", repeat: str = "repeat", experiment: str = EXPERIMENT,
             tracking_uri: str | None = None) -> LawsResult:
    """Read both sweeps' FINISHED children from MLflow, fit, and log the run ``fit_laws`` (see the module docstring)."""
    from mlflow.tracking import MlflowClient

    from tracking.uri import default_tracking_uri

    client = MlflowClient(tracking_uri or default_tracking_uri())
    anchor_id, anchor_runs = sweep_runs(client, experiment, anchors)
    repeat_id, repeat_runs = sweep_runs(client, experiment, repeat)
    result = analyse(anchor_runs, repeat_runs)
    params = {"anchors": anchors, "anchors_run_id": anchor_id, "anchors_runs": str(len(anchor_runs)),
              "repeat": repeat, "repeat_run_id": repeat_id, "repeat_runs": str(len(repeat_runs)), "loss": LOSS}
    result.run_id = log_result(client, experiment, result, params)
    return result


def report(result: LawsResult) -> str:
    """The result as text: constants, rmse of both forms, the per-cell table and the claim's counts."""
    law = result.law
    lines = [
        f"law (anchors, {len(result.anchors)} runs): L = {law.E:.4g} + {law.A:.4g}/N^{law.alpha:.4g} + "
        f"{law.B:.4g}/D^{law.beta:.4g}   rmse {law.rmse:.4g}",
        f"cd form ({len(result.repeat)} runs): R* = {result.cd.c0:.4g} N^-{result.cd.a:.4g} (U/N)^{result.cd.b:.4g}"
        f"   rmse {result.cd.rmse:.4g}",
        f"constant form: R* = {result.constant.c0:.4g}   rmse {result.constant.rmse:.4g}",
        f"{'N':>8} {'U':>8} {'epochs':>6} {'val_loss':>9} {'D_eff':>10} {'eta_bar':>8} {'95% CI (seeds)':>17} {'eta_cd':>8}",
    ]
    for c in result.cells:
        lines.append(f"{c['N']:>8.0f} {c['U']:>8.0f} {c['epochs']:>6d} {c['val_loss']:>9.4f} {c['D_eff']:>10.4g} "
                     f"{c['eta_bar']:>8.4f} {_interval(c):>17} {c['eta_bar_cd']:>8.4f}")
    lines += [f"{k}: {v:.4g}" for k, v in result.claims.items()]
    if result.run_id:
        lines.append(f"logged: run fit_laws {result.run_id} in experiment cd_scaling")
    return "\n".join(lines)


def _interval(cell: dict[str, Any]) -> str:
    lo, hi = cell.get("eta_bar_lo", math.nan), cell.get("eta_bar_hi", math.nan)
    return "-" if math.isnan(lo) else f"[{lo:.3f}, {hi:.3f}]"
