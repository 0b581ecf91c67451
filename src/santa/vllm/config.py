"""santa's configuration inside vLLM, read from the environment (a custom attention backend receives
no configuration of its own from vLLM).

Variables (each optional; the defaults sample with prop at S = 128, seed 0):

- ``SANTA_VLLM_CONFIG``: a JSON file ``{"budget": 128, "kernel": "prop", "seed": 0}`` (any subset of
  the keys below); the variables below override it.
- ``SANTA_VLLM_BUDGET``: S, samples per query head, an int ≥ 1.
- ``SANTA_VLLM_KERNEL``: ``"prop"`` (exact global systematic sampling, the default), ``"flash"``
  (per-tile budgets) or ``"dense"`` (vLLM's own attention for every batch: the exact control).
- ``SANTA_VLLM_SEED``: the root seed, an int in ``[0, 2**63)``; each request's draws are keyed on it,
  the layer, the head and the token's position in its own sequence (:mod:`santa.rng`).

Anything else starting with ``SANTA_VLLM_`` is refused by name (a misspelt variable would otherwise
silently leave the default in place). Nothing here imports vLLM.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path

from santa.rng import check_seed
from santa.sampling import check_budget

PREFIX = "SANTA_VLLM_"
CONFIG_VARIABLE = PREFIX + "CONFIG"
KERNELS = ("prop", "flash", "dense")


@dataclass(frozen=True)
class ServingConfig:
    """How santa's vLLM backend decodes: ``budget`` samples per head with ``kernel``, keyed on ``seed``."""

    budget: int = 128
    kernel: str = "prop"
    seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "budget", check_budget(self.budget))
        object.__setattr__(self, "seed", check_seed(self.seed))
        if self.kernel not in KERNELS:
            raise ValueError(f"kernel must be one of {', '.join(KERNELS)}, got {self.kernel!r}")

    @property
    def samples(self) -> bool:
        """Whether decode batches run santa's kernel (``kernel="dense"``: vLLM's attention for every batch)."""
        return self.kernel != "dense"


FIELDS = tuple(f.name for f in fields(ServingConfig))


def _from_text(name: str, field: str, text: str) -> object:
    """A variable's text as the field's value (ints for budget and seed), or ValueError naming the variable."""
    if field == "kernel":
        return text.strip()
    try:
        return int(text.strip())
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {text!r}") from None


def read_config(environ: Mapping[str, str] | None = None) -> ServingConfig:
    """The :class:`ServingConfig` of ``environ`` (default ``os.environ``): the file named by
    ``SANTA_VLLM_CONFIG`` if set, then the ``SANTA_VLLM_*`` variables over it. ValueError/TypeError
    name the variable, file or key at fault."""
    environ = os.environ if environ is None else environ
    values: dict[str, object] = {}
    path = environ.get(CONFIG_VARIABLE)
    if path:
        values.update(_read_file(Path(path)))
    known = {CONFIG_VARIABLE, *(PREFIX + f.upper() for f in FIELDS)}
    unknown = sorted(name for name in environ if name.startswith(PREFIX) and name not in known)
    if unknown:
        raise ValueError(f"unknown santa variable {unknown[0]}: santa's vLLM backend reads {', '.join(sorted(known))}")
    for field in FIELDS:
        name = PREFIX + field.upper()
        if environ.get(name, "").strip():
            values[field] = _from_text(name, field, environ[name])
    try:
        return ServingConfig(**values)
    except (TypeError, ValueError) as error:
        where = f" (from {CONFIG_VARIABLE}={path} and the SANTA_VLLM_* variables)" if path else " (from the SANTA_VLLM_* variables)"
        raise type(error)(f"{error}{where}") from None


def _read_file(path: Path) -> dict[str, object]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise ValueError(f"{CONFIG_VARIABLE}={path}: cannot read it ({error.strerror or error})") from None
    except ValueError as error:
        raise ValueError(f"{CONFIG_VARIABLE}={path}: not JSON ({error})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{CONFIG_VARIABLE}={path}: expected a JSON object with keys {', '.join(FIELDS)}, got {type(data).__name__}")
    unknown = sorted(set(data) - set(FIELDS))
    if unknown:
        raise ValueError(f"{CONFIG_VARIABLE}={path}: unknown key {unknown[0]!r}; the keys are {', '.join(FIELDS)}")
    return data
