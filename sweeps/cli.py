"""``python main.py sweep ...`` and ``python main.py compare ...`` (``main.py`` hands argv over as is).

Exit codes of ``sweep``: 0 every point done; k in 1..100: k points failed (capped at 100); 101: nothing ran
(invalid sweep file or arguments, message on stderr); 130: interrupted (re-run the same command to resume).
``compare``: 0, or 2 on bad input.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from pathlib import Path

from sweeps.spec import SweepError

EXIT_BAD_INPUT = 101
EXIT_INTERRUPTED = 130
MAX_FAILED_CODE = 100


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise SweepError(message)


def sweep_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="python main.py sweep",
        description="Run every point of a sweep file as a child MLflow run "
        "of one parent run (docs/sweeps.md).",
    )
    p.add_argument(
        "--config", required=True, help="the sweep file, e.g. configs/mlp_classifier/activation_sweep.yaml"
    )
    p.add_argument(
        "--workers", type=int, default=1, help="points run at once, each in its own process (default 1)"
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="list the points (and their state) and the commands; run nothing",
    )
    p.add_argument(
        "--vectorize-seeds",
        action="store_true",
        help="train each point's seeds in one process, stacked over seeds (the sweep file's vectorize_seeds: "
        "true; a vectorizable task only, docs/sweeps.md)",
    )
    p.add_argument(
        "--vectorize-arms",
        action="store_true",
        help="also train points that differ only in the optimizer's hyperparameters (model.optimizer.init_args.*) "
        "and the seed in one process, one row each (the sweep file's vectorize_arms: true; implies "
        "--vectorize-seeds; docs/sweeps.md)",
    )
    p.add_argument(
        "--point",
        type=int,
        action="append",
        metavar="I",
        help="run only point I (repeatable); what each SLURM array task does",
    )
    p.add_argument(
        "--in-process",
        action="store_true",
        help="run the points in this process (no interpreter start-up; for tests and quick looks)",
    )
    p.add_argument(
        "--launcher",
        choices=("local", "slurm", "torchrun"),
        default="local",
        help="local processes (default), a SLURM array job, or torchrun per point",
    )
    p.add_argument(
        "--nodes", type=int, default=1, help="nodes per point (multi-node runs: slurm or torchrun)"
    )
    p.add_argument(
        "--devices-per-node", type=int, default=1, help="processes (GPUs) per node for every point"
    )
    p.add_argument(
        "--strategy", default=None, help="trainer strategy when a point spans several processes (default ddp)"
    )
    p.add_argument("--max-parallel", type=int, default=None, help="SLURM: array tasks running at once (%%N)")
    p.add_argument(
        "--slurm-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an #SBATCH line, e.g. partition=gpu, time=04:00:00, gpus-per-node=1 (repeatable)",
    )
    p.add_argument(
        "--slurm-setup",
        action="append",
        default=[],
        metavar="LINE",
        help="a shell line run before each task, e.g. 'source .venv/bin/activate' (repeatable)",
    )
    p.add_argument("--script", default=None, help="SLURM: where to write the sbatch script")
    p.add_argument("--submit", action="store_true", help="SLURM: submit the script with sbatch")
    p.add_argument(
        "--exec-prefix",
        default=None,
        help="command put before `python main.py` for every point "
        "(the SLURM script uses `srun` for multi-process points)",
    )
    return p


def compare_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="python main.py compare", description="Compare MLflow runs over seeds: table, figure, CSV."
    )
    p.add_argument(
        "--experiment", required=True, help="MLflow experiment (the method name, e.g. mlp_classifier)"
    )
    p.add_argument(
        "--sweep", default=None, help="a sweep's name or parent run id (default: every run of the experiment)"
    )
    p.add_argument("--metric", required=True,
                   help="the metric compared, e.g. test/acc; a glob such as 'diag/weight_drift/*/drift' compares "
                   "every matching metric (a row per metric and group)")
    p.add_argument(
        "--by",
        action="append",
        default=[],
        help="group by this param (repeatable); "
        "'model.activation' finds model.init_args.activation, 'seed' finds seed_everything",
    )
    p.add_argument(
        "--x", default=None, help="scatter the metric against this metric or numeric param (Spearman rho)"
    )
    p.add_argument(
        "--mode", choices=("max", "min"), default=None, help="which is best (default: min for losses/errors)"
    )
    p.add_argument("--agg", choices=("last", "mean", "min", "max"), default="last",
                   help="each run's value: its last logged value (default), or the mean/min/max of its history")
    p.add_argument("--steps", default=None, metavar="A:B",
                   help="with --agg: only the history at steps A..B (either side may be empty, e.g. 500:)")
    p.add_argument("--divide-by", default=None, metavar="METRIC",
                   help="divide each run's value by its value of METRIC (same --agg and --steps): with --agg mean "
                   "a ratio of means, e.g. trace / grad_norm_sq_unbiased for a noise scale over a phase")
    p.add_argument("--baseline", default=None, metavar="KEY=VALUE",
                   help="add each group's ratio and difference to the group KEY=VALUE (a --by key), paired by "
                   "seed, and Welch's t-test against it")
    p.add_argument("--per-group", action="store_true",
                   help="with --x: correlate the group means (seeds averaged), not the runs")
    p.add_argument("--leave-one-out", default=None, metavar="KEY",
                   help="with --x: Spearman's rho without each value of KEY (a --by key), and within it")
    p.add_argument("--where", action="append", default=[], metavar="KEY=VALUE",
                   help="only the runs whose param or tag KEY has this value (repeatable, all must hold)")
    p.add_argument("--bootstrap", type=int, default=0, metavar="N",
                   help="with --x: a 95%% interval of rho from N resamples of the grid points (groups)")
    p.add_argument("--pool-datasets", action="store_true", help="compare runs on different datasets together")
    p.add_argument("--out", default=None, help="output folder (default compare/<experiment>[/<sweep>])")
    p.add_argument(
        "--no-log", action="store_true", help="do not log the figure and CSVs to the sweep's parent run"
    )
    return p


def main(argv: list[str]) -> int:
    """Entry point: ``argv[0]`` is ``sweep`` or ``compare``."""
    command, rest = (argv[0], list(argv[1:])) if argv else ("", [])
    if command == "sweep":
        return _guard(sweep_main, rest, EXIT_BAD_INPUT, "the same command again skips the points that finished")
    if command == "compare":
        return _guard(compare_main, rest, 2, "the same command again starts over")
    print("usage: python main.py {sweep,compare} ...", file=sys.stderr)
    return 2


def _guard(fn, argv: list[str], bad_input: int, after_interrupt: str) -> int:
    from tracking.uri import TrackingServerUnreachable

    try:
        return fn(argv)
    except SystemExit as exit_:  # --help
        return exit_.code if isinstance(exit_.code, int) else 0
    except (SweepError, TrackingServerUnreachable) as err:
        print(f"error: {err}", file=sys.stderr)
        return bad_input
    except KeyboardInterrupt:  # outside the points (the runner stops those itself): at start-up, in compare
        print(f"interrupted (Ctrl-C); {after_interrupt}", file=sys.stderr)
        return EXIT_INTERRUPTED


def build_plan(args: argparse.Namespace):
    """The sweep's plan: the file read, its keys put in their full form and checked against the base config,
    its points expanded (imports the trainer: in a sweep worker when there is one, see ``WorkerPool.plan``)."""
    from sweeps.launchers import trainer_args
    from sweeps.runner import SweepPlan
    from sweeps.spec import canonicalize, checkpoint_root, expand, experiment_of, load_sweep, monitor_of, validate
    from tracking.uri import default_tracking_uri

    spec = load_sweep(args.config)
    spec.vectorize_arms = spec.vectorize_arms or args.vectorize_arms
    spec.vectorize_seeds = spec.vectorize_seeds or args.vectorize_seeds or spec.vectorize_arms
    resolved = canonicalize(spec)  # model.lr -> model.init_args.lr, before the points are named
    points = expand(spec)
    validate(spec, points, resolved)
    extra = trainer_args(args.nodes, args.devices_per_node, args.strategy)
    return SweepPlan(
        spec=spec,
        points=points,
        experiment=experiment_of(resolved, spec.overrides),
        checkpoint_root=checkpoint_root(resolved, spec.overrides),
        tracking_uri=default_tracking_uri(),
        extra_args=extra,
        monitor=monitor_of(resolved, spec.overrides),
    )


def sweep_main(argv: list[str]) -> int:
    args = sweep_parser().parse_args(argv)
    if args.workers < 1:
        raise SweepError(f"--workers must be at least 1, got {args.workers}")
    if args.in_process and (args.workers > 1 or args.launcher != "local" or args.exec_prefix):
        raise SweepError("--in-process runs one point at a time in this process: drop --workers/--launcher")
    if args.dry_run:  # what the file says, at once; checking it against the base config imports the trainer
        from sweeps.spec import expand, load_sweep

        spec = load_sweep(args.config)
        print(f"sweep {spec.name}: {len(expand(spec))} point(s) of {spec.base.name}; checking them against the "
              "base config ...", flush=True)
    pool = None
    if not args.dry_run and not args.in_process and args.launcher == "local" and not args.exec_prefix and (
        args.nodes * args.devices_per_node == 1
    ):
        from sweeps.runner import WorkerPool, import_tracking
        from sweeps.spec import load_sweep

        # started now, in the background: the workers (their fork server) import torch, Lightning and MLflow
        # while this process imports MLflow; the first of them then checks the sweep
        base = load_sweep(args.config).base
        pool = WorkerPool(args.workers, warmup=["fit", "--config", str(base), "--print_config"])
        pool.start()
        import_tracking()
    try:
        return _run_sweep(args, pool, argv)
    finally:
        if pool is not None:
            pool.close(timeout=0)  # a no-op after a run (the runner closed it); at once after an error


def _run_sweep(args: argparse.Namespace, pool, argv: list[str]) -> int:
    from sweeps import launchers
    from sweeps.runner import (
        InProcess,
        Subprocesses,
        SweepRunner,
        client_for,
        dry_run_table,
        earlier_durations,
        ensure_parent,
        estimate_line,
        find_parent,
        last_line,
        point_states,
    )
    from tracking.uri import check_tracking_server

    # in a worker when there is one: this process then never imports torch or Lightning
    plan = pool.plan(argv) if pool is not None else build_plan(args)
    n = len(plan.points)
    only = sorted(set(args.point)) if args.point else None
    if only and not all(0 <= i < n for i in only):
        raise SweepError(f"--point must lie in 0..{n - 1} for this sweep of {n} point(s), got {only}")
    if plan.spec.vectorize_seeds and args.nodes * args.devices_per_node > 1:
        raise SweepError("vectorize_seeds trains a point's seeds in one process, which does not run over several "
                         "processes (DDP): drop vectorize_seeds, or run each point on one device")
    if args.nodes > 1 and args.launcher == "local" and not args.exec_prefix:
        raise SweepError(
            "a point on several nodes needs a cluster launcher: --launcher slurm or --launcher torchrun"
        )

    if args.dry_run:
        client = parent = None
        durations: dict[str, list[float]] = {}
        if _store_exists(plan.tracking_uri):
            check_tracking_server(plan.tracking_uri)
            client = client_for(plan.tracking_uri)
            parent = find_parent(client, plan.experiment, plan.spec.name)
            durations = earlier_durations(client, plan)
        states = point_states(plan, parent, client)
        print("\n".join(dry_run_table(plan, parent, client, states)))
        print(estimate_line(plan, states, durations, args.workers))
        parent_id = parent.info.run_id if parent is not None else "<parent run id>"
        _print_commands(args, plan, parent_id, only)
        return 0

    check_tracking_server(plan.tracking_uri)
    if args.launcher == "slurm":
        script = _write_slurm(args, plan)
        parent_id = ensure_parent(client_for(plan.tracking_uri), plan)
        print(f"sweep {plan.spec.name}: {n} point(s), parent run {parent_id}\nwrote {script}")
        if args.submit:
            if not launchers.sbatch_available():
                raise SweepError("sbatch is not on PATH: submit the script from a SLURM login node")
            return subprocess.run(["sbatch", str(script)], check=False).returncode
        print(f"submit it with: sbatch {script}")
        return 0
    if args.launcher == "torchrun" and args.nodes > 1:
        raise SweepError(
            "a multi-node torchrun point is started on every node: run with --dry-run and start the "
            "printed command on each node (NODE_RANK=0..N-1, same MASTER_ADDR), or use --launcher slurm"
        )

    if args.in_process:
        executor = InProcess()
    elif pool is not None:
        executor = pool
    else:
        prefix = shlex.split(args.exec_prefix) if args.exec_prefix else []
        if args.launcher == "torchrun":
            prefix = launchers.torchrun_prefix(1, args.devices_per_node)
        executor = Subprocesses(prefix)
    runner = SweepRunner(plan, executor, workers=args.workers)
    outcomes = runner.run(only)
    failed = [o for o in outcomes if o.status == "FAILED"]
    killed = [o for o in outcomes if o.status == "KILLED"]
    counts = {s: sum(o.status == s for o in outcomes) for s in ("FINISHED", "SKIPPED", "FAILED", "KILLED")}
    print(
        f"sweep {plan.spec.name}: "
        + ", ".join(f"{v} {k.lower()}" for k, v in counts.items() if v)
        + f"; parent run {runner.parent_id}"
    )
    for o in failed:
        print(f"  FAILED {o.point.run_name}: {o.message}; log: {plan.log_file(o.point)}")
    print(last_line(plan, runner.client))
    if killed:
        return EXIT_INTERRUPTED
    return min(len(failed), MAX_FAILED_CODE)


def _store_exists(uri: str) -> bool:
    """A dry run must not create an empty sqlite store (and wait for its migrations) just to read it."""
    if uri.startswith("sqlite:///"):
        return Path(uri[len("sqlite:///") :]).is_file()
    return True


def _print_commands(args: argparse.Namespace, plan, parent_id: str, only: list[int] | None) -> None:
    from sweeps import launchers

    points = [p for p in plan.points if only is None or p.index in only]
    if args.launcher == "slurm":
        path = Path(args.script) if args.script else plan.log_dir / f"{plan.spec.name}.sbatch"
        print(f"\n# {path} (not written: --dry-run)")
        print(_slurm_text(args, plan))
        return
    together = (" (points that differ in optimizer hyperparameters and seed in one fit: vectorize_arms)"
                if plan.spec.vectorize_arms else " (a point's seeds in one fit: vectorize_seeds)"
                if plan.spec.vectorize_seeds else "")
    print(f"\n# commands, one point after the other{together}:")
    for job in plan.jobs(points):
        p = job[0]
        if plan.spec.vectorize_seeds:
            fit = plan.seeds_fit_args(job, parent_id)
            header = f"# {plan.group_name(p)} (points {', '.join(str(q.index) for q in job)})"
        else:
            fit = plan.fit_args(p, parent_id)
            header = f"# point {p.index}: {p.run_name}"
        steps = [fit] + ([plan.test_args(q) for q in job] if plan.spec.test else [])
        if args.launcher == "torchrun":
            lines = launchers.torchrun_commands(steps, args.nodes, args.devices_per_node)
        else:
            prefix = (args.exec_prefix + " ") if args.exec_prefix else ""
            lines = [f"{prefix}python main.py {shlex.join(s)}" for s in steps]
        print(header)
        print("\n".join(lines))
    if args.launcher == "torchrun" and args.nodes > 1:
        print(
            f"# start each line on all {args.nodes} nodes with NODE_RANK=0..{args.nodes - 1} and the same "
            "MASTER_ADDR (the address of node 0) and MASTER_PORT"
        )


def _slurm_text(args: argparse.Namespace, plan) -> str:
    from sweeps import launchers

    return launchers.slurm_script(
        sweep_file=plan.spec.path,
        name=plan.spec.name,
        n_points=len(plan.points),
        tracking_uri=plan.tracking_uri,
        log_dir=plan.log_dir,
        max_parallel=args.max_parallel,
        nodes=args.nodes,
        devices=args.devices_per_node,
        options=args.slurm_option,
        setup=args.slurm_setup,
    )


def _write_slurm(args: argparse.Namespace, plan) -> Path:

    path = Path(args.script) if args.script else plan.log_dir / f"{plan.spec.name}.sbatch"
    path.parent.mkdir(parents=True, exist_ok=True)
    plan.log_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(_slurm_text(args, plan))
    path.chmod(0o755)
    return path


def compare_main(argv: list[str]) -> int:
    from sweeps.compare import compare
    from sweeps.output import slug, table, write_outputs
    from sweeps.runner import client_for
    from tracking.uri import check_tracking_server, default_tracking_uri

    args = compare_parser().parse_args(argv)
    uri = default_tracking_uri()
    if not _store_exists(uri):
        raise SweepError(f"no MLflow store at {uri}: run something first, or set MLFLOW_TRACKING_URI")
    check_tracking_server(uri)
    client = client_for(uri)
    result = compare(
        client, args.experiment, args.metric, by=args.by, sweep=args.sweep, x=args.x, mode=args.mode,
        agg=args.agg, steps=args.steps, baseline=args.baseline, x_per_group=args.per_group,
        leave_one_out=args.leave_one_out, pool_datasets=args.pool_datasets, where=args.where,
        bootstrap=args.bootstrap, divide_by=args.divide_by,
    )
    print(table(result))
    out = Path(args.out) if args.out else Path("compare") / slug(args.experiment) / slug(args.sweep or "all")
    files = write_outputs(client, result, out, log_to_parent=not args.no_log)
    print("wrote " + ", ".join(str(p) for p in files.values()))
    if result.parent_id and not args.no_log:
        print(f"logged to the sweep's parent run {result.parent_id} under compare/")
    return 0
