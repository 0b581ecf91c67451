"""The ``santa`` command: ``santa generate``, ``santa bench …``, ``santa eval …``."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from tqdm import tqdm


def _generate(args: argparse.Namespace) -> int:
    from santa.generate import run

    bar = tqdm(total=2, desc="answering (dense, then sampled)", unit="method")
    prompt, answers = run(
        model_name=args.model,
        n_tokens=args.length,
        budget=args.budget,
        sampler=args.sampler,
        seed=args.seed,
        prompt_seed=args.prompt_seed,
        depth=args.depth,
        prefill=args.prefill,
        max_new_tokens=args.max_new_tokens,
        prompt_text=args.prompt,
        expected=tuple(args.expect),
        device=args.device,
        progress=lambda name: bar.update(1),
    )
    bar.close()
    print(f"\nprompt: {prompt.task}, {prompt.n_tokens} tokens; expected answer: {', '.join(prompt.answers) or '(none given)'}")
    header = f"{'method':<22} {'found':<6} {'V rows read/head':>16} {'(GQA union)':>11} {'prefill s':>9} {'decode tok/s':>12}  answer"
    print(header)
    print("-" * len(header))
    for a in answers:
        share = f"{100 * a.share_per_head:.1f} %" if a.share_per_head is not None else "100 %"
        union = f"{100 * a.share_per_kv_head:.1f} %" if a.share_per_kv_head is not None else "100 %"
        found = ("yes" if a.found else "no") if prompt.answers else "-"
        print(f"{a.method:<22} {found:<6} {share:>16} {union:>11} {a.prefill_s:>9.2f} {a.tokens_per_s:>12.1f}  {a.text!r}")
    return 0


def _delegate(module: str):
    """Run ``module.main(argv)`` with the remaining arguments."""

    def run(args: argparse.Namespace) -> int:
        return importlib.import_module(module).main(args.rest) or 0

    return run


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="santa", description="Stochastic sparse attention for LLM decoding.")
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="answer a needle-in-a-haystack prompt with dense attention and with SANTA")
    gen.add_argument("--model", default="smollm2-135m", help="bundled model: smollm2-135m (default) or qwen2.5-coder-0.5b")
    gen.add_argument("--length", type=int, default=2048, help="prompt length in tokens (default 2048)")
    gen.add_argument("--budget", type=int, default=64, help="samples per query head, S (default 64)")
    gen.add_argument("--sampler", default="systematic", choices=["systematic", "stratified", "iid", "topk", "dense"])
    gen.add_argument("--seed", type=int, default=0, help="seed of the sampler's randomness")
    gen.add_argument("--prompt-seed", type=int, default=0, help="seed of the needle and haystack")
    gen.add_argument("--depth", type=float, default=0.5, help="needle depth in the haystack, 0..1")
    gen.add_argument("--prefill", default="dense", choices=["dense", "sampled"], help="sample the prefill too")
    gen.add_argument("--max-new-tokens", type=int, default=32)
    gen.add_argument("--prompt", default=None, help="your own prompt instead of the needle task")
    gen.add_argument("--expect", action="append", default=[], help="string the answer must contain (with --prompt)")
    gen.add_argument("--device", default="cpu")
    gen.set_defaults(func=_generate)

    for name, module, text in (
        ("bench", "santa.bench.cli", "benchmarks: `santa bench kernels`, `santa bench e2e`"),
        ("eval", "santa.eval.cli", "accuracy sweeps: `santa eval run|report|variance`"),
    ):
        p = sub.add_parser(name, help=text, add_help=False)
        p.add_argument("rest", nargs=argparse.REMAINDER)
        p.set_defaults(func=_delegate(module))
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except BrokenPipeError:  # `santa eval report … | head`: the reader left; stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
