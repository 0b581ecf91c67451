"""The sweep runner: a grid of (task, length, method, budget, prompt, seed) jobs, one JSONL line each.

Prompts of one (model, length, task) run in left-padded batches, and every method of the grid runs
on the whole batch. The batch is prefilled once with exact attention and every decode-only job
rewinds the KV cache to the prompt and decodes from there, so a sweep of M methods costs one
prefill, not M. Each finished job is appended to the JSONL file at once (one ``write`` of one line
on an ``O_APPEND`` descriptor, then ``fsync``), and a re-run skips every job whose key is already in
the file: a killed sweep loses only the method it was running on the batch in flight.

Two paths run a job (``path=`` of :func:`run_sweep`, recorded in each record's ``"path"``); the rules
that pick one and the fast path's prefill, decode and teacher-forced steps are :mod:`santa.engine`'s,
this module keeps the grid, the batching and the sweep file:

- ``"hf"``: the transformers model with :mod:`santa.hf`'s attention (left-padded batches, the
  reference samplers); every job can run here but ``prop`` / ``flash``.
- ``"fast"``: :mod:`santa.model` on the same weights: right-padded batch with per-sequence lengths,
  one dense prefill, the decode step as one CUDA graph on CUDA. ``prop`` / ``flash`` run
  :func:`santa.kernels.decode` (record ``"santa.model/kernels"``; ``"santa.model/kernels-torch"``
  where Triton does not run, i.e. on CPU without ``TRITON_INTERPRET=1``), iid / stratified /
  systematic / top-k the reference on the same cache (``"santa.model/reference"``), dense SDPA
  (``"santa.model/sdpa"``). Teacher-forced KL (task ``"kl"``) runs stepwise here
  (:func:`run_fast_kl_batch`, ``"kl_mode": "stepwise"``): one dense prefill of the context, then
  T − 1 single-token steps that feed the text's own tokens, against a stepwise dense SDPA
  reference — so prop and flash get KL too. Jobs it cannot run — sampled prefill, Bernoulli
  scores, ``exact_when_covers`` — stay on the HF path, with ``"path_reason"`` in their record
  (the HF path scores KL in one teacher-forced chunk, ``"kl_mode": "chunked"``).

The path is not part of the job key: a sweep resumes across paths (both run the same estimator
on the same prompts; records say which ran).

One writer per file: :func:`run_sweep` holds the file's lock while it runs, so a second sweep on the
same file stops at once (:class:`santa.sweep_files.SweepLocked`) instead of writing every record
twice. The kernel drops the lock with the process, so a killed sweep leaves no stale lock behind.
Reading, appending and locking sweep files is :mod:`santa.sweep_files`' (the ablation, the tuning
history and the benchmarks write the same files).
"""

from __future__ import annotations

import itertools
import json
import math
import platform
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

import santa.hf
import santa.model
from santa import engine, methods
from santa.engine import (  # noqa: F401 (FAST_ONLY, PATHS, check_paths: the path rules, re-exported for santa eval)
    FAST_BACKENDS,
    FAST_ONLY,
    PATHS,
    check_paths,
    hf_reason,
    nominal_share,
    path_label,
    resolve_path,
    to_fast_model,
)
from santa.eval.grading import grade
from santa.eval.tasks import FIXED_LENGTH_TASKS, TASKS, Prompt, build_prompt, check_prompt_length  # noqa: F401 (re-exported)
from santa.hf_greedy import greedy_continue_batch, left_pad, padded_forward, returned_cache, stop_token_ids
from santa.provenance import code_commit
from santa.rng import MAX_SEED  # sampler seeds are ints in [0, 2**63)
from santa.sweep_files import SweepFileError, append_record, appending, load_sweep

METHODS = methods.names()  # santa.methods' registry, in its order (dense first)
HF_METHODS = methods.names(path="hf")
MAX_NEW_TOKENS = 64  # default answer budget of the generation tasks (RULER-style: 64, as the paper)
PREFILLS = ("dense", "sampled")
KV_CACHES = ("auto", "fp8")  # Job.kv_cache: the model's dtype, or e4m3 with per-KV-head scales (fast path only)


