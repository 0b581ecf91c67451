"""santa bench e2e: batched long-context greedy decode with every attention backend.

The paper's Table 3 protocol on Llama-3.1-8B shapes (random bf16 weights made on the GPU): per
(prompt length, batch) the KV caches are filled with random values instead of running a 30k-token
prefill at every batch (speed does not depend on the values); prefill is timed once per prompt
length at batch 1 with the real dense prefill. Each backend then decodes N tokens, the whole step
(32 layers, logits, argmax, cache and position updates) replayed from one CUDA graph. Reported:
ms per output token (wall time of the N replays ÷ N, and per-step event times to show they are
stable), eager ms per token, peak memory, the weights-only step (no attention) and the Amdahl
bound ``1/(w + (1 − w)/s_kv)`` with w = weights-only step ÷ best dense step.

Backends: santa.model's own (``sdpa``, ``santa-prop``, ``santa-flash``), and two attentions of this
benchmark plugged into santa.model's decode step with ``make_context(..., attention=fn)``:
``flashinfer`` (FlashInfer's paged decode over the same cache, planned on the host before every
step) and ``weights-only`` (no attention at all: its output is q, the rest of the step for Amdahl).
Also, on request: ``santa-prop-2launch``, santa's prop on its two-launch Triton kernels
(``Tuning(one_launch=False)``), where ``santa-prop`` runs the one-launch CUDA prop (Hopper, bf16 caches): the same
estimator, so the two rows time one change in one run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

from santa.model import CONFIGS, DecodeContext, Transformer, greedy_step, make_context, prefill
from santa.provenance import run_record

# this benchmark's attentions, plugged into santa.model's decode step (the others are santa.model's backends)
PLUGGED = ("flashinfer", "weights-only")
BACKENDS = ("sdpa", "flashinfer", "santa-prop", "santa-flash", "weights-only")  # the table's and the plot's order
PAGE_SIZE = 16  # FlashInfer's page: santa.model's cache length (a multiple of santa.model.CACHE_ALIGN) is a multiple
DENSE = ("sdpa", "flashinfer")
# speed probes: SDPA over the whole static cache, no mask (reads ≤ 0.5 % more keys); santa's prop on its two Triton
# launches (where santa-prop runs the one-launch CUDA kernel: issue 24)
EXTRA = ("sdpa-nomask", "santa-prop-2launch")
SANTA = ("santa-prop", "santa-flash", "santa-prop-2launch")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Every flag checked before any work (argparse errors, exit 2)."""
    from santa import cliargs

    p = argparse.ArgumentParser(prog="santa bench e2e", description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="llama-3.1-8b", choices=sorted(CONFIGS))
    p.add_argument("--batches", default=[1, 6, 16], type=cliargs.int_list("batch size", 1),
                   help="comma-separated batch sizes (default 1,6,16)")
    p.add_argument("--prompts", default=[30000], type=cliargs.int_list("prompt length", 1),
                   help="comma-separated prompt lengths (default 30000)")
    p.add_argument("--new-tokens", type=cliargs.int_in(1), default=128, help="tokens decoded per backend (default 128)")
    p.add_argument("--warmup", type=cliargs.int_in(0), default=3, help="eager warm-up steps (compile, JIT, cuDNN plans)")
    p.add_argument("--eager-steps", type=cliargs.int_in(1), default=4, help="eager (no graph) steps timed per backend")
    p.add_argument("--backends", default=[*BACKENDS, "sdpa-nomask"], type=cliargs.choice_list("backend", BACKENDS + EXTRA),
                   help=f"comma-separated, from {BACKENDS + EXTRA} (default: all but santa-prop-2launch)")
    p.add_argument("--budget-prop", type=cliargs.int_in(1), default=128, help="S for santa-prop (default 128)")
    p.add_argument("--budget-flash", type=cliargs.int_in(1), default=2048, help="S for santa-flash (default 2048)")
    p.add_argument("--santa-impl", default="auto", choices=["auto", "kernels", "torch"])
    p.add_argument("--sdpa", default=["cudnn", "efficient", "flash"],
                   type=cliargs.choice_list("SDPA backend", ("cudnn", "efficient", "flash", "math")),
                   help="SDPA backends to try for decode, in order; the first that runs is used")
    p.add_argument("--no-prefill", action="store_true", help="skip the batch-1 prefill timing")
    p.add_argument("--no-graph", action="store_true", help="time eager steps only (CPU)")
    p.add_argument("--device", type=cliargs.device, default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "fp8"],
                   help="the KV cache: the model's dtype, or e4m3 with per-KV-head scales (santa reads it directly, "
                        "flashinfer decodes it as fp8, sdpa attends its dequantised copy)")
    p.add_argument("--seed", type=cliargs.seed, default=0, help="seed of the random weights, caches and sampler, in [0, 2**63)")
    p.add_argument("--out", type=cliargs.output_folder, default=os.environ.get("OUT", "runs/e2e"), help="folder for e2e.json and e2e.png")
    args = p.parse_args(argv)
    if args.device == "cpu":
        args.no_graph = True
    need, total = largest_case_bytes(args), device_memory(args.device)
    if need > total:
        p.error(f"the largest case (batch {max(args.batches)}, {max(args.prompts)} + {args.warmup + args.new_tokens + 1} positions) "
                f"needs about {need / 2**30:.1f} GiB for the {args.config} weights and its KV cache; {args.device} has "
                f"{total / 2**30:.1f} GiB: use smaller --batches or --prompts")
    return args


