"""Calibration of santa's error-target budgets (issue 42): does ``E‖ô − o‖² / ‖o‖²`` come out at ε²?

For every head of a case, R seeds of :func:`santa.attention.error_target_values` (the reference: a
pilot of S₀ draws estimates the variance trace T and ‖o‖², then ``S_r = clamp(⌈T̂ / (ε² N̂)⌉, 1, cap)``
fresh draws) against the exact output o, per sampler and ε. Heads come from

- ``synthetic``: four classes from peaked to flat (score spread × value spread), 8 heads each, 8192 keys;
- ``smollm2-135m`` / ``qwen2.5-coder-0.5b``: the bundled models' real attention at the last position
  of a needle prompt (``santa.eval.variance.capture_last_query``, dense prefill on the CPU); classes
  are tertiles of the exact relative trace ``T / ‖o‖²`` over every layer and head (easy, medium,
  hard), ``--heads-per-class`` heads of each measured, evenly spaced through the tertile.

Per (source, class, sampler, ε) it records the realised ``E r² / ε²`` (mean over heads of the mean over
seeds, with the standard error over seeds), the mean budget, the mean value rows read (pilot included),
the share of rows where the cap decided, and what a fixed budget reading as many rows would give
(``T / (S ‖o‖²)`` for iid at the same mean reads). One JSONL record per case (resumable: a re-run
skips the cases already in the file), a provenance record per invocation and the commit in every case;
``--plot`` draws it.

    python benchmarks/eval/error_target_calibration.py OUT.jsonl [--sources synthetic,smollm2-135m] \
        [--length 8192] [--seeds 200] [--targets 0.05,0.1,0.2,0.3] [--cap 4096] [--pilot 16] \
        [--heads-per-class 8] [--plot OUT.png]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch

from santa.attention import error_target_values
from santa.provenance import run_record
from santa.sampling import SAMPLERS
from santa.sweep_files import SweepFileError, append_record, read_records, sweep_lock

SYNTHETIC = {  # class: (score spread, value noise around a shared mean) — peaked to flat
    "peaked": (4.0, 1.0),
    "focused": (2.0, 1.0),
    "spread": (1.0, 1.0),
    "flat": (0.25, 1.0),
}


def synthetic_heads(n_keys: int, dim: int = 64, heads: int = 8, seed: int = 0) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """``{class: (probs [H, n], values [H, n, d])}``: scores ``~ N(0, spread²)``, values a per-head
    mean direction of norm √d plus unit noise."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, (spread, noise) in SYNTHETIC.items():
        scores = spread * torch.randn(heads, n_keys, generator=g)
        mean = torch.randn(heads, 1, dim, generator=g)
        values = mean + noise * torch.randn(heads, n_keys, dim, generator=g)
        out[name] = (torch.softmax(scores.double(), -1).float(), values)
    return out