@dataclass(frozen=True, order=True)
class Job:
    """One cell entry: a prompt answered (or scored, for ``task="kl"``) by one method."""

    model: str
    task: str
    length: int  # prompt length in tokens (0 for GSM8K / MMLU, whose length the item sets)
    prompt: int  # prompt seed
    prefill: str  # "dense" (decode-only sampling, paper Section 3) or "sampled" (Section 4)
    method: str
    budget: int  # S, or k for top-k; 0 for dense
    seed: int  # sampler seed; 0 for deterministic methods
    max_new_tokens: int  # new tokens to generate; for task "kl", tokens scored under teacher forcing
    exact_when_covers: bool = False  # SantaConfig.exact_when_budget_covers
    score_samples: int = 0  # Bernoulli qKᵀ draws B for the sampled rows' scores; 0 = exact scores
    schedule: str = ""  # name of a per-layer budget schedule ("" = ``budget`` in every layer)
    layer_budgets: tuple[tuple[int, int], ...] = ()  # the schedule's (layer, S) pairs
    kv_cache: str = "auto"  # the KV cache's dtype: "auto" (the model's) or "fp8" (e4m3, per-KV-head scales; fast path)
    error_target: float = 0.0  # a relative error target ε (budget is then the cap); 0 = the fixed budget

    def key(self) -> str:
        fields = asdict(self)
        for name in ("score_samples", "schedule", "layer_budgets", "error_target"):
            if not fields[name]:
                del fields[name]  # jobs without them keep the keys of records written before they existed
        if fields["kv_cache"] == "auto":
            del fields["kv_cache"]
        return json.dumps(fields, sort_keys=True)

    @property
    def group(self) -> tuple:
        """Jobs with the same group share one prompt (and one dense prefill)."""
        return (self.model, self.task, self.length, self.prompt)

    def config(self) -> santa.hf.SantaConfig:
        if self.method == "dense":  # with score_samples: Bernoulli scores, exact value stage
            score = self.score_samples or None
            return santa.hf.SantaConfig(sampler="dense", score_samples=score, record_stats=score is not None)
        return santa.hf.SantaConfig(
            budget=self.budget,
            sampler=self.method,
            seed=self.seed,
            prefill=self.prefill,
            exact_when_budget_covers=self.exact_when_covers,
            record_stats=True,
            kernel="reference",  # the spec's samplers on every device (on CUDA "auto" would run the prop kernel)
            score_samples=self.score_samples or None,
            layer_budgets=dict(self.layer_budgets),
            error_target=self.error_target or None,
        )


