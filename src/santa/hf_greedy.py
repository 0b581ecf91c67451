"""Batched greedy decoding of a Hugging Face causal LM from a prefilled KV cache.

Left padding (:func:`left_pad`), one forward over a padded batch with the right position ids
(:func:`padded_forward`) and the greedy loop (:func:`greedy_continue_batch`). Below both
:mod:`santa.eval` (the sweep runner) and :mod:`santa.generate` (the main job): it imports neither.
"""

from __future__ import annotations

import inspect

import torch

from santa.checks import integer


def left_pad(token_lists: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Stack prompts of different lengths, padded on the left.

    Returns ``ids`` ``[B, L]`` int64 and ``mask`` ``[B, L]`` int64 (1 = prompt token, 0 = padding),
    or ``mask=None`` when every prompt has the same length (no padding to mask).
    """
    pad_id = integer("pad_id", pad_id, low=0)
    if not token_lists or any(len(t) == 0 for t in token_lists):
        raise ValueError("token_lists must hold at least one prompt, and every prompt at least one token")
    width = max(len(t) for t in token_lists)
    ids = torch.full((len(token_lists), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(token_lists), width), dtype=torch.long)
    for row, tokens in enumerate(token_lists):
        ids[row, width - len(tokens) :] = torch.tensor(tokens, dtype=torch.long)
        mask[row, width - len(tokens) :] = 1
    if bool(mask.all()):
        return ids.to(device), None
    return ids.to(device), mask.to(device)


def padded_forward(model, ids: torch.Tensor, mask: torch.Tensor | None, *, cache=None, logits_to_keep: int = 0):
    """One forward of ``ids`` ``[B, Lq]`` over ``cache`` (or none), left padding included.

    ``mask`` ``[B, Lc + Lq]`` covers the cached tokens and ``ids`` (1 = real token); position ids
    count real tokens only, so a padded prompt sees the positions it would see alone.
    ``logits_to_keep``: logits of the last so many positions only (0 = all).
    """
    kwargs = {"use_cache": True, "logits_to_keep": integer("logits_to_keep", logits_to_keep, low=0)}
    if cache is not None:
        kwargs[cache_keyword(model)] = cache
    if mask is not None:
        positions = (mask.cumsum(1) - 1).clamp_min(0)[:, -ids.shape[1] :]
        kwargs.update(attention_mask=mask, position_ids=positions)
    return model(input_ids=ids, **kwargs)


@torch.inference_mode()
def greedy_continue_batch(
    model, tokenizer, cache, last_logits: torch.Tensor, max_new_tokens: int, mask: torch.Tensor | None = None
) -> list[list[int]]:
    """Greedy decode a batch from a prefilled cache.

    last_logits ``[B, V]``: the prefill's last position (gives the first new token).
    mask ``[B, L]``: the prefilled cache's padding mask (1 = real token), or None.
    Returns each row's tokens up to and including its first stop token (at most ``max_new_tokens``).
    Rows that stopped keep decoding until every row has stopped; their extra tokens are dropped.
    """
    max_new_tokens = integer("max_new_tokens", max_new_tokens, low=1)  # the first new token comes from the prefill
    stop = stop_token_ids(tokenizer)
    stop_ids = torch.tensor(sorted(stop), dtype=torch.long, device=last_logits.device)
    token = last_logits.argmax(-1, keepdim=True)  # [B, 1]
    steps = [token]
    finished = torch.isin(token[:, 0], stop_ids)
    for _ in range(max_new_tokens - 1):
        if bool(finished.all()):
            break
        if mask is not None:
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        out = padded_forward(model, token, mask, cache=cache, logits_to_keep=1)
        cache = returned_cache(out)
        token = out.logits[:, -1].argmax(-1, keepdim=True)
        steps.append(token)
        finished |= torch.isin(token[:, 0], stop_ids)
    rows = torch.cat(steps, dim=1).tolist()
    return [_up_to_stop(row, stop) for row in rows]


def _up_to_stop(tokens: list[int], stop: set[int]) -> list[int]:
    for i, token in enumerate(tokens):
        if token in stop:
            return tokens[: i + 1]
    return tokens


def greedy_continue(model, tokenizer, cache, last_logits: torch.Tensor, max_new_tokens: int) -> list[int]:
    """Greedy decode one prompt from a prefilled cache (the first token comes from ``last_logits`` ``[1, V]``)."""
    return greedy_continue_batch(model, tokenizer, cache, last_logits, max_new_tokens)[0]


def stop_token_ids(tokenizer) -> set[int]:
    ids = (tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.eos_token_id)
    return {i for i in ids if isinstance(i, int) and i != tokenizer.unk_token_id}


def cache_keyword(model) -> str:
    """transformers ≥ 5.24 names the KV cache argument ``cache``; earlier releases ``past_key_values``."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def returned_cache(output):
    return output.cache if getattr(output, "cache", None) is not None else output.past_key_values
