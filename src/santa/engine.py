"""The decode engine: which attention method runs on which path, and prefill, decode and
teacher-forced scoring on :mod:`santa.model`, timed.

Two paths run a method:

- ``"hf"``: the transformers model with :mod:`santa.hf`'s attention (left-padded batches, the
  reference samplers, sampled prefill, Bernoulli scores);
- ``"fast"``: :mod:`santa.model` on the same weights (bfloat16 on CUDA): a right-padded batch with
  per-sequence lengths, one dense prefill, the greedy decode step as one CUDA graph on CUDA.
  ``prop`` / ``flash`` run santa's kernels (their :class:`~santa.kernels.DecodePlan`), the other
  samplers their reference on the same cache, ``dense`` SDPA.

The rules that pick one (:func:`resolve_path`, :func:`hf_reason`, :func:`check_paths`), what a
record says ran (:func:`path_label`, :func:`nominal_share`) and the fast path's model
(:func:`to_fast_model`) live here, read from :data:`santa.methods.METHODS`. ``santa generate``,
``santa eval`` and the benchmarks call :func:`prefill`, :func:`decode` and :func:`teacher_forced`;
the loop itself is :func:`santa.model.decode_tokens` (one :func:`santa.model.greedy_step` per token),
the one that :func:`santa.model.generate` runs too: santa.model sits below this module and
imports nothing from it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

import torch

import santa.model
from santa import methods
from santa.error_target import DEFAULT_PILOT

PATHS = ("auto", "hf", "fast")
FAST_ONLY = tuple(name for name in methods.names() if "hf" not in methods.METHODS[name].paths)  # santa's kernels
FAST_BACKENDS = {m.name: m.model_backend for m in methods.METHODS.values()}  # method → santa.model backend


# --- which method runs where ---------------------------------------------------------------------


def resolve_path(path: str, device: str | torch.device) -> str:
    """``"auto"`` → ``"fast"`` on CUDA, ``"hf"`` elsewhere; ``"hf"`` / ``"fast"`` as given."""
    if path not in PATHS:
        raise ValueError(f"path must be one of {PATHS}, got {path!r}")
    if path != "auto":
        return path
    return "fast" if torch.device(device).type == "cuda" else "hf"


def hf_reason(job) -> str | None:
    """Why ``job`` must run on the HF path (None: the fast path can run it). job: anything with
    ``prefill``, ``score_samples`` and ``exact_when_covers`` (a :class:`santa.eval.runner.Job`)."""
    if job.prefill == "sampled":
        return "sampled prefill: santa.model prefills densely, so this runs on the HF path"
    if job.score_samples:
        return "Bernoulli qKᵀ scores run on the HF path only"
    if job.exact_when_covers:
        return "exact_when_covers runs on the HF path only"
    return None


def check_paths(jobs: Iterable, path: str, *, hf_because: str | None = None) -> None:
    """Refuse (``ValueError``) prop / flash jobs that would have to run on the HF path, which has no
    kernel path for left-padded batches, and jobs on an fp8 KV cache (``kv_cache="fp8"``: only
    santa.model has one) that would. ``path``: ``"hf"`` or ``"fast"`` (resolved); jobs as in
    :func:`hf_reason`, with a ``method`` (and a ``kv_cache``). hf_because: why ``path`` is ``"hf"``,
    as the refusal says it (default ``"--path hf was asked for"``; a caller whose ``"auto"`` picked
    hf says so)."""
    on_hf = hf_because or "--path hf was asked for"
    for job in jobs:
        if getattr(job, "kv_cache", "auto") != "auto":
            reason = on_hf if path == "hf" else hf_reason(job)
            if reason is not None:
                raise ValueError(f"an fp8 KV cache runs on the fast path only (santa.model), but {reason}")
        if job.method in FAST_ONLY:
            reason = on_hf if path == "hf" else hf_reason(job)
            if reason is not None:
                raise ValueError(f"method {job.method} runs on the fast path only (santa.kernels), but {reason}")


def fast_method(sampler: str, kernel: str | None = None) -> methods.Method:
    """The method that runs ``sampler`` on the fast path: sampler ``"systematic"`` runs santa's
    kernel (``kernel``, default :data:`santa.methods.DEFAULT_KERNEL`), the others themselves."""
    if sampler == "systematic":
        return methods.method(kernel or methods.DEFAULT_KERNEL)
    return methods.method(sampler)


def path_label(backend: str, device: str | torch.device) -> str:
    """The ``"path"`` a fast-path record carries for a santa.model backend."""
    if backend in santa.model.REFERENCE_BACKENDS:
        return "santa.model/reference"
    method = methods.by_model_backend(backend)
    if method is not None and method.kernel:
        from santa.kernels import use_triton

        return "santa.model/kernels" if use_triton(torch.device(device)) else "santa.model/kernels-torch"
    return f"santa.model/{backend}"


def nominal_share(backend: str, budget: int, n_prompt: int, steps: int) -> float:
    """Share of visible V rows a fast-path backend reads per query head, averaged over ``steps``
    decode steps after ``n_prompt`` prompt tokens: ``min(S, n) / n`` for the sampled ones (S rows
    drawn, at most every row), 1 for dense."""
    if backend == "sdpa" or steps == 0:
        return 1.0
    shares = [min(budget, n) / n for n in range(n_prompt + 1, n_prompt + 1 + steps)]
    return sum(shares) / len(shares)


def fast_dtype(device: str | torch.device) -> torch.dtype:
    """The fast path's weights and cache: bfloat16 on CUDA (the product's), float32 elsewhere."""
    return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32


def to_fast_model(hf_model) -> santa.model.Transformer:
    """santa.model's :class:`~santa.model.Transformer` on the HF model's device, in :func:`fast_dtype`."""
    device = next(hf_model.parameters()).device
    return santa.model.Transformer.from_hf(hf_model, dtype=fast_dtype(device)).eval()


# --- prefill, decode, teacher-forced scoring -----------------------------------------------------


@dataclass
class Prefilled:
    """One dense prefill of a right-padded batch into santa.model's static cache, shared by every
    method: decode never writes below ``lengths[b]``, so each method restarts from ``first``."""

    first: torch.Tensor  # [B, 1] int64: the prefill's greedy token
    lengths: torch.Tensor  # [B] int64: prompt tokens per sequence
    max_new_tokens: int  # the cache holds T_max + this
    seconds: float


def sync(device: torch.device) -> None:
    """Wait for ``device`` (CUDA) so that host timers measure its work; nothing on the CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.inference_mode()
