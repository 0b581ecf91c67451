"""The main job: answer a needle-in-a-haystack prompt with dense attention and with SANTA.

Two paths (``path=`` of :func:`run`):

- ``"hf"`` (the CPU default): the transformers model with :mod:`santa.hf`'s attention; one prefill
  per method (dense SDPA prefill in both, unless ``prefill="sampled"``), greedy decoding, the
  batch's prompts one after another. An untimed warm-up answer (the first prompt, dense, a few
  tokens) runs first, so that the first timed method does not pay the one-off costs (lazy
  initialisation, first-call allocations) and both prefill columns time the same work.
- ``"fast"`` (the CUDA default): :mod:`santa.model` on the same weights (bfloat16 on CUDA): the
  batch's prompts, of different lengths, in one right-padded batch; one dense prefill shared by
  both methods, the decode step as one CUDA graph on CUDA; SANTA is santa's kernel
  (``kernel="prop"`` or ``"flash"``) for ``sampler="systematic"``, the reference sampler on the
  same cache otherwise. The share of V rows read is the nominal ``min(S, n)/n`` per head.

Both report the answers (decoded with the model's tokenizer), whether the needle was found, the
share of value rows read and the decode speed.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

import santa.hf
from santa import engine, methods
from santa.assets import DEFAULT_MODEL, load_model
from santa.checks import integer
from santa.eval.tasks import Prompt, chat, check_prompt_length, contains_all, needle_prompt
from santa.hf_greedy import cache_keyword, greedy_continue, padded_forward, returned_cache, stop_token_ids  # noqa: F401 (cache_keyword: re-exported)


@dataclass
class Answer:
    method: str
    text: str
    found: bool
    prefill_s: float
    decode_s: float
    new_tokens: int
    share_per_head: float | None  # share of visible V rows read per query head (sampled decode); None: exact; NaN: not counted (an error target off the kernels)
    share_per_kv_head: float | None  # the same for the union over each KV head's query group
    prompt: int = 0  # index of its prompt in the batch
    batch_tokens: int | None = None  # fast path: new tokens of the whole batch in decode_s
    path: str = "hf"  # "hf", or the santa.model path (see santa.engine.path_label)

    @property
    def tokens_per_s(self) -> float:
        """Decode tokens/s: of the whole batch on the fast path, of this prompt on the HF path."""
        return (self.batch_tokens or self.new_tokens) / max(self.decode_s, 1e-9)


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
    batch: int = 1,
    kernel: str | None = None,
    path: str = "hf",
    progress=None,
    error_target: float | None = None,
) -> tuple[list[Prompt], list[Answer]]:
    """Build the prompts (``batch`` needle prompts, seeds ``prompt_seed …``), answer them with dense
    attention and with ``sampler`` at ``budget``; returns (prompts, answers: dense ones first).

    kernel: ``"prop"`` / ``"flash"``: santa's kernel for ``sampler="systematic"`` (None: prop on the
    fast path, santa.hf's ``"auto"`` on the HF path). error_target: a relative error ε instead of one budget
    for every head (:mod:`santa.error_target`), ``budget`` the cap. Every argument is checked before the model
    loads (``ValueError`` naming it).
    """
    methods = [("dense (SDPA)", santa.hf.SantaConfig(sampler="dense"))]
    methods.append(
        (
            sampled_name(sampler, budget, error_target),
            santa.hf.SantaConfig(budget=budget, sampler=sampler, seed=seed, prefill=prefill, record_stats=True, kernel=kernel or "auto",
                                 error_target=error_target),
        )
    )
    check_run_arguments(n_tokens=n_tokens, depth=depth, max_new_tokens=max_new_tokens, prompt_text=prompt_text, prompt_seed=prompt_seed)
    check_path_arguments(path=path, batch=batch, kernel=kernel, sampler=sampler, prefill=prefill, prompt_text=prompt_text)
    check_device(device)
    dtype = torch.bfloat16 if path == "fast" and torch.device(device).type == "cuda" else torch.float32
    model, tokenizer = load_model(model_name, device=device, dtype=dtype)
    if prompt_text is None:
        check_context(model, model_name, n_tokens, max_new_tokens, "--length")
        prompts = [needle_prompt(tokenizer, n_tokens, seed=prompt_seed + i, depth=depth) for i in range(batch)]
        for prompt in prompts:
            check_prompt_length(prompt, n_tokens)
    else:
        text = chat(tokenizer, prompt_text)
        n = len(tokenizer.encode(text, add_special_tokens=False))
        check_context(model, model_name, n, max_new_tokens, "the prompt")
        prompts = [Prompt(task="user", text=text, answers=tuple(expected), n_tokens=n, seed=prompt_seed)]
    if path == "fast":
        backends = [("dense (sdpa)", "sdpa"), fast_method(sampler, budget, kernel, error_target)]
        return prompts, answer_fast(engine.to_fast_model(model), tokenizer, prompts, backends, budget=budget, seed=seed,
                                    max_new_tokens=max_new_tokens, progress=progress, error_target=error_target)
    warm_up(model, tokenizer, prompts[0], max_new_tokens)
    answers = []
    for name, config in methods:
        santa.hf.configure(model, config)
        for i, prompt in enumerate(prompts):
            config.stats = santa.hf.DecodeStats()
            text, prefill_s, decode_s, new_tokens = greedy_answer(model, tokenizer, prompt, max_new_tokens)
            sampled = config.stats.calls > 0
            answers.append(
                Answer(
                    method=name,
                    text=text,
                    found=graded_found(prompt, text),
                    prefill_s=prefill_s,
                    decode_s=decode_s,
                    new_tokens=new_tokens,
                    share_per_head=config.stats.share_per_head if sampled else None,
                    share_per_kv_head=config.stats.share_per_kv_head if sampled else None,
                    prompt=i,
                )
            )
        if progress is not None:
            progress(name)
    return prompts, answers


WARM_UP_TOKENS = 2  # decode steps of the warm-up answer: the step's one-off costs, not a measurement


def warm_up(model, tokenizer, prompt: Prompt, max_new_tokens: int) -> None:
    """One untimed dense answer to ``prompt`` (its full prefill, a few decode steps): the first timed
    run would otherwise pay the one-off costs alone (the first prefill of a length took 2–3× the
    next on SmolLM2 at 2k tokens on the CPU), and dense, timed first, looked slower than sampled
    although both prefill densely."""
    santa.hf.configure(model, santa.hf.SantaConfig(sampler="dense"))
    greedy_answer(model, tokenizer, prompt, min(max_new_tokens, WARM_UP_TOKENS))


def graded_found(prompt: Prompt, text: str) -> bool:
    """Whether ``text`` holds every expected answer of ``prompt`` (False when none is expected)."""
    return bool(prompt.answers) and contains_all(text, prompt.answers) == 1.0


def sampled_name(method: str, budget: int, error_target: float | None) -> str:
    """How the answers name the sampled method: ``"systematic S=64"``, or ``"systematic ε=0.1 S≤64"``."""
    return f"{method} S={budget}" if error_target is None else f"{method} ε={error_target:g} S≤{budget}"


def fast_method(sampler: str, budget: int, kernel: str | None, error_target: float | None = None) -> tuple[str, str]:
    """(name, santa.model backend) of the sampled method on the fast path (:func:`santa.engine.fast_method`)."""
    backend = engine.fast_method(sampler, kernel).model_backend
    return ("dense (sdpa)", backend) if sampler == "dense" else (sampled_name(backend, budget, error_target), backend)


def answer_fast(model, tokenizer, prompts: list[Prompt], backends: list[tuple[str, str]], *, budget: int, seed: int,
                max_new_tokens: int, progress=None, error_target: float | None = None) -> list[Answer]:
    """Answer every prompt in one batch with each (name, backend) of santa.model, from one shared
    dense prefill. On CUDA each backend first decodes a few warm-up tokens (Triton compile and the
    CUDA graph capture stay out of the timing)."""
    token_lists = [tokenizer(p.text, add_special_tokens=False).input_ids for p in prompts]
    pre = engine.prefill(model, token_lists, max_new_tokens)
    stops = stop_token_ids(tokenizer)
    device = model.output.weight.device
    answers = []
    for name, backend in backends:
        kwargs = {"backend": backend, "budget": budget, "seed": seed, "stop_tokens": stops}
        if backend != "sdpa" and error_target is not None:
            kwargs["error_target"] = error_target
        if device.type == "cuda":
            engine.decode(model, pre, min(max_new_tokens, 4), **kwargs)
        rows, decode_s, measured = engine.decode(model, pre, max_new_tokens, **kwargs)
        for i, (prompt, row) in enumerate(zip(prompts, rows, strict=True)):
            text = tokenizer.decode(row, skip_special_tokens=True).strip()
            sampled = backend != "sdpa"
            answers.append(
                Answer(
                    method=name,
                    text=text,
                    found=graded_found(prompt, text),
                    prefill_s=pre.seconds,
                    decode_s=decode_s,
                    new_tokens=len(row),
                    # an error target's reads are each head's own: counted by the kernels (NaN where nothing counted them)
                    share_per_head=((measured[i] if measured is not None else math.nan) if error_target is not None else
                                    engine.nominal_share(backend, budget, len(token_lists[i]), len(row) - 1)) if sampled else None,
                    share_per_kv_head=None,
                    prompt=i,
                    batch_tokens=sum(len(r) for r in rows),
                    path=engine.path_label(backend, device),
                )
            )
        if progress is not None:
            progress(name)
    return answers


PATHS = methods.PATHS
KERNELS = methods.names(kernels=True)


def check_path_arguments(*, path: str, batch: int, kernel: str | None, sampler: str, prefill: str, prompt_text: str | None) -> None:
    """The arguments of :func:`run` that pick the path, checked before the model loads (``ValueError``)."""
    if path not in PATHS:
        raise ValueError(f"path must be one of {PATHS}, got {path!r}")
    integer("batch", batch, low=1)
    if batch > 1 and prompt_text is not None:
        raise ValueError("batch > 1 builds needle prompts of different seeds; it does not apply with prompt_text")
    if kernel is not None and kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS} or None, got {kernel!r}")
    if kernel is not None and sampler != "systematic":
        raise ValueError(f"kernel picks santa's kernel for sampler 'systematic', got sampler {sampler!r}")
    if path == "fast" and prefill != "dense":
        raise ValueError("prefill 'sampled' runs on the HF path only (santa.model prefills densely)")


def check_run_arguments(*, n_tokens: int, depth: float, max_new_tokens: int, prompt_text: str | None, prompt_seed: int = 0) -> None:
    """The arguments of :func:`run` that no constructor checks before the model loads (integers
    by :func:`santa.checks.integer`: TypeError for the wrong type, ValueError for a bad value)."""
    integer("max_new_tokens", max_new_tokens, low=1)
    integer("n_tokens", n_tokens, low=1)
    integer("prompt_seed", prompt_seed, low=0)
    if prompt_text is not None and (not isinstance(prompt_text, str) or not prompt_text.strip()):
        raise ValueError(f"prompt_text must be a non-empty string or None, got {prompt_text!r}")
    if prompt_text is None and not (isinstance(depth, (int, float)) and not isinstance(depth, bool) and 0.0 <= depth <= 1.0):
        raise ValueError(f"depth must lie in [0, 1], got {depth!r}")


def check_device(device: object) -> None:
    """``device`` must name a torch device this machine has (``ValueError`` before the model loads)."""
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise ValueError(f"device must be cpu, cuda or cuda:N, got {device!r}") from None
    if parsed.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r}: CUDA is not available on this machine (torch.cuda.is_available() is False)")
    if parsed.type == "cuda" and parsed.index is not None and parsed.index >= torch.cuda.device_count():
        raise ValueError(f"device {device!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    if parsed.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be cpu, cuda or cuda:N, got {device!r}")


def check_context(model, model_name: str, n_prompt: int, max_new_tokens: int, what: str) -> None:
    """Refuse a prompt and answer longer than the model's context (``max_position_embeddings``):
    past it the model still runs, but on positions it was never trained on."""
    limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if isinstance(limit, int) and n_prompt + max_new_tokens > limit:
        raise ValueError(
            f"{what} ({n_prompt} tokens) and max_new_tokens ({max_new_tokens}) exceed the {limit}-token context of {model_name}"
        )