def largest_case_bytes(args: argparse.Namespace) -> int:
    """Bytes of the model's weights and the KV cache of the largest (batch, prompt) case, from the config alone."""
    a = CONFIGS[args.config]
    size = getattr(torch, args.dtype).itemsize
    cache_size = 1 if args.kv_cache_dtype == "fp8" else size
    layer = 2 * a.dim * a.dim + 2 * a.dim * a.n_kv_head * a.head_dim + 3 * a.dim * a.intermediate_size
    weights = (a.vocab_size * a.dim * (1 if a.tie_embeddings else 2) + a.n_layer * layer) * size
    positions = max(args.prompts) + args.warmup + args.new_tokens + 1
    return weights + 2 * a.n_layer * max(args.batches) * positions * a.n_kv_head * a.head_dim * cache_size


def device_memory(device: str) -> int:
    """Bytes of memory on ``device``: the GPU's, or the machine's for the CPU."""
    if device.startswith("cuda"):
        return torch.cuda.get_device_properties(torch.device(device)).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def sdpa_context(names: list[str]):
    """``sdpa_kernel`` pinned to ``names`` (cudnn, flash, efficient, math) in that priority."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    table = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
             "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}
    backends = [table[n] for n in names]
    try:
        return sdpa_kernel(backends, set_priority=True)
    except TypeError:
        return sdpa_kernel(backends)


class FlashInferDecode:
    """FlashInfer paged decode over santa.model's contiguous cache viewed as ``[B·L_max/P, P, H_kv, d]``
    pages: :meth:`plan` on the host before every step (one length for the batch), :meth:`attention`
    plugged into the step."""

    def __init__(self, model: Transformer, page_size: int = PAGE_SIZE, use_tensor_cores: bool = False):
        import flashinfer

        cache = model.layers[0].attention.kv_cache
        self.batch, self.max_len, self.n_kv_head, self.head_dim = cache.k_cache.shape
        if self.max_len % page_size:
            raise ValueError(f"cache length {self.max_len} is not a multiple of page_size {page_size}")
        self.page_size, self.pages_per_seq = page_size, self.max_len // page_size
        self.n_head, self.dtype, device = model.args.n_head, model.output.weight.dtype, cache.k_cache.device
        self.kv_dtype, self.group = cache.k_cache.dtype, model.args.n_head // model.args.n_kv_head
        self.workspace = torch.zeros(256 << 20, dtype=torch.uint8, device=device)
        self.wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            self.workspace, kv_layout="NHD", use_cuda_graph=True, use_tensor_cores=use_tensor_cores,
            paged_kv_indptr_buffer=torch.zeros(self.batch + 1, dtype=torch.int32, device=device),
            paged_kv_indices_buffer=torch.zeros(self.batch * self.pages_per_seq, dtype=torch.int32, device=device),
            paged_kv_last_page_len_buffer=torch.zeros(self.batch, dtype=torch.int32, device=device),
        )
        # page i of sequence b is b·pages_per_seq + i
        self.all_pages = torch.arange(self.batch * self.pages_per_seq, dtype=torch.int32, device=device).view(self.batch, -1)
        self.n_pages = None

    def plan(self, n_keys: int) -> None:
        """Host-side plan for ``n_keys`` visible keys per sequence (call before every step)."""
        n_pages = -(-n_keys // self.page_size)
        if n_pages != self.n_pages and self.n_pages is not None:
            torch.cuda.current_stream().synchronize()  # the plan's pinned host buffer must be free to rewrite
        self.n_pages = n_pages
        indptr = (torch.arange(self.batch + 1, dtype=torch.int32) * n_pages).pin_memory()
        last = torch.full((self.batch,), n_keys - (n_pages - 1) * self.page_size, dtype=torch.int32).pin_memory()
        indices = self.all_pages[:, :n_pages].reshape(-1)
        self.wrapper.plan(
            indptr, indices, last, self.n_head, self.n_kv_head, self.head_dim, self.page_size,
            q_data_type=self.dtype, kv_data_type=self.kv_dtype,
        )

    def run(self, q: Tensor, k_cache: Tensor, v_cache: Tensor) -> Tensor:
        # q: [B, H, d]; caches: [B, L_max, H_kv, d] → pages [B·L_max/P, P, H_kv, d]
        pages = (-1, self.page_size, self.n_kv_head, self.head_dim)
        return self.wrapper.run(q, (k_cache.view(pages), v_cache.view(pages)))

    def attention(self, q: Tensor, k_cache: Tensor, v_cache: Tensor, ctx: DecodeContext, layer: int) -> Tensor:
        """The ``flashinfer`` backend, as santa.model calls a plugged-in attention. On an fp8 cache with
        per-KV-head scales (FlashInfer takes one scale per call) q's heads are multiplied by their K scale
        and the output's by their V scale: ``q·(s_k k) = (s_k q)·k``, ``Σ p (s_v v) = s_v Σ p v``."""
        k_scale, v_scale = ctx.kv_scales[layer] if ctx.kv_scales else (1.0, 1.0)
        if not isinstance(k_scale, Tensor):
            return self.run(q, k_cache, v_cache)
        per_head = (-1, self.n_head, 1)
        out = self.run(q * k_scale.repeat_interleave(self.group).view(per_head).to(q.dtype), k_cache, v_cache)
        return out * v_scale.repeat_interleave(self.group).view(per_head).to(out.dtype)


