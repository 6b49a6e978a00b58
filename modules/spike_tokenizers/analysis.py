"""Analyses over the benchmark sweep's runs that ``compare`` cannot express, each logged as a run of its own:

- ``python -m modules.spike_tokenizers dissociation --sweep benchmark``: every ordered pair of sweep points
  (A, B) where A reconstructs better (paired by seed, ``test/bits_per_spike``), with how much worse A decodes
  (``test/decode_r2`` of B minus A) and its 95 % t interval over seeds; the pair with the largest gap is the
  claim's "better reconstructor, worse decoder" pair.
- ``python -m modules.spike_tokenizers heldout --sweep benchmark``: per seed, the mean held-out loss
  (``test/heldout_decode_drop`` and ``test/heldout_bits_drop``) of the population tokenizers' points minus that of
  the single-neuron ones, with its 95 % t interval over seeds.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from typing import Any

from errors import ConfigError

POPULATION_KINDS = ("pop_ae", "vqvae", "event")
SINGLE_NEURON_KINDS = ("count", "patch")
Table = dict[str, dict[int, dict[str, float]]]  # point -> seed -> metric -> value


def t_interval(values: list[float]) -> tuple[float, float, float]:
    """``(mean, lo, hi)``: the mean and its two-sided 95 % Student-t interval (nan bounds for one value)."""
    from scipy import stats

    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, float("nan"), float("nan")
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = float(stats.t.ppf(0.975, n - 1)) * sd / math.sqrt(n)
    return mean, mean - half, mean + half


def dissociation_pairs(table: Table, bits: str = "test/bits_per_spike", r2: str = "test/decode_r2") -> list[dict[str, Any]]:
    """Every ordered pair (A, B) of points with A's bits/spike above B's on average over their shared seeds: the
    paired differences ``bits_gain = bits(A) - bits(B)`` and ``decode_gap = r2(B) - r2(A)`` with their t intervals,
    largest ``decode_gap`` first."""
    rows = []
    for a, va in table.items():
        for b, vb in table.items():
            seeds = sorted(set(va) & set(vb))
            if a == b or not seeds:
                continue
            gain = t_interval([va[s][bits] - vb[s][bits] for s in seeds])
            if gain[0] <= 0:
                continue
            gap = t_interval([vb[s][r2] - va[s][r2] for s in seeds])
            rows.append({"better_reconstructor": a, "better_decoder": b, "seeds": len(seeds),
                         "bits_gain": gain[0], "bits_gain_lo": gain[1], "bits_gain_hi": gain[2],
                         "decode_gap": gap[0], "decode_gap_lo": gap[1], "decode_gap_hi": gap[2]})
    return sorted(rows, key=lambda r: -r["decode_gap"])


def population_contrast(table: Table, kinds: Mapping[str, str], metric: str) -> dict[str, float]:
    """Per seed, the mean of ``metric`` over the population-kind points minus over the single-neuron ones; its
    mean and t interval over the seeds that have both."""
    seeds = sorted({s for v in table.values() for s in v})
    diffs = []
    for s in seeds:
        pop = [v[s][metric] for p, v in table.items() if kinds[p] in POPULATION_KINDS and s in v]
        single = [v[s][metric] for p, v in table.items() if kinds[p] in SINGLE_NEURON_KINDS and s in v]
        if pop and single:
            diffs.append(sum(pop) / len(pop) - sum(single) / len(single))
    if not diffs:
        raise ConfigError(f"no seed has both population and single-neuron runs with {metric}")
    mean, lo, hi = t_interval(diffs)
    return {"diff": mean, "diff_lo": lo, "diff_hi": hi, "seeds": float(len(diffs))}


def read_sweep(sweep: str, metrics: tuple[str, ...], tracking_uri: str | None = None,
               experiment: str = "spike_tokenizers") -> tuple[Any, str, Table, dict[str, str]]:
    """``(client, parent run id, table, kind of each point)`` from the newest sweep ``sweep``'s FINISHED children."""
    import mlflow

    from tracking.analysis_run import finished_sweep_runs
    from tracking.uri import default_tracking_uri

    client = mlflow.MlflowClient(tracking_uri or default_tracking_uri())
    parent, children = finished_sweep_runs(client, experiment, sweep)
    table: Table = {}
    kinds: dict[str, str] = {}
    for run in children:
        point, seed = run.data.tags.get("sweep.point"), run.data.tags.get("sweep.seed")
        if point is None or seed is None or int(seed) in table.get(point, {}):
            continue
        if not all(m in run.data.metrics for m in metrics):
            continue
        table.setdefault(point, {})[int(seed)] = {m: float(run.data.metrics[m]) for m in metrics}
        kinds[point] = run.data.params.get("model.init_args.kind", "")
    if not table:
        raise ConfigError(f"sweep {sweep!r} has no FINISHED run with {list(metrics)}: run its test stage (test: true)")
    return client, parent, table, kinds


