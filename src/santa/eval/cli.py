"""``santa eval run|report|variance|bernoulli``: accuracy sweeps, their report, variance and Bernoulli qKᵀ diagnostics.

Every flag is checked before any work (no model loads for a bad command line).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import struct
import sys
from dataclasses import dataclass
from pathlib import Path

from santa import cliargs, install_hint
from santa.engine import FAST_ONLY, PATHS, check_paths, resolve_path
from santa.eval.runner import (
    ERROR_TARGET_METHODS,
    HF_METHODS,
    KV_CACHES,
    MAX_NEW_TOKENS,
    METHODS,
    PREFILLS,
    grid,
    run_sweep,
)
from santa.eval.tasks import FIXED_LENGTH_TASKS, TASKS, missing_data
from santa.schedule_file import load_layer_budgets
from santa.sweep_files import SweepFileError

EXIT_STATUS = (
    "exit status: 0 done; 1 a sweep file cannot be used (missing, locked by another run, not a sweep "
    "file: one line names the file and line) or the work failed; 2 a bad command line (nothing run); "
    "130 interrupted (Ctrl-C)"
)
DIAGNOSTICS_EXIT_STATUS = (
    "exit status: 0 done; 1 the work failed (one line: a model that cannot load, an output that cannot be written); "
    "2 a bad command line (nothing run); 130 interrupted (Ctrl-C)"
)
MAX_JOBS = 1_000_000  # jobs one `eval run` grid may hold (a record line each; more is a typo, or several sweeps)
# Prompt length floors above cliargs.MIN_PROMPT_TOKENS: cwe lists its words in the question (~380 tokens)
MIN_LENGTH = {"cwe": 512}


# --- what a bundled model allows, read from its config without loading any weight ------------------


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a bundled model that bound the flags: decoder layers, context length (prompt +
    new tokens, max_position_embeddings), query heads and head dimension."""

    layers: int
    context: int
    heads: int
    head_dim: int


def model_shape(model: str) -> ModelShape:
    """A bundled model's :class:`ModelShape`, without loading any weight: from the cached
    ``config.json`` when the model was loaded before, else from the GGUF header (the joined file in the cache
    when a multi-part model was joined before, else its packages; a few KiB
    read). ValueError naming the file when neither can be read."""
    from santa import assets

    spec = assets.lookup(model)
    config = assets.cache_dir() / model / "config.json"
    if config.is_file():
        return _config_shape(config)
    joined = assets.joined_gguf_path(spec)  # a multi-part GGUF joined before: its header, no package needed
    if len(spec.files) > 1 and joined.is_file():
        return _gguf_shape([joined])
    parts = [assets.package_folder(p, spec.install) / f for p, f in zip(spec.packages, spec.files, strict=True)]
    return _gguf_shape(parts)


def _positive(where: Path, name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{where}: {name} must be an integer ≥ 1, got {value!r}")
    return value


def _config_shape(path: Path) -> ModelShape:
    """The shape a Hugging Face ``config.json`` gives."""
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path}: cannot read the model's config ({error})") from None
    if not isinstance(config, dict):
        raise ValueError(f"{path}: not a model config (a JSON object)")
    get = lambda name: _positive(path, name, config.get(name))  # noqa: E731
    heads = get("num_attention_heads")
    head_dim = get("head_dim") if config.get("head_dim") is not None else get("hidden_size") // heads
    return ModelShape(get("num_hidden_layers"), get("max_position_embeddings"), heads, max(head_dim, 1))


GGUF_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
GGUF_STRING, GGUF_ARRAY = 8, 9