def no_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, ctx: DecodeContext, layer: int) -> Tensor:
    """The ``weights-only`` backend: no attention at all (its output is q), for Amdahl."""
    return q


def plugged_attention(model: Transformer, backend: str, *, budget: int = 128) -> tuple[Callable[..., Tensor] | None, FlashInferDecode | None]:
    """The attention this benchmark plugs into santa.model for ``backend`` (None for santa.model's own
    backends) and, for ``flashinfer``, its wrapper (to plan before every step)."""
    if backend == "weights-only":
        return no_attention, None
    if backend == "santa-prop-2launch":
        return two_launch_attention(model, budget), None
    if backend == "flashinfer":
        # on an fp8 cache FlashInfer's tensor-core decode is the faster (H200, 2026-12-02, µs per layer call:
        # 40.4 against 69.5 at 32k, 217.1 against 472.4 at B = 8 × 32k; benchmarks/RESULTS.md, fp8 kernels)
        wrapper = FlashInferDecode(model, use_tensor_cores=model.layers[0].attention.kv_cache.fp8)
        return wrapper.attention, wrapper
    return None, None


def two_launch_attention(model: Transformer, budget: int) -> Callable[..., Tensor]:
    """The ``santa-prop-2launch`` attention: santa.model's santa-prop step on a plan of santa's two-launch Triton prop
    (``Tuning(one_launch=False)``), planned now (outside any CUDA graph) for the model's cache."""
    from santa.kernels import Tuning, plan_decode

    cache = model.layers[0].attention.kv_cache
    batch, n_keys, kv_heads, head_dim = cache.k_cache.shape
    plan = plan_decode(batch=batch, heads=model.args.n_head, kv_heads=kv_heads, head_dim=head_dim, n_keys=n_keys,
                       budget=budget, dtype=model.output.weight.dtype, device=cache.k_cache.device, kv_dtype=cache.k_cache.dtype,
                       tuning=Tuning(one_launch=False))
    plan.workspace  # noqa: B018 (allocated now)

    def attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, ctx: DecodeContext, layer: int) -> Tensor:
        if ctx.budget_for(layer) != budget:
            raise ValueError(f"layer {layer} samples {ctx.budget_for(layer)} per head; santa-prop-2launch was planned for {budget}")
        k_scale, v_scale = ctx.kv_scales[layer]
        return plan.run(q, k_cache, v_cache, seq_lens=ctx.seq_lens, seed=ctx.layer_keys[layer], positions=ctx.positions,
                        k_scale=k_scale, v_scale=v_scale)

    return attention


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def env_info(device: torch.device) -> dict:
    info = run_record()  # command line, environment, commit, versions; the device's details follow
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        pass
    try:
        import flashinfer

        info["flashinfer"] = flashinfer.__version__
    except Exception:  # noqa: BLE001 - optional
        pass
    if device.type == "cuda":
        info["device"] = torch.cuda.get_device_name(device)
        info["cudnn"] = torch.backends.cudnn.version()
    else:
        info["device"] = platform.processor() or "cpu"
    info["dirty"] = info["source_dirty"]  # the name earlier e2e.json files use
    return info


