"""The ``santa`` command: ``santa generate``, and ``santa bench|eval|ablate|tune …`` delegated to
their modules (``santa bench`` to the source checkout's ``benchmarks/bench/``, which is not part of
the library: outside a checkout it is a one-line error).

Exit status: 0 done; 1 the work failed with a one-line error (a library refusal, a missing asset);
2 a bad command line, refused before any work (argparse's status); 130 interrupted (Ctrl-C).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path

from santa import cliargs, methods

# The subcommands of `santa eval` (santa.eval.cli.COMMANDS, which imports the whole sweep runner:
# too heavy for `santa -h`; a test keeps the two lists equal).
EVAL_COMMANDS = ("run", "report", "variance", "bernoulli")
# The benchmarks of `santa bench` (benchmarks.bench.cli.COMMANDS: they live in the source checkout,
# not in the library, and santa imports nothing from them until `santa bench` runs; a test keeps the
# two lists equal).
BENCH_COMMANDS = ("kernels", "e2e", "capture", "real")
BENCH_MODULE = "benchmarks.bench.cli"
# santa <name> … runs <module>.main(argv) with the arguments after <name>, -h included
DELEGATED = {
    "bench": (BENCH_MODULE, f"benchmarks: santa bench {'|'.join(BENCH_COMMANDS)} (from a source checkout)"),
    "eval": ("santa.eval.cli", f"accuracy sweeps: santa eval {'|'.join(EVAL_COMMANDS)}"),
    "ablate": ("santa.budgets.ablate_cli", "budget ablations: santa ablate -h"),
    "tune": ("santa.budgets.tune_cli", "budget tuning: santa tune -h"),
}
EXIT_STATUS = "exit status: 0 done, 1 the work failed (one-line error), 2 a bad command line (nothing run), 130 interrupted"
INTERRUPTED = 130  # 128 + SIGINT, the shell's status for a command ended by Ctrl-C
DISTRIBUTION = "santa-attention"  # the installed package whose version `santa --version` prints
SAMPLERS = methods.names(path="hf")  # the methods santa generate --sampler can name (the kernels: --kernel)
NEEDLE_DEFAULTS = {"length": 2048, "depth": 0.5}  # --length and --depth: the needle prompt only
NO_DECODE = "n/a"  # the answers table's decode columns for an answer of one token (no decode step)


def _generate(args: argparse.Namespace) -> int:
    import torch
    from tqdm import tqdm

    from santa.generate import run

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    bar = tqdm(total=2, desc="answering (dense, then sampled)", unit="method")
    try:
        prompts, answers = run(
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
            batch=args.batch,
            kernel=args.kernel,
            path=args.path,
            progress=lambda name: bar.update(1),
            error_target=args.error_target,
        )
    except (ValueError, TypeError, OSError) as error:  # the library's refusals, a model that cannot load: one line, no traceback
        return _failed(bar, str(error))
    except (MemoryError, torch.OutOfMemoryError) as error:
        detail = str(error).splitlines()[0] if str(error) else type(error).__name__
        return _failed(bar, f"out of memory ({detail}): try a smaller --length or --batch")
    except KeyboardInterrupt:  # main() says so in one line: leave no half-drawn bar above it
        bar.leave = False
        bar.close()
        raise
    bar.close()
    print_answers(prompts, answers, fast=args.path == "fast")
    return 0


def _failed(bar, message: str) -> int:
    """Clear the progress bar (leave no half-drawn bar above the error) and print one error line: status 1."""
    bar.leave = False
    bar.close()
    print(f"santa generate: error: {message}", file=sys.stderr)
    return 1


def print_answers(prompts: list, answers: list, *, fast: bool) -> None:
    """The answers table: one row per (method, prompt); a prompt column when the batch holds several."""
    first = prompts[0]
    if len(prompts) == 1:
        print(f"\nprompt: {first.task}, {first.n_tokens} tokens; expected answer: {', '.join(first.answers) or '(none given)'}")
    else:
        lengths = ", ".join(str(p.n_tokens) for p in prompts)
        print(f"\nprompts: {len(prompts)} × {first.task} (needle seeds {prompts[0].seed}–{prompts[-1].seed}), {lengths} tokens")
    if fast:
        paths = ", ".join(dict.fromkeys(a.path for a in answers))
        print(f"path: santa.model ({paths}); V rows read: min(S, n)/n per head; decode tok/s of the whole batch")
    column = f"{'prompt':>6} " if len(prompts) > 1 else ""
    header = f"{'method':<22} {column}{'found':<6} {'V rows read/head':>16} {'(GQA union)':>11} {'prefill s':>9} {'decode tok/s':>12}  answer"
    print(header)
    print("-" * len(header))
    undecoded = False  # a row whose only token came from the prefill (a stop token first): no decode step to report
    for a in answers:
        counted = a.share_per_head is None or a.share_per_head == a.share_per_head  # NaN: an error target's reads, not counted
        share = "not counted" if not counted else f"{100 * a.share_per_head:.1f} %" if a.share_per_head is not None else "100 %"
        sampled_without_union = a.share_per_head is not None and a.share_per_kv_head is None
        union = ("–" if sampled_without_union or not counted
                 else f"{100 * a.share_per_kv_head:.1f} %" if a.share_per_kv_head is not None else "100 %")
        speed = f"{a.tokens_per_s:.1f}"
        if a.new_tokens < 2:
            share = union = NO_DECODE
            undecoded = True
        if (a.batch_tokens or a.new_tokens) < 2:
            speed = NO_DECODE
        prompt = prompts[a.prompt]
        found = ("yes" if a.found else "no") if prompt.answers else "-"
        seed = f"{prompt.seed:>6} " if len(prompts) > 1 else ""
        print(f"{a.method:<22} {seed}{found:<6} {share:>16} {union:>11} {a.prefill_s:>9.2f} {speed:>12}  {a.text!r}")
    if undecoded:
        print(f"{NO_DECODE}: no decode step ran (the answer's only token came from the prefill)")
    if len(prompts) > 1:
        for name in dict.fromkeys(a.method for a in answers):
            rows = [a for a in answers if a.method == name]
            print(f"{name}: needle found in {sum(a.found for a in rows)}/{len(rows)} prompts")


def new_tokens(text: str) -> int:
    """``--max-new-tokens`` of generate: ≥ 2, for the first token comes from the prefill, and the
    decode columns (V rows read, decode tok/s) need at least one decode step after it."""
    value = cliargs.integer(text)
    if value < 2:
        raise cliargs.Error(f"expected an integer ≥ 2 (the first token comes from the prefill; the V rows read and "
                            f"decode tok/s need a decode step), got {value}")
    return value


def non_empty(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a non-empty string")
    return text


def add_generate(sub) -> argparse.ArgumentParser:
    what = "answer a needle-in-a-haystack prompt with dense attention and with SANTA"
    gen = sub.add_parser(
        "generate",
        help=what,
        description=f"{what[0].upper()}{what[1:]}: the answers, whether the needle was found, the share of value rows read and the decode speed.",
        epilog=EXIT_STATUS,
    )
    gen.add_argument("--model", default="smollm2-135m", type=cliargs.bundled_model, help="bundled model: smollm2-135m (default) or qwen2.5-coder-0.5b")
    gen.add_argument(
        "--length",
        type=cliargs.int_in(cliargs.MIN_PROMPT_TOKENS),
        default=None,
        help=f"needle prompt length in tokens, ≥ {cliargs.MIN_PROMPT_TOKENS} (default {NEEDLE_DEFAULTS['length']})",
    )
    gen.add_argument("--budget", type=cliargs.positive_int, default=64, help="samples per query head, S ≥ 1 (default 64)")
    gen.add_argument("--sampler", default="systematic", choices=SAMPLERS, help="how SANTA picks the value rows it reads (default systematic)")
    gen.add_argument("--error-target", type=cliargs.positive_real, default=None, metavar="EPS",
                     help="a relative error ε > 0 instead of one budget for every head: each head draws min(S, what a pilot "
                     "of 16 draws says it needs), --budget the cap (iid, stratified, systematic; the prop kernel)")
    gen.add_argument("--seed", type=cliargs.seed, default=0, help="seed of the sampler's randomness, in [0, 2**63)")
    gen.add_argument("--prompt-seed", type=cliargs.nonnegative_int, default=0, help="seed of the needle and haystack, ≥ 0")
    gen.add_argument("--depth", type=cliargs.unit_interval, default=None, help="needle depth in the haystack, 0..1 (default 0.5)")
    gen.add_argument("--prefill", default="dense", choices=["dense", "sampled"], help="sample the prefill too")
    gen.add_argument("--max-new-tokens", type=new_tokens, default=32,
                     help="tokens to generate, ≥ 2: the first comes from the prefill, the others from decode steps (default 32)")
    gen.add_argument("--prompt", default=None, type=non_empty, help="your own prompt instead of the needle task")
    gen.add_argument("--expect", action="append", default=[], type=non_empty, help="string the answer must contain (with --prompt)")
    gen.add_argument("--device", default="auto", type=cliargs.device_or_auto, help="auto (default: cuda when present, else cpu), cpu, cuda or cuda:N")
    gen.add_argument(
        "--path",
        default="auto",
        choices=["auto", "hf", "fast"],
        help="fast: santa.model (one batch, CUDA graph, santa's kernels); hf: transformers + santa.hf; "
        "auto (default): fast on CUDA, hf on CPU and with --prefill sampled",
    )
    gen.add_argument("--batch", type=cliargs.positive_int, default=1, help="needle prompts (seeds --prompt-seed …) answered together, ≥ 1 (default 1)")
    gen.add_argument("--kernel", default=None, choices=methods.kernels(), help=f"santa's kernel for --sampler systematic (default {methods.DEFAULT_KERNEL} on the fast path)")
    gen.add_argument("--threads", type=cliargs.threads, default=None, help=f"torch CPU threads, 1 to {cliargs.MAX_THREADS} (default: torch's)")
    gen.set_defaults(func=_generate, check=check_generate, error=gen.error)
    return gen


def check_generate(args: argparse.Namespace) -> None:
    """Flags that only make sense together (or apart); fills the needle defaults and resolves
    ``--device auto`` and ``--path auto``. ``args.error`` is ``santa generate``'s ``parser.error`` (status 2)."""
    check_generate_path(args)
    if args.prompt is None:
        if args.expect:
            args.error("--expect needs --prompt (the needle prompt brings its own answer)")
        for name, value in NEEDLE_DEFAULTS.items():
            if getattr(args, name) is None:
                setattr(args, name, value)
        check_generate_context(args)
        return
    for name in NEEDLE_DEFAULTS:
        if getattr(args, name) is not None:
            args.error(f"--{name} sets the needle prompt; it does not apply with --prompt")
        setattr(args, name, NEEDLE_DEFAULTS[name])