class _Parts:
    """The parts of a GGUF file read as one byte stream (a split file is its parts in order)."""

    def __init__(self, stack: contextlib.ExitStack, paths: list[Path]):
        self.files = [stack.enter_context(open(p, "rb")) for p in paths]
        self.name = paths[0]

    def read(self, n: int) -> bytes:
        data = b""
        while len(data) < n and self.files:
            data += self.files[0].read(n - len(data))
            if len(data) < n:
                self.files.pop(0)
        if len(data) < n:
            raise ValueError(f"{self.name}: the GGUF header is cut short")
        return data

    def unpack(self, fmt: str):
        return struct.unpack(fmt, self.read(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        return self.read(self.unpack("<Q")).decode("utf-8", errors="replace")

    def value(self, kind: int):
        """One metadata value (arrays are skipped: None)."""
        if kind in GGUF_SCALARS:
            return self.unpack(GGUF_SCALARS[kind])
        if kind == GGUF_STRING:
            return self.string()
        if kind != GGUF_ARRAY:
            raise ValueError(f"{self.name}: unknown GGUF value type {kind}")
        item, count = self.unpack("<I"), self.unpack("<Q")
        for _ in range(count):
            self.value(item)
        return None


def _gguf_shape(paths: list[Path]) -> ModelShape:
    """The shape a GGUF header's ``{arch}.*`` keys give (read until they are all seen)."""
    fields: dict[str, object] = {}
    with contextlib.ExitStack() as stack:
        try:
            stream = _Parts(stack, paths)
            if stream.read(4) != b"GGUF":
                raise ValueError(f"{paths[0]}: not a GGUF file")
            version = stream.unpack("<I")
            stream.unpack("<Q" if version >= 2 else "<I")  # tensor count
            for _ in range(stream.unpack("<Q" if version >= 2 else "<I")):
                key = stream.string()
                fields[key] = stream.value(stream.unpack("<I"))
                arch = fields.get("general.architecture")
                if arch and key.startswith("tokenizer.") and f"{arch}.block_count" in fields:
                    break  # the model's keys come before the tokenizer's
        except OSError as error:
            raise ValueError(f"{paths[0]}: cannot read the GGUF header ({error.strerror or error})") from None
    arch = fields.get("general.architecture")
    get = lambda name: _positive(paths[0], f"{arch}.{name}", fields.get(f"{arch}.{name}"))  # noqa: E731
    heads = get("attention.head_count")
    head_dim = get("attention.key_length") if f"{arch}.attention.key_length" in fields else get("embedding_length") // heads
    return ModelShape(get("block_count"), get("context_length"), heads, max(head_dim, 1))


def min_length(task: str) -> int:
    """Shortest ``--lengths`` value a task is built at (its question and template must fit, with a haystack)."""
    return MIN_LENGTH.get(task, cliargs.MIN_PROMPT_TOKENS)


def sweep_out(text: str) -> str:
    """``--out`` of ``eval run``: a writable plain JSONL path (gzip cannot be appended to)."""
    if text.endswith(".gz"):
        raise argparse.ArgumentTypeError(f"{text}: a sweep appends lines and cannot write gzip; give a .jsonl path")
    return cliargs.output_file(text)


def method_pair(text: str) -> list[str]:
    """``--compare A,B``: two different sampled or top-k methods."""
    pair = [p.strip() for p in text.split(",")]
    allowed = METHODS[1:]
    if len(pair) != 2:
        raise argparse.ArgumentTypeError(f"expected two methods A,B (e.g. systematic,topk), got {text!r}")
    for name in pair:
        if name not in allowed:
            raise argparse.ArgumentTypeError(f"unknown method {name!r}; choose from {', '.join(allowed)}")
    if pair[0] == pair[1]:
        raise argparse.ArgumentTypeError(f"compare two different methods, got {pair[0]!r} twice")
    return pair


def add_run(sub) -> None:
    run = sub.add_parser("run", help="run a sweep grid; appends to --out and skips jobs already there", epilog=EXIT_STATUS)
    run.add_argument("--out", required=True, type=sweep_out, help="JSONL results file (appended to; re-run to resume; one writer at a time)")
    run.add_argument("--model", default="smollm2-135m", type=cliargs.model_list, help="comma list: smollm2-135m, qwen2.5-coder-0.5b")
    run.add_argument("--tasks", default="niah_single", type=cliargs.choice_list("task", TASKS), help=f"comma list of {', '.join(TASKS)}")
    run.add_argument(
        "--lengths",
        default="2048",
        type=cliargs.int_list("length", 1),
        help=f"prompt lengths in tokens, comma list (≥ {cliargs.MIN_PROMPT_TOKENS}; cwe ≥ {MIN_LENGTH['cwe']}; ignored by gsm8k, mmlu)",
    )
    run.add_argument(
        "--methods",
        default=",".join(HF_METHODS),
        type=cliargs.choice_list("method", METHODS),
        help=f"comma list of {', '.join(METHODS)} (default {','.join(HF_METHODS)}; {' and '.join(FAST_ONLY)}: santa's kernels, fast path only)",
    )
    run.add_argument("--budgets", default="16,32,64,128,256", type=cliargs.int_list("budget", 1), help="S (top-k: k), integers ≥ 1")
    run.add_argument("--prompts", default="0-9", type=cliargs.int_list("prompt seed", 0), help="prompt seeds ≥ 0: '0-49' or a comma list")
    run.add_argument("--seeds", default="0", type=cliargs.int_list("seed", 0, cliargs.MAX_SEED), help="sampler seeds for stochastic methods, in [0, 2**63)")
    run.add_argument("--prefill", default="dense", type=cliargs.choice_list("prefill", PREFILLS), help="dense (decode-only sampling) and/or sampled")
    run.add_argument("--max-new-tokens", type=cliargs.positive_int, default=MAX_NEW_TOKENS, help=f"answer tokens, ≥ 1 (default {MAX_NEW_TOKENS})")
    run.add_argument(
        "--score-samples",
        default="0",
        type=cliargs.int_list("score sample count", 0),
        help="Bernoulli qKᵀ draws B for the decode scores, e.g. 0,8,16 (0: exact scores; dense with B > 0 samples the scores alone)",
    )
    run.add_argument(
        "--kl-tokens", type=cliargs.int_in(2), default=32, help="teacher-forced tokens per KL prompt, T ≥ 2 (T−1 are scored)"
    )
    run.add_argument(
        "--exact-when-covers", action="store_true", help="use exact attention when S ≥ keys (off: always sample)"
    )
    run.add_argument(
        "--layer-budgets", type=schedule_file, default=None, metavar="FILE",
        help="a per-layer schedule (santa tune budgets' schedule.json) for every sampled method; layers not in it use "
        "--budgets; records name it by the file's stem",
    )
    run.add_argument(
        "--kv-caches", default="auto", type=cliargs.choice_list("KV cache", KV_CACHES),
        help="comma list of KV cache dtypes every method runs on: auto (the model's) and/or fp8 (e4m3, per-KV-head scales "
        "calibrated on the prefill; fast path only)",
    )
    run.add_argument(
        "--error-targets", default="0", type=cliargs.error_targets,
        help="relative error targets ε for the sampled methods (iid, stratified, systematic, prop), e.g. 0,0.1,0.2: each "
        "head draws min(S, what its pilot asks for), --budgets the caps; 0 (the default) is the fixed budget",
    )
    run.add_argument("--device", default=None, type=cliargs.device, help="cpu or cuda (default: cuda when present)")
    run.add_argument("--batch", type=cliargs.positive_int, default=8, help="prompts run together, ≥ 1")
    run.add_argument(
        "--path",
        default="auto",
        choices=PATHS,
        help="hf: transformers + santa.hf (left-padded); fast: santa.model (kernels for prop/flash, the reference for "
        "iid/stratified/systematic/topk, sdpa for dense; teacher-forced KL stepwise; sampled prefill, Bernoulli scores "
        "and exact_when_covers stay on hf); "
        "auto (default): fast on CUDA, hf elsewhere",
    )
    run.add_argument("--threads", type=cliargs.threads, default=None, help=f"torch CPU threads, 1 to {cliargs.MAX_THREADS}")
    run.set_defaults(error=run.error)


def add_report(sub) -> None:
    rep = sub.add_parser(
        "report",
        help="table with bootstrap CIs, and plots",
        description="One record per job key is reported: duplicates (a job written twice) are dropped, and "
        "lines cut short by a killed run are skipped, both noted on stderr.",
        epilog=EXIT_STATUS,
    )
    rep.add_argument("jsonl", nargs="+", help="sweep files (.jsonl, or gzip)")
    rep.add_argument("--plots", default=None, type=cliargs.output_folder, help="folder for the plots")
    view = rep.add_mutually_exclusive_group()
    view.add_argument("--pivot", action="store_true", help="paper-style tables: methods × S per task")
    view.add_argument(
        "--smallest-budgets", action="store_true", help="per task: smallest S matching dense from there on"
    )
    view.add_argument(
        "--compare",
        default=None,
        type=method_pair,
        metavar="A,B",
        help="paired difference A − B of two sampled or top-k methods on the same prompts, e.g. systematic,topk",
    )
    rep.add_argument("--delta", action="store_true", help="with --pivot: paired difference to dense (points)")
    rep.set_defaults(error=rep.error)


def add_diagnostics(sub, name: str, help_text: str, out: str) -> argparse.ArgumentParser:
    """The flags ``variance`` and ``bernoulli`` share."""
    p = sub.add_parser(name, help=help_text, epilog=DIAGNOSTICS_EXIT_STATUS)
    p.add_argument("--model", default="smollm2-135m", type=cliargs.bundled_model, help="bundled model: smollm2-135m (default) or qwen2.5-coder-0.5b")
    p.add_argument("--task", default="niah_single", choices=list(TASKS))
    p.add_argument("--length", type=cliargs.positive_int, default=2048, help=f"prompt tokens (≥ {cliargs.MIN_PROMPT_TOKENS})")
    p.add_argument("--prompts", type=cliargs.positive_int, default=4, help="prompts, ≥ 1")
    p.add_argument("--out", default=f"{out}.json", type=cliargs.output_file, help=f"JSON results (default {out}.json)")
    p.add_argument("--plot", default=f"{out}.png", type=cliargs.figure_file, help=f"the figure (default {out}.png)")
    p.add_argument("--device", default=None, type=cliargs.device, help="cpu, cuda or cuda:N (default: cuda when present, else cpu)")
    p.set_defaults(error=p.error)
    return p


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="santa eval", description="Accuracy of SANTA / S²ANTA on the bundled real models.", epilog=EXIT_STATUS
    )
    sub = parser.add_subparsers(dest="command", required=True)
    add_run(sub)
    add_report(sub)
    var = add_diagnostics(sub, "variance", "variance trace and unique keys vs S on real prompts", "variance")
    var.add_argument("--budgets", default="8,16,32,64,128,256,512", type=cliargs.int_list("budget", 1), help="at least two S ≥ 1")
    var.add_argument("--replicates", type=cliargs.int_in(2), default=32, help="systematic: replicate offsets R ≥ 2")
    ber = add_diagnostics(sub, "bernoulli", "Bernoulli qKᵀ: key features read and KL vs the number of draws B", "bernoulli")
    ber.add_argument("--samples", default="1,2,4,8,16,32", type=cliargs.int_list("number of draws", 1), help="numbers of ternary draws B ≥ 1")
    return parser


def chosen_tasks(args: argparse.Namespace) -> list[str]:
    """The tasks a subcommand builds prompts of (none for ``report``)."""
    if args.command == "report":
        return []
    return args.tasks if args.command == "run" else [args.task]


def check_args(args: argparse.Namespace) -> None:
    """Checks that join flags (each flag's own value is checked by its ``type``); ``args.error`` is
    the subcommand's ``parser.error`` (status 2)."""
    for task in chosen_tasks(args):
        install = missing_data(task)
        if install:
            args.error(f"argument --task{'s' * (args.command == 'run')}: task {task} needs its data, not installed: {install}")
    if args.command == "run":
        for task in args.tasks:
            short = [n for n in args.lengths if n < min_length(task)]
            if task not in FIXED_LENGTH_TASKS and short:
                args.error(f"argument --lengths: task {task} needs prompts of ≥ {min_length(task)} tokens, got {short[0]}")
        if "kl" in args.tasks and args.kl_tokens >= min(args.lengths):
            args.error(f"argument --kl-tokens: must be below every --lengths value (the KL context), got {args.kl_tokens} ≥ {min(args.lengths)}")
        jobs = grid_size(args)
        if jobs > MAX_JOBS:
            args.error(f"the grid of these flags holds up to {jobs:,} jobs, more than {MAX_JOBS:,}; split it over several sweeps")
        device = default_device(args.device)
        asked, args.path = args.path, resolve_path(args.path, device)
        if args.path == "hf" and set(args.methods) & set(FAST_ONLY):
            args.error(f"argument --methods: {' and '.join(FAST_ONLY)} run on the fast path only (--path fast; auto picks it on CUDA)")
        # --path auto (the default) picked hf: say so, and what to pass, rather than "--path hf was asked for"
        chosen = f"--path auto (the default) picks hf on {device}: pass --path fast" if asked == "auto" else None
        try:
            check_paths(run_grid(args), args.path, hf_because=chosen)
        except ValueError as error:
            args.error(f"argument --{'kv-caches' if 'fp8' in str(error) else 'methods'}: {error}")
    elif args.command == "report":
        if args.delta and not args.pivot:
            args.error("argument --delta: only with --pivot")
        if args.plots and not has_matplotlib():
            args.error(f"argument --plots: needs matplotlib: {install_hint('plot')} (or leave out --plots)")
    else:
        if not has_matplotlib():
            args.error(f"argument --plot: santa eval {args.command} writes a plot and needs matplotlib: {install_hint('plot')}")
        if args.task not in FIXED_LENGTH_TASKS and args.length < min_length(args.task):
            args.error(f"argument --length: task {args.task} needs prompts of ≥ {min_length(args.task)} tokens, got {args.length}")
        if cliargs.same_file(args.out, cliargs.figure_written(args.plot)):
            args.error(f"argument --plot: {args.plot} is also --out; give the figure and the JSON results files of their own")
        if args.command == "variance" and len(set(args.budgets)) < 2:
            args.error(f"argument --budgets: the variance slope needs at least two budgets, got {args.budgets}")


def grid_size(args: argparse.Namespace) -> int:
    """Jobs of ``eval run``'s flags, counted without building them (an upper bound: repeats not merged)."""
    per_prompt = 0
    for method in args.methods:
        per_prompt += 1 if method == "dense" else len(args.prefill) * len(args.budgets) * (1 if method == "topk" else len(args.seeds))
        if method in ERROR_TARGET_METHODS:
            per_prompt += len(args.prefill) * len(args.budgets) * len(args.seeds) * (len(args.error_targets) - 1)
    return (len(args.model) * len(args.tasks) * len(args.lengths) * len(args.prompts) * per_prompt * len(args.score_samples)
            * len(args.kv_caches))


def check_model_limits(args: argparse.Namespace) -> None:
    """Flags checked against each model's config, read without loading any weight (:func:`model_shape`):
    the context length, the layers of ``--layer-budgets``, the draws of the diagnostics. A bad flag
    is ``args.error`` (status 2); a config that cannot be read is ValueError (status 1)."""
    from santa.sampling import MAX_DRAWS

    for model in args.model if args.command == "run" else [args.model]:
        shape = model_shape(model)
        if args.command == "run":
            check_run_limits(args, model, shape)
            continue
        if args.task not in FIXED_LENGTH_TASKS and args.length > shape.context:
            args.error(f"argument --length: {model} reads at most {shape.context} tokens, got {args.length}")
        keys = args.length if args.task not in FIXED_LENGTH_TASKS else shape.context  # an item's prompt: at most the context
        if args.command == "variance":
            draws = args.replicates * shape.heads * max(keys, *args.budgets)
            if draws > MAX_DRAWS:
                args.error(
                    f"argument --replicates: {args.replicates} replicates × {shape.heads} heads × {max(keys, *args.budgets)} keys "
                    f"or S = {draws:,} draws per layer, past santa.sampling.MAX_DRAWS = {MAX_DRAWS:,}; use fewer replicates or smaller S"
                )
        elif max(args.samples) * shape.heads * shape.head_dim > MAX_DRAWS:
            args.error(
                f"argument --samples: B = {max(args.samples)} draws × {shape.heads} heads × {shape.head_dim} features per layer "
                f"is past santa.sampling.MAX_DRAWS = {MAX_DRAWS:,}; use B ≤ {MAX_DRAWS // (shape.heads * shape.head_dim)}"
            )


def check_run_limits(args: argparse.Namespace, model: str, shape: ModelShape) -> None:
    """``eval run``: every prompt and its answer fit the model's context; the schedule's layers exist."""
    for task in args.tasks:
        if task in FIXED_LENGTH_TASKS:  # the item sets the prompt's length
            if args.max_new_tokens >= shape.context:
                args.error(f"argument --max-new-tokens: {model} reads at most {shape.context} tokens (prompt and answer), got {args.max_new_tokens}")
            continue
        new = 0 if task == "kl" else args.max_new_tokens  # KL: the teacher-forced tokens are part of the length
        if max(args.lengths) + new > shape.context:
            answer = "" if task == "kl" else f" + --max-new-tokens {new}"
            args.error(f"argument --lengths: {model} reads at most {shape.context} tokens, got {max(args.lengths)}{answer} ({task})")
    if args.layer_budgets:
        stem, budgets, path = args.layer_budgets
        beyond = [layer for layer in budgets if layer >= shape.layers]
        if beyond:
            args.error(f"argument --layer-budgets: {path} sets layer {beyond[0]}, but {model} has {shape.layers} layers (0 to {shape.layers - 1})")
        if len(budgets) < shape.layers:
            print(f"santa eval run: note: {path} sets {len(budgets)} of {model}'s {shape.layers} layers; "
                  "the others use --budgets", file=sys.stderr)


def has_matplotlib() -> bool:
    import importlib.util

    return importlib.util.find_spec("matplotlib") is not None


def fail(command: str, error: Exception) -> int:
    """One line on stderr, status 1: a sweep file that cannot be used, or work that failed."""
    print(f"santa eval {command}: error: {error}", file=sys.stderr)
    return 1


def run_grid(args: argparse.Namespace) -> list:
    """The jobs of ``eval run``'s flags."""
    return grid(
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
        layer_budgets=args.layer_budgets[1] if args.layer_budgets else None,
        schedule=args.layer_budgets[0] if args.layer_budgets else "schedule",
        kv_caches=args.kv_caches,
        error_targets=args.error_targets,
    )


def schedule_file(text: str) -> tuple[str, dict[int, int], str]:
    """``--layer-budgets FILE`` → (the file's stem, ``{layer: S}``, the path), checked before any work
    (its layers against each model's in :func:`check_run_limits`)."""
    try:
        budgets = load_layer_budgets(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return Path(text).stem, budgets, text


def check_sweep_records(path: Path, records: list[tuple[int, dict]]) -> None:
    """``eval run --out``: the file's ``(line, record)`` pairs must be sweep records of ``santa eval run`` (those the
    report reads), not another command's (a file of ``santa ablate layers`` or ``santa tune``, which
    the sweep's records would spoil for both); :class:`SweepFileError` naming the file, the line and
    what it holds. :func:`~santa.eval.runner.run_sweep` calls it on the records it reads, before any model loads."""
    from santa.eval.report import record_problem

    for line, record in records:
        problem = record_problem(record)
        if problem:
            holds = foreign_record(record)
            what = f"{holds}, not a sweep record of santa eval run" if holds else f"not a sweep record of santa eval run ({problem})"
            raise SweepFileError(f"{path}, line {line}: {what}; give --out a sweep file of santa eval run, or a new file")


def foreign_record(record: dict) -> str | None:
    """What another command's record in a sweep file is, in words (None: not known)."""
    if {"name", "schedule", "scores"} <= record.keys():
        return "a schedule cell of santa ablate layers / santa tune evaluate"
    if {"update", "theta"} <= record.keys():
        return "a policy update of santa tune budgets (history.jsonl)"
    return None


def run_command(args: argparse.Namespace) -> int:
    jobs = run_grid(args)
    try:
        ran = run_sweep(jobs, args.out, device=args.device, batch_size=args.batch, path=args.path,
                        check_records=check_sweep_records)
    except OSError as error:  # main says it in one line; an error without a file name is the appends' to --out (a full disk, say)
        if error.filename is not None or isinstance(error, BrokenPipeError):
            raise
        raise SweepFileError(f"{args.out}: cannot append the sweep's records ({error.strerror or error})") from None
    print(f"{len(jobs)} jobs in the grid, {ran} run now, {len(jobs) - ran} already in {args.out}")
    return 0


def report_command(args: argparse.Namespace) -> int:
    from santa.eval.report import (
        cells,
        compare_methods,
        load_records,
        pivot,
        plot,
        plot_delta,
        smallest_matching_budgets,
        table,
    )

    loaded = load_records(args.jsonl)
    for note in loaded.notes():
        print(f"santa eval report: {note}", file=sys.stderr)
    records = loaded.records
    # the cells (a bootstrap each) are needed by every output but --compare, and by the plots
    all_cells = cells(records) if args.compare is None or args.plots else []
    if args.compare is not None:
        print(compare_methods(records, *args.compare))
    elif args.smallest_budgets:
        print(smallest_matching_budgets(all_cells))
    else:
        print(pivot(all_cells, delta=args.delta) if args.pivot else table(all_cells))
    if args.plots and all_cells:
        for path in plot(all_cells, args.plots) + plot_delta(all_cells, args.plots):
            print(f"wrote {path}")
    return 0


def variance_command(args: argparse.Namespace) -> int:
    from santa.assets import load_model
    from santa.eval.variance import diagnostics, plot_diagnostics, save

    model, tokenizer = load_model(args.model, device=default_device(args.device))
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
    print(json.dumps({k: result[k] for k in ("slopes", "trace", "unique_keys", "unique_keys_kv", "mean_keys")}, indent=1))
    print(f"wrote {args.out} and {args.plot}")
    return 0


def bernoulli_command(args: argparse.Namespace) -> int:
    from santa.assets import load_model
    from santa.eval.score_stage import bernoulli_diagnostics, plot_bernoulli
    from santa.eval.variance import save

    model, tokenizer = load_model(args.model, device=default_device(args.device))
    result = bernoulli_diagnostics(
        model, tokenizer, task=args.task, length=args.length, prompts=args.prompts, samples=args.samples
    )
    result["model"] = args.model
    save(result, args.out)
    plot_bernoulli(result, args.plot)
    print(json.dumps({k: result[k] for k in ("samples", "read_kv", "read_head_kv", "kl")}, indent=1))
    print(f"wrote {args.out} and {args.plot}")
    return 0


def default_device(device: str | None) -> str:
    import torch

    return device or ("cuda" if torch.cuda.is_available() else "cpu")


COMMANDS = {"run": run_command, "report": report_command, "variance": variance_command, "bernoulli": bernoulli_command}


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    check_args(args)
    try:
        if args.command != "report":
            check_model_limits(args)
        if getattr(args, "threads", None):
            import torch

            torch.set_num_threads(args.threads)
        return COMMANDS[args.command](args)
    except BrokenPipeError:  # `santa eval report … | head`: santa.cli stops quietly
        raise
    except (SweepFileError, ValueError, OSError) as error:  # one line, no traceback (a file that cannot be read or written too)
        return fail(args.command, error)


if __name__ == "__main__":
    sys.exit(main())