def weight_bytes(model: Transformer) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def kv_bytes(model: Transformer, batch: int, max_len: int, element_size: int) -> int:
    a = model.args
    return 2 * a.n_layer * batch * max_len * a.n_kv_head * a.head_dim * element_size


@torch.inference_mode()
def time_prefill(model: Transformer, prompt: int, device: torch.device, seed: int) -> dict:
    """Dense prefill of ``prompt`` random tokens at batch 1 (after a short warm-up prefill)."""
    model.setup_caches(1, prompt + 1)
    gen = torch.Generator(device=device).manual_seed(seed)
    tokens = torch.randint(0, model.args.vocab_size, (1, prompt), device=device, generator=gen)
    with sdpa_context(["cudnn", "flash", "efficient", "math"]) if device.type == "cuda" else contextlib.nullcontext():
        prefill(model, tokens[:, : min(prompt, 512)])
        sync(device)
        start = time.perf_counter()
        first = prefill(model, tokens)
        sync(device)
    return {"prompt": prompt, "batch": 1, "prefill_s": time.perf_counter() - start, "first_token": int(first[0, 0])}


def fill_random(model: Transformer, seed: int) -> None:
    """Random K/V everywhere in the caches (stands in for the prefill's K/V); an fp8 cache gets them
    through its own prefill write (``KVCache.update``: per-KV-head scales calibrated, values quantised)."""
    torch.manual_seed(seed)
    for layer in model.layers:
        kv = layer.attention.kv_cache
        if not kv.fp8:
            kv.k_cache.normal_()
            kv.v_cache.normal_()
            continue
        every_position = torch.arange(kv.k_cache.shape[1], device=kv.k_cache.device)
        kv.update(every_position, torch.randn(kv.k_cache.shape, device=kv.k_cache.device),
                  torch.randn(kv.v_cache.shape, device=kv.v_cache.device))


