"""Tables and plots from a sweep's JSONL: accuracy ± 95 % bootstrap CI per cell, value rows read,
average tokens; accuracy vs budget per task (dense as a band) and KL vs budget (log axes)."""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from santa.checks import integer
from santa.eval.runner import KV_CACHES, MAX_NEW_TOKENS, METHODS, PREFILLS
from santa.eval.tasks import TASKS
from santa.methods import METHODS as REGISTRY
from santa.sweep_files import SweepFileError, load_sweep

KL_MODES = ("chunked", "stepwise")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_finite(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _count(low: int) -> tuple:
    return (lambda v: _is_int(v) and v >= low), f"an integer ≥ {low}"


def _one_of(names) -> tuple:
    names = tuple(names)
    return (lambda v: isinstance(v, str) and v in names), f"one of {', '.join(names)}"


def _share() -> tuple:
    return (lambda v: v is None or (_is_finite(v) and 0.0 <= v <= 1.0)), "a number in [0, 1] (or null)"


_NAME = ((lambda v: isinstance(v, str) and v != ""), "a non-empty string")
# The fields every output of this module reads: (test, what is expected). Scores are checked with
# their task (accuracy in [0, 1], KL ≥ 0) and budgets with their method (dense: 0).
RECORD_FIELDS = {
    "key": _NAME,
    "model": _NAME,
    "task": _one_of(TASKS),
    "length": _count(0),
    "prefill": _one_of(PREFILLS),
    "method": _one_of(METHODS),
    "budget": _count(0),
    "prompt": _count(0),
    "score": ((lambda v: _is_finite(v)), "a finite number"),
    "prompt_tokens": _count(0),
    "new_tokens": _count(0),
}
# Fields the report reads when a record has them (older records lack some).
OPTIONAL_FIELDS = {
    "max_new_tokens": _count(1),
    "score_samples": _count(0),
    "schedule": ((lambda v: isinstance(v, str)), "a string"),
    "kv_cache": _one_of(KV_CACHES),
    "error_target": ((lambda v: _is_finite(v) and v >= 0), "a finite number ≥ 0"),
    "kl_mode": _one_of(KL_MODES),
    "nll": ((lambda v: _is_finite(v) and v >= 0), "a finite number ≥ 0"),
    "v_rows_read": _share(),
    "v_rows_read_kv": _share(),
}


def record_problem(record: dict, *, written: bool = True) -> str | None:
    """What is wrong with one record for the report (``None``: nothing): a missing field, a field of
    the wrong type or out of range, a score out of its task's range, a dense record with a budget.

    written: a record read from a sweep file, which must have every field the report reads (the
    job ``key`` and, for KL, ``nll`` too) and a score in its task's range. Records built in memory
    (``written=False``) are checked field by field for the fields they have: a non-finite score,
    an unknown method or a dense record with a budget is refused, a missing ``nll`` shows as "–".
    """
    if written:
        required = list(RECORD_FIELDS) + ["nll"] * (record.get("task") == "kl")  # every KL record written has it
        missing = [name for name in required if name not in record]
        if missing:
            return f"a record without {', '.join(missing)}"
    for name, (valid, expected) in (RECORD_FIELDS | OPTIONAL_FIELDS).items():
        if name in record and (written or name != "key") and not valid(record[name]):
            return f"{name} must be {expected}, got {record[name]!r}"
    score, task = record.get("score"), record.get("task")
    if written and task == "kl" and score < 0:
        return f"score of a KL record must be ≥ 0 (KL in nats/token), got {score!r}"
    if written and task != "kl" and not 0.0 <= score <= 1.0:
        return f"score of a {task} record must be in [0, 1], got {score!r}"
    method, budget = record.get("method"), record.get("budget")
    if method == "dense" and budget not in (None, 0):
        return f"budget of a dense record must be 0 (dense reads every key), got {budget}"
    if method not in (None, "dense") and budget is not None and budget < 1:
        return f"budget of a {method} record must be ≥ 1, got {budget}"
    return None


def check_records(records: Iterable[dict]) -> list[dict]:
    """``records`` as a list, or ``ValueError`` naming the first record the report cannot use (by index)."""
    records = list(records)
    for index, record in enumerate(records):
        if not isinstance(record, dict):
            raise ValueError(f"records[{index}] must be a dict, got {type(record).__name__}")
        problem = record_problem(record, written=False)
        if problem:
            raise ValueError(f"records[{index}]: {problem}")
    return records


@dataclass
class Records:
    """The records of one or more sweep files, one per job key, and what was left out."""

    records: list[dict] = field(default_factory=list)
    duplicates: int = 0  # records whose job key an earlier record (same file or an earlier one) had
    torn: list[tuple[Path, int]] = field(default_factory=list)  # (file, line) cut mid-write, skipped

    def notes(self) -> list[str]:
        """One line per thing left out, for stderr."""
        lines = [f"{path}, line {line}: a record cut short by a killed run; skipped" for path, line in self.torn]
        if self.duplicates:
            lines.append(f"dropped {self.duplicates} duplicate record(s): a job key seen before (the first record of each key is kept)")
        return lines


def check_record(path: Path, line: int, record: dict) -> None:
    """``SweepFileError`` naming the file and line unless the report can use ``record``
    (:func:`record_problem`: every field it reads present, of its type and in its range)."""
    problem = record_problem(record)
    if problem:
        raise SweepFileError(f"{path}, line {line}: {problem}")


def load_records(paths: Iterable[str | Path]) -> Records:
    """The records of sweep files, checked and with one record per job key.

    Two writers on one file (before the runner locked it) or the same sweep passed twice write a
    job twice; the report counts each job once, keeping its first record, and says how many it
    dropped. Raises :class:`SweepFileError` (file and line) for a file that cannot be read, holds
    no record, or holds a record the report cannot use (:func:`record_problem`: a field missing, of
    the wrong type or out of range — a NaN score, a KL record without ``nll``, a dense record with a
    budget, a method or task this version does not know).
    """
    out, seen = Records(), set()
    for path in paths:
        sweep = load_sweep(path)
        if not sweep.records:
            raise SweepFileError(f"{sweep.path}: no sweep records in it")
        out.torn += [(sweep.path, line) for line in sweep.torn]
        for line, record in sweep.records:
            check_record(sweep.path, line, record)
            if record["key"] in seen:
                out.duplicates += 1
                continue
            seen.add(record["key"])
            out.records.append(record)
    return out


def bootstrap_ci(values, *, n_resamples: int = 2000, level: float = 0.95, seed: int = 0) -> tuple[float, float, float]:
    """Mean and percentile-bootstrap CI of the mean: ``(mean, low, high)``.

    n_resamples (≥ 1) and seed (≥ 0) take Python or numpy ints (a float is a TypeError); level is a
    number in (0, 1).
    """
    n_resamples, seed = integer("n_resamples", n_resamples, low=1), integer("seed", seed, low=0)
    if isinstance(level, bool) or not isinstance(level, (int, float)) or not 0 < level < 1:
        raise ValueError(f"level must be a number in (0, 1), got {level!r}")
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        raise ValueError("bootstrap_ci needs at least one value")
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, size=(n_resamples, x.size))].mean(axis=1)
    tail = (1 - level) / 2
    low, high = np.quantile(means, [tail, 1 - tail])
    return float(x.mean()), float(low), float(high)