def prefill(model: santa.model.Transformer, token_lists: list[list[int]], max_new_tokens: int, *,
            kv_cache_dtype: str | torch.dtype | None = None) -> Prefilled:
    """Set up caches for ``B = len(token_lists)`` prompts plus ``max_new_tokens`` and prefill them densely (timed).
    kv_cache_dtype: the cache's dtype (None: the model's; ``"fp8"``: :meth:`santa.model.Transformer.setup_caches`)."""
    device = model.output.weight.device
    padded, lengths = santa.model.pad_prompts(token_lists, vocab_size=model.args.vocab_size, device=device)  # [B, T], [B]
    model.setup_caches(padded.shape[0], padded.shape[1] + max_new_tokens, kv_cache_dtype=kv_cache_dtype)
    sync(device)
    start = time.perf_counter()
    first = santa.model.prefill(model, padded, lengths=lengths)  # [B, 1]
    sync(device)
    return Prefilled(first, lengths, max_new_tokens, time.perf_counter() - start)


def decode_context(model: santa.model.Transformer, pre: Prefilled, backend: str, budget: int, seed: int,
                   layer_budgets: dict[int, int] | None, error_target: float | None = None,
                   pilot: int = DEFAULT_PILOT) -> santa.model.DecodeContext:
    """The decode context of one method after ``pre`` (dense jobs carry budget 0: S = 1 is never read)."""
    return santa.model.make_context(model, backend, prompt_len=pre.lengths, budget=max(budget, 1), seed=seed,
                                    layer_budgets=layer_budgets or None, error_target=error_target, pilot=pilot)


