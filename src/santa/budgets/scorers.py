"""Scoring a per-layer schedule on a model: KL vs dense, or a task graded like ``santa eval run``.

A scorer maps ``(layer_budgets {layer: S}, prompt seeds, sampler seed)`` → ``{prompt: score}``.
Both reuse the eval harness (:mod:`santa.eval.runner` batches, prefill and cache rewinding,
:mod:`santa.eval.grading`): the only difference from ``santa eval run`` is the config, which here
has one budget per layer. The dense part of the work (the prompt's dense prefill, and for KL the
dense reference log-probs) does not depend on the schedule, so it is computed once per set of
prompts and kept (the last ``keep`` sets), and every schedule after that costs only its sampled part.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence

import torch

import santa.hf
from santa.checks import integer
from santa.eval.grading import grade
from santa.eval.runner import Batch, make_batch, prefill, rewind
from santa.hf_greedy import greedy_continue_batch, padded_forward

LOWER_IS_BETTER = ("kl",)


def schedule_config(layer_budgets: Mapping[int, int], *, sampler: str, seed: int, prefill: str = "dense") -> santa.hf.SantaConfig:
    """A SantaConfig with one budget per layer (``budget`` is unused: every layer is listed)."""
    return santa.hf.SantaConfig(
        budget=max(layer_budgets.values()), layer_budgets=dict(layer_budgets), sampler=sampler, seed=seed, prefill=prefill
    )


def chunks(prompts: Sequence[int], batch: int) -> list[tuple[int, ...]]:
    """Sorted prompt seeds in runs of at most ``batch`` (one left-padded batch each)."""
    batch = integer("batch", batch, low=1)
    ordered = sorted(integer("prompts[]", p, low=0) for p in prompts)
    return [tuple(ordered[i : i + batch]) for i in range(0, len(ordered), batch)]


class _Cached:
    """The last ``keep`` dense results, keyed by the tuple of prompt seeds."""

    def __init__(self, keep: int) -> None:
        self.keep, self.items = keep, OrderedDict()

    def get(self, key, make):
        if key not in self.items:
            self.items[key] = make()
            while len(self.items) > self.keep:
                self.items.popitem(last=False)
        self.items.move_to_end(key)
        return self.items[key]


class KLScorer:
    """Mean KL(dense ‖ schedule) per prompt over the last ``kl_tokens − 1`` tokens of held-out essay text.

    The protocol of ``santa eval run --tasks kl`` (teacher forcing; a dense prefill of the first
    ``L − T`` tokens, then the ``T − 1`` continuation rows sampled as one chunk). Lower is better.
    """

    metric = "kl"

    def __init__(
        self, model, tokenizer, *, length: int, kl_tokens: int = 32, sampler: str = "systematic", batch: int = 16, keep: int = 8
    ) -> None:
        length, kl_tokens = integer("length", length, low=2), integer("kl_tokens", kl_tokens, low=2)
        if kl_tokens >= length:
            raise ValueError(f"kl_tokens must be below length, got {kl_tokens} ≥ {length}")
        self.model, self.tokenizer, self.length, self.kl_tokens, self.sampler = model, tokenizer, length, kl_tokens, sampler
        self.batch, self.cached = integer("batch", batch, low=1), _Cached(integer("keep", keep, low=1))

    def _dense(self, prompts: tuple[int, ...]):
        """(cache after the dense context, context length, reference log-probs ``[B, T−1, V]``, batch)."""
        device = next(self.model.parameters()).device
        batch = make_batch("kl", self.tokenizer, self.length, list(prompts), device)
        t = self.kl_tokens
        if min(batch.lengths) <= t:
            raise ValueError(f"KL prompts need more than {t} tokens, got {min(batch.lengths)}")
        context_mask = None if batch.mask is None else batch.mask[:, :-t]
        context = Batch(batch.prompts, batch.ids[:, :-t], context_mask, [n - t for n in batch.lengths])
        cache, _, _ = prefill(self.model, context, santa.hf.SantaConfig(sampler="dense"))
        n_context = context.ids.shape[1]
        reference = self._chunk(batch, cache, n_context, santa.hf.SantaConfig(sampler="dense"))
        return cache, n_context, reference, batch

    def _chunk(self, batch: Batch, cache, n_context: int, config: santa.hf.SantaConfig) -> torch.Tensor:
        """Teacher-forced continuation over the rewound dense cache → log-probs ``[B, T−1, V]``."""
        rewind(cache, n_context)
        santa.hf.configure(self.model, config)
        chunk_mask = None if batch.mask is None else batch.mask[:, :-1]
        with torch.inference_mode():
            out = padded_forward(self.model, batch.ids[:, -self.kl_tokens : -1], chunk_mask, cache=cache)
        return torch.log_softmax(out.logits.float(), dim=-1)

    def scores(self, layer_budgets: Mapping[int, int], *, prompts: Sequence[int], seed: int) -> dict[int, float]:
        out = {}
        for key in chunks(prompts, self.batch):
            cache, n_context, reference, batch = self.cached.get(key, lambda key=key: self._dense(key))
            config = schedule_config(layer_budgets, sampler=self.sampler, seed=seed, prefill="sampled")
            logprobs = self._chunk(batch, cache, n_context, config)
            kl = (reference.exp() * (reference - logprobs)).sum(-1).clamp_min(0.0).mean(-1)  # [B]
            out.update({p: float(k) for p, k in zip(key, kl, strict=True)})
        return out


class TaskScorer:
    """Greedy answers graded by the task's grader (``santa.eval.grading.grade``), score in [0, 1].

    prefill ``"dense"``: dense prefill (kept per prompt set), sampled decode — the RULER setting;
    ``"sampled"``: the schedule samples the prefill too (the paper's GSM8K/MMLU setting).
    """

    def __init__(
        self,
        model,
        tokenizer,
        *,
        task: str,
        length: int,
        max_new_tokens: int = 64,
        sampler: str = "systematic",
        prefill: str = "dense",
        batch: int = 16,
        keep: int = 8,
    ) -> None:
        if prefill not in ("dense", "sampled"):
            raise ValueError(f"prefill must be 'dense' or 'sampled', got {prefill!r}")
        self.model, self.tokenizer, self.task, self.length = model, tokenizer, task, integer("length", length, low=1)
        self.max_new_tokens, self.sampler, self.prefill = integer("max_new_tokens", max_new_tokens, low=1), sampler, prefill
        self.metric = task
        self.batch, self.cached = integer("batch", batch, low=1), _Cached(integer("keep", keep, low=1))

    def _batch(self, prompts: tuple[int, ...]):
        device = next(self.model.parameters()).device
        batch = make_batch(self.task, self.tokenizer, self.length, list(prompts), device)
        dense = prefill(self.model, batch, santa.hf.SantaConfig(sampler="dense")) if self.prefill == "dense" else None
        return batch, dense

    def scores(self, layer_budgets: Mapping[int, int], *, prompts: Sequence[int], seed: int) -> dict[int, float]:
        out = {}
        for key in chunks(prompts, self.batch):
            out.update(self._scores(layer_budgets, key, seed))
        return out

    def _scores(self, layer_budgets: Mapping[int, int], key: tuple[int, ...], seed: int) -> dict[int, float]:
        batch, dense = self.cached.get(key, lambda: self._batch(key))
        config = schedule_config(layer_budgets, sampler=self.sampler, seed=seed, prefill=self.prefill)
        if dense is None:
            cache, last_logits, _ = prefill(self.model, batch, config)
        else:
            cache, last_logits, _ = dense
            rewind(cache, batch.ids.shape[1])
        santa.hf.configure(self.model, config)
        rows = greedy_continue_batch(self.model, self.tokenizer, cache, last_logits, self.max_new_tokens, batch.mask)
        answers = [self.tokenizer.decode(tokens, skip_special_tokens=True).strip() for tokens in rows]
        return {p: grade(prompt, answer) for p, prompt, answer in zip(key, batch.prompts, answers, strict=True)}


def make_scorer(
    model,
    tokenizer,
    *,
    metric: str,
    length: int,
    kl_tokens: int = 32,
    max_new_tokens: int = 64,
    sampler: str = "systematic",
    prefill: str = "dense",
    batch: int = 16,
):
    """``metric="kl"`` → :class:`KLScorer`; a task name of :data:`santa.eval.tasks.TASKS` → :class:`TaskScorer`."""
    if metric == "kl":
        return KLScorer(model, tokenizer, length=length, kl_tokens=kl_tokens, sampler=sampler, batch=batch)
    return TaskScorer(
        model, tokenizer, task=metric, length=length, max_new_tokens=max_new_tokens, sampler=sampler, prefill=prefill, batch=batch
    )