def loglog_slope(x, y) -> float:
    """Least-squares slope of log y on log x (−1 for y ∝ 1/x)."""
    return float(np.polyfit(np.log(np.asarray(x, float)), np.log(np.asarray(y, float)), 1)[0])


def scores_by_prompt(rows: list[dict]) -> dict[int, list[float]]:
    """Each prompt's scores, one per seed: prompts are the sampling unit of every CI here."""
    per_prompt: dict[int, list[float]] = defaultdict(list)
    for r in rows:
        per_prompt[r["prompt"]].append(r["score"])
    return per_prompt


def task_label(record: dict) -> str:
    """The task a record is reported under: its task name, plus the answer budget where that is not
    the default (``gsm8k_512tok``). Runs of one task with different ``max_new_tokens`` are different
    cells (a longer budget lets more answers finish); pooling them would count them as more seeds.
    KL records keep their name: their ``max_new_tokens`` is the teacher-forced length.
    """
    task, new_tokens = record["task"], record.get("max_new_tokens", MAX_NEW_TOKENS)
    return task if task == "kl" or new_tokens == MAX_NEW_TOKENS else f"{task}_{new_tokens}tok"


def setting_label(record: dict) -> str:
    """The record's setting, reported in the ``prefill`` column: ``dense`` (decode-only sampling) or
    ``sampled`` (prefill too), plus ``+bqkB`` where the scores were Bernoulli qKᵀ with B draws.
    KL records of the earlier single-token-step mode get ``/stepwise``."""
    label = record["prefill"]
    if record["task"] == "kl" and record.get("kl_mode", "stepwise") != "chunked":
        label += "/stepwise"  # KL scored by single-token decode steps (an earlier mode)
    if record.get("score_samples"):
        label += f"+bqk{record['score_samples']}"
    if record.get("schedule"):
        label += f"+{record['schedule']}"  # a per-layer budget schedule
    if kv_cache(record) != "auto":
        label += f"+{kv_cache(record)}"  # an fp8 KV cache
    if record.get("error_target"):
        label += f"+ε{record['error_target']:g}"  # budgets from an error target, S the cap
    return label