def log_analysis(client: Any, name: str, sweep: str, parent: str, metrics: dict[str, float], rows: list[dict[str, Any]],
                 experiment: str = "spike_tokenizers") -> str:
    from modules.spike_tokenizers.task import SpikeTokenizerAE
    from tracking.analysis_run import analysis_run, log_metrics

    tags = {"analysis": name, "paper": SpikeTokenizerAE.paper_id, "method": experiment}
    with analysis_run(client, experiment, f"{name} {sweep}", tags, {"sweep": sweep, "sweep_parent": parent}) as run_id:
        log_metrics(client, run_id, {k: v for k, v in metrics.items() if math.isfinite(v)})
        client.log_dict(run_id, {"rows": rows}, f"tables/{name}.json")
    return run_id


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m modules.spike_tokenizers")
    sub = parser.add_subparsers(dest="analysis", required=True)
    for name, text in (("dissociation", "the better-reconstructor / worse-decoder pairs of a sweep, logged as a run"),
                       ("heldout", "population minus single-neuron held-out loss per seed, logged as a run")):
        sub.add_parser(name, help=text).add_argument("--sweep", default="benchmark")
    args = parser.parse_args(argv)
    try:
        if args.analysis == "dissociation":
            client, parent, table, _ = read_sweep(args.sweep, ("test/bits_per_spike", "test/decode_r2"))
            rows = dissociation_pairs(table)
            top = rows[0] if rows else {}
            metrics = {f"dissociation/{k}": float(v) for k, v in top.items() if isinstance(v, float | int)}
            run_id = log_analysis(client, "dissociation", args.sweep, parent, metrics, rows)
            for r in rows[:5]:
                print(f"{r['better_reconstructor']} reconstructs better than {r['better_decoder']} by "
                      f"{r['bits_gain']:.3f} [{r['bits_gain_lo']:.3f}, {r['bits_gain_hi']:.3f}] bits/spike and decodes "
                      f"{r['decode_gap']:.3f} [{r['decode_gap_lo']:.3f}, {r['decode_gap_hi']:.3f}] R^2 worse "
                      f"({r['seeds']} seeds)")
        else:
            drops = ("test/heldout_decode_drop", "test/heldout_bits_drop")
            client, parent, table, kinds = read_sweep(args.sweep, drops)
            metrics, rows = {}, []
            for m in drops:
                c = population_contrast(table, kinds, m)
                key = m.removeprefix("test/")
                metrics.update({f"heldout/{key}_{k}": v for k, v in c.items()})
                rows.append({"metric": m, **c})
                print(f"population minus single-neuron {m}: {c['diff']:.4f} [{c['diff_lo']:.4f}, {c['diff_hi']:.4f}] "
                      f"({int(c['seeds'])} seeds)")
            run_id = log_analysis(client, "heldout", args.sweep, parent, metrics, rows)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"MLflow run {run_id}")
    return 0