def grid(
    *,
    models: Iterable[str],
    tasks: Iterable[str],
    lengths: Iterable[int],
    methods: Iterable[str] = HF_METHODS,
    budgets: Iterable[int] = (16, 32, 64, 128, 256),
    prompts: Iterable[int] = range(10),
    seeds: Iterable[int] = (0,),
    prefills: Iterable[str] = ("dense",),
    max_new_tokens: int = MAX_NEW_TOKENS,
    kl_tokens: int = 32,
    exact_when_covers: bool = False,
    score_samples: Iterable[int] = (0,),
    layer_budgets: dict[int, int] | None = None,
    schedule: str = "schedule",
    kv_caches: Iterable[str] = ("auto",),
    error_targets: Iterable[float] = (0.0,),
) -> list[Job]:
    """Every job of the grid, ordered so that jobs sharing a prompt (one group) are adjacent.

    Dense runs once per prompt (budget 0, seed 0); top-k is deterministic (seed 0 only); sampled
    prefill is only meaningful for sampled methods, so dense-prefill dense is the baseline of both.
    score_samples: Bernoulli qKᵀ draws B per job (0: exact scores); ``dense`` with B > 0 samples
    the decode scores alone.
    layer_budgets: a per-layer schedule ``{layer: S}`` (``santa tune budgets``) for every sampled
    job, named ``schedule`` in the records; layers not in it use the job's budget.
    kv_caches: the KV cache's dtype per job, ``"auto"`` (the model's) and/or ``"fp8"`` (e4m3 with
    per-KV-head scales calibrated on the prefill, :meth:`santa.model.Transformer.setup_caches`; the
    fast path only). Every method of the grid runs on each.
    error_targets: relative error targets ε (:mod:`santa.error_target`) for the sampled methods (iid, stratified,
    systematic, prop), each budget then the cap; 0 is the fixed budget. Dense and top-k run once.
    """
    models, tasks, lengths, prompts = list(models), list(tasks), list(lengths), list(prompts)
    methods, budgets, seeds, prefills = list(methods), list(budgets), list(seeds), list(prefills)
    score_samples, kv_caches, error_targets = list(score_samples), list(kv_caches), list(error_targets)
    _check_error_targets(error_targets, methods)
    _check_ints("score_samples", score_samples, 0, note=" (0 = exact scores)")
    _check_names("kv_cache", kv_caches, KV_CACHES)
    _check_ints("budgets", budgets, 1)
    _check_ints("seeds", seeds, 0, MAX_SEED)
    _check_ints("prompts", prompts, 0)
    _check_ints("lengths", lengths, 1)
    _check_ints("max_new_tokens", [max_new_tokens], 1)
    _check_ints("kl_tokens", [kl_tokens], 2, note=" (T − 1 tokens are scored)")
    _check_names("method", methods, METHODS)
    _check_names("prefill", prefills, PREFILLS)
    _check_names("task", tasks, tuple(TASKS))
    if layer_budgets is not None:
        if not isinstance(layer_budgets, dict) or not layer_budgets:
            raise ValueError(f"layer_budgets must be a non-empty dict {{layer: S}}, got {layer_budgets!r}")
        _check_ints("layer_budgets layers", list(layer_budgets), 0)
        _check_ints("layer_budgets budgets", list(layer_budgets.values()), 1)
        if not isinstance(schedule, str) or not schedule:
            raise ValueError(f"schedule must be a non-empty name, got {schedule!r}")
    per_layer = tuple(sorted(layer_budgets.items())) if layer_budgets else ()
    jobs: set[Job] = set()
    for model, task, length, prompt in itertools.product(models, tasks, lengths, prompts):
        length = 0 if task in FIXED_LENGTH_TASKS else length
        new_tokens = kl_tokens if task == "kl" else max_new_tokens
        for prefill, method, kv_cache in itertools.product(prefills, methods, kv_caches):
            if method == "dense":
                cells = [("dense", 0, 0)]
            elif method == "topk":
                cells = [(prefill, b, 0) for b in budgets]
            else:
                cells = [(prefill, b, s) for b in budgets for s in seeds]
            targets = error_targets if method in ERROR_TARGET_METHODS else [0.0]
            for (pre, budget, seed), b, target in itertools.product(cells, score_samples, targets):
                sched = ("", ()) if method == "dense" or not per_layer else (schedule, per_layer)
                jobs.add(Job(model, task, length, prompt, pre, method, budget, seed, new_tokens, exact_when_covers, b, *sched,
                             kv_cache=kv_cache, error_target=float(target)))
    # Prompt-major order: an interrupted sweep holds about as many prompts for every task.
    return sorted(
        jobs,
        key=lambda j: (
            j.model,
            j.length,
            j.prompt,
            j.task,
            j.prefill != "dense",
            KV_CACHES.index(j.kv_cache),
            METHODS.index(j.method),
            j.score_samples,
            j.budget,
            j.error_target,
            j.seed,
        ),
    )


ERROR_TARGET_METHODS = methods.error_target_methods()  # a global draw each (santa.methods): flash's tiles have none


def _check_error_targets(targets: list, methods: list[str]) -> None:
    """Each ε a finite real ≥ 0 (0: the fixed budget); a positive one needs a method that takes it."""
    for target in targets:
        if isinstance(target, bool) or not isinstance(target, (int, float)) or not math.isfinite(target) or target < 0:
            raise ValueError(f"every error target must be a finite number ≥ 0 (0: the fixed budget), got {target!r}")
    if any(targets) and not any(m in ERROR_TARGET_METHODS for m in methods):
        raise ValueError(f"error targets apply to the methods {ERROR_TARGET_METHODS}, none of which is in {methods}")


def _check_ints(name: str, values: list, low: int, high: int | None = None, *, note: str = "") -> None:
    """Every value an int in ``[low, high)``, else ``ValueError`` naming ``name``."""
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or v < low or (high is not None and v >= high):
            span = f"≥ {low}" if high is None else f"in [{low}, {high})"
            raise ValueError(f"{name} must be integers {span}{note}, got {v!r}")


def _check_names(name: str, values: list, allowed: tuple[str, ...]) -> None:
    for v in values:
        if v not in allowed:
            raise ValueError(f"{name} must be one of {allowed}, got {v!r}")


# --- running jobs --------------------------------------------------------------------------------


