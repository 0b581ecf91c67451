"""Schedule cells run resumably, and their paired comparison with a baseline cell.

A cell is one schedule scored on a set of held-out prompts with one sampler seed. Each finished
cell is one JSONL line (``santa.eval.runner.append_record``: one write, then fsync), keyed by what
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

from santa.budgets.schedule import as_layer_budgets
from santa.eval.report import bootstrap_ci
from santa.eval.runner import append_record, read_records
from santa.provenance import code_commit


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
    """The records of a sweep file, or none when it does not exist yet."""
    return read_records(path) if Path(path).exists() else []


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
    """
    from tqdm import tqdm

    done = {r["key"] for r in existing_records(out)}
    pending = [c for c in cells if cell_key(c, setting=setting, prompts=prompts) not in done]
    if not pending:
        return 0
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    scorer = make_scorer()
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
    return len(pending)


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