def kv_cache(record: dict) -> str:
    """The KV cache a record ran on: ``"auto"`` (the model's dtype; records before the field) or ``"fp8"``."""
    return record.get("kv_cache", "auto")


def is_baseline(record: dict) -> bool:
    """Dense attention with exact scores on its KV cache: the reference the cells of that cache are
    paired with (dense on the model's own cache is the reference of dense on fp8)."""
    return record["method"] == "dense" and record["prefill"] == "dense" and not record.get("score_samples")


def signed_ci(mean: float, low: float, high: float) -> str:
    """A difference in points with its CI, ``*`` where the CI excludes 0: ``-2.5 [-4.0, -0.5]*``."""
    return f"{100 * mean:+.1f} [{100 * low:+.1f}, {100 * high:+.1f}]" + ("" if low <= 0 <= high else "*")


@dataclass
class Cell:
    model: str
    task: str
    length: int
    prefill: str
    method: str
    budget: int
    n_prompts: int
    n_seeds: int
    mean: float
    low: float
    high: float
    v_rows_read: float | None
    v_rows_read_kv: float | None
    avg_tokens: float
    ppl: float | None = None
    # method − dense on the same prompts (paired), with its 95 % bootstrap CI; None for dense / KL
    delta: float | None = None
    delta_low: float | None = None
    delta_high: float | None = None

    @property
    def matches_dense(self) -> bool | None:
        """Whether the paired CI of (method − dense) contains 0."""
        return None if self.delta is None else self.delta_low <= 0.0 <= self.delta_high


def cells(records: list[dict]) -> list[Cell]:
    """One cell per (model, task, length, prefill, method, budget). Scores are first averaged over
    seeds per prompt, then bootstrapped over prompts (the prompts are the sampling unit).

    Each sampled or top-k cell of a RULER-style task also gets the paired difference to dense
    (dense-prefill dense on the same prompts and the same KV cache): the mean of per-prompt
    (method − dense) and its bootstrap CI, much tighter than comparing two unpaired CIs. Dense on an
    fp8 cache is paired with dense on the model's own cache (what fp8 costs dense).

    ValueError naming the first record it cannot use (:func:`record_problem`).
    """
    records = check_records(records)
    grouped: dict[tuple, list[dict]] = defaultdict(list)
    for r in records:
        grouped[(r["model"], task_label(r), r["length"], setting_label(r), r["method"], r["budget"])].append(r)
    dense_scores: dict[tuple, dict[int, float]] = defaultdict(dict)
    for r in records:
        if is_baseline(r) and r["task"] != "kl":
            dense_scores[(r["model"], task_label(r), r["length"], kv_cache(r))][r["prompt"]] = r["score"]
    out = []
    for key, rows in grouped.items():
        per_prompt = scores_by_prompt(rows)
        mean, low, high = bootstrap_ci([np.mean(v) for v in per_prompt.values()])
        model, task, length, _, method, _ = key
        own_cache = kv_cache(rows[0])
        reference = is_baseline(rows[0]) and own_cache == "auto"
        baseline_cache = "auto" if is_baseline(rows[0]) else own_cache
        dense = dense_scores.get((model, task, length, baseline_cache), {})
        paired = [np.mean(v) - dense[p] for p, v in per_prompt.items() if p in dense]
        delta = bootstrap_ci(paired) if not reference and paired else (None, None, None)
        kv = [r["v_rows_read_kv"] for r in rows if r.get("v_rows_read_kv") is not None]
        ppl = [r["nll"] for r in rows if "nll" in r]
        out.append(
            Cell(
                *key,
                n_prompts=len(per_prompt),
                n_seeds=max(len(v) for v in per_prompt.values()),
                mean=mean,
                low=low,
                high=high,
                v_rows_read=float(np.mean(reads))
                if (reads := [r["v_rows_read"] for r in rows if r.get("v_rows_read") is not None])
                else None,
                v_rows_read_kv=float(np.mean(kv)) if kv else None,
                avg_tokens=float(np.mean([r["prompt_tokens"] + r["new_tokens"] for r in rows])),
                ppl=float(np.exp(np.mean(ppl))) if ppl else None,
                delta=delta[0],
                delta_low=delta[1],
                delta_high=delta[2],
            )
        )
    order = {m: i for i, m in enumerate(METHODS)}
    return sorted(
        out, key=lambda c: (c.model, c.task, c.length, c.prefill != "dense", order.get(c.method, 99), c.budget)
    )