def rewind(cache, n_tokens: int) -> None:
    """Cut a DynamicCache back to its first ``n_tokens`` positions, in place."""
    extra = cache.get_seq_length() - n_tokens
    if extra > 0:
        try:
            cache.crop(-extra)  # transformers ≥ 5: a negative count of tokens to remove
        except ValueError:
            cache.crop(n_tokens)  # earlier releases: the length to keep


@dataclass
class Batch:
    """Prompts of one (model, task, length), tokenized and left-padded together."""

    prompts: list[Prompt]
    ids: torch.Tensor  # [B, L] int64, left-padded
    mask: torch.Tensor | None  # [B, L] int64, 1 = prompt token; None when no row is padded
    lengths: list[int]  # prompt tokens per row

    def row(self, prompt_seed: int) -> int:
        return [p.seed for p in self.prompts].index(prompt_seed)


def batch_prompts(task: str, tokenizer, length: int, prompt_seeds: list[int]) -> tuple[list[Prompt], list[list[int]]]:
    """The prompts of one (task, length), checked against the length, and their token ids."""
    prompts = [build_prompt(task, tokenizer, length, seed) for seed in prompt_seeds]
    if task not in FIXED_LENGTH_TASKS:
        for prompt in prompts:
            check_prompt_length(prompt, length)
    return prompts, [tokenizer(p.text, add_special_tokens=False).input_ids for p in prompts]


def make_batch(task: str, tokenizer, length: int, prompt_seeds: list[int], device) -> Batch:
    prompts, token_lists = batch_prompts(task, tokenizer, length, prompt_seeds)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    ids, mask = left_pad(token_lists, pad_id or 0, device)
    return Batch(prompts, ids, mask, [len(t) for t in token_lists])


@torch.inference_mode()
def prefill(model, batch: Batch, config: santa.hf.SantaConfig):
    """Prefill the batch; returns (cache, last-position logits ``[B, V]``, seconds)."""
    santa.hf.configure(model, config)
    start = time.perf_counter()
    out = padded_forward(model, batch.ids, batch.mask, logits_to_keep=1)
    return returned_cache(out), out.logits[:, -1].float(), time.perf_counter() - start


def _share_read(job: Job, config: santa.hf.SantaConfig, n_prompt: int, steps: int) -> tuple[float, float | None]:
    """Share of value rows read in decode steps: per query head, and per KV head (GQA union).

    For sampled methods this is the batch's share (every row of the batch, every decode step).
    """
    if job.method == "dense" or steps == 0:
        return 1.0, 1.0
    if job.method == "topk":
        shares = [min(job.budget, n) / n for n in range(n_prompt + 1, n_prompt + 1 + steps)]
        return sum(shares) / len(shares), None
    if config.stats.calls == 0:  # every step fell back to exact attention
        return 1.0, 1.0
    return config.stats.share_per_head, config.stats.share_per_kv_head


def method_cells(jobs: list[Job]) -> list[list[Job]]:
    """The batch's jobs grouped by what they run (prefill, method, budget, seed, answer length,
    score samples, schedule, KV cache), order kept."""
    cells: dict[tuple, list[Job]] = {}
    for job in jobs:
        cells.setdefault((job.prefill, job.method, job.budget, job.seed, job.max_new_tokens, job.score_samples,
                          job.layer_budgets, job.kv_cache, job.error_target), []).append(job)
    return list(cells.values())


