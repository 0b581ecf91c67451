"""``santa tune budgets|evaluate``: learn a per-layer schedule (Algorithm 1 on Ray) and compare it
with the uniform schedule of the same total on held-out prompts."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from santa import cliargs
from santa.budgets.cli_args import (
    add_model_arguments,
    cell_file,
    check_model_arguments,
    check_plot,
    existing_file,
    positive_float,
    prompt_list,
    seed_list,
    tune_device,
)
from santa.cliargs import nonnegative_int, positive_int

EXIT_STATUS = (
    "exit status: 0 done; 1 the run failed or --out cannot be used (another run is writing it, a corrupt run.json "
    "or history line, a file that is not a cells file); 2 a bad command line (refused before any work); "
    "130 interrupted (Ctrl-C)"
)
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
    run made before the limit existed) and :data:`DEFAULT_MAX_STALENESS` for a new one.
    A ``run.json`` that cannot be read raises :class:`~santa.budgets.run_folder.CheckpointError` naming it."""
    if value != "auto":
        return value
    from santa.budgets.run_folder import saved_spec

    saved = saved_spec(out)
    return DEFAULT_MAX_STALENESS if saved is None else saved.get("max_staleness")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="santa tune", description="Per-layer sample budgets by REINFORCE (the paper's Algorithm 1).", epilog=EXIT_STATUS
    )
    sub = parser.add_subparsers(dest="command", required=True)

    tune = sub.add_parser(
        "budgets",
        help="learn how to spread a total budget over layers (Ray workers; resumable)",
        description="Algorithm 1 on Ray. Re-run the same command to resume from OUT/history.jsonl; one driver per --out at a time.",
        epilog=EXIT_STATUS,
    )
    tune.add_argument("--out", required=True, type=cliargs.output_folder, help="run folder: run.json, history.jsonl, policy.json, schedule.json, plots")
    tune.add_argument("--reward", default="kl", help="kl (−KL vs dense), a task (niah_multivalue, variable_tracking, gsm8k, mmlu, …) or synthetic")
    tune.add_argument("--total", type=positive_int, default=None, help="N, samples summed over layers (default 8·L, the paper's 224 for 28 layers)")
    tune.add_argument("--floor", type=nonnegative_int, default=1, help="samples every layer keeps (default 1; the multinomial spreads N − floor·L)")
    tune.add_argument("--alpha", type=positive_float, default=0.02, help="learning rate α (default 0.02)")
    tune.add_argument("--episodes", type=positive_int, default=10, help="E, episodes per worker run (default 10)")
    tune.add_argument("--questions", type=positive_int, default=16, help="prompts per episode (default 16)")
    tune.add_argument("--train-prompts", type=prompt_list, default=list(range(1000, 2000)),
                      help=f"training prompt seeds, at most {cliargs.MAX_VALUES} (default 1000-1999)")
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
    tune.add_argument("--seed", type=cliargs.seed, default=0, help="seed of the schedule draws and the sampler, in [0, 2**63) (default 0)")
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
    add_model_arguments(tune, device=tune_device)
    tune.set_defaults(device="auto", threads=1, parser=tune)  # parser: cross-flag errors print the subcommand's usage

    ev = sub.add_parser(
        "evaluate",
        help="score schedule files and the uniform schedule of the same total on held-out prompts (paired CIs)",
        description="Appends one JSONL line per finished cell to --out and skips cells already there; one run per --out at a time.",
        epilog=EXIT_STATUS,
    )
    ev.add_argument(
        "--schedule", action="append", required=True, type=existing_file,
        help="a schedule JSON file (repeat for several; files of one name are told apart by their folders)",
    )
    ev.add_argument("--out", required=True, type=cell_file, help="JSONL records (appended to; re-run to resume)")
    ev.add_argument("--metric", default="kl", help="kl or a task name")
    ev.add_argument("--prompts", type=prompt_list, default=list(range(32)), help=f"held-out prompt seeds, at most {cliargs.MAX_VALUES} (default 0-31)")
    ev.add_argument("--seeds", type=seed_list, default=[0], help="sampler seeds in [0, 2**63) (default 0)")
    ev.add_argument("--batch", type=positive_int, default=16, help="prompts run together")
    ev.add_argument(
        "--ablation", default=None, type=existing_file,
        help="an ablation JSONL of santa ablate layers (same model): report the schedules' agreement with it",
    )
    ev.add_argument("--no-progress", action="store_true")
    add_model_arguments(ev)
    ev.set_defaults(parser=ev)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "budgets":  # args.parser: the subcommand's, whose usage its errors print
        return budgets(args.parser, args)
    return evaluate(args.parser, args)