def captured_heads(model_name: str, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every layer's and head's ``(probs [L·H, n], values [L·H, n, d])`` at the last position of a
    niah_single prompt of ``length`` tokens (dense prefill on the CPU)."""
    from santa.assets import load_model
    from santa.eval.tasks import build_prompt
    from santa.eval.variance import capture_last_query

    model, tokenizer = load_model(model_name, dtype=torch.float32)
    prompt = build_prompt("niah_single", tokenizer, length, 0)
    captured = capture_last_query(model, tokenizer, prompt.text)
    probs = torch.cat([c.probs.cpu() for c in captured.values()])
    values = torch.cat([c.values.cpu() for c in captured.values()])
    return probs, values


def relative_trace(probs: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact ``(T / ‖o‖², o)`` per head: ``T = Σ p‖v‖² − ‖o‖²``."""
    p, v = probs.double(), values.double()
    o = torch.einsum("hn,hnd->hd", p, v)
    second = torch.einsum("hn,hn->h", p, (v * v).sum(-1))
    norm2 = (o * o).sum(-1)
    return (second - norm2) / norm2, o


def append_cases(path: Path, cases: dict, *, holder: str) -> int:
    """Run ``cases`` (``{key: zero-argument function → record}``, in order) under the file's lock, one JSONL record each
    as it finishes, after a provenance record per invocation; a re-run skips the keys already in the file, and a
    second run on the same file is refused at once (:func:`santa.sweep_files.sweep_lock`): one line on stderr naming
    ``holder``. Returns the script's exit status (0, or 1 for a refused or unreadable file)."""
    try:
        with sweep_lock(path, holder=holder):
            done = {record.get("key") for record in read_records(path)} if path.exists() else set()
            run = run_record()
            append_record(path, {"key": f"run/{run['date']}", **run})
            for key, measure_case in cases.items():
                if key not in done:
                    record = {"key": key, "commit": run["commit"], **measure_case()}
                    append_record(path, record)
                    print(json.dumps(record), flush=True)
    except SweepFileError as error:  # another run holds the file, or it cannot be read: one line
        print(f"{holder}: error: {error}", file=sys.stderr)
        return 1
    return 0


def one_call(probs: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Heads ``probs [H, n]``, ``values [H, n, d]`` as one attention call: ``[1, H, 1, n]`` and ``[1, H, n, d]``
    (one KV head per head)."""
    heads = probs.shape[0]
    return probs.reshape(1, heads, 1, -1), values.reshape(heads, 1, *values.shape[1:]).transpose(0, 1)


def relative_error(out: torch.Tensor, exact: torch.Tensor) -> torch.Tensor:
    """``‖ô − o‖² / ‖o‖²`` per head, from one call's output ``[1, H, 1, d]`` and the exact ``o [H, d]``."""
    return ((out[0, :, 0].double() - exact) ** 2).sum(-1) / (exact * exact).sum(-1)


def ratio_summary(ratios: list[torch.Tensor], budgets: list[torch.Tensor]) -> dict:
    """Seeds' ``r² / ε²`` per head (``[H]`` each): the mean over heads, its standard error over seeds, the worst
    head's mean, and the mean budget."""
    ratio = torch.stack(ratios)  # [R, H]
    return {"ratio": float(ratio.mean()), "ratio_se": float(ratio.mean(1).std() / math.sqrt(ratio.shape[0])),
            "ratio_worst_head": float(ratio.mean(0).max()), "mean_budget": float(torch.stack(budgets).mean())}


def measure(probs: torch.Tensor, values: torch.Tensor, *, sampler: str, error_target: float, cap: int, pilot: int,
            seeds: int) -> dict:
    """R seeds of the error-target draw on heads ``probs [H, n]``, ``values [H, n, d]``."""
    rho, exact = relative_trace(probs, values)
    ratios, budgets, reads, capped = [], [], [], []
    p4, v4 = one_call(probs, values)
    for seed in range(seeds):
        out, draw = error_target_values(p4, v4, cap, sampler, error_target=error_target, pilot=pilot,
                                        generator=torch.Generator().manual_seed(seed))
        ratios.append(relative_error(out, exact) / error_target**2)
        budgets.append(draw.budgets[0, :, 0].double())
        reads.append(draw.rows_read()[0, :, 0].double())
        capped.append((draw.budgets[0, :, 0] == cap).double())
    head_mean = torch.stack(ratios).mean(0)
    mean_reads = float(torch.stack(reads).mean())
    fixed_iid = float((rho / mean_reads).mean() / error_target**2)  # iid at a fixed S = the same mean reads
    return {
        "heads": probs.shape[0],
        **ratio_summary(ratios, budgets),  # E r² / ε² averaged over heads (± over seeds), the worst head, mean S_r
        "ratio_worst_head_uncapped": float(torch.where(torch.stack(capped).mean(0) == 0, head_mean, -math.inf).max()),
        "mean_rows_read": mean_reads,
        "capped_share": float(torch.stack(capped).mean()),
        "fixed_budget_same_reads_ratio_iid": fixed_iid,
        "relative_trace_median": float(rho.median()),
    }


def classes_of(probs: torch.Tensor, values: torch.Tensor, per_class: int) -> dict[str, torch.Tensor]:
    """Tertiles of the exact relative trace ``T / ‖o‖²`` (easy, medium, hard): ``per_class`` head
    indices of each, evenly spaced through the tertile (all of it when it holds fewer)."""
    rho, _ = relative_trace(probs, values)
    thirds = torch.tensor_split(torch.argsort(rho), 3)
    picked = [third[torch.linspace(0, len(third) - 1, min(per_class, len(third))).round().long()] for third in thirds]
    return dict(zip(("easy", "medium", "hard"), picked, strict=True))


def run(path: Path, *, sources: list[str], length: int, seeds: int, targets: list[float], cap: int, pilot: int,
        per_class: int) -> None:
    from tqdm import tqdm

    done = {record.get("key") for record in read_records(path)} if path.exists() else set()
    run = run_record()
    append_record(path, {"key": f"run/{run['date']}", **run})  # one per invocation: a resumed file says what made each part
    for source in sources:
        if source == "synthetic":
            cases = synthetic_heads(length)
        else:
            wanted = [f"{source}/{c}/{s}/{e}" for c in ("easy", "medium", "hard") for s in SAMPLERS for e in targets]
            if all(key in done for key in wanted):
                continue
            probs, values = captured_heads(source, length)
            cases = {name: (probs[ix], values[ix]) for name, ix in classes_of(probs, values, per_class).items()}
        jobs = [(c, s, e) for c in cases for s in SAMPLERS for e in targets if f"{source}/{c}/{s}/{e}" not in done]
        for name, sampler, target in tqdm(jobs, desc=source, unit="case"):
            probs, values = cases[name]
            result = measure(probs, values, sampler=sampler, error_target=target, cap=cap, pilot=pilot, seeds=seeds)
            append_record(path, {"key": f"{source}/{name}/{sampler}/{target}", "commit": run["commit"], "source": source, "class": name,
                                 "sampler": sampler, "error_target": target, "cap": cap, "pilot": pilot, "seeds": seeds,
                                 "keys": int(probs.shape[-1]), **result})


def plot(path: Path, out: Path) -> None:
    """Realised E r² / ε² per class and sampler (one panel per source), and mean rows read against ε."""
    from santa.eval.report import COLORS, pyplot, save_figure

    records = [r for r in read_records(path) if not str(r.get("key")).startswith("run")]
    sources = sorted({r["source"] for r in records})
    fig, axes = pyplot().subplots(2, len(sources), figsize=(4.2 * len(sources), 6.4), squeeze=False)
    for col, source in enumerate(sources):
        rows = [r for r in records if r["source"] == source]
        classes = list(dict.fromkeys(r["class"] for r in rows))
        for sampler in SAMPLERS:
            for i, name in enumerate(classes):
                cell = sorted((r for r in rows if r["sampler"] == sampler and r["class"] == name), key=lambda r: r["error_target"])
                eps = [r["error_target"] for r in cell]
                style = dict(color=COLORS[sampler], marker="os^v"[i % 4], alpha=0.8)
                axes[0, col].plot(eps, [r["ratio"] for r in cell], label=f"{sampler}, {name}" if col == 0 else None, **style)
                axes[1, col].plot(eps, [r["mean_rows_read"] for r in cell], **style)
        axes[0, col].axhline(1.0, color="grey", ls=":")
        axes[0, col].axhline(1.1, color="red", ls="--", lw=0.8)
        axes[0, col].set_title(source)
        axes[0, col].set_ylabel("realised E‖ô−o‖²/‖o‖² ÷ ε²")
        axes[1, col].set_ylabel("value rows read per head (pilot incl.)")
        for ax in axes[:, col]:
            ax.set_xscale("log")
            ax.set_xlabel("error target ε")
            ax.grid(alpha=0.3, which="both")
        axes[1, col].set_yscale("log")
    axes[0, 0].legend(fontsize=6, ncol=2)
    save_figure(fig, out, 120)


def number_list(text: str, kind=float) -> list:
    try:
        values = [kind(x) for x in text.split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of numbers, got {text!r}") from None
    if not values or any(not (v > 0) for v in values):
        raise argparse.ArgumentTypeError(f"expected numbers > 0, got {text!r}")
    return values


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="JSONL file (resumed when it exists)")
    parser.add_argument("--sources", default="synthetic,smollm2-135m",
                        help="comma-separated: synthetic, smollm2-135m, qwen2.5-coder-0.5b")
    parser.add_argument("--length", type=int, default=8192, help="keys per head (prompt tokens for real heads)")
    parser.add_argument("--seeds", type=int, default=200)
    parser.add_argument("--targets", type=number_list, default=[0.05, 0.1, 0.2, 0.3])
    parser.add_argument("--cap", type=int, default=4096, help="S_max (large, so that the rule decides)")
    parser.add_argument("--pilot", type=int, default=16)
    parser.add_argument("--heads-per-class", type=int, default=8, help="real heads measured per tertile")
    parser.add_argument("--plot", type=Path, default=None, help="PNG of the calibration")
    args = parser.parse_args(argv)
    sources = [s for s in args.sources.split(",") if s]
    known = {"synthetic", "smollm2-135m", "qwen2.5-coder-0.5b"}
    if not sources or set(sources) - known:
        parser.error(f"--sources must name some of {sorted(known)}, got {args.sources!r}")
    if args.seeds < 2 or args.length < 2 or args.cap < 1 or args.pilot < 2 or args.heads_per_class < 1:
        parser.error("--seeds ≥ 2, --length ≥ 2, --cap ≥ 1, --pilot ≥ 2 and --heads-per-class ≥ 1")
    try:
        with sweep_lock(args.out, holder="error_target_calibration.py"):
            run(args.out, sources=sources, length=args.length, seeds=args.seeds, targets=args.targets, cap=args.cap,
                pilot=args.pilot, per_class=args.heads_per_class)
    except SweepFileError as error:  # another run holds the file, or it cannot be read: one line
        print(f"error_target_calibration.py: error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted: the cases finished so far are in the file; run the same command to resume", file=sys.stderr)
        return 130
    if args.plot:
        plot(args.out, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