def run_batch(model, tokenizer, batch_jobs: list[Job], on_done) -> None:
    """Run the jobs of a batch of prompts (one model, task, length); ``on_done(job, record)`` after each.

    Every method runs on all prompts of the batch at once. Decode-only jobs share one dense prefill:
    the cache is rewound to the prompt between methods.
    """
    first = batch_jobs[0]
    device = next(model.parameters()).device
    seeds = sorted({j.prompt for j in batch_jobs})
    batch = make_batch(first.task, tokenizer, first.length, seeds, device)
    if first.task == "kl":
        for n_scored in sorted({j.max_new_tokens for j in batch_jobs}):  # one teacher-forced length per pass
            _run_kl_batch(model, batch, [j for j in batch_jobs if j.max_new_tokens == n_scored], on_done)
        return
    n_padded = batch.ids.shape[1]
    shared = None
    for cell in method_cells(batch_jobs):
        job = cell[0]
        config = job.config()
        if job.prefill == "dense":
            if shared is None:
                shared = prefill(model, batch, santa.hf.SantaConfig(sampler="dense"))
            cache, last_logits, prefill_s = shared
            rewind(cache, n_padded)
        else:
            cache, last_logits, prefill_s = prefill(model, batch, config)
        santa.hf.configure(model, config)
        config.stats = santa.hf.DecodeStats()  # count decode steps only
        start = time.perf_counter()
        rows = greedy_continue_batch(model, tokenizer, cache, last_logits, job.max_new_tokens, batch.mask)
        decode_s = time.perf_counter() - start
        steps = max(len(r) for r in rows) - 1  # decode steps the batch ran (the first token is the prefill's)
        for job in cell:
            i = batch.row(job.prompt)
            prompt, tokens = batch.prompts[i], rows[i]
            answer = tokenizer.decode(tokens, skip_special_tokens=True).strip()
            share, share_kv = _share_read(job, config, batch.lengths[i], steps)
            on_done(
                job,
                {
                    "score": grade(prompt, answer),
                    "answer": answer,
                    "expected": list(prompt.answers),
                    "prompt_tokens": batch.lengths[i],
                    "new_tokens": len(tokens),
                    "v_rows_read": share,
                    "v_rows_read_kv": share_kv,
                    "k_features_read": config.stats.feature_share,
                    "batch": len(batch.prompts),
                    "prefill_s": prefill_s,
                    "decode_s": decode_s,
                },
            )


def kl_fields(kl: torch.Tensor, nll: torch.Tensor, mode: str) -> dict:
    """A KL record's scores from one prompt's per-token ``kl`` and ``nll`` ``[T−1]`` (``mode``: how
    the teacher-forced tokens ran, ``"chunked"`` or ``"stepwise"``)."""
    return {
        "score": float(kl.mean()),
        "kl": float(kl.mean()),
        "kl_per_token": [round(float(x), 6) for x in kl],
        "kl_mode": mode,
        "nll": float(nll.mean()),
        "ppl": math.exp(float(nll.mean())),
    }


def _run_kl_batch(model, batch: Batch, batch_jobs: list[Job], on_done) -> None:
    """KL(dense ‖ method) and perplexity on held-out text under teacher forcing.

    The first ``L − T`` tokens are prefilled densely; the last ``T`` tokens are the teacher-forced
    continuation, the only place a method samples. Token ``t`` is predicted at position ``t−1``;
    the first of the ``T`` is predicted by the dense prefill for every method and is left out, so
    ``T − 1`` tokens are scored.

    The continuation goes through the model as one chunk of ``T − 1`` query rows with sampled
    attention in every row (``prefill="sampled"`` for the chunk, over the dense cache). Under teacher
    forcing this is the same estimator as ``T − 1`` single-token decode steps: each row samples its
    own causal attention distribution and feeds its sampled output to the next layer, so the K/V
    written for continuation tokens are the ones stepwise decoding would write (only the random
    draws differ). It costs one forward instead of ``T − 1``. The value rows read are the batch's share
    over the chunk's rows (distinct rows per head and query row over the keys each sees, an error target's pilot
    included), as the RULER jobs report theirs; dense reads every row.
    """
    n_scored = batch_jobs[0].max_new_tokens
    if min(batch.lengths) <= n_scored:
        raise ValueError(f"KL prompts need more than {n_scored} tokens, got {min(batch.lengths)}")
    ids, mask = batch.ids, batch.mask
    context, continuation = ids[:, :-n_scored], ids[:, -n_scored:]  # left padding: the tail is real text
    context_mask = None if mask is None else mask[:, :-n_scored]
    chunk_mask = None if mask is None else mask[:, :-1]
    context_batch = Batch(batch.prompts, context, context_mask, [n - n_scored for n in batch.lengths])
    cache, _, prefill_s = prefill(model, context_batch, santa.hf.SantaConfig(sampler="dense"))
    n_context = context.shape[1]
    targets = continuation[:, 1:]  # [B, T−1]

    def chunk_logprobs(config: santa.hf.SantaConfig) -> torch.Tensor:
        """Teacher-forced chunk over the rewound dense cache → log-probs ``[B, T−1, V]``."""
        rewind(cache, n_context)
        santa.hf.configure(model, config)
        with torch.inference_mode():
            out = padded_forward(model, continuation[:, :-1], chunk_mask, cache=cache)
        return torch.log_softmax(out.logits.float(), dim=-1)

    reference = chunk_logprobs(santa.hf.SantaConfig(sampler="dense"))
    for cell in method_cells(batch_jobs):
        job = cell[0]
        config = job.config()
        start = time.perf_counter()
        if job.method == "dense" and not job.score_samples:
            logprobs = reference
        elif job.prefill == "sampled":
            # Section 4 setting: every row of the whole text samples, the context's included.
            santa.hf.configure(model, config)
            with torch.inference_mode():
                out = padded_forward(model, ids[:, :-1], chunk_mask, logits_to_keep=n_scored - 1)
            logprobs = torch.log_softmax(out.logits.float(), dim=-1)
        else:
            config.prefill = "sampled"  # the chunk's rows are teacher-forced decode steps
            logprobs = chunk_logprobs(config)
        decode_s = time.perf_counter() - start
        kl = (reference.exp() * (reference - logprobs)).sum(-1).clamp_min(0.0)  # [B, T−1]
        nll = -logprobs.gather(-1, targets[..., None])[..., 0]  # [B, T−1]
        share = kv_share = 1.0 if job.method == "dense" else None
        if job.method != "dense" and config.stats.calls:
            share, kv_share = config.stats.share_per_head, config.stats.share_per_kv_head
        for job in cell:
            i = batch.row(job.prompt)
            on_done(
                job,
                {
                    **kl_fields(kl[i], nll[i], "chunked"),
                    "prompt_tokens": batch.lengths[i],
                    "new_tokens": n_scored - 1,
                    "v_rows_read": share,
                    "v_rows_read_kv": kv_share,
                    "k_features_read": config.stats.feature_share,
                    "batch": len(batch.prompts),
                    "prefill_s": prefill_s,
                    "decode_s": decode_s,
                },
            )


