"""Variance and unique-key diagnostics on real prompts (paper Appendix D, L, M).

For each prompt: one dense prefill; at the last prompt position q⋆ of every layer, the attention
weights ``p`` over the ``n`` keys and the values ``V`` are captured (un-repeated KV heads are
repeated to the query heads). Then, per head, the variance trace ``E‖ô − μ‖²`` of each estimator
(closed form for iid and stratified, R replicate offsets for systematic) and the number of unique
keys a draw reads, averaged over heads, layers and prompts. Slopes are least-squares fits of
log(trace) on log(S).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from santa.attention import attention_probs
from santa.checks import integer
from santa.eval.report import COLORS, loglog_slope, pyplot, save_figure
from santa.eval.tasks import build_prompt
from santa.sampling import SAMPLERS, sample_counts  # SAMPLERS: the stochastic samplers
from santa.stats import unique_keys, variance_trace

CAPTURE = "santa_capture_probs"


class Captured(NamedTuple):
    """One layer at the last prompt position: probs ``[Hq, n]``, values ``[Hq, n, D]`` (KV heads
    repeated to the query heads), the query row ``[Hq, D]``, the keys ``[Hkv, n, D]`` and the
    score scale, so that ``probs = softmax(query · keysᵀ · scale)``."""

    probs: torch.Tensor
    values: torch.Tensor
    query: torch.Tensor
    keys: torch.Tensor
    scale: float


def _capture_forward(module, query, key, value, attention_mask, **kwargs):
    """SDPA, keeping the last query row's :class:`Captured` of the first sequence."""
    store = getattr(module, "santa_capture_store", None)
    if store is not None:
        scale = kwargs.get("scaling") or query.shape[-1] ** -0.5
        probs = attention_probs(query[:1, :, -1:], key[:1], scale=scale)[0, :, 0]  # [Hq, n]
        groups = query.shape[1] // key.shape[1]
        values = value[0].float().repeat_interleave(groups, dim=0)
        store[module.layer_idx] = Captured(probs, values, query[0, :, -1].float(), key[0].float(), float(scale))
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


AttentionInterface.register(CAPTURE, _capture_forward)
AttentionMaskInterface.register(CAPTURE, sdpa_mask)


@torch.inference_mode()
def capture_last_query(model, tokenizer, text: str) -> dict[int, Captured]:
    """``{layer: Captured}`` at the last position of ``text``."""
    store: dict[int, Captured] = {}
    layers = [m for m in model.modules() if hasattr(m, "layer_idx") and hasattr(m, "num_key_value_groups")]
    for m in layers:
        m.santa_capture_store = store
    previous = model.config._attn_implementation
    model.set_attn_implementation(CAPTURE)
    try:
        ids = tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids.to(model.device)
        model(input_ids=ids, use_cache=False)
    finally:
        for m in layers:
            m.santa_capture_store = None
        model.set_attn_implementation(previous)
    return store