def table(all_cells: list[Cell]) -> str:
    """A markdown table, one row per cell (KL cells show KL in nats/token and perplexity)."""
    lines = [
        "| model | task | length | prefill | method | S | prompts×seeds | score (95 % CI) | V rows read/head | (GQA union) | avg tokens |",
        "|---|---|---:|---|---|---:|---:|---|---:|---:|---:|",
    ]
    for c in all_cells:
        if c.task == "kl":
            ppl = "–" if c.ppl is None else f"{c.ppl:.2f}"  # records passed in without nll
            score = f"KL {c.mean:.4f} [{c.low:.4f}, {c.high:.4f}], ppl {ppl}"
        else:
            score = f"{100 * c.mean:.1f} [{100 * c.low:.1f}, {100 * c.high:.1f}]"
        kv = f"{100 * c.v_rows_read_kv:.1f} %" if c.v_rows_read_kv is not None else "–"
        read = f"{100 * c.v_rows_read:.1f} %" if c.v_rows_read is not None else "–"
        budget = "–" if c.method == "dense" else str(c.budget)
        lines.append(
            f"| {c.model} | {c.task} | {c.length or '–'} | {c.prefill} | {c.method} | {budget} | {c.n_prompts}×{c.n_seeds} "
            f"| {score} | {read} | {kv} | {c.avg_tokens:.0f} |"
        )
    return "\n".join(lines)


def pivot(all_cells: list[Cell], *, delta: bool = False) -> str:
    """Paper-style tables: one per (model, task, length, prefill); rows = methods, columns = S.

    Each entry is ``score [95 % CI]`` (%; KL in nats/token for ``task="kl"``); the share of value
    rows read per head is in :func:`table`. ``delta=True``: RULER entries are the paired difference
    to dense in points, ``Δ [95 % CI]``, marked ``*`` where the CI excludes 0 (KL panels are left out).
    KL panels end with the fitted log–log slope of KL vs S per method (−1 for a variance ∝ 1/S).
    """
    blocks = []
    panels: dict[tuple, list[Cell]] = defaultdict(list)
    for c in all_cells:
        if delta and c.task == "kl":
            continue
        panels[(c.model, c.task, c.length, c.prefill)].append(c)
    for (model, task, length, prefill), group in panels.items():
        budgets = sorted({c.budget for c in group if c.method != "dense"})
        n_prompts = sorted({c.n_prompts for c in group})
        def fmt(c: Cell, kl: bool = task == "kl") -> str:
            if kl:
                return f"{c.mean:.3f} [{c.low:.3f}, {c.high:.3f}]"
            if delta and c.delta is not None:
                return signed_ci(c.delta, c.delta_low, c.delta_high)
            return f"{100 * c.mean:.1f} [{100 * c.low:.1f}, {100 * c.high:.1f}]"

        header = f"**{model} · {task} · {length or 'item'} tokens · {prefill} prefill** (prompts per cell: {', '.join(map(str, n_prompts))})"
        slopes = task == "kl" and len(budgets) > 1
        columns = [f"S={b}" for b in budgets] or ["score"]
        lines = [
            header,
            "",
            "| method | " + " | ".join(columns + ["slope"] * slopes) + " |",
            "|---|" + "---|" * (len(columns) + slopes),
        ]
        for method in METHODS:
            row = {c.budget: c for c in group if c.method == method}
            if not row:
                continue
            if method == "dense":
                (c,) = row.values()
                filler = max(len(budgets) - 1, 0) + slopes
                lines.append(f"| dense | {fmt(c)}{' (all S)' if budgets else ''} |" + " |" * filler)
                continue
            entries = [fmt(row[b]) if b in row else "" for b in budgets]
            if slopes:
                fitted = [b for b in sorted(row) if row[b].mean > 0]
                kl = [row[b].mean for b in fitted]
                entries.append(f"{loglog_slope(fitted, kl):.2f}" if len(fitted) > 1 else "–")
            lines.append(f"| {method} | " + " | ".join(entries) + " |")
        blocks.append("\n".join(lines))
    if not blocks:  # say why rather than print a blank line
        if delta and all_cells:
            return ("nothing to show: the difference to dense (--delta) leaves out the KL panels, and these records hold KL "
                    "only; drop --delta to see their tables")
        return "nothing to show: no records"
    return "\n\n".join(blocks)