# --- the fast path: santa.model on the same weights (santa.engine runs it) ----------------------


def run_fast_batch(model: santa.model.Transformer, tokenizer, batch_jobs: list[Job], on_done) -> None:
    """The jobs of one batch of prompts on the fast path: one dense prefill, then each method
    decodes the whole batch from it; ``on_done(job, record)`` after each job."""
    first = batch_jobs[0]
    if first.task == "kl":
        run_fast_kl_batch(model, tokenizer, batch_jobs, on_done)
        return
    device = model.output.weight.device
    seeds = sorted({j.prompt for j in batch_jobs})
    prompts, token_lists = batch_prompts(first.task, tokenizer, first.length, seeds)
    max_new_tokens = max(j.max_new_tokens for j in batch_jobs)
    stops = stop_token_ids(tokenizer)
    pre, pre_kv_cache = None, None
    for cell in method_cells(batch_jobs):  # grid order: the cells of one KV cache are adjacent, one prefill each
        job = cell[0]
        if pre is None or pre_kv_cache != job.kv_cache:
            del pre
            pre, pre_kv_cache = engine.prefill(model, token_lists, max_new_tokens, kv_cache_dtype=job.kv_cache), job.kv_cache
        backend = FAST_BACKENDS[job.method]
        rows, decode_s, measured = engine.decode(model, pre, job.max_new_tokens, backend=backend, budget=job.budget,
                                                 seed=job.seed, stop_tokens=stops, layer_budgets=dict(job.layer_budgets),
                                                 error_target=job.error_target or None)
        nominal = not job.error_target  # an error target's reads are the heads' own: counted by the kernels
        for job in cell:
            i = seeds.index(job.prompt)
            answer = tokenizer.decode(rows[i], skip_special_tokens=True).strip()
            on_done(
                job,
                {
                    "score": grade(prompts[i], answer),
                    "answer": answer,
                    "expected": list(prompts[i].answers),
                    "prompt_tokens": len(token_lists[i]),
                    "new_tokens": len(rows[i]),
                    "v_rows_read": (nominal_share(backend, job.budget, len(token_lists[i]), len(rows[i]) - 1) if nominal
                                    else None if measured is None else measured[i]),
                    "v_rows_read_kv": 1.0 if backend == "sdpa" else None,
                    "v_rows_read_mode": ("nominal min(S, n)/n" if nominal else "unknown (error target off the kernels)"
                                         if measured is None else "measured: the pilot's and S_r draws per head, every step"),
                    "k_features_read": None,
                    "batch": len(prompts),
                    "prefill_s": pre.seconds,
                    "decode_s": decode_s,
                    "path": path_label(backend, device),
                    "dtype": str(model.output.weight.dtype).removeprefix("torch."),
                },
            )