def diagnostics(
    model,
    tokenizer,
    *,
    task: str = "niah_single",
    length: int = 2048,
    prompts: int = 4,
    budgets=(8, 16, 32, 64, 128, 256, 512),
    replicates: int = 32,
    seed: int = 0,
    group_size: int | None = None,
    progress: bool = True,
) -> dict:
    """Mean variance trace and unique keys per (sampler, S), averaged over heads, layers, prompts.

    length, prompts, replicates, seed, group_size and each budget take Python or numpy ints (a
    float is a TypeError); at least two different budgets (the log–log slope needs two).
    """
    from tqdm import tqdm

    length, prompts = integer("length", length, low=1), integer("prompts", prompts, low=1)
    replicates, seed = integer("replicates", replicates, low=2), integer("seed", seed, low=0)
    group_size = None if group_size is None else integer("group_size", group_size, low=1)
    budgets = budget_list("budgets", budgets)
    if len(set(budgets)) < 2:
        raise ValueError(f"budgets must hold at least two different S (the variance slope), got {budgets}")

    generator = torch.Generator().manual_seed(seed)
    trace = {s: {b: [] for b in budgets} for s in SAMPLERS}
    relative = {s: {b: [] for b in budgets} for s in SAMPLERS}
    unique = {s: {b: [] for b in budgets} for s in SAMPLERS}
    unique_kv = {s: {b: [] for b in budgets} for s in SAMPLERS}
    n_keys = []
    for prompt_seed in tqdm(range(prompts), desc="variance", unit="prompt", disable=not progress):
        prompt = build_prompt(task, tokenizer, length, prompt_seed)
        captured = capture_last_query(model, tokenizer, prompt.text)
        for layer in captured.values():
            probs, values = layer.probs.cpu(), layer.values.cpu()
            n_keys.append(probs.shape[-1])
            g = group_size or 1
            mu = torch.einsum("hn,hnd->hd", probs.double(), values.double())
            mu_norm = (mu * mu).sum(-1)  # [Hq]
            for sampler in SAMPLERS:
                for b in budgets:
                    t = variance_trace(probs, values, b, sampler, replicates=replicates, generator=generator)  # [Hq]
                    trace[sampler][b].append(float(t.mean()))
                    relative[sampler][b].append(float((t / mu_norm).mean()))
                    counts = sample_counts(probs, b, sampler, generator=generator)  # [Hq, n]
                    unique[sampler][b].append(float(unique_keys(counts).float().mean()))
                    unique_kv[sampler][b].append(float(unique_keys(counts, group_size=g).float().mean()))
    result = {
        "task": task,
        "length": length,
        "prompts": prompts,
        "budgets": list(budgets),
        "replicates": replicates,
        "mean_keys": float(np.mean(n_keys)),
        "trace": {s: [float(np.mean(trace[s][b])) for b in budgets] for s in SAMPLERS},
        "relative_trace": {s: [float(np.mean(relative[s][b])) for b in budgets] for s in SAMPLERS},
        "unique_keys": {s: [float(np.mean(unique[s][b])) for b in budgets] for s in SAMPLERS},
        "unique_keys_kv": {s: [float(np.mean(unique_kv[s][b])) for b in budgets] for s in SAMPLERS},
    }
    result["slopes"] = {s: loglog_slope(budgets, result["trace"][s]) for s in SAMPLERS}
    return result


def budget_list(name: str, values) -> list[int]:
    """``values`` as a non-empty list of ints ≥ 1 (Python or numpy), or TypeError/ValueError naming ``name``."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise TypeError(f"{name} must be a list of ints ≥ 1, got {type(values).__name__}")
    values = [integer(f"{name}[{i}]", v, low=1) for i, v in enumerate(values)]
    if not values:
        raise ValueError(f"{name} must hold at least one int ≥ 1")
    return values


def plot_diagnostics(result: dict, path: str | Path) -> Path:
    """Variance trace vs S (log–log, with fitted slopes) and unique keys read vs S."""
    budgets = result["budgets"]
    fig, (left, right) = pyplot().subplots(1, 2, figsize=(10, 3.8))
    for s in SAMPLERS:
        left.loglog(budgets, result["trace"][s], "o-", color=COLORS[s], label=f"{s} (slope {result['slopes'][s]:.2f})")
        right.plot(budgets, result["unique_keys"][s], "o-", color=COLORS[s], label=f"{s} per head")
        right.plot(budgets, result["unique_keys_kv"][s], "x--", color=COLORS[s], alpha=0.6, label=f"{s} GQA union")
    left.set_xlabel("budget S")
    left.set_ylabel("variance trace E‖ô − μ‖²")
    left.set_title(f"{result['task']}, {result['length']} tokens, {result['prompts']} prompts")
    right.plot(budgets, budgets, ":", color="grey", label="S")
    right.set_xscale("log", base=2)
    right.set_yscale("log", base=2)
    right.set_xlabel("budget S")
    right.set_ylabel("unique keys read")
    for ax in (left, right):
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    return save_figure(fig, path, 120)


def save(result: dict, path: str | Path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(result, indent=1))