def check_generate_context(args: argparse.Namespace) -> None:
    """The needle prompt (``--length``) and its answer (``--max-new-tokens``) must fit the model's
    context, read from its config without loading any weight (a ``--prompt``'s tokens are known
    once the tokenizer loads: :func:`santa.generate.run` checks those). A config that cannot be
    read is left to the model's load, which names the problem."""
    if args.prompt is not None:
        return
    from santa.eval.cli import model_shape

    try:
        context = model_shape(args.model).context
    except (OSError, ValueError):
        return
    problem = cliargs.context_problem(args.model, context, args.length, args.max_new_tokens)
    if problem:
        args.error(f"argument --length: {problem}")


def check_generate_path(args: argparse.Namespace) -> None:
    """``--device auto`` → cuda when present; ``--path auto`` → fast on CUDA with a dense prefill,
    else hf; and the flags that need one path, or one sampler."""
    import torch

    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.path == "auto":
        args.path = "fast" if torch.device(args.device).type == "cuda" and args.prefill == "dense" else "hf"
    if args.path == "fast" and args.prefill != "dense":
        args.error("--prefill sampled runs on the HF path only (santa.model prefills densely): use --path hf")
    if args.kernel is not None and args.sampler != "systematic":
        args.error(f"--kernel picks santa's kernel for --sampler systematic, not for --sampler {args.sampler}")
    if args.error_target is not None:
        takes = [name for name in SAMPLERS if methods.method(name).takes_error_target]
        if args.sampler not in takes:
            args.error(f"argument --error-target: needs a stochastic --sampler ({', '.join(takes)}), got --sampler {args.sampler}")
        if args.kernel is not None and not methods.method(args.kernel).takes_error_target:
            args.error(f"argument --error-target: runs on --kernel prop (its pilot reads the global CDF), not on --kernel {args.kernel}")
    if args.batch > 1 and args.prompt is not None:
        args.error("--batch builds needle prompts of different seeds; it does not apply with --prompt")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="santa",
        description="Stochastic sparse attention for LLM decoding.",
        epilog=EXIT_STATUS,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    add_generate(sub)
    for name, (_, text) in DELEGATED.items():  # listed for `santa -h`; main() hands them over before parsing
        p = sub.add_parser(name, help=text, add_help=False)
        p.add_argument("rest", nargs=argparse.REMAINDER)
    return parser


