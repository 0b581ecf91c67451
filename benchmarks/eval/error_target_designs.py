"""Two designs of the error-target estimate on SmolLM2's real heads (issue 42): the pilot alone (what santa ships,
with and without its floor of S₀ draws) against an exact ``A = Σ_j p_j ‖v_j‖²`` (per-key ‖v‖² kept beside the
cache, the issue's suggestion, not built in santa: here from the captured V).

With A exact, ``N̂ = (S₀ ‖ȳ‖² − A) / (S₀ − 1)`` (``E‖ȳ‖² = ‖o‖² + (A − ‖o‖²)/S₀``) and ``T̂ = A − N̂``: a tail the pilot
misses still enters A. Heads: SmolLM2-135M at the last position of an 8k needle prompt, tertiles of ``T / ‖o‖²``
(``error_target_calibration.py``'s classes), 8 heads each; systematic outputs; 200 seeds; cap 4096.

    python benchmarks/eval/error_target_designs.py OUT.jsonl [--seeds 200] [--capture FILE.pt]

One JSONL record per case (heads: SmolLM2-135M, an 8192-token niah_single prompt, 8 per class), appended as it is
measured; a re-run skips the cases already in the file (the first version wrote one JSON: ``designs.json``).
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
    captured_heads,
    classes_of,
    one_call,
    ratio_summary,
    relative_error,
    relative_trace,
)

from santa.attention import pilot_moments, weighted_values  # noqa: E402
from santa.error_target import adaptive_budgets, pilot_statistics  # noqa: E402
from santa.sampling import sample_counts, sample_counts_per_row  # noqa: E402

CAP, PILOT = 4096, 16


def measure(probs, values, *, design: str, floor: int, error_target: float, seeds: int) -> dict:
    _, exact = relative_trace(probs, values)
    p4, v4 = one_call(probs, values)
    second = torch.einsum("hn,hn->h", probs.double(), (values.double() ** 2).sum(-1)).reshape(1, -1, 1)  # A
    ratios, budgets = [], []
    for seed in range(seeds):
        g = torch.Generator().manual_seed(seed)
        mean, square_mean = pilot_moments(sample_counts(p4, PILOT, "systematic", generator=g), v4, PILOT)
        if design == "pilot":
            trace, norm2 = pilot_statistics(mean, square_mean, PILOT)
        else:  # exact A
            norm2 = (PILOT * (mean * mean).sum(-1) - second) / (PILOT - 1)
            trace = (second - norm2).clamp_min(0.0)
        budget = adaptive_budgets(trace, norm2, error_target, CAP, floor)
        counts = sample_counts_per_row(p4, budget, "systematic", cap=CAP, generator=g)
        out = weighted_values(counts.float() / budget.unsqueeze(-1).float(), v4)
        ratios.append(relative_error(out, exact) / error_target**2)
        budgets.append(budget.double().flatten())
    return {"design": design, "floor": floor, "error_target": error_target, "seeds": seeds, **ratio_summary(ratios, budgets)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--seeds", type=int, default=200)
    parser.add_argument("--capture", type=Path, default=None, help="cache of the captured heads (.pt), made on first use")
    args = parser.parse_args(argv)

    @functools.cache
    def heads() -> dict:  # captured once, and only if a case is still to run
        if args.capture is not None and args.capture.exists():
            return torch.load(args.capture)
        probs, values = captured_heads("smollm2-135m", 8192)
        cases = {name: (probs[ix], values[ix]) for name, ix in classes_of(probs, values, 8).items()}
        if args.capture is not None:
            torch.save(cases, args.capture)
        return cases

    def case(name: str, design: str, floor: int, target: float) -> dict:
        probs, values = heads()[name]
        return {"class": name, "relative_trace": [float(x) for x in relative_trace(probs, values)[0]],
                **measure(probs, values, design=design, floor=floor, error_target=target, seeds=args.seeds)}

    cases = {f"{name}/{design}/{floor}/{target}/{args.seeds}": functools.partial(case, name, design, floor, target)
             for name in ("easy", "medium", "hard") for design, floor in (("pilot", 1), ("pilot", PILOT), ("exact A", 1),
                                                                          ("exact A", PILOT)) for target in (0.1, 0.3)}
    return append_cases(args.out, cases, holder="error_target_designs.py")

if __name__ == "__main__":
    sys.exit(main())
