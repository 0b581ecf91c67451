"""santa's configuration inside vLLM: vLLM's own configuration for plugins, ``--additional-config`` (the
``"santa"`` entry of ``VllmConfig.additional_config``), and the environment.

    vllm serve <model> --attention-backend CUSTOM --additional-config '{"santa": {"budget": 128, "kernel": "prop"}}'

The keys of the ``"santa"`` entry are ``budget``, ``kernel``, ``seed``, ``error_target`` and ``dense_below`` (below); an unknown key is refused by
name. Where a setting comes from several places, the environment wins over ``--additional-config``, which wins
over the ``SANTA_VLLM_CONFIG`` file; :func:`describe` says where each setting came from (the backend logs it once).

Variables (each optional; the defaults sample with prop at S = 128, seed 0):

- ``SANTA_VLLM_CONFIG``: a JSON file ``{"budget": 128, "kernel": "prop", "seed": 0}`` (any subset of
  the keys below); the variables below override it.
- ``SANTA_VLLM_BUDGET``: S, samples per query head, an int ≥ 1.
- ``SANTA_VLLM_KERNEL``: ``"prop"`` (exact global systematic sampling, the default), ``"flash"``
  (per-tile budgets) or ``"dense"`` (vLLM's own attention for every batch: the exact control).
- ``SANTA_VLLM_SEED``: the root seed, an int in ``[0, 2**63)``; each request's draws are keyed on it,
  the layer, the head and the token's position in its own sequence (:mod:`santa.rng`).
- ``SANTA_VLLM_ERROR_TARGET``: a relative error ε > 0 (prop): each head draws ``min(S, max(16, ⌈T̂/(ε²N̂)⌉))`` samples from a
  pilot of 16 (:mod:`santa.error_target`), the budget the cap; unset: every head draws the budget.
- ``SANTA_VLLM_DENSE_BELOW``: keys, an int ≥ 0 (prop; default by the model's head shape, :func:`default_dense_below`:
  1,024 at Llama-3.1-8B's d = 128 and 4 query heads per KV head, 8,192 elsewhere): a decode step whose longest sequence
  holds fewer keys runs vLLM's FlashAttention (exact), as santa's kernels lose to it there; 0 samples every decode step.
  Inside vLLM's full CUDA graphs both kernels are captured and a device int picks one per replay (the FlashAttention
  launch then reads zero lengths on a sampled step, santa's returns at once on a dense one: a few µs per layer).

Under vLLM's batch-invariant mode (``VLLM_BATCH_INVARIANT=1``: vLLM's kernels give a request the same output whatever
its batch) santa keeps that promise too (:func:`batch_invariant_config`): every decode step samples (no short steps:
an explicit ``dense_below`` > 0 is refused) and santa's decode runs the Triton prop, whose samples are the same alone
or batched (Hopper's one-launch prop sums its float32 CDF in slices that follow the batch).

Anything else starting with ``SANTA_VLLM_`` is refused by name (a misspelt variable would otherwise
silently leave the default in place). Nothing here imports vLLM.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path

from santa.error_target import check_error_target
from santa.methods import METHODS, names
from santa.rng import check_seed
from santa.sampling import check_budget

PREFIX = "SANTA_VLLM_"
CONFIG_VARIABLE = PREFIX + "CONFIG"
ADDITIONAL_KEY = "santa"  # the entry of vLLM's --additional-config that holds santa's settings
KERNELS = (*names(kernels=True), METHODS["dense"].name)  # santa's kernels, or vLLM's own attention (dense)
# dense_below's default, by the model's head shape (head dim d, query heads per KV head G): the keys from which santa's
# decode stops losing to vLLM's FlashAttention inside vLLM 0.26 (benchmarks/vllm/offline.py, decode tokens/s of santa
# sampling every step over FLASH_ATTN, H100, cf3e4d7, benchmarks/results/2026-12-07-vllm-short-steps):
# - Llama-3.1-8B's shape (d = 128, G = 4): 512-token prompts 0.977-0.998x (batch 1-256), 1k 1.005 / 1.051 / 1.111x
#   (batch 16 / 64 / 256), 2k 1.004 / 1.052 / 1.167x (batch 1 / 16 / 64; 1.165x at max_model_len 131072): 1024 keys
DENSE_BELOW_BY_SHAPE = {(128, 4): 1024}
# - every other shape: 8192. Qwen2.5-0.5B's (d = 64, G = 7) still loses at 2k (0.913 / 0.887x at batch 64 / 256, the
#   same run) and in five of eight cells at 3k / 4k (0.823-1.589x over batch 1-256, H100, c85bdc1,
#   benchmarks/results/2026-12-07-vllm-qwen-short-grid; dd57a82's single 4k x 64 cell, 1.468x, did not repeat at
#   1.018x), so 4096 would be slower than FlashAttention where it matters; its paged kernel loses in
#   every cell of 512-4k keys against cuDNN (H100, 58b370b) and wins at 16 x 32k; shapes never
#   measured inside vLLM keep the 8192 of the first measurement (283cdaf, H200: 2k prompts 0.76-0.90x, 8k 1.07-1.10x)
DENSE_BELOW = 8192


def default_dense_below(*, head_dim: int, group: int) -> int:
    """dense_below's default for a model whose query heads share each KV head ``group`` at a time, ``head_dim`` wide:
    :data:`DENSE_BELOW_BY_SHAPE` where that shape was measured inside vLLM, else :data:`DENSE_BELOW`. Under tensor
    parallelism the shape is the one each rank runs (past as many ranks as KV heads vLLM replicates them, so a rank's
    group is smaller than the model's: Llama-3.1-70B at TP 16 runs G = 4, a model not measured at that default)."""
    return DENSE_BELOW_BY_SHAPE.get((head_dim, group), DENSE_BELOW)


@dataclass(frozen=True)
class ServingConfig:
    """How santa's vLLM backend decodes: ``budget`` samples per head with ``kernel``, keyed on ``seed``."""

    budget: int = 128
    kernel: str = "prop"
    seed: int = 0
    error_target: float | None = None  # budgets from a relative error target (prop), budget the cap
    dense_below: int | None = None  # decode steps shorter than this (keys) run FlashAttention; None: the default

    def __post_init__(self) -> None:
        object.__setattr__(self, "budget", check_budget(self.budget))
        object.__setattr__(self, "seed", check_seed(self.seed))
        if self.kernel not in KERNELS:
            raise ValueError(f"kernel must be one of {', '.join(KERNELS)}, got {self.kernel!r}")
        if self.error_target is not None:
            object.__setattr__(self, "error_target", check_error_target(self.error_target))
            if self.kernel == "flash":
                raise ValueError("error_target is implemented by kernel prop (its pilot reads the global CDF), got kernel flash")
        if self.dense_below is not None:
            if isinstance(self.dense_below, bool) or not isinstance(self.dense_below, int) or self.dense_below < 0:
                raise ValueError(f"dense_below must be an int ≥ 0 (keys; 0: sample every decode step), got {self.dense_below!r}")
            if self.dense_below > 0 and self.kernel == "flash":
                raise ValueError("dense_below needs kernel prop (its launches read the gate that picks FlashAttention or santa "
                                 "per step; flash's do not): set dense_below 0 with kernel flash")

    def short_steps(self, *, head_dim: int, group: int) -> int:
        """The keys below which a decode step runs FlashAttention, for a model of this head shape (``head_dim``; query
        heads per KV head, ``group``): ``dense_below``, or by default :func:`default_dense_below` with prop and 0
        (never) with flash; 0 with ``kernel="dense"`` (FlashAttention runs every step anyway)."""
        if not self.samples:
            return 0
        if self.dense_below is not None:
            return self.dense_below
        return default_dense_below(head_dim=head_dim, group=group) if self.kernel == "prop" else 0

    @property
    def samples(self) -> bool:
        """Whether decode batches run santa's kernel (``kernel="dense"``: vLLM's attention for every batch)."""
        return self.kernel != "dense"


FIELDS = tuple(f.name for f in fields(ServingConfig))


def batch_invariant_config(config: ServingConfig) -> ServingConfig:
    """``config`` as santa's backend runs it under vLLM's batch-invariant mode: ``dense_below`` 0 (a short step runs
    FlashAttention when the step's *longest* sequence holds fewer keys, so a request's route, and its tokens, would
    follow its batch); ValueError where ``dense_below`` > 0 was set."""
    if config.dense_below:
        raise ValueError(f"dense_below must be 0 under VLLM_BATCH_INVARIANT=1 (a decode step runs FlashAttention when its "
                         f"longest sequence holds fewer keys, so a request's tokens would depend on its batch), got "
                         f"{config.dense_below}")
    return replace(config, dense_below=0)


def _from_text(name: str, field: str, text: str) -> object:
    """A variable's text as the field's value (ints for budget, seed and dense_below, a number for error_target), or
    ValueError naming the variable."""
    if field == "kernel":
        return text.strip()
    if field == "error_target":
        try:
            return float(text.strip())
        except ValueError:
            raise ValueError(f"{name} must be a number > 0 (a relative error such as 0.1), got {text!r}") from None
    try:
        return int(text.strip())
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {text!r}") from None


def additional_settings(additional_config: object) -> dict[str, object]:
    """santa's entry of vLLM's ``additional_config`` (``--additional-config``): ``{}`` where there is none;
    ValueError naming the entry where it is not an object of santa's keys."""
    if not isinstance(additional_config, Mapping) or ADDITIONAL_KEY not in additional_config:
        return {}
    settings = additional_config[ADDITIONAL_KEY]
    if not isinstance(settings, Mapping):
        raise ValueError(f"--additional-config {ADDITIONAL_KEY!r}: expected an object with keys {', '.join(FIELDS)}, "
                         f"got {type(settings).__name__}")
    unknown = sorted(set(settings) - set(FIELDS))
    if unknown:
        raise ValueError(f"--additional-config {ADDITIONAL_KEY}.{unknown[0]}: unknown setting; santa's are {', '.join(FIELDS)}")
    return dict(settings)


def sources(environ: Mapping[str, str] | None = None, additional_config: object = None) -> dict[str, str]:
    """Where each setting that is set comes from: ``{field: "SANTA_VLLM_…" | "--additional-config" | file path}``."""
    environ = os.environ if environ is None else environ
    found: dict[str, str] = {}
    path = environ.get(CONFIG_VARIABLE)
    if path:
        found.update({field: f"{CONFIG_VARIABLE}={path}" for field in _read_file(Path(path))})
    found.update({field: "--additional-config" for field in additional_settings(additional_config)})
    found.update({field: PREFIX + field.upper() for field in FIELDS if environ.get(PREFIX + field.upper(), "").strip()})
    return found


def describe(config: ServingConfig, environ: Mapping[str, str] | None = None, additional_config: object = None, *,
             head_dim: int, group: int) -> str:
    """One line: every setting's value and where it came from (``default`` where nothing set it); ``dense_below`` as
    it applies to a model of this head shape (:meth:`ServingConfig.short_steps`)."""
    where = sources(environ, additional_config)
    value = {field: getattr(config, field) for field in FIELDS} | {
        "dense_below": config.short_steps(head_dim=head_dim, group=group)}  # None: its default
    return ", ".join(f"{field}={value[field]} ({where.get(field, 'default')})" for field in FIELDS)


def read_config(environ: Mapping[str, str] | None = None, additional_config: object = None) -> ServingConfig:
    """The :class:`ServingConfig` of ``environ`` (default ``os.environ``) and vLLM's ``additional_config`` (a dict,
    or None): the file named by ``SANTA_VLLM_CONFIG`` if set, then ``additional_config["santa"]`` over it, then the
    ``SANTA_VLLM_*`` variables over both. ValueError/TypeError name the variable, file or key at fault."""
    environ = os.environ if environ is None else environ
    values: dict[str, object] = {}
    path = environ.get(CONFIG_VARIABLE)
    if path:
        values.update(_read_file(Path(path)))
    values.update(additional_settings(additional_config))
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
        given = [f"{CONFIG_VARIABLE}={path}"] if path else []
        given += ["--additional-config"] if additional_settings(additional_config) else []
        where = f" (from {', '.join([*given, 'the SANTA_VLLM_* variables'])})"
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
