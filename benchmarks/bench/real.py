"""santa bench real: decode speed of a real bundled model, dense vs santa, with the answers checked.

For each (length, batch): ``batch`` needle prompts of about ``length`` tokens (needle seeds 0…B−1,
so their lengths differ a little and run as one batch with per-sequence lengths) go through
:func:`santa.model.generate` once per backend. The decode time per token is the difference of two
runs, ``(t(new_tokens) − t(warm_tokens)) / (new_tokens − warm_tokens)``, so the prefill and the
graph capture cancel; one untimed warm-up call per backend, then medians of ``--repeats``. A pair
whose longer run took no longer than its shorter one measured the prefill's jitter, not decode: it
is timed again, up to ``PAIR_ATTEMPTS`` times, then kept with a warning. The answers of the longer
run are graded as ``santa generate`` grades them (the needle's value in the answer).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

from santa import cliargs
from santa.checks import integer
from santa.provenance import run_record
from santa.rng import check_seed

PAIR_ATTEMPTS = 3  # timings of one (short, long) pair before a non-positive difference is kept
MAX_BATCH = 1024  # --batches: needle prompts built and decoded together


def _timed_generate(model, prompts, tokens: int, **kwargs) -> tuple[float, list]:
    """Seconds of one :func:`santa.model.generate` call (synchronised) and its outputs."""
    from santa.model import generate

    if torch.cuda.is_available() and next(model.parameters()).is_cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    outputs = generate(model, prompts, tokens, **kwargs)
    if torch.cuda.is_available() and next(model.parameters()).is_cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - t0, outputs


def bench_case(model, tokenizer, *, length: int, batch: int, backends: list[str], budget: int,
               new_tokens: int, warm_tokens: int, repeats: int, seed: int) -> dict:
    """ms per decode token and the needle score per backend for one (length, batch).

    The counts take Python or numpy ints (a float is a TypeError); warm_tokens < new_tokens.
    """
    from santa.eval.tasks import contains_all, needle_prompt

    length, batch = integer("length", length, low=1), integer("batch", batch, low=1)
    budget, repeats, seed = integer("budget", budget, low=1), integer("repeats", repeats, low=1), check_seed(seed)
    new_tokens = integer("new_tokens", new_tokens, low=2)
    warm_tokens = integer("warm_tokens", warm_tokens, low=1, high=new_tokens)

    prompts = [needle_prompt(tokenizer, length, seed=s) for s in range(batch)]
    ids = [torch.tensor(tokenizer(p.text, add_special_tokens=False)["input_ids"]) for p in prompts]
    case = {"length": length, "batch": batch, "prompt_tokens": [len(x) for x in ids], "backends": {}}
    for backend in backends:
        kwargs = dict(backend=backend, budget=budget, seed=seed)
        _timed_generate(model, ids, warm_tokens, **kwargs)  # warm-up: compilation, autotuning, allocator
        per_token = []
        for _ in range(repeats):
            for _attempt in range(PAIR_ATTEMPTS):  # a pair with t_long ≤ t_short timed noise (prefill jitter), not decode
                t_short, _ = _timed_generate(model, ids, warm_tokens, **kwargs)
                t_long, outputs = _timed_generate(model, ids, new_tokens, **kwargs)
                if t_long > t_short:
                    break
            else:
                print(f"  warning: n≈{length} B={batch} {backend}: {new_tokens} tokens took no longer than {warm_tokens} in "
                      f"{PAIR_ATTEMPTS} tries; the timing is below the noise (raise --new-tokens)", file=sys.stderr, flush=True)
            per_token.append((t_long - t_short) / (new_tokens - warm_tokens) * 1e3)
        answers = [tokenizer.decode(o.tolist(), skip_special_tokens=True) for o in outputs]
        found = [contains_all(a, p.answers) for a, p in zip(answers, prompts, strict=True)]
        case["backends"][backend] = {
            "ms_per_token_median": statistics.median(per_token), "ms_per_token_all": per_token,
            "found": sum(found) / len(found), "answers": answers[:4],
            "share_of_v_read": None if backend == "sdpa" else min(1.0, budget / min(case["prompt_tokens"])),
        }
        row = case["backends"][backend]
        print(f"  n≈{length} B={batch} {backend:11s} {row['ms_per_token_median']:8.3f} ms/token  found {row['found']:.2f}", flush=True)
    dense = case["backends"].get("sdpa")
    if dense:
        for row in case["backends"].values():
            row["speedup_vs_sdpa"] = dense["ms_per_token_median"] / row["ms_per_token_median"]
    return case


def build_parser() -> argparse.ArgumentParser:
    from santa.kernels import MAX_BUDGET

    p = argparse.ArgumentParser(prog="santa bench real", description=__doc__.splitlines()[0])
    p.add_argument("--model", type=cliargs.bundled_model, default="smollm2-135m")
    p.add_argument("--lengths", type=cliargs.int_list("prompt length", cliargs.MIN_PROMPT_TOKENS), default=[8192],
                   help=f"prompt lengths, comma list (≥ {cliargs.MIN_PROMPT_TOKENS}; with --new-tokens, at most the model's context)")
    p.add_argument("--batches", type=cliargs.int_list("batch size", 1, MAX_BATCH + 1), default=[1, 16],
                   help=f"batch sizes, comma list (1 to {MAX_BATCH})")
    p.add_argument("--backends", type=cliargs.choice_list("backend", ("sdpa", "santa-prop", "santa-flash")),
                   default=["sdpa", "santa-prop"])
    p.add_argument("--budget", type=cliargs.int_in(1, MAX_BUDGET + 1), default=64,
                   help=f"S for the santa backends, 1 to {MAX_BUDGET} (default 64)")
    p.add_argument("--new-tokens", type=cliargs.int_in(2), default=64, help="tokens of the timed (and graded) run")
    p.add_argument("--warm-tokens", type=cliargs.int_in(1), default=16, help="tokens of the run subtracted from it")
    p.add_argument("--repeats", type=cliargs.int_in(1), default=3)
    p.add_argument("--seed", type=cliargs.seed, default=0, help="seed of the sampler's randomness, in [0, 2**63)")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--device", type=cliargs.device, default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--out", type=cliargs.output_folder, default=os.environ.get("OUT", "runs/bench_real"))
    return p


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The flags, checked before any work: the longest prompt and its answer against the model's
    context, read from its config without loading weights (status 2; 1 when the config cannot be read)."""
    from santa.eval.cli import model_shape

    parser = build_parser()
    args = parser.parse_args(argv)
    if args.warm_tokens >= args.new_tokens:
        parser.error(f"--warm-tokens ({args.warm_tokens}) must be below --new-tokens ({args.new_tokens})")
    try:
        context = model_shape(args.model).context
    except ValueError as error:
        print(f"santa bench real: error: {error}", file=sys.stderr)
        raise SystemExit(1) from None
    if max(args.lengths) + args.new_tokens > context:
        parser.error(f"argument --lengths: {args.model} reads at most {context} tokens, got {max(args.lengths)} + --new-tokens {args.new_tokens}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from santa.model import load_bundled

    model, tokenizer = load_bundled(args.model, dtype=getattr(torch, args.dtype), device=args.device)
    results = {"run": run_record(), "model": args.model, "device": torch.cuda.get_device_name(0) if args.device.startswith("cuda") else "cpu",
               "dtype": args.dtype, "budget": args.budget, "date": time.strftime("%Y-%m-%d"),
               "commit": os.environ.get("SANTA_COMMIT", ""), "cases": []}
    os.makedirs(args.out, exist_ok=True)
    for length in args.lengths:
        for batch in args.batches:
            try:
                case = bench_case(
                    model, tokenizer, length=length, batch=batch, backends=args.backends, budget=args.budget,
                    new_tokens=args.new_tokens, warm_tokens=args.warm_tokens, repeats=args.repeats, seed=args.seed)
            except ValueError as error:  # a library refusal (e.g. draws past MAX_DRAWS on the CPU): one line, status 1
                print(f"santa bench real: error: n≈{length} B={batch}: {error}", file=sys.stderr)
                return 1
            results["cases"].append(case)
            with open(os.path.join(args.out, "real.json"), "w") as f:  # after every case: survives a crash
                json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
