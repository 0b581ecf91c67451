"""Schedule cells run resumably, and their paired comparison with a baseline cell.

A cell is one schedule scored on a set of held-out prompts with one sampler seed. Each finished
cell is one JSONL line (:func:`santa.sweep_files.append_record`: one write, then fsync), keyed by what
it ran; a re-run skips the cells already in the file, so a killed sweep loses only the cell in
flight. Comparisons are paired: per prompt, cell − baseline (each averaged over seeds), then a
percentile bootstrap over prompts (``santa.eval.report.bootstrap_ci``).
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from santa.eval.report import bootstrap_ci
from santa.provenance import code_commit
from santa.schedule_file import as_layer_budgets
from santa.sweep_files import SweepFileError, append_record, appending, load_sweep


@dataclass(frozen=True)
class Cell:
    """A named schedule ``[L]`` with one sampler seed. ``layer``: the one-hot layer, if any."""

    name: str
    schedule: tuple[int, ...]
    seed: int = 0
    layer: int | None = None


def cell_key(cell: Cell, *, setting: dict, prompts: Sequence[int]) -> str:
    return json.dumps({**setting, "name": cell.name, "schedule": list(cell.schedule), "seed": cell.seed, "prompts": sorted(prompts)}, sort_keys=True)


def existing_records(path: str | Path) -> list[dict]:
    """The records of a cells file (none when it does not exist yet), every one checked to be a cell
    record; :class:`~santa.sweep_files.SweepFileError` names the file and line of one that is not
    (a hand-edited line, or a file of another command)."""
    path = Path(path)
    if not path.exists():
        return []
    records = []
    for number, record in load_sweep(path).records:
        problem = cell_record_problem(record)
        if problem:
            raise SweepFileError(f"{path}, line {number}: not a schedule cell record ({problem}); not a file of santa ablate layers / santa tune evaluate")
        records.append(record)
    return records


def cell_record_problem(record: dict) -> str | None:
    """What is wrong with a cell record (the fields the comparison reads), or None."""
    if not isinstance(record.get("name"), str):
        return "no 'name' string"
    total, layer, scores = record.get("total"), record.get("layer"), record.get("scores")
    if not _is_int(total):
        return f"'total' must be an integer, got {total!r:.40}"
    if layer is not None and not _is_int(layer):
        return f"'layer' must be an integer or null, got {layer!r:.40}"
    if not isinstance(scores, dict) or not scores:
        return "no 'scores' object {prompt: score}"
    for prompt, score in scores.items():
        if not (prompt.isascii() and prompt.isdigit()) or isinstance(score, bool) or not isinstance(score, (int, float)):
            return f"scores must map prompt seeds to numbers, got {prompt!r}: {score!r:.40}"
    return None


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def run_cells(
    cells: Sequence[Cell],
    *,
    out: str | Path,
    prompts: Sequence[int],
    setting: dict,
    make_scorer: Callable[[], object],
    progress: bool = True,
) -> int:
    """Score every cell not yet in ``out``; returns the number run.

    setting: what the cells share (model, metric, length, sampler, …), written into every record
    and its key. ``make_scorer()`` is called once, only when some cell is pending (it loads the model).
    One writer per file: ``out`` is locked for the whole call (:func:`santa.sweep_files.appending`,
    the lock of ``santa eval run``), so a second run on it raises
    :class:`~santa.sweep_files.SweepLocked` before it reads or loads anything; a file that is not
    a plain cells JSONL raises :class:`~santa.sweep_files.SweepFileError` naming it (and the line).
    """
    out = Path(out)
    if out.suffix == ".gz":
        raise SweepFileError(f"{out}: cells are appended as lines and cannot be written to gzip; give a .jsonl path")
    out.parent.mkdir(parents=True, exist_ok=True)
    with appending(out, holder="run"):
        done = {r["key"] for r in existing_records(out)}
        pending = [c for c in cells if cell_key(c, setting=setting, prompts=prompts) not in done]
        if pending:
            _score_cells(pending, out=out, prompts=prompts, setting=setting, scorer=make_scorer(), progress=progress)
    return len(pending)


def _score_cells(pending: Sequence[Cell], *, out: Path, prompts: Sequence[int], setting: dict, scorer, progress: bool) -> None:
    """Score each cell and append its record to ``out`` as it finishes."""
    from tqdm import tqdm

    commit = code_commit()
    bar = tqdm(total=len(pending), desc="santa budgets", unit="cell", disable=not progress)
    for cell in pending:
        bar.set_postfix_str(f"{cell.name} seed {cell.seed}")
        start = time.perf_counter()
        scores = scorer.scores(as_layer_budgets(cell.schedule), prompts=prompts, seed=cell.seed)
        record = {
            "key": cell_key(cell, setting=setting, prompts=prompts),
            **setting,
            "name": cell.name,
            "layer": cell.layer,
            "schedule": list(cell.schedule),
            "total": int(sum(cell.schedule)),
            "seed": cell.seed,
            "scores": {str(p): s for p, s in sorted(scores.items())},
            "score": float(np.mean(list(scores.values()))),
            "seconds": time.perf_counter() - start,
            "commit": commit,
            "time": time.time(),
        }
        append_record(out, record)
        bar.update(1)
    bar.close()


def per_prompt(records: Sequence[dict], name: str) -> dict[int, float]:
    """Cell ``name``'s score per prompt, averaged over its seeds (prompts are the sampling unit)."""
    by_prompt: dict[int, list[float]] = defaultdict(list)
    for r in records:
        if r["name"] == name:
            for p, s in r["scores"].items():
                by_prompt[int(p)].append(s)
    return {p: float(np.mean(v)) for p, v in sorted(by_prompt.items())}


