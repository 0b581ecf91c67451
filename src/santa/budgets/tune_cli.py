"""``santa tune budgets|evaluate``: learn a per-layer schedule (Algorithm 1 on Ray) and compare it
with the uniform schedule of the same total on held-out prompts."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from santa.budgets.cli_args import (
    add_model_arguments,
    check_model_arguments,
    check_plot,
    int_list,
    positive_float,
)
from santa.cliargs import nonnegative_int, positive_int

DEFAULT_MAX_STALENESS = 4  # policy versions; a run's episodes lag by about (workers − 1) versions when workers keep pace


def workers_arg(text: str) -> int | None:
    if text == "auto":
        return None
    return positive_int(text)


def staleness_arg(text: str) -> int | str | None:
    """``auto`` (kept as the string), ``none`` (None: keep every episode) or an int ≥ 0."""
    if text == "none":
        return None
    return text if text == "auto" else nonnegative_int(text)


def resolve_staleness(value: int | str | None, out: str) -> int | None:
    """``--max-staleness``: as given; ``auto`` is the saved value of a run being resumed (none for a
    run made before the limit existed) and :data:`DEFAULT_MAX_STALENESS` for a new one."""
    if value != "auto":
        return value
    from santa.budgets.checkpoint import RUN

    try:
        return json.loads((Path(out) / RUN).read_text(encoding="utf-8")).get("max_staleness")
    except (OSError, ValueError, AttributeError):  # a new run; or an unreadable run.json, which checkpoint.prepare names
        return DEFAULT_MAX_STALENESS


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="santa tune", description="Per-layer sample budgets by REINFORCE (the paper's Algorithm 1).")
    sub = parser.add_subparsers(dest="command", required=True)

    tune = sub.add_parser(
        "budgets",
        help="learn how to spread a total budget over layers (Ray workers; resumable)",
        description="Algorithm 1 on Ray. Re-run the same command to resume from OUT/history.jsonl.",
    )
    tune.add_argument("--out", required=True, help="run folder: run.json, history.jsonl, policy.json, schedule.json, plots")
    tune.add_argument("--reward", default="kl", help="kl (−KL vs dense), a task (niah_multivalue, variable_tracking, gsm8k, mmlu, …) or synthetic")
    tune.add_argument("--total", type=positive_int, default=None, help="N, samples summed over layers (default 8·L, the paper's 224 for 28 layers)")
    tune.add_argument("--floor", type=nonnegative_int, default=1, help="samples every layer keeps (default 1; the multinomial spreads N − floor·L)")
    tune.add_argument("--alpha", type=positive_float, default=0.02, help="learning rate α (default 0.02)")
    tune.add_argument("--episodes", type=positive_int, default=10, help="E, episodes per worker run (default 10)")
    tune.add_argument("--questions", type=positive_int, default=16, help="prompts per episode (default 16)")
    tune.add_argument("--train-prompts", type=int_list, default=list(range(1000, 2000)), help="training prompt seeds (default 1000-1999)")
    tune.add_argument("--iterations", type=positive_int, default=500, help="policy updates to reach (default 500; the paper ran 501)")
    tune.add_argument(
        "--max-seconds", type=positive_float, default=None,
        help="stop dispatching after this many seconds of this session, accept the runs in flight and end (re-run to resume)",
    )
    tune.add_argument(
        "--max-staleness", type=staleness_arg, default="auto",
        help=f"drop episodes drawn more than this many policy versions ago (slow CPU workers beside GPU ones lag "
             f"by many); none keeps all (default auto: {DEFAULT_MAX_STALENESS} for a new run, the saved value on resume)",
    )
    tune.add_argument("--baseline", default="running", choices=("running", "batch"), help="running mean of all rewards (default) or the batch mean")
    tune.add_argument("--seed", type=nonnegative_int, default=0)
    tune.add_argument("--workers", type=workers_arg, default=None, help="workers, or auto: one per GPU, else one per --threads CPUs (default auto)")
    tune.add_argument(
        "--cpu-workers", type=nonnegative_int, default=0,
        help="with --device cuda: this many CPU workers beside the GPU workers, --threads torch threads (and Ray CPUs) each (default 0)",
    )
    tune.add_argument("--address", default=None, help="join this Ray cluster (e.g. auto, or host:6379) instead of starting a local Ray")
    tune.add_argument("--num-cpus", type=positive_int, default=None, help="CPUs of the local Ray (default: all)")
    tune.add_argument("--num-gpus", type=nonnegative_int, default=None, help="GPUs of the local Ray (default: all it finds)")
    tune.add_argument("--no-plots", action="store_true", help="skip the learning-curve and schedule plots")
    tune.add_argument("--no-progress", action="store_true")
    add_model_arguments(tune)
    tune.set_defaults(device="auto", threads=1)

    ev = sub.add_parser(
        "evaluate",
        help="score schedule files and the uniform schedule of the same total on held-out prompts (paired CIs)",
        description="Appends one JSONL line per finished cell to --out and skips cells already there.",
    )
    ev.add_argument("--schedule", action="append", required=True, type=Path, help="a schedule JSON file (repeat for several)")
    ev.add_argument("--out", required=True, help="JSONL records (appended to; re-run to resume)")
    ev.add_argument("--metric", default="kl", help="kl or a task name")
    ev.add_argument("--prompts", type=int_list, default=list(range(32)), help="held-out prompt seeds (default 0-31)")
    ev.add_argument("--seeds", type=int_list, default=[0], help="sampler seeds (default 0)")
    ev.add_argument("--batch", type=positive_int, default=16, help="prompts run together")
    ev.add_argument("--ablation", default=None, help="an ablation JSONL of `santa ablate layers`: report the schedules' agreement with it")
    ev.add_argument("--no-progress", action="store_true")
    add_model_arguments(ev)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "budgets":
        return budgets(parser, args)
    return evaluate(parser, args)


def budgets(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    check_model_arguments(parser, args, metric="kl" if args.reward == "synthetic" else args.reward, auto_device=True)
    if args.questions > len(args.train_prompts):
        parser.error(f"--questions ({args.questions}) exceeds the {len(args.train_prompts)} --train-prompts")
    check_plot(parser, not args.no_plots)
    check_workers(parser, args)
    from santa.budgets.distributed import RayMissing, import_ray

    try:
        import_ray()
    except RayMissing as error:
        parser.error(str(error))
    from santa.budgets.rewards import RewardSpec, check_prompts, model_layers

    try:
        n_layers = model_layers(args.model)
    except (OSError, ValueError) as error:
        parser.error(f"cannot read the layers of {args.model!r}: {error}")
    if args.reward != "synthetic":
        try:
            check_prompts(args.model, metric=args.reward, length=args.length, prompt=args.train_prompts[0])
        except ValueError as error:
            parser.error(f"--reward {args.reward} at --length {args.length}: {error}")
    total = args.total if args.total is not None else 8 * n_layers
    if total < args.floor * n_layers:
        parser.error(f"--total ({total}) is below --floor × layers ({args.floor} × {n_layers})")
    if args.floor == 0 and args.reward != "synthetic":
        parser.error("--floor 0 can give a layer S = 0, which sampled attention cannot run; use --floor ≥ 1")

    from santa.budgets.checkpoint import CheckpointError, TuneSpec
    from santa.budgets.distributed import tune

    reward = RewardSpec(
        kind=args.reward, model=args.model, length=args.length, questions=args.questions, pool=tuple(args.train_prompts),
        sampler=args.sampler, prefill=args.prefill, kl_tokens=args.kl_tokens, max_new_tokens=args.max_new_tokens,
    )
    spec = TuneSpec(reward=reward, n_layers=n_layers, total=total, floor=args.floor, alpha=args.alpha, episodes=args.episodes,
                    baseline=args.baseline, seed=args.seed, max_staleness=resolve_staleness(args.max_staleness, args.out))
    try:
        result = tune(
            spec, out=args.out, iterations=args.iterations, workers=args.workers, address=args.address, num_cpus=args.num_cpus,
            num_gpus=args.num_gpus, device=args.device, threads=args.threads or 1, cpu_workers=args.cpu_workers,
            max_seconds=args.max_seconds, progress=not args.no_progress,
        )
    except CheckpointError as error:
        parser.error(str(error))
    except RuntimeError as error:  # workers that cannot start (a model that does not load, …)
        print(f"santa tune: error: {error}", file=sys.stderr)
        return 1
    dropped = sum(len(u.get("dropped", [])) for u in result.updates)
    limit = "none" if spec.max_staleness is None else spec.max_staleness
    print(f"updates {result.state.version}, episodes {result.state.reward_count} "
          f"(+{dropped} dropped as more than {limit} versions stale), running mean reward {result.state.running_mean}")
    print(f"schedule (N = {total}): {result.schedule}")
    print(f"wrote {Path(args.out) / 'schedule.json'}")
    if not args.no_plots:
        from santa.budgets.plots import plot_learning_curve, plot_schedule
        from santa.budgets.reinforce import softmax

        title = f"{args.model}, reward {args.reward}, N = {total} over {n_layers} layers"
        print(f"wrote {plot_learning_curve(result.updates, Path(args.out) / 'learning_curve.png', title=title)}")
        probs = softmax(result.state.theta)
        print(f"wrote {plot_schedule(result.schedule, Path(args.out) / 'schedule.png', probs=probs, floor=args.floor, title=title)}")
    return 0


def check_workers(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """--cpu-workers needs --device cuda; --num-gpus is for a local Ray; a local Ray must have the CPUs
    (and the GPUs, where --num-gpus says) for every worker asked for, since none could ever start otherwise."""
    from santa.budgets.distributed import missing_resources

    if args.cpu_workers and args.device != "cuda":
        parser.error(f"--cpu-workers adds CPU workers beside the GPU workers: it needs --device cuda, got --device {args.device} (for CPU workers alone use --device cpu --workers N)")
    if args.address is not None:
        if args.num_gpus is not None or args.num_cpus is not None:
            parser.error("--num-cpus and --num-gpus size the local Ray; with --address the cluster has its own")
        return
    if args.device == "auto":
        return  # CPU or GPU workers: known once Ray has started
    threads = args.threads or 1
    cpus = args.num_cpus or len(os.sched_getaffinity(0))
    gpus = args.num_gpus if args.num_gpus is not None else (args.workers or 1)  # without --num-gpus: checked once Ray has started
    problem = missing_resources({"CPU": cpus, "GPU": gpus}, device=args.device, workers=args.workers, cpu_workers=args.cpu_workers, threads=threads)
    if problem:
        parser.error(f"the local Ray cannot run these workers ({'--num-cpus' if args.num_cpus else 'this machine'}: {cpus} CPUs): {problem}")


def evaluate(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    check_model_arguments(parser, args, metric=args.metric)
    from santa.budgets.schedule import load_layer_budgets, uniform_schedule

    schedules = {}
    for path in args.schedule:
        try:
            budgets = load_layer_budgets(path)
        except ValueError as error:
            parser.error(str(error))
        if sorted(budgets) != list(range(len(budgets))):
            parser.error(f"schedule file {path}: layers must be 0…L−1, got {sorted(budgets)}")
        schedules[f"schedule {path.stem}"] = tuple(budgets[l] for l in range(len(budgets)))
    shapes = {(len(s), sum(s)) for s in schedules.values()}
    if len(shapes) > 1:
        parser.error(f"the schedules must share their layer count and total, got (layers, total) {sorted(shapes)}")
    (n_layers, total), = shapes
    from santa.budgets.rewards import check_prompts, model_layers

    if model_layers(args.model) != n_layers:
        parser.error(f"the schedules have {n_layers} layers, {args.model} has {model_layers(args.model)}")
    try:
        check_prompts(args.model, metric=args.metric, length=args.length, prompt=args.prompts[0])
    except ValueError as error:
        parser.error(f"--metric {args.metric} at --length {args.length}: {error}")
    if args.ablation and not Path(args.ablation).exists():
        parser.error(f"--ablation {args.ablation}: no such file")
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    from santa.budgets.ablate_cli import load_scorer, scoring_setting
    from santa.budgets.sweep import Cell, cell_key, compare, existing_records, run_cells, table

    uniform = tuple(uniform_schedule(n_layers=n_layers, total=total))
    cells = [Cell("uniform", uniform, seed) for seed in args.seeds]
    cells += [Cell(name, s, seed) for seed in args.seeds for name, s in schedules.items()]
    setting = scoring_setting(args, metric=args.metric)
    run_cells(cells, out=args.out, prompts=args.prompts, setting=setting, make_scorer=lambda: load_scorer(args, metric=args.metric), progress=not args.no_progress)
    keys = {cell_key(c, setting=setting, prompts=args.prompts) for c in cells}
    print(table(compare([r for r in existing_records(args.out) if r["key"] in keys]), metric=args.metric))
    if args.ablation:
        from santa.budgets.agreement import agreement

        records = existing_records(args.ablation)
        metric = records[0]["metric"] if records else args.metric
        ablation = compare(records)
        for name, s in schedules.items():
            rho, sensitive, most = agreement(s, ablation, metric=metric)
            print(f"{name}: Spearman ρ(samples, one-hot sensitivity) = {rho:+.2f}; most sensitive layers {sensitive}, most samples {most}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