def smallest_matching_budgets(all_cells: list[Cell]) -> str:
    """Per (model, length, prefill, task): for each method, the smallest S from which no loss
    against dense is detectable — the paired CI's upper end is ≥ 0 — at that S and every larger S
    measured (">S_max" where none qualifies).

    A budget picker, with its limit stated: no loss detectable at n prompts is not no loss (the CI
    half-width is printed so the reader sees what size of loss would go unseen). Each budget comes
    with the share of value rows read per head at that S, where the records hold it: what the
    budget saves.
    """
    groups: dict[tuple, dict[str, list[Cell]]] = defaultdict(lambda: defaultdict(list))
    for c in all_cells:
        if c.delta is not None:
            groups[(c.model, c.length, c.prefill, c.task)][c.method].append(c)
    methods = [m for m in METHODS[1:] if any(m in g for g in groups.values())]
    lines = [
        "| model | length | prefill | task | prompts | " + " | ".join(methods) + " | CI half-width at the largest S |",
        "|---|---:|---|---|---:|" + "---:|" * len(methods) + "---:|",
    ]
    if not groups:  # say why rather than print a header alone
        return ("nothing to show: no sampled or top-k cell has a paired difference to dense (it needs dense records of "
                "the same prompts; KL records have none)")
    for (model, length, prefill, task), by_method in sorted(groups.items()):
        entries, widths, n = [], [], 0
        for method in methods:
            line = sorted(by_method.get(method, []), key=lambda c: c.budget)
            if not line:
                entries.append("–")
                continue
            n = max(n, line[-1].n_prompts)
            widths.append(100 * (line[-1].delta_high - line[-1].delta_low) / 2)
            safe = next((c for i, c in enumerate(line) if all(d.delta_high >= 0 for d in line[i:])), None)
            if safe is None:
                entries.append(f">{line[-1].budget}")
            else:
                read = f" ({100 * safe.v_rows_read:.2f} % of V)" if safe.v_rows_read is not None else ""
                entries.append(f"{safe.budget}{read}")
        width = f"±{max(widths):.1f} pts" if widths else "–"
        lines.append(f"| {model} | {length or '–'} | {prefill} | {task} | {n} | " + " | ".join(entries) + f" | {width} |")
    return "\n".join(lines)


