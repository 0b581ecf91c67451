"""The sweep runner: a grid of (task, length, method, budget, prompt, seed) jobs, one JSONL line each.

Jobs that share a prompt and a dense prefill are run together: the prompt is prefilled once with
exact attention and every decode-only job rewinds the KV cache to the prompt and decodes from
there, so a sweep of M methods costs one prefill, not M. Each finished job is appended to the
JSONL file at once (one ``write`` of one line on an ``O_APPEND`` descriptor, then ``fsync``), and a
re-run skips every job whose key is already in the file: a killed sweep loses only the job it was
running.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import platform
import subprocess
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

import santa.hf
from santa.eval.grading import grade
from santa.eval.tasks import FIXED_LENGTH_TASKS, Prompt, build_prompt
from santa.generate import cache_keyword, greedy_continue, returned_cache

METHODS = ("dense", "iid", "stratified", "systematic", "topk")
STOCHASTIC = ("iid", "stratified", "systematic")


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

    def key(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @property
    def group(self) -> tuple:
        """Jobs with the same group share one prompt (and one dense prefill)."""
        return (self.model, self.task, self.length, self.prompt)

    def config(self) -> santa.hf.SantaConfig:
        if self.method == "dense":
            return santa.hf.SantaConfig(sampler="dense")
        return santa.hf.SantaConfig(
            budget=self.budget,
            sampler=self.method,
            seed=self.seed,
            prefill=self.prefill,
            exact_when_budget_covers=self.exact_when_covers,
            record_stats=True,
            kernel="reference",  # the spec's samplers on every device (on CUDA "auto" would run the prop kernel)
        )


def grid(
    *,
    models: Iterable[str],
    tasks: Iterable[str],
    lengths: Iterable[int],
    methods: Iterable[str] = METHODS,
    budgets: Iterable[int] = (16, 32, 64, 128, 256),
    prompts: Iterable[int] = range(10),
    seeds: Iterable[int] = (0,),
    prefills: Iterable[str] = ("dense",),
    max_new_tokens: int = 64,
    kl_tokens: int = 32,
    exact_when_covers: bool = False,
) -> list[Job]:
    """Every job of the grid, ordered so that jobs sharing a prompt (one group) are adjacent.

    Dense runs once per prompt (budget 0, seed 0); top-k is deterministic (seed 0 only); sampled
    prefill is only meaningful for sampled methods, so dense-prefill dense is the baseline of both.
    """
    methods, budgets, seeds, prefills = list(methods), list(budgets), list(seeds), list(prefills)
    for m in methods:
        if m not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {m!r}")
    jobs: set[Job] = set()
    for model, task, length, prompt in itertools.product(models, tasks, lengths, prompts):
        length = 0 if task in FIXED_LENGTH_TASKS else length
        new_tokens = kl_tokens if task == "kl" else max_new_tokens
        for prefill, method in itertools.product(prefills, methods):
            if method == "dense":
                cells = [("dense", 0, 0)]
            elif method == "topk":
                cells = [(prefill, b, 0) for b in budgets]
            else:
                cells = [(prefill, b, s) for b in budgets for s in seeds]
            for pre, budget, seed in cells:
                jobs.add(Job(model, task, length, prompt, pre, method, budget, seed, new_tokens, exact_when_covers))
    # Prompt-major order: an interrupted sweep holds about as many prompts for every task.
    return sorted(
        jobs,
        key=lambda j: (
            j.model,
            j.length,
            j.prompt,
            j.task,
            j.prefill != "dense",
            METHODS.index(j.method),
            j.budget,
            j.seed,
        ),
    )


# --- JSONL store ---------------------------------------------------------------------------------


def read_records(path: str | Path) -> list[dict]:
    """Every complete record of a JSONL file (a torn last line from a killed run is ignored)."""
    path = Path(path)
    if not path.exists():
        return []
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return [r for r in records if isinstance(r, dict) and "key" in r]


def append_record(path: str | Path, record: dict) -> None:
    """Append one JSON line atomically: one write on an O_APPEND descriptor, then fsync."""
    data = (json.dumps(record, sort_keys=True) + "\n").encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        # A torn line left by a killed writer would swallow this record: start on a fresh line.
        if os.fstat(fd).st_size > 0:
            with open(path, "rb") as f:
                f.seek(-1, os.SEEK_END)
                if f.read(1) != b"\n":
                    data = b"\n" + data
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


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
class Prefilled:
    """A prompt after one forward pass: its KV cache and the logits of the last position."""

    prompt: Prompt
    ids: torch.Tensor  # [1, L] int64
    cache: object
    last_logits: torch.Tensor  # [1, V] float32
    prefill_s: float
    extra: dict = field(default_factory=dict)


@torch.inference_mode()
def prefill(model, ids: torch.Tensor, config: santa.hf.SantaConfig):
    santa.hf.configure(model, config)
    start = time.perf_counter()
    out = model(input_ids=ids, use_cache=True)
    return returned_cache(out), out.logits[:, -1].float(), time.perf_counter() - start


def _share_read(job: Job, config: santa.hf.SantaConfig, n_prompt: int, steps: int) -> tuple[float, float | None]:
    """Share of value rows read in decode steps: per query head, and per KV head (GQA union)."""
    if job.method == "dense" or steps == 0:
        return 1.0, 1.0
    if job.method == "topk":
        shares = [min(job.budget, n) / n for n in range(n_prompt + 1, n_prompt + 1 + steps)]
        return sum(shares) / len(shares), None
    if config.stats.calls == 0:  # every step fell back to exact attention
        return 1.0, 1.0
    return config.stats.share_per_head, config.stats.share_per_kv_head


def run_group(model, tokenizer, group_jobs: list[Job], on_done) -> None:
    """Run the jobs of one prompt; ``on_done(job, record)`` after each."""
    first = group_jobs[0]
    prompt = build_prompt(first.task, tokenizer, first.length, first.prompt)
    device = next(model.parameters()).device
    if first.task == "kl":
        _run_kl_group(model, tokenizer, prompt, group_jobs, on_done, device)
        return
    ids = tokenizer(prompt.text, return_tensors="pt", add_special_tokens=False).input_ids.to(device)
    n_prompt = ids.shape[1]
    shared = None
    for job in group_jobs:
        config = job.config()
        if job.prefill == "dense":
            if shared is None:
                shared = prefill(model, ids, santa.hf.SantaConfig(sampler="dense"))
            cache, last_logits, prefill_s = shared
            rewind(cache, n_prompt)
        else:
            cache, last_logits, prefill_s = prefill(model, ids, config)
        santa.hf.configure(model, config)
        config.stats = santa.hf.DecodeStats()  # count decode steps only
        start = time.perf_counter()
        tokens = greedy_continue(model, tokenizer, cache, last_logits, job.max_new_tokens)
        decode_s = time.perf_counter() - start
        answer = tokenizer.decode(tokens, skip_special_tokens=True).strip()
        share, share_kv = _share_read(job, config, n_prompt, len(tokens) - 1)
        on_done(
            job,
            {
                "score": grade(prompt, answer),
                "answer": answer,
                "expected": list(prompt.answers),
                "prompt_tokens": n_prompt,
                "new_tokens": len(tokens),
                "v_rows_read": share,
                "v_rows_read_kv": share_kv,
                "prefill_s": prefill_s,
                "decode_s": decode_s,
            },
        )


def _run_kl_group(model, tokenizer, prompt: Prompt, group_jobs: list[Job], on_done, device) -> None:
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
    draws differ). It costs one forward instead of ``T − 1``. The value rows read are not reported
    for KL jobs: the RULER rows give them.
    """
    ids = tokenizer(prompt.text, return_tensors="pt", add_special_tokens=False).input_ids.to(device)
    n_scored = group_jobs[0].max_new_tokens
    context, continuation = ids[:, :-n_scored], ids[:, -n_scored:]
    cache, _, prefill_s = prefill(model, context, santa.hf.SantaConfig(sampler="dense"))
    n_context = context.shape[1]
    targets = continuation[0, 1:]
    reference = None
    jobs = sorted(group_jobs, key=lambda j: (j.method != "dense", j.prefill != "dense"))
    for job in jobs:
        config = job.config()
        start = time.perf_counter()
        if job.prefill == "sampled" and job.method != "dense":
            # Section 4 setting: every row of the whole text samples, the context's included.
            santa.hf.configure(model, config)
            with torch.inference_mode():
                out = model(input_ids=ids[:, :-1], use_cache=False)
            logprobs = torch.log_softmax(out.logits[0, n_context:].float(), dim=-1)  # [T−1, V]
        else:
            if job.method != "dense":
                config.prefill = "sampled"  # the chunk's rows are teacher-forced decode steps
            rewind(cache, n_context)
            santa.hf.configure(model, config)
            with torch.inference_mode():
                out = model(input_ids=continuation[:, :-1], use_cache=True, **{cache_keyword(model): cache})
            logprobs = torch.log_softmax(out.logits[0].float(), dim=-1)  # [T−1, V], predicts continuation[1:]
        decode_s = time.perf_counter() - start
        if reference is None:  # the dense job runs first
            dense_config = santa.hf.SantaConfig(sampler="dense")
            if job.method == "dense":
                reference = logprobs
            else:
                rewind(cache, n_context)
                santa.hf.configure(model, dense_config)
                with torch.inference_mode():
                    ref_out = model(input_ids=continuation[:, :-1], use_cache=True, **{cache_keyword(model): cache})
                reference = torch.log_softmax(ref_out.logits[0].float(), dim=-1)
        kl = (reference.exp() * (reference - logprobs)).sum(-1).clamp_min(0.0)  # [T−1]
        nll = -logprobs.gather(-1, targets[:, None])[:, 0]
        share = 1.0 if job.method == "dense" else None
        on_done(
            job,
            {
                "score": float(kl.mean()),
                "kl": float(kl.mean()),
                "kl_per_token": [round(float(x), 6) for x in kl],
                "kl_mode": "chunked",
                "nll": float(nll.mean()),
                "ppl": math.exp(float(nll.mean())),
                "prompt_tokens": ids.shape[1],
                "new_tokens": n_scored - 1,
                "v_rows_read": share,
                "v_rows_read_kv": share,
                "prefill_s": prefill_s,
                "decode_s": decode_s,
            },
        )


