"""argparse types and checks shared by ``santa ablate`` and ``santa tune``: every flag is checked
before any work, and a bad one ends in an argparse error (exit 2), never a traceback."""

from __future__ import annotations

import argparse
import importlib.util

from santa import install_hint
from santa.budgets.rewards import TINY
from santa.cliargs import positive_int

SAMPLERS = ("systematic", "stratified", "iid", "topk")


def int_list(text: str) -> list[int]:
    """``"0-15"`` (inclusive), ``"1,3,5"`` or a mix → sorted unique ints ≥ 0."""
    out: set[int] = set()
    try:
        for part in text.split(","):
            part = part.strip()
            if not part:
                continue
            if "-" in part:
                lo, hi = (int(x) for x in part.split("-"))
                if hi < lo:
                    raise ValueError
                out.update(range(lo, hi + 1))
            else:
                out.add(int(part))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers such as '0-15' or '1,3,5', got {text!r}") from None
    if not out or min(out) < 0:
        raise argparse.ArgumentTypeError(f"expected one or more integers ≥ 0, got {text!r}")
    return sorted(out)


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


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags that say how a schedule is scored (shared by ablation, evaluation and tuning)."""
    parser.add_argument("--model", default="smollm2-135m", help=f"bundled model (smollm2-135m, qwen2.5-coder-0.5b) or {TINY}")
    parser.add_argument("--length", type=positive_int, default=1024, help="prompt tokens (ignored by gsm8k/mmlu; default 1024)")
    parser.add_argument("--sampler", default="systematic", choices=SAMPLERS)
    parser.add_argument(
        "--prefill", default="dense", choices=("dense", "sampled"), help="task metrics: sample the prefill too (KL samples the scored rows)"
    )
    parser.add_argument("--kl-tokens", type=positive_int, default=32, help="KL: teacher-forced tokens T (T−1 scored)")
    parser.add_argument("--max-new-tokens", type=positive_int, default=64, help="task metrics: answer tokens")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads")


def check_model_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace, *, metric: str, auto_device: bool = False) -> None:
    """Errors (exit 2) for a model, metric or device santa cannot use, before anything loads."""
    from santa.assets import MODELS

    if args.model not in MODELS and args.model != TINY:
        parser.error(f"--model must be one of {', '.join(sorted(MODELS))} or {TINY}, got {args.model!r}")
    if metric not in metric_choices():
        parser.error(f"metric must be one of {', '.join(metric_choices())}, got {metric!r}")
    if auto_device and args.device not in ("auto", "cpu", "cuda"):
        parser.error(f"--device must be auto, cpu or cuda, got {args.device!r}")
    if not auto_device and args.device not in ("cpu", "cuda") and not args.device.startswith("cuda:"):
        parser.error(f"--device must be cpu, cuda or cuda:N, got {args.device!r}")
    if metric == "kl" and args.kl_tokens >= args.length:
        parser.error(f"--kl-tokens ({args.kl_tokens}) must be below --length ({args.length})")


def check_plot(parser: argparse.ArgumentParser, wanted: bool) -> None:
    if wanted and importlib.util.find_spec("matplotlib") is None:
        parser.error(f"plots need matplotlib: {install_hint('plot')} (or leave out the plot flags)")
