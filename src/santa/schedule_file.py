"""Per-layer budget schedules as data: the ``{layer: S}`` form and the schedule file.

A schedule is a list ``[S_0, …, S_{L−1}]`` of samples per query row and head for each layer; as a
:class:`santa.hf.SantaConfig` argument it is the dict ``{layer: S}`` (:func:`as_layer_budgets`).
The file is ``{"layer_budgets": {"0": 3, "1": 5, …}, …metadata}``: ``santa tune budgets`` writes it
(:func:`write_schedule`), ``santa eval run --layer-budgets``, ``santa tune evaluate`` and the model
APIs read it (:func:`load_layer_budgets`). :func:`write_json_atomic` writes it, and the tuning run's
and the benchmarks' other JSON files, whole or not at all.

Below :mod:`santa.eval` and :mod:`santa.budgets`, which both read it; the search's own schedules
(uniform, one-hot, a policy's rounding) are built in :mod:`santa.budgets.schedule`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from santa.checks import integer


def budget_for(layer: int, *, layer_budgets: Mapping[int, int] | None, budget: int) -> int:
    """S in ``layer``: its entry of ``layer_budgets``, else ``budget`` (the one per-layer budget rule of santa.hf's
    configs and santa.model's decode contexts)."""
    return layer_budgets.get(layer, budget) if layer_budgets else budget


def as_layer_budgets(schedule: Sequence[int]) -> dict[int, int]:
    """``[S_0, …, S_{L−1}]`` → ``{layer: S}`` (the form ``SantaConfig(layer_budgets=…)`` takes); every S an int ≥ 1."""
    return {layer: integer(f"schedule[{layer}]", s, low=1) for layer, s in enumerate(schedule)}


def write_json_atomic(path: str | Path, obj: object) -> Path:
    """Write ``obj`` as JSON to ``path`` all at once: a temporary file, fsync, rename, fsync of the folder.
    Keys keep their order (layers in numeric order, not "0", "1", "10", …)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(staging, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(staging, path)
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)
    return path


def write_schedule(path: str | Path, layer_budgets: Sequence[int] | Mapping[int, int], **metadata) -> Path:
    """Write ``{"layer_budgets": {"0": S_0, …}, **metadata}`` atomically; returns the path."""
    budgets = dict(layer_budgets) if isinstance(layer_budgets, Mapping) else as_layer_budgets(layer_budgets)
    if "layer_budgets" in metadata:
        raise ValueError("metadata must not hold 'layer_budgets'")
    checked = {integer("layer", k, low=0): integer(f"layer_budgets[{k}]", v, low=1) for k, v in budgets.items()}
    return write_json_atomic(path, {"layer_budgets": {str(k): v for k, v in sorted(checked.items())}, **metadata})


def load_layer_budgets(path: str | Path) -> dict[int, int]:
    """Read a schedule file → ``{layer: S}``, for ``santa.hf.SantaConfig(layer_budgets=…)``.

    Raises ValueError naming the file when it cannot be read, is not JSON, has no
    ``"layer_budgets"`` object, or holds a layer that is not an integer ≥ 0 (or one twice, "1" and "01") or a budget
    that is not an integer ≥ 1.
    """
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as error:
        raise ValueError(f"schedule file {path}: cannot read it ({error.strerror or error})") from error
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"schedule file {path}: not valid JSON ({error})") from error
    if not isinstance(data, dict) or not isinstance(data.get("layer_budgets"), dict):
        raise ValueError(f"schedule file {path}: expected a JSON object with a 'layer_budgets' object {{\"0\": S, …}}")
    if not data["layer_budgets"]:
        raise ValueError(f"schedule file {path}: 'layer_budgets' is empty")
    budgets: dict[int, int] = {}
    for key, value in data["layer_budgets"].items():
        if not (isinstance(key, str) and key.isdigit() and key.isascii()):
            raise ValueError(f"schedule file {path}: layer {key!r} is not an integer ≥ 0")
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"schedule file {path}: layer {key} has budget {value!r}, expected an integer ≥ 1")
        if int(key) in budgets:
            raise ValueError(f"schedule file {path}: layer {key!r} repeats layer {int(key)}")
        budgets[int(key)] = value
    return dict(sorted(budgets.items()))