def run_fast_kl_batch(model: santa.model.Transformer, tokenizer, batch_jobs: list[Job], on_done) -> None:
    """KL(dense ‖ method) and perplexity under teacher forcing on the fast path, stepwise.

    The semantics of :func:`_run_kl_batch`: of each text's L tokens the first L − T are prefilled
    densely (one prefill, right-padded, shared by every method), the last T are the continuation,
    and T − 1 of them are scored (the first is the dense prefill's prediction for every method).
    Unlike the HF path's one sampled chunk, every method — and the dense reference, SDPA — runs T − 1
    single-token decode steps of its santa.model backend (prop / flash: santa.kernels), so the
    sampled methods are compared with dense on the same stepwise decoding
    (``"kl_mode": "stepwise"``). Jobs with different T in one batch get a prefill each.
    """
    first = batch_jobs[0]
    device = model.output.weight.device
    dtype = str(model.output.weight.dtype).removeprefix("torch.")
    seeds = sorted({j.prompt for j in batch_jobs})
    prompts, token_lists = batch_prompts(first.task, tokenizer, first.length, seeds)
    for n_scored in sorted({j.max_new_tokens for j in batch_jobs}):
        jobs = [j for j in batch_jobs if j.max_new_tokens == n_scored]
        if min(len(t) for t in token_lists) <= n_scored:
            raise ValueError(f"KL prompts need more than {n_scored} tokens, got {min(len(t) for t in token_lists)}")
        contexts = [t[:-n_scored] for t in token_lists]
        pre = engine.prefill(model, contexts, n_scored)
        continuation = torch.tensor([t[-n_scored:] for t in token_lists], dtype=torch.long, device=device)  # [B, T]
        dense = engine.teacher_forced(model, pre, continuation, backend="sdpa")
        pre_kv_cache = "auto"
        for cell in method_cells(jobs):
            job = cell[0]
            backend = FAST_BACKENDS[job.method]
            if job.kv_cache != pre_kv_cache:  # the reference stays dense on the model's cache
                del pre
                pre, pre_kv_cache = engine.prefill(model, contexts, n_scored, kv_cache_dtype=job.kv_cache), job.kv_cache
            if job.method == "dense" and job.kv_cache == "auto":
                nll, kl, decode_s = dense.nll, torch.zeros_like(dense.nll), dense.seconds
            else:
                run = engine.teacher_forced(model, pre, continuation, backend=backend, budget=job.budget, seed=job.seed,
                                            layer_budgets=dict(job.layer_budgets), reference=dense.logprobs,
                                            error_target=job.error_target or None)
                nll, kl, decode_s = run.nll, run.kl, run.seconds
            nll, kl = nll.cpu(), kl.cpu()
            share = 1.0 if job.method == "dense" else None
            for job in cell:
                i = seeds.index(job.prompt)
                on_done(
                    job,
                    {
                        **kl_fields(kl[i], nll[i], "stepwise"),
                        "prompt_tokens": len(token_lists[i]),
                        "new_tokens": n_scored - 1,
                        "v_rows_read": share,
                        "v_rows_read_kv": share,
                        "k_features_read": None,
                        "batch": len(prompts),
                        "prefill_s": pre.seconds,
                        "decode_s": decode_s,
                        "reference_s": dense.seconds,
                        "path": path_label(backend, device),
                        "dtype": dtype,
                    },
                )
        del dense, pre


