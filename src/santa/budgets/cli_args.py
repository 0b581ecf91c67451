"""argparse types and checks shared by ``santa ablate`` and ``santa tune``: every flag is checked
before any work, and a bad one ends in an argparse error (exit 2), never a traceback."""

from __future__ import annotations

import argparse
import importlib.util
import os
from collections.abc import Callable
from pathlib import Path

from santa import cliargs, install_hint
from santa.budgets.rewards import TINY
from santa.cliargs import positive_int
from santa.methods import METHODS

SAMPLERS = tuple(m.sampler for m in METHODS.values() if m.sampler and not m.exact)  # the reference samplers
MAX_THREADS = cliargs.MAX_THREADS  # torch CPU threads (santa.cliargs.threads)


def sorted_int_list(what: str, high: int | None = None) -> Callable[[str], list[int]]:
    """``"0-15"`` (inclusive), ``"1,3,5"`` or a mix → sorted unique ints in ``[0, high)``, at most
    ``santa.cliargs.MAX_VALUES`` of them (a range such as ``0-300000000`` is refused, not expanded)."""
    parse = cliargs.int_list(what, 0, high)

    def sorted_unique(text: str) -> list[int]:
        return sorted(set(parse(text)))

    sorted_unique.__name__ = f"{what}_list"
    return sorted_unique


prompt_list = sorted_int_list("prompt seed")
seed_list = sorted_int_list("seed", cliargs.MAX_SEED)
layer_list = sorted_int_list("layer")
threads_arg = cliargs.threads


def cell_file(text: str) -> str:
    """``--out`` of ablate / evaluate: a writable plain JSONL path (cells are appended; gzip cannot be)."""
    if text.endswith(".gz"):
        raise argparse.ArgumentTypeError(f"{text}: cells are appended as lines and cannot be written to gzip; give a .jsonl path")
    return cliargs.output_file(text)


def existing_file(text: str) -> str:
    """A file that exists and can be read (not a folder)."""
    path = Path(text)
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"{text}: {'is a folder' if path.is_dir() else 'no such file'}; give a file")
    if not os.access(path, os.R_OK):
        raise argparse.ArgumentTypeError(f"{text}: cannot read it")
    return text


def tune_device(text: str) -> str:
    """``--device`` of ``tune budgets``: auto, cpu or cuda, the workers' device (checked against this
    machine only for a local Ray: see ``tune_cli.check_workers``)."""
    if text not in ("auto", "cpu", "cuda"):
        raise argparse.ArgumentTypeError(f"expected auto, cpu or cuda, got {text!r}")
    return text


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {text!r}")
    return value


def metric_choices() -> list[str]:
    from santa.eval.tasks import TASKS

    return ["kl"] + [t for t in TASKS if t != "kl"]


def add_model_arguments(parser: argparse.ArgumentParser, *, device: Callable[[str], str] = cliargs.device) -> None:
    """The flags that say how a schedule is scored (shared by ablation, evaluation and tuning).
    device: the ``--device`` type (``cliargs.device``: cpu, cuda or cuda:N where CUDA is present)."""
    parser.add_argument("--model", default="smollm2-135m", help=f"bundled model (smollm2-135m, qwen2.5-coder-0.5b) or {TINY}")
    parser.add_argument("--length", type=positive_int, default=1024, help="prompt tokens (ignored by gsm8k/mmlu; default 1024)")
    parser.add_argument("--sampler", default="systematic", choices=SAMPLERS)
    parser.add_argument(
        "--prefill", default="dense", choices=("dense", "sampled"), help="task metrics: sample the prefill too (KL samples the scored rows)"
    )
    parser.add_argument("--kl-tokens", type=cliargs.int_in(2), default=32, help="KL: teacher-forced tokens T ≥ 2 (T−1 scored)")
    parser.add_argument("--max-new-tokens", type=positive_int, default=64, help="task metrics: answer tokens")
    parser.add_argument("--device", default="cpu", type=device, help="cpu or cuda (cuda:N; CUDA must be present)")
    parser.add_argument("--threads", type=threads_arg, default=None, help=f"torch CPU threads, 1-{MAX_THREADS}")


def check_model_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace, *, metric: str, context: bool = True,
                          flag: str = "--metric", other_choices: tuple[str, ...] = ()) -> None:
    """Errors (exit 2) for a model or metric santa cannot use, or a prompt longer than the model's
    context (``context=False``: no model runs, as for the synthetic reward), before anything loads.
    flag: the flag that gave ``metric`` (``--reward`` of tune budgets), other_choices: the values it
    also takes, listed in its error."""
    from santa.assets import MODELS

    if args.model not in MODELS and args.model != TINY:
        parser.error(f"argument --model: invalid choice: {args.model!r} (choose from {', '.join([*sorted(MODELS), TINY])})")
    if metric not in metric_choices():
        parser.error(f"argument {flag}: invalid choice: {metric!r} (choose from {', '.join([*metric_choices(), *other_choices])})")
    if metric == "kl" and args.kl_tokens >= args.length:
        parser.error(f"--kl-tokens ({args.kl_tokens}) must be below --length ({args.length})")
    if context:
        check_context(parser, args, metric=metric)


def model_context(model: str) -> int:
    """The model's context length (max_position_embeddings), read from its config or GGUF header
    without loading any weight (:func:`santa.eval.cli.model_shape`); ValueError or OSError naming
    the file when neither can be read."""
    if model == TINY:
        from santa.budgets.tiny import CONTEXT

        return CONTEXT
    from santa.eval.cli import model_shape

    return model_shape(model).context


def check_context(parser: argparse.ArgumentParser, args: argparse.Namespace, *, metric: str) -> None:
    """``--length`` (with ``--max-new-tokens`` for a task metric; KL's teacher-forced tokens are part
    of its length) must fit the model's context; gsm8k and mmlu ignore ``--length``, so their answer
    alone is checked."""
    from santa.eval.tasks import FIXED_LENGTH_TASKS

    try:
        context = model_context(args.model)
    except (OSError, ValueError) as error:
        parser.error(f"cannot read the context length of {args.model!r}: {error}")
    if metric in FIXED_LENGTH_TASKS:
        if args.max_new_tokens >= context:
            parser.error(f"argument --max-new-tokens: {args.model} reads at most {context} tokens (prompt and answer), got {args.max_new_tokens}")
        return
    problem = cliargs.context_problem(args.model, context, args.length, 0 if metric == "kl" else args.max_new_tokens)
    if problem:
        parser.error(f"argument --length: {problem}")


def check_plot(parser: argparse.ArgumentParser, wanted: bool) -> None:
    if wanted and importlib.util.find_spec("matplotlib") is None:
        parser.error(f"plots need matplotlib: {install_hint('plot')} (or leave out the plot flags)")