class Decoded(NamedTuple):
    """:func:`decode`'s result."""

    rows: list[list[int]]  # each row's tokens, up to and including its first stop token
    seconds: float  # the decode steps run, each at the pace of those after the first (which captures the CUDA graph)
    v_rows_read: list[float] | None  # per row, measured share of visible V rows read per query head; None: not measured


@torch.inference_mode()
def decode(
    model: santa.model.Transformer, pre: Prefilled, max_new_tokens: int, *, backend: str, budget: int, seed: int,
    stop_tokens: Iterable[int], layer_budgets: dict[int, int] | None = None, error_target: float | None = None,
    pilot: int = DEFAULT_PILOT,
) -> Decoded:
    """Greedy decode from a shared :class:`Prefilled` with one santa.model backend → :class:`Decoded`. The loop of
    :func:`santa.model.generate`, after its prefill; on CUDA the step is one CUDA graph where the
    backend is capturable (:func:`santa.model.capturable`: not the reference samplers, which check
    on the host). ``seconds``: the steps run, each at the pace of the steps after the first (the first captures the
    graph; with one step or none after it, the whole loop). With an error target on the kernels the value rows each head drew are counted on the device
    (:func:`measured_shares`); a fixed budget's are known without it (:func:`nominal_share`)."""
    if not 1 <= max_new_tokens <= pre.max_new_tokens:
        raise ValueError(f"max_new_tokens must be in [1, {pre.max_new_tokens}] (the cache's room), got {max_new_tokens}")
    device = pre.first.device
    ctx = decode_context(model, pre, backend, budget, seed, layer_budgets, error_target, pilot)
    counting = error_target is not None and ctx.attend is santa.model.kernel_decode and max_new_tokens > 1
    if counting:
        ctx.reads = torch.zeros(pre.first.shape[0], model.args.n_head, dtype=torch.int64, device=device)
    stops = torch.tensor(sorted(stop_tokens), dtype=torch.long, device=device)  # [n_stop]
    clock = {"first_done": math.nan, "steps": 0}  # when step 1 had finished (host time); the steps run

    def finished(step: int) -> None:  # decode_tokens' hook after each step
        if step == 1:  # it captured the CUDA graph: the clock starts once it has run
            sync(device)
            clock["first_done"] = time.perf_counter()
        clock["steps"] = step

    sync(device)
    start = time.perf_counter()
    rows = santa.model.decode_tokens(model, ctx, pre.first, pre.lengths, max_new_tokens, stop_tokens=stops,
                                     cuda_graph=santa.model.capturable(model, backend), on_step=finished)
    sync(device)
    end = time.perf_counter()
    steps = clock["steps"]
    # every step run at the pace of those after the first: step 1 captured the graph, which a warm-up call cannot keep
    # out of this one (the graph belongs to this call's buffers)
    seconds = (end - clock["first_done"]) / (steps - 1) * steps if steps >= 2 else end - start
    return Decoded(rows, seconds, measured_shares(ctx, pre, model.args.n_layer) if counting else None)


def measured_shares(ctx: santa.model.DecodeContext, pre: Prefilled, layers: int) -> list[float]:
    """Per row b, the value rows its heads drew (``ctx.reads``, summed over layers and steps) over the rows they could
    read: ``Σ_h reads[b, h] / (H · layers · Σ_i (n_b + 1 + i))`` over the loop's steps i (its last position from
    ``ctx.positions``; the loop runs every row until all have stopped, and counts them all)."""
    steps = (ctx.positions.long() - pre.lengths.to(ctx.positions.device) + 1).clamp_min(0)  # [B]
    n = pre.lengths.to(steps.device)
    visible = steps * (n + 1) + steps * (steps - 1) // 2  # Σ_{i < steps} (n + 1 + i)
    heads = ctx.reads.shape[1]
    shares = ctx.reads.sum(-1).double() / (heads * layers * visible.double()).clamp_min(1)
    return shares.tolist()