def version() -> str:
    """The installed distribution's version (``santa-attention``), else ``santa.__version__`` (a
    source tree run without installing it)."""
    from importlib import metadata

    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        import santa

        return getattr(santa, "__version__", "unknown")


def delegate(name: str, argv: list[str]) -> int:
    """Run ``santa <name> argv`` by its module's ``main(argv)``; a module that cannot be loaded (a
    missing dependency: not a bad command line) is a one-line error (status 1)."""
    module_name = DELEGATED[name][0]
    if name == "bench" and not find_benchmarks():
        print(f"santa bench: error: {NO_CHECKOUT}", file=sys.stderr)
        return 1
    try:
        module = importlib.import_module(module_name)
        entry = module.main
    except (ImportError, AttributeError) as error:
        print(f"santa {name}: error: santa {name} is not available here: {module_name}.main cannot be loaded ({error})", file=sys.stderr)
        return 1
    return entry(argv) or 0


PACKAGE_DIR = Path(__file__).resolve().parent  # <checkout>/src/santa when installed with pip install -e .
NO_CHECKOUT = (  # the benchmarks are not part of the installed package (benchmarks/ beside src/)
    "the benchmarks run from a source checkout, not from an installed package: in a clone of the repository "
    "(installed with pip install -e .) run "
    "santa bench, or python -m benchmarks.bench.cli from its root"
)


