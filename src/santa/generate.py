"""The main job: answer a needle-in-a-haystack prompt with dense attention and with SANTA.

One prefill per method (dense SDPA prefill in both, unless ``prefill="sampled"``), greedy decoding,
and a report of the answers, whether the needle was found, the share of value rows read and the
decode speed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

import santa.hf
from santa.assets import DEFAULT_MODEL, load_model
from santa.decoding import cache_keyword, greedy_continue, padded_forward, returned_cache  # noqa: F401 (cache_keyword: re-exported)
from santa.eval.runner import check_prompt_length
from santa.eval.tasks import Prompt, chat, contains_all, needle_prompt


@dataclass
class Answer:
    method: str
    text: str
    found: bool
    prefill_s: float
    decode_s: float
    new_tokens: int
    share_per_head: float | None  # share of visible V rows read per query head (sampled decode)
    share_per_kv_head: float | None  # the same for the union over each KV head's query group

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / max(self.decode_s, 1e-9)


@torch.inference_mode()
def greedy_answer(model, tokenizer, prompt: Prompt, max_new_tokens: int) -> tuple[str, float, float, int]:
    """Greedy decode; returns (answer text, prefill seconds, decode seconds, new tokens)."""
    ids = tokenizer(prompt.text, return_tensors="pt", add_special_tokens=False).input_ids.to(model.device)
    start = time.perf_counter()
    out = padded_forward(model, ids, None, logits_to_keep=1)
    prefill_s = time.perf_counter() - start
    start = time.perf_counter()
    tokens = greedy_continue(model, tokenizer, returned_cache(out), out.logits[:, -1], max_new_tokens)
    decode_s = time.perf_counter() - start
    return tokenizer.decode(tokens, skip_special_tokens=True).strip(), prefill_s, decode_s, len(tokens)


def run(
    *,
    model_name: str = DEFAULT_MODEL,
    n_tokens: int = 2048,
    budget: int = 64,
    sampler: str = "systematic",
    seed: int = 0,
    prompt_seed: int = 0,
    depth: float = 0.5,
    prefill: str = "dense",
    max_new_tokens: int = 32,
    prompt_text: str | None = None,
    expected: tuple[str, ...] = (),
    device: str = "cpu",
    progress=None,
) -> tuple[Prompt, list[Answer]]:
    """Build the prompt, answer it with dense attention and with ``sampler`` at ``budget``.

    Every argument is checked before the model loads (``ValueError`` naming it).
    """
    methods = [("dense (SDPA)", santa.hf.SantaConfig(sampler="dense"))]
    methods.append(
        (f"{sampler} S={budget}", santa.hf.SantaConfig(budget=budget, sampler=sampler, seed=seed, prefill=prefill, record_stats=True))
    )
    check_run_arguments(n_tokens=n_tokens, depth=depth, max_new_tokens=max_new_tokens, prompt_text=prompt_text)
    model, tokenizer = load_model(model_name, device=device)
    if prompt_text is None:
        prompt = needle_prompt(tokenizer, n_tokens, seed=prompt_seed, depth=depth)
        check_prompt_length(prompt, n_tokens)
    else:
        text = chat(tokenizer, prompt_text)
        n = len(tokenizer.encode(text, add_special_tokens=False))
        prompt = Prompt(task="user", text=text, answers=tuple(expected), n_tokens=n, seed=prompt_seed)
    answers = []
    for name, config in methods:
        santa.hf.configure(model, config)
        text, prefill_s, decode_s, new_tokens = greedy_answer(model, tokenizer, prompt, max_new_tokens)
        sampled = config.stats.calls > 0
        answers.append(
            Answer(
                method=name,
                text=text,
                found=bool(prompt.answers) and contains_all(text, prompt.answers) == 1.0,
                prefill_s=prefill_s,
                decode_s=decode_s,
                new_tokens=new_tokens,
                share_per_head=config.stats.share_per_head if sampled else None,
                share_per_kv_head=config.stats.share_per_kv_head if sampled else None,
            )
        )
        if progress is not None:
            progress(name)
    return prompt, answers


def check_run_arguments(*, n_tokens: int, depth: float, max_new_tokens: int, prompt_text: str | None) -> None:
    """The arguments of :func:`run` that no constructor checks before the model loads."""
    for name, value in (("max_new_tokens", max_new_tokens), ("n_tokens", n_tokens)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int ≥ 1, got {value!r}")
    if prompt_text is None and not (isinstance(depth, (int, float)) and 0.0 <= depth <= 1.0):
        raise ValueError(f"depth must lie in [0, 1], got {depth!r}")