@dataclass(frozen=True)
class Comparison:
    """A cell's mean score with its bootstrap CI, and its paired difference to the baseline."""

    name: str
    layer: int | None
    total: int
    prompts: int
    mean: float
    low: float
    high: float
    delta: float | None
    delta_low: float | None
    delta_high: float | None

    @property
    def differs(self) -> bool:
        """The paired 95 % CI of the difference excludes 0."""
        return self.delta is not None and (self.delta_low > 0 or self.delta_high < 0)


def compare(records: Sequence[dict], *, baseline: str = "uniform", seed: int = 0) -> list[Comparison]:
    """Every cell of ``records`` (first-seen order), paired with ``baseline`` on their common prompts."""
    names = list(dict.fromkeys(r["name"] for r in records))
    base = per_prompt(records, baseline) if baseline in names else {}
    out = []
    for name in names:
        scores = per_prompt(records, name)
        first = next(r for r in records if r["name"] == name)
        mean, low, high = bootstrap_ci(list(scores.values()), seed=seed)
        common = sorted(set(scores) & set(base))
        if name != baseline and common:
            delta = bootstrap_ci([scores[p] - base[p] for p in common], seed=seed)
        else:
            delta = (None, None, None)
        out.append(Comparison(name, first.get("layer"), first["total"], len(scores), mean, low, high, *delta))
    return out


def table(comparisons: Sequence[Comparison], *, metric: str, baseline: str = "uniform") -> str:
    """Markdown table: cell, total budget, prompts, score [95 % CI], paired Δ vs baseline [95 % CI]."""
    lines = [f"| cell | total N | prompts | {metric} [95 % CI] | Δ vs {baseline} [95 % CI] |", "| --- | ---: | ---: | --- | --- |"]
    for c in comparisons:
        delta = "–" if c.delta is None else f"{c.delta:+.4f} [{c.delta_low:+.4f}, {c.delta_high:+.4f}]{' *' if c.differs else ''}"
        lines.append(f"| {c.name} | {c.total} | {c.prompts} | {c.mean:.4f} [{c.low:.4f}, {c.high:.4f}] | {delta} |")
    return "\n".join(lines)