def attention_check(model: Transformer, ctx, prompt: int, device: torch.device, seed: int,
                    flashinfer: FlashInferDecode | None = None) -> float:
    """‖out − dense‖/‖dense‖ of layer 0's decode attention with ``prompt + 1`` visible keys (float32 dense)."""
    attn = model.layers[0].attention
    cache = attn.kv_cache
    batch = cache.k_cache.shape[0]
    gen = torch.Generator(device=device).manual_seed(seed + 7)
    q = torch.randn(batch, model.args.n_head, model.args.head_dim, device=device, generator=gen).to(model.output.weight.dtype)
    pos = torch.tensor([prompt], device=device)
    ctx.prepare(pos)
    if flashinfer is not None:
        flashinfer.plan(prompt + 1)
    out = ctx.attend(q, cache.k_cache, cache.v_cache, ctx, attn.layer_id).float()
    n = prompt + 1
    k_values, v_values = cache.dequantised(torch.float32)
    k = k_values[:, :n].float().transpose(1, 2)  # [B, H_kv, n, d]
    v = v_values[:, :n].float().transpose(1, 2)
    with sdpa_context(["math"]) if device.type == "cuda" else contextlib.nullcontext():
        ref = torch.nn.functional.scaled_dot_product_attention(q.float().unsqueeze(2), k, v, enable_gqa=True).squeeze(2)
    return float((out - ref).norm() / ref.norm())


def probe_sdpa(model: Transformer, ctx, prompt: int, names: list[str], row: dict) -> str:
    """The first SDPA backend in ``names`` that runs layer 0's decode call (recorded in ``row``)."""
    attn = model.layers[0].attention
    cache = attn.kv_cache
    q = torch.randn(cache.k_cache.shape[0], model.args.n_head, model.args.head_dim, device=cache.k_cache.device,
                    dtype=model.output.weight.dtype)
    failures = {}
    for name in names:
        try:
            with sdpa_context([name]):
                ctx.attend(q, cache.k_cache, cache.v_cache, ctx, attn.layer_id)
            torch.cuda.synchronize()
        except RuntimeError as e:
            failures[name] = str(e).splitlines()[0][:200]
            continue
        row["sdpa_backend"] = name
        if failures:
            row["sdpa_failed"] = failures
        return name
    raise RuntimeError(f"no SDPA backend ran: {failures}")


