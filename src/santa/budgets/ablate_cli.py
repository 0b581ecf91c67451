"""``santa ablate layers``: the one-hot layer ablation (Fig. 8), resumable, with paired bootstrap CIs."""

from __future__ import annotations

import argparse
import sys

from santa import cliargs
from santa.budgets.cli_args import (
    add_model_arguments,
    cell_file,
    check_model_arguments,
    check_plot,
    layer_list,
    prompt_list,
    seed_list,
)
from santa.cliargs import positive_int

PROG = "santa ablate layers"
EXIT_STATUS = (
    "exit status: 0 done; 1 the run failed or --out cannot be used (another run is writing it, or it is not a cells "
    "file); 2 a bad command line (refused before any work); 130 interrupted (Ctrl-C)"
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="santa ablate", description="Per-layer sensitivity to the sample budget.", epilog=EXIT_STATUS)
    sub = parser.add_subparsers(dest="command", required=True)
    layers = sub.add_parser(
        "layers",
        help="S = 1 in one layer, a base budget elsewhere, for every layer, vs the uniform baseline",
        description="The one-hot ablation: appends one JSONL line per finished cell to --out and skips cells already there. "
        "One run per --out at a time.",
        epilog=EXIT_STATUS,
    )
    layers.add_argument("--out", required=True, type=cell_file, help="JSONL records (appended to; re-run to resume)")
    layers.add_argument("--metric", default="kl", help="kl (lower is better) or a task: niah_multivalue, variable_tracking, gsm8k, …")
    layers.add_argument("--base", type=positive_int, default=16, help="samples in every other layer (paper: 16 for DeepSeek-7B)")
    layers.add_argument("--one-hot", type=positive_int, default=1, help="samples in the ablated layer (default 1)")
    layers.add_argument("--layers", type=layer_list, default=None, help="layers to ablate, e.g. '0-9' (default: all)")
    layers.add_argument("--prompts", type=prompt_list, default=list(range(16)), help=f"held-out prompt seeds, at most {cliargs.MAX_VALUES} (default 0-15)")
    layers.add_argument("--seeds", type=seed_list, default=[0], help="sampler seeds in [0, 2**63) (default 0)")
    layers.add_argument("--batch", type=positive_int, default=16, help="prompts run together")
    layers.add_argument(
        "--plot", type=cliargs.figure_file, default=None,
        help="write the Fig. 8-style plot here, e.g. ablation.png (needs matplotlib: pip install 'santa-attention[plot]')",
    )
    layers.add_argument("--no-progress", action="store_true")
    add_model_arguments(layers)
    layers.set_defaults(parser=layers)  # cross-flag errors print the subcommand's usage
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    parser = args.parser  # santa ablate layers: its usage above its errors
    check_model_arguments(parser, args, metric=args.metric)
    check_plot(parser, args.plot is not None)
    if args.one_hot == args.base:
        parser.error(f"argument --one-hot: must differ from --base ({args.base}): every one-hot cell would be the uniform baseline")
    if args.plot is not None and cliargs.same_file(args.out, cliargs.figure_written(args.plot)):
        parser.error(f"argument --plot: {args.plot} is also --out; give the figure and the cells files of their own")
    from santa.budgets.rewards import check_prompts, model_layers

    try:
        n_layers = model_layers(args.model)
    except (OSError, ValueError) as error:
        parser.error(f"cannot read the layers of {args.model!r}: {error}")
    try:
        check_prompts(args.model, metric=args.metric, length=args.length, prompt=args.prompts[0])
    except ValueError as error:
        parser.error(f"--metric {args.metric} at --length {args.length}: {error}")
    if args.layers is not None and max(args.layers) >= n_layers:
        parser.error(f"--layers must lie in 0-{n_layers - 1} ({args.model} has {n_layers} layers), got {max(args.layers)}")
    return failed_as_exit_1(PROG, lambda: run(args, n_layers))


def failed_as_exit_1(prog: str, work) -> int:
    """``work()``'s exit status, or 1 with one line on stderr when its output file cannot be used
    (another run holds it, a malformed line: the message names the file and line; a file that cannot
    be written, a full disk)."""
    from santa.sweep_files import SweepFileError

    try:
        return work()
    except BrokenPipeError:  # the reader of stdout left: santa.cli stops quietly
        raise
    except (SweepFileError, OSError) as error:
        print(f"{prog}: error: {error}", file=sys.stderr)
        return 1


def run(args: argparse.Namespace, n_layers: int) -> int:
    from santa.budgets.ablate import BASELINE, layer_cells, plot_ablation
    from santa.budgets.sweep import cell_key, compare, existing_records, run_cells, table

    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    setting = scoring_setting(args, metric=args.metric)
    cells = layer_cells(n_layers=n_layers, base=args.base, one_hot=args.one_hot, layers=args.layers, seeds=args.seeds)
    run_cells(cells, out=args.out, prompts=args.prompts, setting=setting, make_scorer=lambda: load_scorer(args, metric=args.metric), progress=not args.no_progress)
    keys = {cell_key(c, setting=setting, prompts=args.prompts) for c in cells}  # the file may hold other grids too
    records = [r for r in existing_records(args.out) if r["key"] in keys]
    comparisons = compare(records, baseline=BASELINE)
    print(table(comparisons, metric=args.metric))
    if args.plot:
        title = f"{args.model}, {args.metric}, {args.length} tokens, base S={args.base}, one-hot S={args.one_hot}, {len(args.prompts)} prompts"
        print(f"wrote {plot_ablation(comparisons, args.plot, metric=args.metric, title=title)}")
    return 0


def scoring_setting(args: argparse.Namespace, *, metric: str) -> dict:
    """What every cell of a sweep shares, as written into its records and keys."""
    setting = {"model": args.model, "metric": metric, "length": args.length, "sampler": args.sampler}
    if metric == "kl":
        setting["kl_tokens"] = args.kl_tokens
    else:
        setting.update(prefill=args.prefill, max_new_tokens=args.max_new_tokens)
    return setting


def load_scorer(args: argparse.Namespace, *, metric: str):
    from santa.budgets.rewards import load
    from santa.budgets.scorers import make_scorer

    model, tokenizer = load(args.model, args.device)
    return make_scorer(
        model, tokenizer, metric=metric, length=args.length, kl_tokens=args.kl_tokens,
        max_new_tokens=args.max_new_tokens, sampler=args.sampler, prefill=args.prefill, batch=args.batch,
    )


if __name__ == "__main__":
    sys.exit(main())
