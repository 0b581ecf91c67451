"""``santa eval run|report|variance|bernoulli``: accuracy sweeps, their report, variance and Bernoulli qKᵀ diagnostics."""

from __future__ import annotations

import argparse
import json
import sys

from santa.eval.runner import MAX_NEW_TOKENS, METHODS, grid, run_sweep
from santa.eval.tasks import TASKS


def _ints(text: str) -> list[int]:
    """``"16,32,64"`` or a range ``"0-49"`` (inclusive) → list of ints."""
    out: list[int] = []
    for part in text.split(","):
        if "-" in part.strip()[1:]:
            lo, hi = part.split("-")
            out += list(range(int(lo), int(hi) + 1))
        elif part.strip():
            out.append(int(part))
    return out


def _strs(text: str) -> list[str]:
    return [p.strip() for p in text.split(",") if p.strip()]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="santa eval", description="Accuracy of SANTA / S²ANTA on the bundled real models."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run a sweep grid; appends to --out and skips jobs already there")
    run.add_argument("--out", required=True, help="JSONL results file (appended to; re-run to resume)")
    run.add_argument("--model", default="smollm2-135m", type=_strs, help="comma list: smollm2-135m, qwen2.5-coder-0.5b")
    run.add_argument("--tasks", default="niah_single", type=_strs, help=f"comma list of {', '.join(TASKS)}")
    run.add_argument("--lengths", default="2048", type=_ints, help="prompt lengths in tokens, comma list")
    run.add_argument("--methods", default=",".join(METHODS), type=_strs)
    run.add_argument("--budgets", default="16,32,64,128,256", type=_ints)
    run.add_argument("--prompts", default="0-9", type=_ints, help="prompt seeds: '0-49' or a comma list")
    run.add_argument("--seeds", default="0", type=_ints, help="sampler seeds for stochastic methods")
    run.add_argument("--prefill", default="dense", type=_strs, help="dense (decode-only sampling) and/or sampled")
    run.add_argument("--max-new-tokens", type=int, default=MAX_NEW_TOKENS)
    run.add_argument(
        "--score-samples",
        default="0",
        type=_ints,
        help="Bernoulli qKᵀ draws B for the decode scores, e.g. 0,8,16 (0: exact scores; dense with B > 0 samples the scores alone)",
    )
    run.add_argument(
        "--kl-tokens", type=int, default=32, help="teacher-forced tokens per KL prompt (T; T−1 are scored)"
    )
    run.add_argument(
        "--exact-when-covers", action="store_true", help="use exact attention when S ≥ keys (off: always sample)"
    )
    run.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    run.add_argument("--batch", type=int, default=8, help="prompts run together (left-padded)")
    run.add_argument("--threads", type=int, default=None, help="torch CPU threads")

    rep = sub.add_parser("report", help="table with bootstrap CIs, and plots")
    rep.add_argument("jsonl", nargs="+")
    rep.add_argument("--plots", default=None, help="folder for the plots")
    rep.add_argument("--pivot", action="store_true", help="paper-style tables: methods × S per task")
    rep.add_argument("--delta", action="store_true", help="with --pivot: paired difference to dense (points)")
    rep.add_argument(
        "--smallest-budgets", action="store_true", help="per task: smallest S matching dense from there on"
    )
    rep.add_argument(
        "--compare",
        default=None,
        metavar="A,B",
        help="paired difference A − B of two sampled or top-k methods on the same prompts, e.g. systematic,topk",
    )

    var = sub.add_parser("variance", help="variance trace and unique keys vs S on real prompts")
    var.add_argument("--model", default="smollm2-135m")
    var.add_argument("--task", default="niah_single")
    var.add_argument("--length", type=int, default=2048)
    var.add_argument("--prompts", type=int, default=4)
    var.add_argument("--budgets", default="8,16,32,64,128,256,512", type=_ints)
    var.add_argument("--replicates", type=int, default=32, help="systematic: replicate offsets R")
    var.add_argument("--out", default="benchmarks/eval/variance.json")
    var.add_argument("--plot", default="benchmarks/eval/variance.png")
    var.add_argument("--device", default=None)

    ber = sub.add_parser("bernoulli", help="Bernoulli qKᵀ: key features read and KL vs the number of draws B")
    ber.add_argument("--model", default="smollm2-135m")
    ber.add_argument("--task", default="niah_single")
    ber.add_argument("--length", type=int, default=2048)
    ber.add_argument("--prompts", type=int, default=4)
    ber.add_argument("--samples", default="1,2,4,8,16,32", type=_ints, help="numbers of ternary draws B")
    ber.add_argument("--out", default="benchmarks/eval/bernoulli.json")
    ber.add_argument("--plot", default="benchmarks/eval/bernoulli.png")
    ber.add_argument("--device", default=None)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "threads", None):
        import torch

        torch.set_num_threads(args.threads)
    if args.command == "run":
        jobs = grid(
            models=args.model,
            tasks=args.tasks,
            lengths=args.lengths,
            methods=args.methods,
            budgets=args.budgets,
            prompts=args.prompts,
            seeds=args.seeds,
            prefills=args.prefill,
            max_new_tokens=args.max_new_tokens,
            kl_tokens=args.kl_tokens,
            score_samples=args.score_samples,
            exact_when_covers=args.exact_when_covers,
        )
        ran = run_sweep(jobs, args.out, device=args.device, batch_size=args.batch)
        print(f"{len(jobs)} jobs in the grid, {ran} run now, {len(jobs) - ran} already in {args.out}")
        return 0
    if args.command == "report":
        from santa.eval.report import (
            cells,
            compare_methods,
            pivot,
            plot,
            plot_delta,
            smallest_matching_budgets,
            table,
        )
        from santa.eval.runner import read_records

        pair = None if args.compare is None else args.compare.split(",")
        if pair is not None and len(pair) != 2:
            raise SystemExit(f"--compare takes two methods A,B (e.g. systematic,topk), got {args.compare!r}")
        records = [r for path in args.jsonl for r in read_records(path)]
        # the cells (a bootstrap each) are needed by every output but --compare, and by the plots
        all_cells = cells(records) if pair is None or args.plots else []
        if pair is not None:
            try:
                print(compare_methods(records, *pair))
            except ValueError as error:
                raise SystemExit(f"--compare: {error}") from None
        elif args.smallest_budgets:
            print(smallest_matching_budgets(all_cells))
        else:
            print(pivot(all_cells, delta=args.delta) if args.pivot else table(all_cells))
        if args.plots and all_cells:
            for path in plot(all_cells, args.plots) + plot_delta(all_cells, args.plots):
                print(f"wrote {path}")
        return 0
    if args.command == "variance":
        import torch

        from santa.assets import load_model
        from santa.eval.variance import diagnostics, plot_diagnostics, save

        device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
        model, tokenizer = load_model(args.model, device=device)
        result = diagnostics(
            model,
            tokenizer,
            task=args.task,
            length=args.length,
            prompts=args.prompts,
            budgets=args.budgets,
            replicates=args.replicates,
            group_size=model.config.num_attention_heads // model.config.num_key_value_heads,
        )
        result["model"] = args.model
        save(result, args.out)
        plot_diagnostics(result, args.plot)
        print(
            json.dumps(
                {k: result[k] for k in ("slopes", "trace", "unique_keys", "unique_keys_kv", "mean_keys")}, indent=1
            )
        )
        print(f"wrote {args.out} and {args.plot}")
        return 0
    if args.command == "bernoulli":
        import torch

        from santa.assets import load_model
        from santa.eval.score_stage import bernoulli_diagnostics, plot_bernoulli
        from santa.eval.variance import save

        if not args.samples or min(args.samples) < 1:
            raise SystemExit(f"--samples must be integers ≥ 1, got {args.samples}")
        device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
        model, tokenizer = load_model(args.model, device=device)
        result = bernoulli_diagnostics(
            model, tokenizer, task=args.task, length=args.length, prompts=args.prompts, samples=args.samples
        )
        result["model"] = args.model
        save(result, args.out)
        plot_bernoulli(result, args.plot)
        print(json.dumps({k: result[k] for k in ("samples", "read_kv", "read_head_kv", "kl")}, indent=1))
        print(f"wrote {args.out} and {args.plot}")
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