def benchmarks_root(package_dir: Path = PACKAGE_DIR) -> Path | None:
    """The source checkout whose ``benchmarks/bench/cli.py`` sits beside ``src/`` (santa at
    ``<root>/src/santa``), or None for an installed santa (no checkout around it)."""
    root = package_dir.parent.parent
    return root if (root / "benchmarks" / "bench" / "cli.py").is_file() else None


def find_benchmarks() -> bool:
    """Whether ``benchmarks.bench`` can be imported: the checkout's root is put on ``sys.path``
    (first, so that no other ``benchmarks`` module shadows it). Only ``santa bench`` calls this."""
    root = benchmarks_root()
    if root is None:
        return False
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    return True


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] in DELEGATED:  # before argparse, so that `santa eval -h` reaches eval's parser
            return delegate(argv[0], argv[1:])
        parser = build_parser()
        args = parser.parse_args(argv)
        args.check(args)
        return args.func(args)
    except BrokenPipeError:  # `santa eval report … | head`: the reader left; stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:  # Ctrl-C: one line, no traceback, the shell's status for SIGINT
        command = next((a for a in argv if not a.startswith("-")), None)
        prog = f"santa {command}" if command in (*DELEGATED, "generate") else "santa"
        print(f"{prog}: interrupted", file=sys.stderr)
        return INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