def batches(jobs: list[Job], batch_size: int) -> list[list[Job]]:
    """Split jobs into batches of at most ``batch_size`` prompts of one (model, length, task).

    Order: model, length, then prompt chunk, then task, so that an interrupted sweep holds about as
    many prompts for every task.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be ≥ 1, got {batch_size}")
    blocks: dict[tuple, dict[int, list[Job]]] = {}
    for job in jobs:
        blocks.setdefault((job.model, job.length, job.task), {}).setdefault(job.prompt, []).append(job)
    keyed = []
    for (model, length, task), by_prompt in blocks.items():
        seeds = sorted(by_prompt)
        for chunk, k in enumerate(range(0, len(seeds), batch_size)):
            batch_jobs = [j for seed in seeds[k : k + batch_size] for j in by_prompt[seed]]
            keyed.append(((model, length, chunk, task), batch_jobs))
    return [batch_jobs for _, batch_jobs in sorted(keyed, key=lambda item: item[0])]


def run_sweep(
    jobs: list[Job],
    out: str | Path,
    *,
    device: str | None = None,
    batch_size: int = 8,
    progress: bool = True,
    load=None,
    path: str = "auto",
    check_records: Callable[[Path, list[tuple[int, dict]]], None] | None = None,
) -> int:
    """Run every job of ``jobs`` not yet in ``out``; returns the number run.

    batch_size: prompts run together; every method of the grid runs on the batch.
    path: ``"hf"``, ``"fast"`` or ``"auto"`` (fast on CUDA, hf elsewhere): see the module
    docstring; prop / flash jobs that cannot run on the fast path are refused (``ValueError``)
    before anything loads.
    ``load(model_name, device)`` → (model, tokenizer) defaults to :func:`santa.assets.load_model`.
    The file is locked for the whole run (:func:`santa.sweep_files.appending`): a second sweep on it
    raises :class:`~santa.sweep_files.SweepLocked` before it reads or loads anything. A plain (not
    gzip) JSONL file only. ``check_records(out, [(line, record), …])``: called on the file's records, read once under the
    lock, before anything loads (``santa eval run`` refuses another command's file there).
    """
    _check_ints("batch_size", [batch_size], 1)
    if load is None:
        from santa.assets import load_model as load
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    path = resolve_path(path, device)
    check_paths(jobs, path)
    out = Path(out)
    if out.suffix == ".gz":
        raise SweepFileError(f"{out}: a sweep appends lines and cannot write gzip; run on the uncompressed .jsonl")
    out.parent.mkdir(parents=True, exist_ok=True)
    with appending(out):
        records = load_sweep(out).records
        if check_records is not None:
            check_records(out, records)
        done = {r["key"] for _, r in records}
        pending = [j for j in jobs if j.key() not in done]
        if pending:
            _run_pending(pending, out, device, batch_size, progress, load, path)
    return len(pending)


def _run_pending(pending: list[Job], out: Path, device: str, batch_size: int, progress: bool, load, path: str) -> None:
    """Run ``pending`` in batches on ``path`` ("hf" or "fast"), appending each record to ``out`` as it finishes."""
    from tqdm import tqdm

    environment = {
        "device": torch.cuda.get_device_name()
        if device.startswith("cuda")
        else platform.processor() or platform.machine(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "commit": code_commit(),
    }
    bar = tqdm(total=len(pending), desc="santa eval", unit="job", disable=not progress)
    loaded: dict[str, tuple] = {}

    def recorder(on_hf: bool):
        """on_hf: the records of run_batch (the HF path), with why it ran there when the fast path was asked for."""

        def on_done(job: Job, result: dict) -> None:
            extra = {"path": "hf"} if on_hf else {}
            if on_hf and path == "fast":
                extra["path_reason"] = hf_reason(job)
            record = {"key": job.key(), **asdict(job), **extra, **result, **environment, "time": time.time()}
            append_record(out, record)
            bar.update(1)
            score = f" qK B={job.score_samples}" if job.score_samples else ""
            bar.set_postfix_str(f"{job.task} {job.length} {job.method} S={job.budget}{score} ({record['path']})")

        return on_done

    for batch_jobs in batches(pending, batch_size):
        model_name = batch_jobs[0].model
        if model_name not in loaded:
            loaded.clear()
            loaded[model_name] = load(model_name, device=device)
        model, tokenizer = loaded[model_name][:2]  # (hf model, tokenizer[, its santa.model copy once the fast path ran])
        if path == "hf":
            run_batch(model, tokenizer, batch_jobs, recorder(on_hf=True))
            continue
        fast_jobs = [j for j in batch_jobs if hf_reason(j) is None]
        hf_jobs = [j for j in batch_jobs if hf_reason(j) is not None]
        if fast_jobs:
            if len(loaded[model_name]) == 2:
                loaded[model_name] += (to_fast_model(model),)
            run_fast_batch(loaded[model_name][2], tokenizer, fast_jobs, recorder(on_hf=False))
        if hf_jobs:
            run_batch(model, tokenizer, hf_jobs, recorder(on_hf=True))
    bar.close()