def budgets(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    synthetic = args.reward == "synthetic"  # no model runs: --length does not apply
    check_model_arguments(parser, args, metric="kl" if synthetic else args.reward, context=not synthetic, flag="--reward",
                          other_choices=("synthetic",))
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

    from santa.budgets.distributed import tune
    from santa.budgets.run_folder import CheckpointError, RunMismatch, TuneSpec

    reward = RewardSpec(
        kind=args.reward, model=args.model, length=args.length, questions=args.questions, pool=tuple(args.train_prompts),
        sampler=args.sampler, prefill=args.prefill, kl_tokens=args.kl_tokens, max_new_tokens=args.max_new_tokens,
    )
    try:
        spec = TuneSpec(reward=reward, n_layers=n_layers, total=total, floor=args.floor, alpha=args.alpha, episodes=args.episodes,
                        baseline=args.baseline, seed=args.seed, max_staleness=resolve_staleness(args.max_staleness, args.out))
        result = tune(
            spec, out=args.out, iterations=args.iterations, workers=args.workers, address=args.address, num_cpus=args.num_cpus,
            num_gpus=args.num_gpus, device=args.device, threads=args.threads or 1, cpu_workers=args.cpu_workers,
            max_seconds=args.max_seconds, progress=not args.no_progress,
        )
    except RunMismatch as error:  # the command line asks for other settings than the folder's run: before any work
        parser.error(str(error))
    except (CheckpointError, RuntimeError) as error:  # a folder that cannot be used; workers that cannot start
        print(f"santa tune budgets: error: {error}", file=sys.stderr)
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
    if args.device == "cuda" and (args.num_gpus is None or args.reward != "synthetic") and not cuda_available():
        # a local Ray runs its workers here; only the synthetic reward on GPUs declared by --num-gpus loads no model
        parser.error("--device cuda: CUDA is not available on this machine (torch.cuda.is_available() is False) and a "
                     "local Ray runs its workers here; use --device cpu, or --address to join a cluster with GPUs")


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def schedule_labels(paths: list[str]) -> dict[str, str]:
    """A cell name per schedule file → its path: ``schedule STEM``, with as many parent folders as it
    takes to tell the file from the others (``schedule a/schedule``, ``schedule b/schedule``).
    A file given twice raises ValueError."""
    resolved = [Path(p).resolve() for p in paths]
    for i, path in enumerate(resolved):
        if path in resolved[:i]:
            raise ValueError(f"--schedule {paths[i]} is given twice")
    return {f"schedule {_label(path, [q for q in resolved if q != path])}": given for path, given in zip(resolved, paths, strict=True)}


def _label(path: Path, others: list[Path]) -> str:
    """The shortest ``folder/…/stem`` ending of ``path`` that no other path ends with, else the whole path
    (same folder and stem, another suffix). Endings of different depths never match, so labels are unique."""

    def ending(p: Path, depth: int) -> str:  # the stem and depth − 1 folders above it
        return "/".join((*p.parent.parts[max(len(p.parent.parts) - depth + 1, 0) :], p.stem))

    for depth in range(1, len(path.parts) + 1):
        if all(ending(path, depth) != ending(q, depth) for q in others):
            return ending(path, depth)
    return str(path)


def read_schedules(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, tuple[int, ...]]:
    """Every ``--schedule`` file as a cell name → schedule ``[L]`` (exit 2 naming a file that cannot be used)."""
    from santa.schedule_file import load_layer_budgets

    try:
        labels = schedule_labels(args.schedule)
    except ValueError as error:
        parser.error(str(error))
    schedules = {}
    for name, path in labels.items():
        try:
            budgets = load_layer_budgets(path)
        except ValueError as error:
            parser.error(str(error))
        if sorted(budgets) != list(range(len(budgets))):
            parser.error(f"schedule file {path}: layers must be 0…L−1, got {sorted(budgets)}")
        schedules[name] = tuple(budgets[l] for l in range(len(budgets)))
    return schedules


def read_ablation(path: str, *, model: str, n_layers: int) -> list[dict]:
    """The cells of one ablation of ``model`` with layers below ``n_layers``; SweepFileError naming the file otherwise."""
    from santa.budgets.sweep import existing_records
    from santa.sweep_files import SweepFileError

    records = existing_records(path)
    if not records:
        raise SweepFileError(f"{path}: holds no ablation cells")
    settings = {json.dumps({k: r.get(k) for k in ("model", "metric", "length", "sampler", "kl_tokens", "prefill", "max_new_tokens")}) for r in records}
    if len(settings) > 1:
        raise SweepFileError(f"{path}: holds cells of {len(settings)} settings (model, metric, length, …); give the file of one ablation")
    if not isinstance(records[0].get("metric"), str):
        raise SweepFileError(f"{path}: its cells have no metric; not a file of santa ablate layers")
    if records[0].get("model") != model:
        raise SweepFileError(f"{path}: an ablation of {records[0].get('model')!r}, not of --model {model}")
    layers = [r["layer"] for r in records if r["layer"] is not None]
    if layers and max(layers) >= n_layers:
        raise SweepFileError(f"{path}: ablates layer {max(layers)}, the schedules have {n_layers} layers")
    return records


def evaluate(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    check_model_arguments(parser, args, metric=args.metric)

    schedules = read_schedules(parser, args)
    shapes = {(len(s), sum(s)) for s in schedules.values()}
    if len(shapes) > 1:
        parser.error(f"the schedules must share their layer count and total, got (layers, total) {sorted(shapes)}")
    (n_layers, total), = shapes
    from santa.budgets.rewards import check_prompts, model_layers

    try:
        model_n_layers = model_layers(args.model)
    except (OSError, ValueError) as error:
        parser.error(f"cannot read the layers of {args.model!r}: {error}")
    if model_n_layers != n_layers:
        parser.error(f"the schedules have {n_layers} layers, {args.model} has {model_n_layers}")
    try:
        check_prompts(args.model, metric=args.metric, length=args.length, prompt=args.prompts[0])
    except ValueError as error:
        parser.error(f"--metric {args.metric} at --length {args.length}: {error}")
    from santa.budgets.ablate_cli import failed_as_exit_1

    return failed_as_exit_1("santa tune evaluate", lambda: score_schedules(args, schedules, n_layers=n_layers, total=total))


def score_schedules(args: argparse.Namespace, schedules: dict[str, tuple[int, ...]], *, n_layers: int, total: int) -> int:
    """Score the schedules and their uniform schedule (resumably), print the table and the agreement with --ablation."""
    from santa.budgets.ablate_cli import load_scorer, scoring_setting
    from santa.budgets.schedule import uniform_schedule
    from santa.budgets.sweep import Cell, cell_key, compare, existing_records, run_cells, table

    ablation = read_ablation(args.ablation, model=args.model, n_layers=n_layers) if args.ablation else None
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    uniform = tuple(uniform_schedule(n_layers=n_layers, total=total))
    cells = [Cell("uniform", uniform, seed) for seed in args.seeds]
    cells += [Cell(name, s, seed) for seed in args.seeds for name, s in schedules.items()]
    setting = scoring_setting(args, metric=args.metric)
    run_cells(cells, out=args.out, prompts=args.prompts, setting=setting, make_scorer=lambda: load_scorer(args, metric=args.metric), progress=not args.no_progress)
    keys = {cell_key(c, setting=setting, prompts=args.prompts) for c in cells}
    print(table(compare([r for r in existing_records(args.out) if r["key"] in keys]), metric=args.metric))
    if ablation is not None:
        from santa.budgets.agreement import agreement_text

        comparisons = compare(ablation)
        for name, s in schedules.items():
            print(f"{name}: {agreement_text(s, comparisons, metric=ablation[0]['metric'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