@dataclass
class TeacherForced:
    """One method's teacher-forced steps over the prefilled context: per scored token ``[B, T−1]``."""

    nll: torch.Tensor  # −log p(continuation[b, i+1]), float32
    kl: torch.Tensor | None  # KL(reference ‖ method), float32, ≥ 0; None for the reference itself
    logprobs: torch.Tensor | None  # [B, T−1, V] float32: kept for the reference only
    seconds: float


@torch.inference_mode()
def teacher_forced(
    model: santa.model.Transformer, pre: Prefilled, continuation: torch.Tensor, *, backend: str, budget: int = 0,
    seed: int = 0, layer_budgets: dict[int, int] | None = None, reference: torch.Tensor | None = None,
    error_target: float | None = None, pilot: int = DEFAULT_PILOT,
) -> TeacherForced:
    """T − 1 teacher-forced decode steps from the prefilled context (eager, device work only).

    continuation: int64 ``[B, T]``, the last T tokens of each text; ``pre`` prefilled the first
    ``pre.lengths[b]`` (the context). Step i feeds ``continuation[b, i]`` at position
    ``pre.lengths[b] + i`` and its log-softmax scores ``continuation[b, i+1]``. The steps write the
    cache at positions ≥ ``pre.lengths[b]`` only (and see no key beyond their own position), so
    every method restarts from the same prefix. reference: the dense steps' log-probs
    ``[B, T−1, V]``; with it the per-token KL is accumulated step by step and no ``[B, T−1, V]``
    tensor is kept, without it (the reference run) the log-probs are returned. error_target, pilot: budgets from
    an error target, budget the cap (:func:`santa.model.make_context`).
    """
    n_steps = continuation.shape[1] - 1
    if not 1 <= n_steps <= pre.max_new_tokens:
        raise ValueError(f"continuation must be 2 to {pre.max_new_tokens + 1} tokens (the cache's room), got {n_steps + 1}")
    device = continuation.device
    ctx = decode_context(model, pre, backend, budget, seed, layer_budgets, error_target, pilot)
    batch = continuation.shape[0]
    nll = torch.empty(batch, n_steps, dtype=torch.float32, device=device)
    kl = None if reference is None else torch.empty_like(nll)
    logprobs = None if reference is not None else torch.empty(batch, n_steps, model.args.vocab_size, dtype=torch.float32, device=device)
    input_pos = pre.lengths.clone()  # [B]: where step i writes, lengths[b] + i
    sync(device)
    start = time.perf_counter()
    for i in range(n_steps):
        ctx.prepare(input_pos)
        logits = model(continuation[:, i : i + 1], input_pos, ctx)  # [B, 1, V] float32
        lp = torch.log_softmax(logits[:, 0].float(), dim=-1)  # [B, V]
        nll[:, i] = -lp.gather(-1, continuation[:, i + 1 : i + 2])[:, 0]
        if reference is None:
            logprobs[:, i] = lp
        else:
            ref = reference[:, i]  # [B, V]
            kl[:, i] = (ref.exp() * (ref - lp)).sum(-1).clamp_min(0.0)
        input_pos.add_(1)
    sync(device)
    return TeacherForced(nll, kl, logprobs, time.perf_counter() - start)


__all__ = [
    "FAST_BACKENDS",
    "FAST_ONLY",
    "PATHS",
    "Prefilled",
    "TeacherForced",
    "check_paths",
    "decode",
    "fast_dtype",
    "fast_method",
    "hf_reason",
    "nominal_share",
    "path_label",
    "prefill",
    "resolve_path",
    "teacher_forced",
    "to_fast_model",
]
