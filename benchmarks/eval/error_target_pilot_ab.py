"""Which pilot estimates an error target's variance best (issue 42): iid against stratified and systematic pilots.

santa's rule (:mod:`santa.error_target`) chooses each row's budget from a pilot's sample variance T̂; the realised
error is convex in T̂, so a noisy T̂ raises it. On the synthetic "peaked" heads of
``error_target_calibration.py`` (8 heads, 8192 keys), iid outputs with each pilot: the realised ``E r² / ε²``
(mean over heads of the mean over seeds, its standard error over seeds), the worst head, and the mean budget.
santa ships the systematic pilot; the others are rebuilt here from the library's pieces for this comparison.

    python benchmarks/eval/error_target_pilot_ab.py OUT.jsonl [--seeds 200] [--targets 0.05,0.1] [--pilots 16,32]

One JSONL record per case (heads: synthetic peaked, 8 × 8192 keys; iid outputs), appended as it is measured; a re-run
skips the cases already in the file (the first version wrote one JSON at the end of each case: ``pilot_ab.json``).
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from error_target_calibration import (  # noqa: E402
    append_cases,
    number_list,
    one_call,
    ratio_summary,
    relative_error,
    relative_trace,
    synthetic_heads,
)

from santa.attention import pilot_moments, weighted_values  # noqa: E402
from santa.error_target import adaptive_budgets, pilot_statistics  # noqa: E402
from santa.sampling import SAMPLERS, sample_counts, sample_counts_per_row  # noqa: E402

CAP = 4096


def measure(probs, values, *, pilot_sampler: str, pilot: int, error_target: float, seeds: int) -> dict:
    """iid outputs with budgets from a ``pilot_sampler`` pilot of ``pilot`` draws, over ``seeds`` seeds."""
    _, exact = relative_trace(probs, values)
    p4, v4 = one_call(probs, values)
    ratios, budgets = [], []
    for seed in range(seeds):
        g = torch.Generator().manual_seed(seed)
        pilot_counts = sample_counts(p4, pilot, pilot_sampler, generator=g)
        trace, norm2 = pilot_statistics(*pilot_moments(pilot_counts, v4, pilot), pilot)
        budget = adaptive_budgets(trace, norm2, error_target, CAP, 1)  # no floor: the rule as this A/B measured it
        counts = sample_counts_per_row(p4, budget, "iid", cap=CAP, generator=g)
        out = weighted_values(counts.float() / budget.unsqueeze(-1).float(), v4)
        ratios.append(relative_error(out, exact) / error_target**2)
        budgets.append(budget.double().flatten())
    return {"pilot_sampler": pilot_sampler, "pilot": pilot, "error_target": error_target, "seeds": seeds,
            **ratio_summary(ratios, budgets)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--seeds", type=int, default=200)
    parser.add_argument("--targets", type=number_list, default=[0.05, 0.1])
    parser.add_argument("--pilots", type=lambda text: [int(x) for x in number_list(text)], default=[16, 32])
    args = parser.parse_args(argv)
    if args.seeds < 2 or any(p < 2 for p in args.pilots):
        parser.error("--seeds ≥ 2 and every pilot ≥ 2")
    probs, values = synthetic_heads(8192)["peaked"]
    cases = {f"{sampler}/{pilot}/{target}/{args.seeds}": functools.partial(
        measure, probs, values, pilot_sampler=sampler, pilot=pilot, error_target=target, seeds=args.seeds)
        for pilot in args.pilots for sampler in SAMPLERS for target in args.targets}
    return append_cases(args.out, cases, holder="error_target_pilot_ab.py")


if __name__ == "__main__":
    sys.exit(main())