def compare_methods(records: list[dict], first: str, second: str) -> str:
    """Paired difference ``first − second`` of two sampled or top-k methods on the same prompts,
    per (model, task, length, prefill) and budget S, in points with its 95 % bootstrap CI (``*``
    where it excludes 0). The last column averages each prompt's difference over the S both
    methods ran, which pools the budgets without treating them as independent samples.

    Scores are averaged over seeds per prompt first. KL records are left out (the KL panels already
    separate the methods), and so is dense: ``pivot(..., delta=True)`` gives the difference to dense.
    """
    for name, method in (("first", first), ("second", second)):
        if method not in METHODS[1:]:
            raise ValueError(f"{name} method must be one of {', '.join(METHODS[1:])}, got {method!r}")
    if first == second:
        raise ValueError(f"compare two different methods, got {first!r} twice")
    records = check_records(records)
    # (model, task, length, prefill) → method → S → that cell's records
    grouped: dict[tuple, dict] = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for r in records:
        if r["task"] != "kl" and r["method"] in (first, second):
            grouped[(r["model"], task_label(r), r["length"], setting_label(r))][r["method"]][r["budget"]].append(r)
    lines = [
        f"**{first} − {second}**, paired on the same prompts (points; * = 95 % CI excludes 0)",
        "",
        "| model | task | length | prefill | prompts | per S | mean over S |",
        "|---|---|---:|---|---:|---|---|",
    ]
    header = len(lines)
    for panel in sorted(grouped):
        a, b = grouped[panel][first], grouped[panel][second]
        diffs = {}
        for budget in sorted(set(a) & set(b)):
            left, right = scores_by_prompt(a[budget]), scores_by_prompt(b[budget])
            diffs[budget] = {p: np.mean(left[p]) - np.mean(right[p]) for p in left if p in right}
        diffs = {budget: d for budget, d in diffs.items() if d}
        if not diffs:
            continue
        common = sorted(set.intersection(*(set(d) for d in diffs.values())))
        per_s = "; ".join(f"S={budget}: {signed_ci(*bootstrap_ci(list(d.values())))}" for budget, d in diffs.items())
        pooled = signed_ci(*bootstrap_ci([np.mean([d[p] for d in diffs.values()]) for p in common])) if common else "–"
        model, task, length, prefill = panel
        lines.append(f"| {model} | {task} | {length or '–'} | {prefill} | {len(common)} | {per_s} | {pooled} |")
    if len(lines) == header:  # no row: say why rather than print a header alone
        held = sorted({r["method"] for r in records if r["task"] != "kl"}, key=METHODS.index)
        what = f"the non-KL records hold {', '.join(held)}" if held else "the records hold KL only" if records else "there are no records"
        return (f"nothing to compare: no {first} and {second} records of the same task, length, prefill and budget S on "
                f"the same prompts (KL is left out); {what}")
    return "\n".join(lines)


def pyplot():
    """matplotlib's pyplot on the file-only Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def file_name(text: str) -> str:
    """``text`` as one file name in the plots folder: characters other than letters, digits and
    ``. _ + -`` (a ``/`` in a hand-edited model or schedule name) become ``_``."""
    name = re.sub(r"[^A-Za-z0-9._+-]", "_", text)
    return "_" + name if name.startswith(".") else name


def save_figure(fig, path: str | Path, dpi: int) -> Path:
    """Lay out, write (creating the folder) and close ``fig``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    fig.clf()
    pyplot().close(fig)
    return path


COLORS = {m.name: m.colour for m in REGISTRY.values() if m.colour is not None}  # every method but dense


def method_label(method: str) -> str:
    """A method's name in plots: its registry label, with the name where they differ (``S²ANTA-sys (systematic)``)."""
    label = REGISTRY[method].label
    return label if label == method else f"{label} ({method})"