def step_stats(step_ms: list[float]) -> dict:
    s = sorted(step_ms)
    q = max(1, len(step_ms) // 4)
    return {
        "step_ms_median": statistics.median(step_ms),
        "step_ms_mean": statistics.fmean(step_ms),
        "step_ms_p10": s[int(0.1 * (len(s) - 1))],
        "step_ms_p90": s[int(0.9 * (len(s) - 1))],
        "step_ms_first_quarter": statistics.fmean(step_ms[:q]),
        "step_ms_last_quarter": statistics.fmean(step_ms[-q:]),
    }


@torch.inference_mode()
def run_backend(model: Transformer, backend: str, batch: int, prompt: int, args: argparse.Namespace) -> dict:
    device = torch.device(args.device)
    budget = args.budget_flash if backend == "santa-flash" else args.budget_prop
    row = {"prompt": prompt, "batch": batch, "backend": backend, "new_tokens": args.new_tokens}
    if backend in SANTA:
        row["budget"] = budget
        kernels = args.santa_impl != "torch"  # santa.kernels (Triton on CUDA, else its reference), or santa.kernels.reference
        row["impl"] = "triton" if kernels and device.type == "cuda" else ("reference" if kernels else "torch")
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    attention, flashinfer = plugged_attention(model, backend, budget=budget)
    ctx = make_context(model, backend.removesuffix("-nomask"), prompt_len=prompt, budget=budget, seed=args.seed,
                       santa_impl=args.santa_impl, attention=attention)
    if backend == "sdpa-nomask":
        ctx.attn_bias = None
    if ctx.plans and (one := ctx.plans[budget].one_launch) is not None:  # santa-prop on the one-launch CUDA kernel
        row["impl"] = f"cuda one-launch {one.plan.name}"
    gen = torch.Generator(device=device).manual_seed(args.seed + batch)
    token0 = torch.randint(0, model.args.vocab_size, (batch, 1), device=device, generator=gen)
    token = token0.clone()
    input_pos = torch.tensor([prompt], device=device)
    use_sdpa_ctx = backend.startswith("sdpa") and device.type == "cuda"
    sdpa_names = [probe_sdpa(model, ctx, prompt, args.sdpa, row)] if use_sdpa_ctx else []

    def cm():
        return sdpa_context(sdpa_names) if use_sdpa_ctx else contextlib.nullcontext()

    def reset():
        token.copy_(token0)
        input_pos.fill_(prompt)
        if ctx.attn_bias is not None:
            ctx.attn_bias[..., prompt:] = -math.inf

    def plan(i: int):
        if flashinfer is not None:
            flashinfer.plan(prompt + i + 1)  # key at position prompt + i becomes visible

    step = greedy_step(model, ctx, token, input_pos)  # the decode loop's step (santa.model.decode_tokens), without stop tokens

    # eager warm-up: Triton compiles, FlashInfer JITs, cuDNN builds its plans
    start = time.perf_counter()
    side = torch.cuda.Stream(device) if device.type == "cuda" else None
    with cm(), (torch.cuda.stream(side) if side is not None else contextlib.nullcontext()):
        if side is not None:
            side.wait_stream(torch.cuda.current_stream(device))
        for i in range(args.warmup):
            plan(i)
            step()
    if side is not None:
        torch.cuda.current_stream(device).wait_stream(side)
    sync(device)
    row["warmup_s"] = time.perf_counter() - start
    reset()
    with cm():
        row["attn_rel_err_layer0"] = attention_check(model, ctx, prompt, device, args.seed, flashinfer)

    # eager steps
    reset()
    sync(device)
    times = []
    with cm():
        for i in range(args.eager_steps if not args.no_graph else args.new_tokens):
            t = time.perf_counter()
            plan(i)
            step()
            sync(device)
            times.append(1e3 * (time.perf_counter() - t))
    row["eager_ms_per_token"] = statistics.median(times) if times else None
    if args.no_graph:
        row.update(step_stats(times))
        row["ms_per_token"] = statistics.fmean(times)
        row["decode_s"] = sum(times) / 1e3
        row["graph"] = False
        return row

    # one CUDA graph for the whole step
    reset()
    plan(0)
    start = time.perf_counter()
    graph = torch.cuda.CUDAGraph()
    with cm(), torch.cuda.graph(graph):
        step()
    sync(device)
    row["capture_s"] = time.perf_counter() - start
    reset()
    graph.replay()  # one untimed replay after capture
    reset()
    sync(device)
    n = args.new_tokens
    events = [torch.cuda.Event(enable_timing=True) for _ in range(n + 1)]
    start = time.perf_counter()
    for i in range(n):
        plan(i)
        events[i].record()
        graph.replay()
    events[n].record()
    sync(device)
    row["decode_s"] = time.perf_counter() - start
    row["graph"] = True
    row["ms_per_token"] = 1e3 * row["decode_s"] / n
    row.update(step_stats([events[i].elapsed_time(events[i + 1]) for i in range(n)]))
    row["final_pos"] = int(input_pos)
    row["tokens_in_vocab"] = bool(((token >= 0) & (token < model.args.vocab_size)).all())
    row["peak_mem_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    del graph
    return row


def kv_speedup_from_bytes(kernel: str, n: int, budget: int, group: int, head_dim: int, elem: int) -> float:
    """Dense K+V bytes over santa's bytes per (sequence, KV head): the s_kv of the Amdahl model, for the kernel a row
    ran (:func:`row_kernel`).

    prop reads K and at most min(n, G·S) V rows, and on its two Triton launches (``"prop"``, not ``"prop one launch"``)
    also writes and reads back its fp32 score stash (G values per key); flash reads K, at most min(n, G·⌈S/T⌉·T) V rows,
    and writes and reads one fp32 partial of d values per (head, tile of 128 keys).
    """
    dense = 2 * n * head_dim * elem
    k = n * head_dim * elem
    if kernel == "prop":
        extra = 2 * n * group * 4 + min(n, group * budget) * head_dim * elem
    elif kernel == "prop one launch":  # no stash: the scores stay in shared memory
        extra = min(n, group * budget) * head_dim * elem
    else:
        tiles = -(-n // 128)
        extra = min(n, group * -(-budget // tiles) * tiles) * head_dim * elem + 2 * tiles * group * head_dim * 4
    return dense / (k + extra)


def row_kernel(row: dict) -> str:
    """The santa kernel a row ran: ``"flash"``, ``"prop one launch"`` (santa-prop on Hopper, bf16) or ``"prop"``."""
    if row["backend"] == "santa-flash":
        return "flash"
    return "prop one launch" if row.get("impl", "").startswith("cuda one-launch") else "prop"


def summarise(rows: list[dict], model: Transformer, prompt: int, batch: int) -> dict:
    """Speedups vs the best dense backend and the Amdahl bounds for one (prompt, batch)."""
    by = {r["backend"]: r for r in rows if r["prompt"] == prompt and r["batch"] == batch and "ms_per_token" in r}
    dense = {b: by[b]["ms_per_token"] for b in DENSE if b in by}
    out = {"prompt": prompt, "batch": batch}
    if not dense:
        return out
    best = min(dense, key=dense.get)
    out.update(best_dense=best, best_dense_ms=dense[best])
    if "weights-only" not in by:
        return out
    w = by["weights-only"]["ms_per_token"] / dense[best]
    out["weights_only_ms"] = by["weights-only"]["ms_per_token"]
    out["w"] = w
    out["amdahl_limit"] = 1 / (w + (1 - w) / 2)  # santa reads all of K and no V: s_kv = 2
    a = model.args
    for b in SANTA:
        if b not in by:
            continue
        r = by[b]
        s_bytes = kv_speedup_from_bytes(row_kernel(r), prompt, r["budget"], a.n_head // a.n_kv_head, a.head_dim,
                                        model.layers[0].attention.kv_cache.k_cache.element_size())
        attn_dense = dense[best] - out["weights_only_ms"]
        attn_santa = r["ms_per_token"] - out["weights_only_ms"]
        out[b] = {
            "speedup": dense[best] / r["ms_per_token"],
            "attention_speedup": attn_dense / attn_santa if attn_santa > 0 else float("inf"),
            "s_kv_bytes": s_bytes,
            "amdahl_bytes": 1 / (w + (1 - w) / s_bytes),
            "of_limit": (dense[best] / r["ms_per_token"]) / out["amdahl_limit"],
        }
    return out


def plot(report: dict, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    rows = [r for r in report["runs"] if "ms_per_token" in r]
    keys = sorted({(r["prompt"], r["batch"]) for r in rows})
    if not keys:
        return
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.5))
    width = 0.8 / len(BACKENDS + EXTRA)
    for j, backend in enumerate(BACKENDS + EXTRA):
        ys = [next((r["ms_per_token"] for r in rows if (r["prompt"], r["batch"]) == k and r["backend"] == backend), 0) for k in keys]
        ax1.bar([i + j * width for i in range(len(keys))], ys, width, label=backend)
    ax1.set_xticks([i + 0.4 - width / 2 for i in range(len(keys))], [f"{p // 1000}k × B{b}" for p, b in keys])
    ax1.set_ylabel("ms per output token (CUDA graph)")
    ax1.legend(fontsize=8)
    ax1.set_title("decode step, Llama-3.1-8B shapes")
    summ = [s for s in report["summary"] if "amdahl_limit" in s]
    xs = list(range(len(summ)))
    ax2.plot(xs, [s["amdahl_limit"] for s in summ], "k--", marker="_", label="Amdahl limit (s_kv = 2)")
    for b, color in zip(SANTA, ("tab:green", "tab:red", "tab:purple"), strict=True):
        ax2.plot(xs, [s.get(b, {}).get("speedup", float("nan")) for s in summ], color=color, marker="o", label=f"{b} measured")
        ax2.plot(xs, [s.get(b, {}).get("amdahl_bytes", float("nan")) for s in summ], ":", color=color, marker="x", label=f"{b} Amdahl (bytes)")
    ax2.axhline(1.0, color="grey", lw=0.5)
    ax2.set_xticks(xs, [f"{s['prompt'] // 1000}k × B{s['batch']}" for s in summ])
    ax2.set_ylabel("decode speedup vs best dense")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def print_table(report: dict) -> None:
    print(f"\n{'prompt':>6} {'B':>3} {'backend':<13} {'ms/tok':>8} {'med':>7} {'q1':>7} {'q4':>7} {'eager':>7} {'peakGiB':>8} {'attn_err':>8}  note")
    for r in report["runs"]:
        if "ms_per_token" not in r:
            print(f"{r['prompt']:>6} {r['batch']:>3} {r['backend']:<13} {'—':>8}  {r.get('error', r.get('skipped', ''))[:80]}")
            continue
        print(
            f"{r['prompt']:>6} {r['batch']:>3} {r['backend']:<13} {r['ms_per_token']:>8.3f} {r['step_ms_median']:>7.3f} "
            f"{r['step_ms_first_quarter']:>7.3f} {r['step_ms_last_quarter']:>7.3f} {r['eager_ms_per_token'] or 0:>7.2f} "
            f"{r.get('peak_mem_gib', 0):>8.1f} {r['attn_rel_err_layer0']:>8.2e}  {r.get('impl', '')} {r.get('budget', '')} {r.get('sdpa_backend', '')}"
        )
    for s in report["summary"]:
        if "amdahl_limit" not in s:
            continue
        parts = [f"{b}: {s[b]['speedup']:.3f}x (attn {s[b]['attention_speedup']:.2f}x, bytes-Amdahl {s[b]['amdahl_bytes']:.3f}, {100 * s[b]['of_limit']:.0f}% of limit)" for b in SANTA if b in s]
        print(f"{s['prompt']} B{s['batch']}: best dense {s['best_dense']} {s['best_dense_ms']:.3f} ms, weights-only {s['weights_only_ms']:.3f} ms, "
              f"w={s['w']:.3f}, limit {s['amdahl_limit']:.3f}x; " + "; ".join(parts))
    for p in report["prefill"]:
        print(f"prefill {p['prompt']} tokens, batch 1: {p['prefill_s']:.3f} s")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    report = {"env": env_info(device), "args": {k: v for k, v in vars(args).items()}, "prefill": [], "runs": [], "summary": []}
    start = time.perf_counter()
    model = Transformer.random(CONFIGS[args.config], device=device, dtype=dtype, seed=args.seed).eval()
    sync(device)
    report["build_model_s"] = time.perf_counter() - start
    report["weight_gib"] = weight_bytes(model) / 2**30
    print(f"model {args.config}: {report['weight_gib']:.2f} GiB of weights, built in {report['build_model_s']:.1f} s", flush=True)

    def save():
        (out_dir / "e2e.json").write_text(json.dumps(report, indent=1))

    for prompt in args.prompts:
        if not args.no_prefill:
            try:
                report["prefill"].append(time_prefill(model, prompt, device, args.seed))
                print(f"prefill {prompt} at batch 1: {report['prefill'][-1]['prefill_s']:.3f} s", flush=True)
            except Exception as e:  # noqa: BLE001 - report and carry on
                traceback.print_exc()
                report["prefill"].append({"prompt": prompt, "batch": 1, "error": repr(e)})
            save()
        for batch in args.batches:
            max_len = prompt + args.warmup + args.new_tokens + 1
            for layer in model.layers:
                layer.attention.kv_cache = None
            if device.type == "cuda":
                torch.cuda.empty_cache()
                free = torch.cuda.mem_get_info(device)[0]
                need = kv_bytes(model, batch, max_len, 1 if args.kv_cache_dtype == "fp8" else dtype.itemsize) + (6 << 30)
                if need > free:
                    for backend in args.backends:
                        report["runs"].append({"prompt": prompt, "batch": batch, "backend": backend, "skipped": f"needs {need / 2**30:.0f} GiB, {free / 2**30:.0f} free"})
                    continue
            max_len = model.setup_caches(batch, max_len, kv_cache_dtype=args.kv_cache_dtype)
            fill_random(model, args.seed)
            for backend in args.backends:
                t = time.perf_counter()
                try:
                    row = run_backend(model, backend, batch, prompt, args)
                except Exception as e:  # noqa: BLE001 - one backend failing must not lose the others
                    traceback.print_exc()
                    row = {"prompt": prompt, "batch": batch, "backend": backend, "error": repr(e)[:500]}
                row["cache_len"] = max_len
                row["wall_s"] = time.perf_counter() - t
                report["runs"].append(row)
                print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}), flush=True)
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                save()
            report["summary"].append(summarise(report["runs"], model, prompt, batch))
            save()
    report["total_s"] = time.perf_counter() - start
    save()
    plot(report, out_dir / "e2e.png")
    print_table(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
