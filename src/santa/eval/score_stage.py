"""Bernoulli qKᵀ on real prompts: key features read and the error it adds, against B.

For each prompt: one dense prefill; at the last prompt position of every layer the query row, the
keys and the values are captured (:func:`santa.eval.variance.capture_last_query`). Then for each
sampler and number of ternary draws B, one Bernoulli query per head (:func:`santa.bernoulli_query`)
gives, averaged over heads, layers and prompts:

- ``read_kv``: the share of key features a KV head reads with the mean group query (one draw per
  GQA group, the paper's scheme); ``read_head``: the share a query head reads with one draw per
  head, and ``read_head_kv``: what a KV head must then load, the union over its group's heads;
- ``kl``: KL(p ‖ p̂) in nats between the attention weights of the exact and the sampled scores;
- ``relative_error``: ``‖p̂V − pV‖² / ‖pV‖²``, the error of the attention output with an exact
  value stage (the score stage alone).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from santa.bernoulli import SCORE_SAMPLERS, bernoulli_query
from santa.checks import integer
from santa.eval.report import COLORS, pyplot, save_figure
from santa.eval.tasks import build_prompt
from santa.eval.variance import Captured, budget_list, capture_last_query

METRICS = ("read_kv", "read_head", "read_head_kv", "kl", "relative_error")


def layer_metrics(layer: Captured, samples: int, sampler: str, generator: torch.Generator) -> dict[str, float]:
    """The metrics of one layer, averaged over its heads (one draw each)."""
    samples = integer("samples", samples, low=1)
    hq, hkv = layer.query.shape[0], layer.keys.shape[0]
    query = layer.query.double().reshape(1, hq, 1, -1)  # [1, Hq, 1, D]
    keys = layer.keys.double().repeat_interleave(hq // hkv, dim=0)  # [Hq, n, D]
    grouped = bernoulli_query(query, samples, kv_heads=hkv, sampler=sampler, generator=generator)
    per_head = bernoulli_query(query, samples, sampler=sampler, generator=generator)
    scores = torch.einsum("hd,hnd->hn", grouped.query[0, :, 0], keys) * layer.scale
    log_p = torch.log_softmax(torch.einsum("hd,hnd->hn", query[0, :, 0], keys) * layer.scale, dim=-1)
    log_p_hat = torch.log_softmax(scores, dim=-1)
    kl = (log_p.exp() * (log_p - log_p_hat)).sum(-1)  # [Hq]
    values = layer.values.double()
    exact = torch.einsum("hn,hnd->hd", log_p.exp(), values)
    sampled = torch.einsum("hn,hnd->hd", log_p_hat.exp(), values)
    error = ((sampled - exact) ** 2).sum(-1) / (exact**2).sum(-1)
    return {
        "read_kv": grouped.read_fraction,
        "read_head": per_head.read_fraction,
        "read_head_kv": float(per_head.features_read.reshape(1, hkv, hq // hkv, 1, -1).any(dim=2).float().mean()),
        "kl": float(kl.mean()),
        "relative_error": float(error.mean()),
    }


def bernoulli_diagnostics(
    model,
    tokenizer,
    *,
    task: str = "niah_single",
    length: int = 2048,
    prompts: int = 4,
    samples=(1, 2, 4, 8, 16, 32),
    seed: int = 0,
    progress: bool = True,
) -> dict:
    """Mean of each metric per (sampler, B) over layers and prompts: ``result[metric][sampler]`` is a
    list aligned with ``result["samples"]``. length, prompts, seed and each number of draws take
    Python or numpy ints (a float is a TypeError)."""
    from tqdm import tqdm

    length, prompts = integer("length", length, low=1), integer("prompts", prompts, low=1)
    seed, samples = integer("seed", seed, low=0), budget_list("samples", samples)

    generator = torch.Generator().manual_seed(seed)
    values = {m: {s: {b: [] for b in samples} for s in SCORE_SAMPLERS} for m in METRICS}
    for prompt_seed in tqdm(range(prompts), desc="bernoulli qK", unit="prompt", disable=not progress):
        prompt = build_prompt(task, tokenizer, length, prompt_seed)
        for layer in capture_last_query(model, tokenizer, prompt.text).values():
            layer = Captured(*(x.cpu() if isinstance(x, torch.Tensor) else x for x in layer))
            for sampler in SCORE_SAMPLERS:
                for b in samples:
                    for metric, value in layer_metrics(layer, b, sampler, generator).items():
                        values[metric][sampler][b].append(value)
    result = {"task": task, "length": length, "prompts": prompts, "samples": list(samples)}
    for metric in METRICS:
        result[metric] = {s: [float(np.mean(values[metric][s][b])) for b in samples] for s in SCORE_SAMPLERS}
    return result


def plot_bernoulli(result: dict, path: str | Path) -> Path:
    """Key features read vs B (left) and KL(p ‖ p̂) vs B (right, log axes)."""
    samples = result["samples"]
    fig, (left, right) = pyplot().subplots(1, 2, figsize=(10, 3.8))
    for s in SCORE_SAMPLERS:
        left.plot(samples, [100 * x for x in result["read_kv"][s]], "o-", color=COLORS[s], label=f"{s}, per KV head (mean group query)")
        left.plot(samples, [100 * x for x in result["read_head_kv"][s]], "x--", color=COLORS[s], alpha=0.6, label=f"{s}, per-head draws, union per KV head")
        right.loglog(samples, result["kl"][s], "o-", color=COLORS[s], label=s)
    left.set_xscale("log", base=2)
    left.set_xlabel("ternary draws B")
    left.set_ylabel("key features read (%)")
    left.set_title(f"{result.get('model', '')} · {result['task']} · {result['length']} tokens · {result['prompts']} prompts", fontsize=9)
    right.set_xlabel("ternary draws B")
    right.set_ylabel("KL(p ‖ p̂) per head (nats)")
    for ax in (left, right):
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    return save_figure(fig, path, 120)