def git_commit() -> str | None:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).parent,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def run_sweep(jobs: list[Job], out: str | Path, *, device: str | None = None, progress: bool = True, load=None) -> int:
    """Run every job of ``jobs`` not yet in ``out``; returns the number run.

    ``load(model_name, device)`` → (model, tokenizer) defaults to :func:`santa.assets.load_model`.
    """
    from tqdm import tqdm

    if load is None:
        from santa.assets import load_model as load
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    done = {r["key"] for r in read_records(out)}
    pending = [j for j in jobs if j.key() not in done]
    if not pending:
        return 0
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    environment = {
        "device": torch.cuda.get_device_name()
        if device.startswith("cuda")
        else platform.processor() or platform.machine(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "commit": git_commit(),
    }
    bar = tqdm(total=len(pending), desc="santa eval", unit="job", disable=not progress)
    loaded: dict[str, tuple] = {}

    def on_done(job: Job, result: dict) -> None:
        append_record(out, {"key": job.key(), **asdict(job), **result, **environment, "time": time.time()})
        bar.update(1)
        bar.set_postfix_str(f"{job.task} {job.method} S={job.budget}")

    groups = itertools.groupby(pending, key=lambda j: j.group)
    for (model_name, *_), group_jobs in groups:
        if model_name not in loaded:
            loaded.clear()
            loaded[model_name] = load(model_name, device=device)
        model, tokenizer = loaded[model_name]
        run_group(model, tokenizer, list(group_jobs), on_done)
    bar.close()
    return len(pending)