def plot(all_cells: list[Cell], out_dir: str | Path) -> list[Path]:
    """accuracy vs budget per (model, task, length, prefill), dense as a band; KL vs budget (log–log)."""
    plt = pyplot()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    panels: dict[tuple, list[Cell]] = defaultdict(list)
    for c in all_cells:
        panels[(c.model, c.task, c.length)].append(c)
    written = []
    for (model, task, length), group in panels.items():
        fig, ax = plt.subplots(figsize=(5.5, 3.8))
        scale = 1.0 if task == "kl" else 100.0
        for c in group:
            if c.method == "dense" and c.prefill == "dense" and task != "kl":
                ax.axhspan(
                    scale * c.low, scale * c.high, color="grey", alpha=0.25, label=f"dense ({c.n_prompts} prompts)"
                )
                ax.axhline(scale * c.mean, color="grey", lw=1)
            elif c.method == "dense" and "+bqk" in c.prefill:  # Bernoulli scores, dense values: no S axis
                ax.axhline(scale * c.mean, color="black", lw=1, ls=":", label=f"dense values ({c.prefill})")
        settings = sorted({c.prefill for c in group}, key=lambda p: (p != "dense", p))
        for number, prefill in enumerate(settings):
            for method in METHODS[1:]:
                line = sorted((c for c in group if c.method == method and c.prefill == prefill), key=lambda c: c.budget)
                if task == "kl":
                    line = [c for c in line if c.mean > 0]
                if not line:
                    continue
                x = [c.budget for c in line]
                y = np.array([scale * c.mean for c in line])
                err = np.array([[scale * (c.mean - c.low) for c in line], [scale * (c.high - c.mean) for c in line]])
                style = ("-", "--", ":", "-.")[number % 4]
                name = method_label(method)
                label = name if prefill == "dense" else f"{name}, sampled prefill" if prefill == "sampled" else f"{name}, {prefill}"
                ax.errorbar(
                    x, y, yerr=err.clip(min=0), fmt="o" + style, color=COLORS[method], capsize=3, label=label, ms=4
                )
        ax.set_xscale("log", base=2)
        ax.set_xlabel("budget S (top-k: k)")
        if task == "kl":
            ax.set_yscale("log")
            ax.set_ylabel("KL(dense ‖ method), nats/token")
        else:
            ax.set_ylabel("score (%)")
        ax.set_title(f"{model} · {task} · {length or 'item'} tokens")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
        written.append(save_figure(fig, out_dir / file_name(f"{'kl' if task == 'kl' else 'accuracy'}_{model}_{task}_{length or 'items'}.png"), 120))
    return written


def plot_delta(all_cells: list[Cell], out_dir: str | Path) -> list[Path]:
    """Paired difference to dense vs budget: one figure per (model, length, prefill), one panel per
    RULER-style task, every method as a line with its 95 % CI. A budget is safe for a task where
    the band contains 0."""
    plt = pyplot()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    figures: dict[tuple, dict[str, list[Cell]]] = defaultdict(lambda: defaultdict(list))
    for c in all_cells:
        if c.delta is not None:
            figures[(c.model, c.length, c.prefill)][c.task].append(c)
    written = []
    for (model, length, prefill), tasks in figures.items():
        names = sorted(tasks)
        fig, axes = plt.subplots(1, len(names), figsize=(3.6 * len(names), 3.4), sharey=True, squeeze=False)
        for ax, task in zip(axes[0], names, strict=True):
            ax.axhline(0.0, color="grey", lw=1)
            for c in tasks[task]:
                if c.method == "dense":  # Bernoulli scores with dense values (the setting's score stage alone)
                    ax.axhspan(100 * c.delta_low, 100 * c.delta_high, color="black", alpha=0.1)
                    ax.axhline(100 * c.delta, color="black", lw=1, ls=":", label="dense values")
            for method in METHODS[1:]:
                line = sorted((c for c in tasks[task] if c.method == method), key=lambda c: c.budget)
                if not line:
                    continue
                x = [c.budget for c in line]
                y = np.array([100 * c.delta for c in line])
                low = np.array([100 * c.delta_low for c in line])
                high = np.array([100 * c.delta_high for c in line])
                ax.plot(x, y, "o-", color=COLORS[method], label=method_label(method), ms=4)
                ax.fill_between(x, low, high, color=COLORS[method], alpha=0.15)
            ax.set_xscale("log", base=2)
            ax.set_title(f"{task} ({tasks[task][0].n_prompts} prompts)", fontsize=9)
            ax.set_xlabel("budget S (top-k: k)")
            ax.grid(alpha=0.3, which="both")
        axes[0][0].set_ylabel("method − dense (points, paired)")
        axes[0][0].legend(fontsize=7)
        fig.suptitle(f"{model} · {f'{length} tokens' if length else 'items'} · {prefill} prefill", fontsize=10)
        written.append(save_figure(fig, out_dir / file_name(f"delta_{model}_{length or 'items'}_{prefill}.png"), 110))
    return written


def report(jsonl: str | Path, plot_dir: str | Path | None = None) -> tuple[str, list[Path]]:
    all_cells = cells(load_records([jsonl]).records)
    paths = plot(all_cells, plot_dir) if plot_dir is not None and all_cells else []
    return table(all_cells), paths
