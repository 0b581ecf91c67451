"""Decode-step kernel benchmark (benchmarks/PROTOCOL.md protocol): santa prop/flash against dense backends.

Run as ``python -m benchmarks.bench.kernels [--out DIR] [--quick]`` on a CUDA machine. Writes
``kernels.json`` (every raw number, device, versions, commit) and ``kernels.png`` under DIR and
prints a table. Timing: CUDA events around exactly one backend call (all its launches), a 512 MB
read before every timed iteration (clean cold L2; ``--write-flush`` adds the paper's in-place
update as its own column), 10 warm-ups, 40 timed, median and mean; also replayed from a CUDA graph.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

from benchmarks.bench.timing import Flusher, host_us_per_call, time_fn  # noqa: F401 (Flusher: re-exported)
from santa.checks import integer
from santa.provenance import run_record

READ_BW = 4.5e12  # bytes/s a read-only kernel reaches on the H200 (benchmarks/PROTOCOL.md)
H, H_KV, D = 32, 8, 128  # Llama-3.1-8B (the defaults of --heads/--kv-heads/--head-dim)
DTYPE = torch.bfloat16


# --------------------------------------------------------------------------- timing


def measure(results, key, fn, flusher, *, graph=True, write=False, meta=None):
    """Times ``fn`` (eager, graph replay, optionally dirty flush); with ``meta["bytes"]`` (what the
    backend must move) also TB/s beside every median."""
    entry = dict(meta or {})
    try:
        entry["eager"] = time_fn(fn, flusher.read)
        if graph:
            entry["graph"] = time_fn(fn, flusher.read, graph=True)
        if write:
            entry["write_flush"] = time_fn(fn, flusher.write)
    except Exception as exc:  # a backend that does not run here is recorded, not fatal
        entry["error"] = f"{type(exc).__name__}: {exc}"[:400]
    if "bytes" in entry:
        for mode in ("eager", "graph", "write_flush"):
            if mode in entry:
                entry[mode]["tb_per_s"] = entry["bytes"] / (entry[mode]["median_us"] * 1e-6) / 1e12
    results[key] = entry
    eager = entry.get("eager", {}).get("median_us")
    g = entry.get("graph", {}).get("median_us")
    tbps = entry.get("graph", entry.get("eager", {})).get("tb_per_s")
    print(f"  {key:55s} eager {eager if eager is None else round(eager, 1)!s:>8} graph {g if g is None else round(g, 1)!s:>8}"
          + ("" if tbps is None else f"  {tbps:5.2f} TB/s")
          + (f"  ERROR {entry['error'][:80]}" if "error" in entry else ""), flush=True)
    return entry


# --------------------------------------------------------------------------- backends


def k_read_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def _read_k(k_ptr, out_ptr, n_rows, BLOCK: tl.constexpr, DIM: tl.constexpr):
        pid = tl.program_id(0)
        rows = pid * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(k_ptr + rows[:, None] * DIM + tl.arange(0, DIM)[None, :], mask=rows[:, None] < n_rows, other=0.0)
        tl.store(out_ptr + pid, tl.sum(tl.sum(x.to(tl.float32), axis=1), axis=0))

    def run(k, out):
        n_rows = k.numel() // k.shape[-1]
        _read_k[(triton.cdiv(n_rows, 128),)](k, out, n_rows, BLOCK=128, DIM=k.shape[-1], num_warps=4)

    return run


def sdpa_fn(q, k, v, backend):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    b = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}[backend]
    q4 = q.unsqueeze(2)  # [B, H, 1, d]
    k4, v4 = k.transpose(1, 2), v.transpose(1, 2)  # NHD [B, n, H_kv, d] → [B, H_kv, n, d] (a view)

    def run():
        with sdpa_kernel(b):
            return torch.nn.functional.scaled_dot_product_attention(q4, k4, v4, enable_gqa=True)

    return run


def santa_plan(q, k, budget, kernel, *, block_table=None, kv_layout="NHD", scale=None, tuning=None):
    """The plan that :func:`santa.kernels.decode` would run for these inputs."""
    from santa.kernels import plan_decode

    batch, heads, dim = q.shape
    page_size = k.shape[1] if block_table is not None else None
    n_keys = k.shape[1] * (block_table.shape[1] if block_table is not None else 1)
    return plan_decode(batch=batch, heads=heads, kv_heads=k.shape[2], head_dim=dim, n_keys=n_keys, budget=budget,
                       dtype=q.dtype, device=q.device, kernel=kernel, kv_layout=kv_layout, page_size=page_size,
                       scale=scale, tuning=tuning)


def santa_stage_fns(q, k, v, budget, kernel, *, out, seq_lens=None, block_table=None, scale=None, workspace=None):
    """Closures for each launch of a santa call (prop: pass 1, pass 2; flash: partial, merge)."""
    plan = santa_plan(q, k, budget, kernel, block_table=block_table, scale=scale)
    return dict(plan.stages(q, k, v, seq_lens=seq_lens, block_table=block_table, out=out, workspace=workspace))


def rel_error(est, exact):
    return float((est.float() - exact.float()).norm() / exact.float().norm())


# --------------------------------------------------------------------------- runs


def flex_decode_fn(q, k, v):
    """FlexAttention decode (torch.compile'd ``flex_attention``, no mask), same inputs as SDPA."""
    from torch.nn.attention.flex_attention import flex_attention

    compiled = torch.compile(flex_attention, dynamic=False)
    q4 = q.unsqueeze(2)  # [B, H, 1, d]
    k4, v4 = k.transpose(1, 2), v.transpose(1, 2)

    def run():
        return compiled(q4, k4, v4, enable_gqa=True)

    return run


def dense_anchors(results, tag, q, k, v, flusher, fi, *, write=False):
    """Every dense backend on the same inputs (q ``[B, H, d]``, K/V NHD ``[B, n, H_kv, d]``): the ones to beat."""
    kv_bytes = 2 * k.numel() * k.element_size()
    meta = {"floor_us": kv_bytes / READ_BW * 1e6, "bytes": kv_bytes}
    measure(results, f"{tag}/cudnn_sdpa", sdpa_fn(q, k, v, "cudnn"), flusher, write=write, meta=meta)
    measure(results, f"{tag}/flash_sdpa", sdpa_fn(q, k, v, "flash"), flusher, write=write, meta=meta)
    measure(results, f"{tag}/flex_attention", flex_decode_fn(q, k, v), flusher, meta=meta)
    if fi is not None and q.shape[0] == 1:
        q2, k2, v2 = q[0], k[0], v[0]
        for tc in (False, True):
            measure(results, f"{tag}/flashinfer{'_tc' if tc else ''}", lambda tc=tc: fi.single_decode_with_kv_cache(
                q2, k2, v2, kv_layout="NHD", use_tensor_cores=tc), flusher, write=write, meta=meta)


def santa_bytes(q, k, budget, kernel, v_rows: float | None = None) -> float:
    """Bytes a santa call must move: K once, the sampled V rows (at most S per head), and prop's fp32
    stash (written once, read back where sampled: counted twice, an upper bound)."""
    batch, heads, dim = q.shape
    n_keys, kv_heads = k.shape[1], k.shape[2]
    rows = v_rows if v_rows is not None else batch * min(heads * budget, kv_heads * n_keys)
    stash = batch * heads * n_keys * 4 * 2 if kernel == "prop" else 0
    return k.numel() * k.element_size() + rows * dim * k.element_size() + stash


def bench_single(n_keys, results, flusher, args, fi):
    from santa.kernels import decode, make_workspace

    torch.manual_seed(0)
    dev = torch.device("cuda")
    heads, kv_heads, dim = args.heads, args.kv_heads, args.head_dim
    q = torch.randn(1, heads, dim, device=dev, dtype=DTYPE)
    k = torch.randn(1, n_keys, kv_heads, dim, device=dev, dtype=DTYPE)
    v = torch.randn(1, n_keys, kv_heads, dim, device=dev, dtype=DTYPE)
    tag = f"b1/n{n_keys}"
    k_bytes = k.numel() * k.element_size()
    write = n_keys in (4096, 8192, 32768, 131072) and not args.quick
    sink = torch.empty(triton_cdiv(k.numel() // dim, 128), device=dev)
    read_k = k_read_kernel()
    measure(results, f"{tag}/k_read_triton", lambda: read_k(k, sink), flusher, write=False,
            meta={"floor_us": k_bytes / READ_BW * 1e6, "bytes": k_bytes})
    dense_anchors(results, tag, q, k, v, flusher, fi, write=write)
    for kernel, budgets in (("prop", args.prop_budgets), ("flash", args.flash_budgets)):
        for budget in budgets:
            ws = make_workspace(q, k, budget, kernel=kernel)
            out = torch.empty_like(q)
            nbytes = santa_bytes(q, k, budget, kernel)
            fn = lambda kernel=kernel, budget=budget, ws=ws, out=out: decode(  # noqa: E731
                q, k, v, budget, kernel=kernel, out=out, workspace=ws)
            entry = measure(results, f"{tag}/santa_{kernel}_S{budget}", fn, flusher, write=write,
                            meta={"floor_us": nbytes / READ_BW * 1e6, "bytes": nbytes, "kernel": kernel,
                                  "variant": "prop-global-sys (exact global systematic, 2 launches)" if kernel == "prop"
                                  else "flash (uniform per-tile budget, merge)"})
            if budget in (128, 2048):
                plan = santa_plan(q, k, budget, kernel)
                entry["host_us_eager_decode"] = host_us_per_call(fn)
                entry["host_us_plan_run"] = host_us_per_call(lambda plan=plan, out=out: plan.run(q, k, v, out=out))
                print(f"    host µs per call: decode {entry['host_us_eager_decode']:.1f}, plan.run {entry['host_us_plan_run']:.1f}")
                for stage, sfn in plan.stages(q, k, v, out=out):
                    measure(results, f"{tag}/santa_{kernel}_S{budget}/{stage}", sfn, flusher)
    # estimate error on a peaked case (q × 4), benchmarks/PROTOCOL.md
    if n_keys == 32768 or args.quick:
        qp = q * 4
        exact = torch.nn.functional.scaled_dot_product_attention(
            qp.float().unsqueeze(2), k.float().transpose(1, 2), v.float().transpose(1, 2), enable_gqa=True).squeeze(2)
        err = {}
        for kernel, budget in [("prop", s) for s in args.prop_budgets] + [("flash", s) for s in args.flash_budgets]:
            errs = [rel_error(decode(qp, k, v, budget, kernel=kernel, offset=o), exact) for o in range(8)]
            err[f"{kernel}_S{budget}"] = statistics.fmean(errs)
        results[f"{tag}/peaked_error"] = err
        print(f"  peaked-case relative error (mean of 8 offsets): {json.dumps({k_: round(v_, 4) for k_, v_ in err.items()})}")


def triton_cdiv(a, b):
    return -(-a // b)


def random_inputs(batch: int, n_keys: int, args, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Seeded bf16 q ``[B, H, d]`` and NHD K, V ``[B, n, H_kv, d]`` on the GPU, in the shapes of ``args``."""
    torch.manual_seed(seed)
    q = torch.randn(batch, args.heads, args.head_dim, device="cuda", dtype=DTYPE)
    k = torch.randn(batch, n_keys, args.kv_heads, args.head_dim, device="cuda", dtype=DTYPE)
    v = torch.randn(batch, n_keys, args.kv_heads, args.head_dim, device="cuda", dtype=DTYPE)
    return q, k, v


def flashinfer_paged(fi, q, k_pages, v_pages, table, *, tensor_cores: bool, **scales):
    """FlashInfer's paged decode over full pages ``[pages, P, H_kv, d]`` (NHD) in the order of ``table``
    (int32 ``[B, pages per sequence]``), planned once: a zero-argument call. ``scales``: ``k_scale`` /
    ``v_scale`` of an fp8 cache (its dtype is the pages')."""
    batch, pages_per_seq = table.shape
    _, page_size, kv_heads, dim = k_pages.shape
    wrapper = fi.BatchDecodeWithPagedKVCacheWrapper(
        torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device=q.device), "NHD", use_tensor_cores=tensor_cores)
    indptr = torch.arange(0, batch + 1, device=q.device, dtype=torch.int32) * pages_per_seq
    last = torch.full((batch,), page_size, dtype=torch.int32, device=q.device)
    wrapper.plan(indptr, table.reshape(-1), last, q.shape[1], kv_heads, dim, page_size, q_data_type=q.dtype,
                 kv_data_type=k_pages.dtype)
    return lambda: wrapper.run(q, (k_pages, v_pages), **scales)


def bench_batch(batch, n_keys, results, flusher, args, fi, page_size=16):
    from santa.kernels import decode, make_workspace

    dev = torch.device("cuda")
    kv_heads, dim = args.kv_heads, args.head_dim
    q, k, v = random_inputs(batch, n_keys, args, seed=1)
    seq_lens = torch.full((batch,), n_keys, dtype=torch.int32, device=dev)
    tag = f"b{batch}/n{n_keys}"
    kv_bytes = 2 * k.numel() * k.element_size()
    meta_dense = {"floor_us": kv_bytes / READ_BW * 1e6, "bytes": kv_bytes}
    dense_anchors(results, tag, q, k, v, flusher, None)
    pages_per_seq = n_keys // page_size
    perm = torch.randperm(batch * pages_per_seq, device=dev)
    k_pages = torch.empty(batch * pages_per_seq, page_size, kv_heads, dim, device=dev, dtype=DTYPE)
    v_pages = torch.empty_like(k_pages)
    k_pages[perm] = k.reshape(batch * pages_per_seq, page_size, kv_heads, dim)
    v_pages[perm] = v.reshape(batch * pages_per_seq, page_size, kv_heads, dim)
    table = perm.reshape(batch, pages_per_seq).to(torch.int32)
    k_c, v_c = k, v
    if fi is not None:
        for tc in (False, True):
            name = f"{tag}/flashinfer_paged{'_tc' if tc else ''}"
            try:
                measure(results, name, flashinfer_paged(fi, q, k_pages, v_pages, table, tensor_cores=tc), flusher, meta=meta_dense)
            except Exception as exc:
                results[name] = {"error": f"{type(exc).__name__}: {exc}"[:400]}
                print("  flashinfer paged failed:", exc)
    budget = 128
    ws = make_workspace(q, k_c, budget, kernel="prop")
    out = torch.empty_like(q)
    nbytes = santa_bytes(q, k_c, budget, "prop")
    meta = {"floor_us": nbytes / READ_BW * 1e6, "bytes": nbytes}
    measure(results, f"{tag}/santa_prop_S{budget}", lambda: decode(q, k_c, v_c, budget, kernel="prop", seq_lens=seq_lens, out=out, workspace=ws),
            flusher, meta=meta)
    for stage, sfn in santa_stage_fns(q, k_c, v_c, budget, "prop", seq_lens=seq_lens, out=out, workspace=ws).items():
        measure(results, f"{tag}/santa_prop_S{budget}/{stage}", sfn, flusher)
    wsp = make_workspace(q, k_pages, budget, kernel="prop", block_table=table)
    measure(results, f"{tag}/santa_prop_S{budget}_paged", lambda: decode(
        q, k_pages, v_pages, budget, kernel="prop", seq_lens=seq_lens, block_table=table, out=out, workspace=wsp),
        flusher, meta=meta)
    a = decode(q, k_c, v_c, budget, seq_lens=seq_lens, seed=3)
    b = decode(q, k_pages, v_pages, budget, seq_lens=seq_lens, block_table=table, seed=3)
    results[f"{tag}/paged_equals_contiguous"] = bool(torch.equal(a, b))
    budget = 2048
    ws = make_workspace(q, k_c, budget, kernel="flash")
    out = torch.empty_like(q)
    nbytes = santa_bytes(q, k_c, budget, "flash")
    measure(results, f"{tag}/santa_flash_S{budget}", lambda: decode(q, k_c, v_c, budget, kernel="flash", seq_lens=seq_lens, out=out, workspace=ws),
            flusher, meta={"floor_us": nbytes / READ_BW * 1e6, "bytes": nbytes})


def bench_fp8(batch, n_keys, results, flusher, args, fi, page_size=16, k_scale=0.5, v_scale=0.5):
    """fp8 (e4m3) K/V caches, one case: santa prop (and flash at batch 1) on fp8 beside FlashInfer's fp8
    decode (CUDA cores and tensor cores), cuDNN SDPA and santa prop on the bf16 caches the fp8 ones were
    quantised from (``cache = bf16 / scale``), every backend on the same inputs in this run."""
    from santa.kernels import decode, make_workspace

    dev = torch.device("cuda")
    kv_heads, dim = args.kv_heads, args.head_dim
    q, k, v = random_inputs(batch, n_keys, args, seed=2)
    k8, v8 = (k.float() / k_scale).to(torch.float8_e4m3fn), (v.float() / v_scale).to(torch.float8_e4m3fn)
    tag = f"fp8/b{batch}/n{n_keys}"
    dense8 = 2 * k8.numel()
    meta8 = {"floor_us": dense8 / READ_BW * 1e6, "bytes": dense8}
    meta16 = {"floor_us": 2 * dense8 / READ_BW * 1e6, "bytes": 2 * dense8}
    measure(results, f"{tag}/cudnn_sdpa_bf16", sdpa_fn(q, k, v, "cudnn"), flusher, meta=meta16)
    budget = 128
    out = torch.empty_like(q)
    for name, kc, vc, scales in (("bf16", k, v, {}), ("fp8", k8, v8, dict(k_scale=k_scale, v_scale=v_scale))):
        ws = make_workspace(q, kc, budget, kernel="prop")
        nbytes = santa_bytes(q, kc, budget, "prop")
        measure(results, f"{tag}/santa_prop_S{budget}_{name}", lambda kc=kc, vc=vc, ws=ws, scales=scales: decode(
            q, kc, vc, budget, kernel="prop", out=out, workspace=ws, **scales), flusher,
            meta={"floor_us": nbytes / READ_BW * 1e6, "bytes": nbytes})
    if batch == 1:
        ws = make_workspace(q, k8, 2048, kernel="flash")
        nbytes = santa_bytes(q, k8, 2048, "flash")
        measure(results, f"{tag}/santa_flash_S2048_fp8", lambda: decode(q, k8, v8, 2048, kernel="flash", out=out, workspace=ws,
                                                                         k_scale=k_scale, v_scale=v_scale),
                flusher, meta={"floor_us": nbytes / READ_BW * 1e6, "bytes": nbytes})
    if fi is None:
        return
    for tc in (False, True):
        name = f"{tag}/flashinfer_fp8{'_tc' if tc else ''}"
        try:
            if batch == 1:
                fn = lambda tc=tc: fi.single_decode_with_kv_cache(q[0], k8[0], v8[0], kv_layout="NHD",  # noqa: E731
                                                                  use_tensor_cores=tc, k_scale=k_scale, v_scale=v_scale)
            else:
                pages_per_seq = n_keys // page_size  # sequence b's pages in order: b·pages_per_seq + i
                table = torch.arange(batch * pages_per_seq, device=dev, dtype=torch.int32).view(batch, pages_per_seq)
                fn = flashinfer_paged(fi, q, k8.view(-1, page_size, kv_heads, dim), v8.view(-1, page_size, kv_heads, dim), table,
                                      tensor_cores=tc, k_scale=k_scale, v_scale=v_scale)
            measure(results, name, fn, flusher, meta=meta8)
        except Exception as exc:  # a backend that does not run here is recorded, not fatal
            results[name] = {"error": f"{type(exc).__name__}: {exc}"[:400]}
            print("  flashinfer fp8 failed:", exc)


# --------------------------------------------------------------------------- real attention (captures)


def load_capture(path: str) -> dict:
    """A ``santa bench capture`` file: ``{"layers": {i: {"q", "k", "v"}}, "scale", "meta"}``.

    ValueError naming the file when it cannot be read or does not hold that: at least one layer,
    each with q ``[1, H, d]`` and K, V ``[1, n, H_kv, d]`` (n ≥ 1, H a multiple of H_kv) floating
    point tensors, and a scale that is a positive number or None.
    """
    try:
        cap = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise ValueError(f"{path}: no such file (make one with santa bench capture)") from None
    except Exception as error:  # noqa: BLE001 - torch.load raises many kinds for a file that is not a capture
        raise ValueError(f"{path}: not a santa bench capture file ({type(error).__name__}: {str(error)[:120]})") from None
    problem = capture_problem(cap)
    if problem:
        raise ValueError(f"{path}: not a santa bench capture file: {problem}")
    return cap


def capture_problem(cap: object) -> str | None:
    """What a loaded capture lacks (None: nothing)."""
    if not isinstance(cap, dict) or not isinstance(cap.get("layers"), dict) or not cap["layers"]:
        return "expected a dict with a non-empty 'layers' dict"
    scale = cap.get("scale")
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale > 0):
        return f"scale must be a positive number or None, got {scale!r}"
    for layer, t in cap["layers"].items():
        if not isinstance(t, dict) or not all(isinstance(t.get(x), torch.Tensor) and t[x].is_floating_point() for x in "qkv"):
            return f"layer {layer!r} must hold floating-point tensors q, k and v"
        q, k, v = t["q"], t["k"], t["v"]
        if q.dim() != 3 or k.dim() != 4 or k.shape != v.shape or q.shape[0] != 1 or k.shape[0] != 1:
            return f"layer {layer!r}: expected q [1, H, d] and k, v [1, n, H_kv, d], got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        if k.shape[1] < 1 or k.shape[2] < 1 or q.shape[1] % k.shape[2] or q.shape[2] != k.shape[3]:
            return f"layer {layer!r}: q {tuple(q.shape)} does not match k {tuple(k.shape)} (H a multiple of H_kv ≥ 1, one d, n ≥ 1)"
    return None


def tile_keys(x: torch.Tensor, n: int) -> torch.Tensor:
    """``[B, n0, H_kv, d]`` repeated along the keys and cut to ``n`` (real statistics, not a real n-token prompt)."""
    n = integer("n", n, low=1)
    reps = triton_cdiv(n, x.shape[1])
    return x.repeat(1, reps, 1, 1)[:, :n].contiguous()


def real_inputs(cap: dict, layer, n: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q ``[1, H, d]``, K/V ``[1, n, H_kv, d]`` of a captured layer (tiled past the captured length),
    or Gaussian of the same shapes for ``layer == "gaussian"`` (q × 4: benchmarks/PROTOCOL.md's peaked case)."""
    n = integer("n", n, low=1)
    first = next(iter(cap["layers"].values()))
    if layer == "gaussian":
        g = torch.Generator(device="cpu").manual_seed(0)
        h, (_, _, h_kv, d) = first["q"].shape[1], first["k"].shape
        q = 4 * torch.randn(1, h, d, generator=g)  # × 4: benchmarks/PROTOCOL.md's peaked case (logit std 4 at any d)
        k = torch.randn(1, n, h_kv, d, generator=g)
        v = torch.randn(1, n, h_kv, d, generator=g)
        return q.to(device, DTYPE), k.to(device, DTYPE), v.to(device, DTYPE)
    if layer not in cap["layers"]:
        raise ValueError(f"layer must be one of the captured layers {sorted(cap['layers'])} or 'gaussian', got {layer!r}")
    t = cap["layers"][layer]
    k, v = t["k"], t["v"]
    if n != k.shape[1]:
        k, v = tile_keys(k, n), tile_keys(v, n)
    return t["q"].to(device, DTYPE), k.to(device, DTYPE), v.to(device, DTYPE)


def dense_reference(q, k, v, scale=None) -> torch.Tensor:
    """float32 softmax attention, q ``[B, H, d]``, K/V NHD: ``[B, H, d]``."""
    return torch.nn.functional.scaled_dot_product_attention(
        q.float().unsqueeze(2), k.float().transpose(1, 2), v.float().transpose(1, 2), enable_gqa=True, scale=scale).squeeze(2)


def attention_profile(q, k, scale=None) -> dict:
    """How peaked the decode-step weights are: per head perplexity exp(entropy) and keys holding 90 % of the mass (medians over heads)."""
    h, h_kv, d = q.shape[1], k.shape[2], q.shape[2]
    scale = 1.0 / d ** 0.5 if scale is None else scale
    kk = k[0].float().transpose(0, 1).repeat_interleave(h // h_kv, dim=0)  # [H, n, d]
    p = torch.softmax(torch.einsum("hd,hnd->hn", q[0].float(), kk) * scale, dim=-1)
    ent = -(p * p.clamp_min(1e-30).log()).sum(-1)
    top = torch.sort(p, dim=-1, descending=True).values.cumsum(-1)
    k90 = (top < 0.9).sum(-1) + 1
    return {"perplexity_median": float(ent.exp().median()), "perplexity_per_head": ent.exp().tolist(),
            "keys_90pct_median": float(k90.float().median()), "keys_90pct_per_head": k90.tolist(),
            "max_weight_median": float(p.max(-1).values.median())}


def real_accuracy(q, k, v, configs, seeds=range(8), scale=None) -> dict:
    """Per (kernel, S): ‖ô − o‖/‖o‖ against float32 dense (median and all over seeds) and the unique
    V rows read per KV head (rows any head of the group sampled; median over seeds, mean over KV heads)."""
    from santa.kernels import decode

    exact = dense_reference(q, k, v, scale)
    group = q.shape[1] // k.shape[2]
    acc = {}
    for kernel, budget in configs:
        errs, rows = [], []
        for seed in seeds:
            est, counts = decode(q, k, v, budget, kernel=kernel, seed=seed, scale=scale, return_counts=True)
            errs.append(rel_error(est, exact))
            c = counts[:, :, : k.shape[1]].reshape(counts.shape[0], k.shape[2], group, -1)
            rows.append(float((c > 0).any(dim=2).sum(-1).float().mean()))
        acc[f"{kernel}_S{budget}"] = {"rel_error_median": statistics.median(errs), "rel_error_all": errs,
                                     "unique_v_rows_per_kv_head": statistics.median(rows), "n_keys": k.shape[1]}
    return acc


def _bench_real_one(cap, layer, n, n0, configs, results, flusher, args, fi, device):
    from santa.kernels import decode, make_workspace

    tag = f"real/L{layer}/n{n}"
    print(f"real attention, layer {layer}, n_k = {n}{' (tiled)' if n > n0 and layer != 'gaussian' else ''}:", flush=True)
    q, k, v = real_inputs(cap, layer, n, device)
    scale = None if layer == "gaussian" else cap.get("scale")
    h, h_kv, d = q.shape[1], k.shape[2], q.shape[2]
    kv_bytes = 2 * k.numel() * k.element_size()
    meta_dense = {"floor_us": kv_bytes / READ_BW * 1e6, "bytes": kv_bytes}
    acc = real_accuracy(q, k, v, configs, seeds=range(args.real_seeds), scale=scale)
    results[f"{tag}/accuracy"] = acc
    results[f"{tag}/profile"] = attention_profile(q, k, scale)
    print("  error (median of seeds) / unique V rows per KV head: "
          + ", ".join(f"{c} {a['rel_error_median']:.4f}/{a['unique_v_rows_per_kv_head']:.0f}" for c, a in acc.items()), flush=True)
    sink = torch.empty(triton_cdiv(k.numel() // d, 128), device=device)
    read_k = k_read_kernel()
    measure(results, f"{tag}/k_read_triton", lambda: read_k(k, sink), flusher, meta={"floor_us": kv_bytes / 2 / READ_BW * 1e6})
    measure(results, f"{tag}/cudnn_sdpa", sdpa_fn(q, k, v, "cudnn"), flusher, meta=meta_dense)
    measure(results, f"{tag}/flash_sdpa", sdpa_fn(q, k, v, "flash"), flusher, meta=meta_dense)
    if fi is not None:
        q2, k2, v2 = q[0], k[0], v[0]
        measure(results, f"{tag}/flashinfer", lambda: fi.single_decode_with_kv_cache(q2, k2, v2, kv_layout="NHD"),
                flusher, meta=meta_dense)
    for kernel, budget in configs:
        ws = make_workspace(q, k, budget, kernel=kernel)
        out = torch.empty_like(q)
        rows = acc[f"{kernel}_S{budget}"]["unique_v_rows_per_kv_head"]
        stash = h * n * 4 * 2 if kernel == "prop" else 0
        floor_bytes = kv_bytes / 2 + rows * h_kv * d * 2 + stash
        fn = lambda kernel=kernel, budget=budget, ws=ws, out=out: decode(  # noqa: E731
            q, k, v, budget, kernel=kernel, scale=scale, out=out, workspace=ws)
        measure(results, f"{tag}/santa_{kernel}_S{budget}", fn, flusher,
                meta={"floor_us": floor_bytes / READ_BW * 1e6, "bytes": floor_bytes, "kernel": kernel})
        if budget in (128, 2048):
            for stage, sfn in santa_stage_fns(q, k, v, budget, kernel, scale=scale, out=out, workspace=ws).items():
                measure(results, f"{tag}/santa_{kernel}_S{budget}/{stage}", sfn, flusher, graph=False)


def bench_real(cap, results, flusher, args, fi, device=None, save=None):
    """Every backend on captured (and tiled) inputs; the same protocol as :func:`bench_single`."""
    device = device or torch.device("cuda")
    meta = cap.get("meta", {})
    n0 = next(iter(cap["layers"].values()))["k"].shape[1]
    layers = list(cap["layers"])
    mid = layers[len(layers) // 2]
    order = [mid] + [x for x in layers if x != mid] + (["gaussian"] if args.real_gaussian else [])
    sizes = [n0 if n == 0 else n for n in args.real_sizes]
    configs = [("prop", s) for s in args.prop_budgets] + [("flash", s) for s in args.flash_budgets]
    results["real/meta"] = {**meta, "captured_n": n0, "sizes": sizes, "tiled_beyond": n0,
                            "note": "keys/values past the captured length are the captured ones repeated (tiled)"}
    t0 = time.time()
    for n in sizes:
        for layer in order:
            if args.max_seconds and time.time() - t0 > args.max_seconds:
                results.setdefault("real/skipped", []).append(f"L{layer}/n{n}")
                print(f"  skipped layer {layer} n {n}: past --max-seconds", flush=True)
                continue
            _bench_real_one(cap, layer, n, n0, configs, results, flusher, args, fi, device)
            if save is not None:
                save()
    results["real/seconds"] = time.time() - t0


def _latency_lines(ax, sizes, names, timing):
    """One line per backend: median µs vs n_k on log–log axes. ``timing(n, name)`` → a timing dict
    with ``median_us`` (or an empty dict where that case was not measured)."""
    for name in names:
        pts = [(n, timing(n, name).get("median_us")) for n in sizes]
        pts = [p for p in pts if p[1] is not None]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.legend(fontsize=7)


def plot_real(results, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    keys = [k for k in results if k.startswith("real/L") and k.endswith("/cudnn_sdpa")]
    layers = list(dict.fromkeys(k.split("/")[1] for k in keys))
    sizes = sorted({int(k.split("/")[2][1:]) for k in keys})
    if not sizes:
        return
    names = ["cudnn_sdpa", "flash_sdpa", "flashinfer", "k_read_triton", "santa_prop_S64", "santa_prop_S128", "santa_prop_S256",
             "santa_flash_S1024", "santa_flash_S2048"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.8))
    real_layers = [x for x in layers if x != "Lgaussian"]
    show = real_layers[0] if real_layers else layers[0]
    _latency_lines(ax1, sizes, names, lambda n, name: results.get(f"real/{show}/n{n}/{name}", {}).get("graph", {}))
    ax1.set_xlabel("n_k (captured length; longer = tiled captures)")
    ax1.set_ylabel("µs (median, clean cold L2, CUDA graph)")
    ax1.set_title(f"SmolLM2 {show} (H=9, H_kv=3, d=64), batch 1")
    n0 = sizes[0]
    configs = [c for c in names if c.startswith("santa_")]
    width = 0.8 / max(1, len(layers))
    for j, layer in enumerate(layers):
        acc = results.get(f"real/{layer}/n{n0}/accuracy", {})
        ys = [acc.get(c.removeprefix("santa_"), {}).get("rel_error_median", float("nan")) for c in configs]
        ax2.bar([i + j * width for i in range(len(configs))], ys, width, label=layer)
    ax2.set_xticks([i + 0.4 - width / 2 for i in range(len(configs))], [c.removeprefix("santa_") for c in configs], fontsize=8)
    if any(p.get_height() > 0 for p in ax2.patches):
        ax2.set_yscale("log")
    ax2.set_ylabel(f"‖ô − o‖/‖o‖ at n = {n0} (median of seeds)")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def tuning_name(tuning) -> str:
    """``"default"``, or the fields that differ from it, e.g. ``warps_pass24_samples_per_program64``."""
    from santa.kernels import Tuning

    base = vars(Tuning())
    return "_".join(f"{k_}{v_}" for k_, v_ in vars(tuning).items() if v_ != base[k_]) or "default"


def tuning_variants() -> list:
    """The prop launch variants of the tuning sweep (:class:`santa.kernels.Tuning`), the defaults first."""
    from santa.kernels import Tuning

    return [
        Tuning(),  # the measured defaults
        Tuning(warps_pass2=4), Tuning(warps_pass2=8),
        Tuning(samples_per_program=16), Tuning(samples_per_program=64), Tuning(samples_per_program=128),
        Tuning(samples_per_program=128, warps_pass2=4),
        Tuning(block_n=64), Tuning(block_n=256), Tuning(warps_pass1=8), Tuning(stages_pass1=2),
        Tuning(pdl=False),
        Tuning(tile_search="scan"), Tuning(tile_search="bisect"),
        Tuning(samples_per_program=64, tile_search="bisect"), Tuning(samples_per_program=128, tile_search="bisect"),
        Tuning(k_evict_first=True), Tuning(k_evict_first=False), Tuning(discard_stash=False),
    ]


def sweep_prop_tuning(results, flusher, args, n_keys=32768, batch=1):
    """prop launch variants (:class:`santa.kernels.Tuning`) at one size: speed only, samples do not change; pass 1
    alone too for the default (the K stream)."""
    torch.manual_seed(0)
    dev = torch.device("cuda")
    q = torch.randn(batch, args.heads, args.head_dim, device=dev, dtype=DTYPE)
    k = torch.randn(batch, n_keys, args.kv_heads, args.head_dim, device=dev, dtype=DTYPE)
    v = torch.randn(batch, n_keys, args.kv_heads, args.head_dim, device=dev, dtype=DTYPE)
    reference_out = santa_plan(q, k, 128, "prop").run(q, k, v, seed=5)
    best = None
    variants = tuning_variants()
    if args.tune_variants:
        names = {tuning_name(t): t for t in variants}
        variants = [names[n] for n in args.tune_variants]  # names checked by main
    for tuning in variants:
        name = tuning_name(tuning)
        try:
            plan = santa_plan(q, k, 128, "prop", tuning=tuning)
            out = torch.empty_like(q)
            e = measure(results, f"tune/b{batch}/n{n_keys}/prop_S128/{name}", lambda plan=plan, out=out: plan.run(q, k, v, out=out), flusher)
            e["close_to_default"] = bool(torch.allclose(plan.run(q, k, v, seed=5).float(), reference_out.float(), atol=2e-2, rtol=2e-2))
            if name == "default":  # pass 1 alone: the K stream
                measure(results, f"tune/b{batch}/n{n_keys}/prop_S128/{name}/pass1", plan.stages(q, k, v, out=out)[0][1], flusher)
            t = e.get("graph", {}).get("median_us")
            if t is not None and (best is None or t < best[0]):
                best = (t, name)
        except Exception as exc:
            print("  tuning variant failed:", tuning, exc)
    results[f"tune/best/b{batch}/n{n_keys}"] = best
    return best


def environment() -> dict:
    """The results file's provenance: command line, environment, commit, date, versions, device."""
    return run_record()


def plot(results, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    sizes = sorted({int(k.split("/")[1][1:]) for k in results if k.startswith("b1/n")})
    fig, ax = plt.subplots(figsize=(7, 4.5))
    names = sorted({k.split("/")[2] for k in results if k.startswith("b1/n") and k.count("/") == 2 and "peaked" not in k})
    _latency_lines(ax, sizes, names, lambda n, name: results.get(f"b1/n{n}/{name}", {}).get("eager", {}))
    ax.set_xlabel("n_k (keys)")
    ax.set_ylabel("µs per decode step (median, clean cold L2)")
    ax.set_title("Decode attention, Llama-3.1-8B shapes, batch 1, H200")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def build_parser() -> argparse.ArgumentParser:
    from santa import cliargs

    parser = argparse.ArgumentParser(prog="santa bench kernels", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=cliargs.output_folder, default=os.environ.get("OUT", "runs/bench_kernels"),
                        help="folder for kernels.json and kernels.png (or real_attention.json/png)")
    parser.add_argument("--quick", action="store_true", help="two sizes, no batches (a smoke run)")
    parser.add_argument("--sizes", type=int, nargs="*", default=[4096, 8192, 16384, 32768, 65536, 131072])
    parser.add_argument("--prop-budgets", type=int, nargs="*", default=[64, 128, 256])
    parser.add_argument("--flash-budgets", type=int, nargs="*", default=[1024, 2048])
    parser.add_argument("--heads", type=int, default=H, help=f"query heads H (default {H}, Llama-3.1-8B)")
    parser.add_argument("--kv-heads", type=int, default=H_KV, help=f"KV heads H_kv (default {H_KV})")
    parser.add_argument("--head-dim", type=int, default=D, help=f"head dim d (default {D})")
    parser.add_argument("--batches", type=int, nargs="*", default=[8, 32], help="batch sizes of the batched case")
    parser.add_argument("--batch-keys", type=int, default=32768, help="keys per sequence in the batched case")
    parser.add_argument("--no-flashinfer", action="store_true")
    parser.add_argument("--fp8", action="store_true", help="also the fp8-cache table: santa on e4m3 K/V against FlashInfer's fp8 decode")
    parser.add_argument("--only-fp8", action="store_true", help="the fp8-cache table alone (the --sizes at batch 1, --batches)")
    parser.add_argument("--no-tune", action="store_true")
    parser.add_argument("--only-tune", action="store_true", help="the prop tuning sweep alone")
    parser.add_argument("--tune-variants", nargs="*", default=None,
                        help="names of the sweep's variants to run (default: all), e.g. default samples_per_program64")
    parser.add_argument("--tune-cases", default="1x8192,1x32768,1x131072,8x32768,32x32768",
                        help="batch×keys cases of the tuning sweep (comma list)")
    parser.add_argument("--no-batch", action="store_true")
    parser.add_argument("--real", metavar="FILE", help="only the real-attention run, on a file written by santa bench capture "
                        "(writes real_attention.json/png)")
    parser.add_argument("--real-sizes", type=int, nargs="*", default=[0, 32768, 131072],
                        help="n_k for --real; 0 = the captured length, longer = tiled captures")
    parser.add_argument("--real-seeds", type=int, default=8, help="seeds per estimate error (median reported)")
    parser.add_argument("--real-gaussian", action="store_true", help="with --real, also Gaussian inputs of the same shapes (q × 4)")
    parser.add_argument("--max-seconds", type=float, default=0, help="with --real, skip what starts after this many seconds")
    return parser


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Every flag, before any work (``parser.error``, status 2); the GPU last (its memory against the largest case)."""
    from santa.kernels import MAX_BUDGET

    for name in ("heads", "kv_heads", "head_dim", "batch_keys"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be ≥ 1, got {getattr(args, name)}")
    try:
        args.tune_cases = [tuple(int(x) for x in case.split("x")) for case in args.tune_cases.split(",")]
    except ValueError:
        parser.error(f"--tune-cases must be a comma list of BATCHxKEYS, got {args.tune_cases!r}")
    if any(len(c) != 2 or min(c) < 1 for c in args.tune_cases):
        parser.error(f"--tune-cases must be a comma list of BATCHxKEYS with both ≥ 1, got {args.tune_cases!r}")
    if args.only_tune and args.no_tune:
        parser.error("--only-tune and --no-tune exclude each other")
    if args.heads % args.kv_heads:
        parser.error(f"--heads {args.heads} must be a multiple of --kv-heads {args.kv_heads}")
    if args.head_dim not in (64, 128, 256):
        parser.error(f"--head-dim must be 64, 128 or 256, got {args.head_dim}")
    for name in ("sizes", "prop_budgets", "flash_budgets", "batches"):
        if any(x < 1 for x in getattr(args, name)):
            parser.error(f"--{name.replace('_', '-')}: every value must be ≥ 1, got {getattr(args, name)}")
    for name in ("prop_budgets", "flash_budgets"):
        if any(x > MAX_BUDGET for x in getattr(args, name)):
            parser.error(f"--{name.replace('_', '-')}: the kernels take at most {MAX_BUDGET} samples per head, got {max(getattr(args, name))}")
    if args.real_seeds < 1:
        parser.error(f"--real-seeds must be ≥ 1, got {args.real_seeds}")
    if any(n < 0 for n in args.real_sizes):
        parser.error(f"--real-sizes must be ≥ 0 (0 = the captured length), got {args.real_sizes}")
    if not args.max_seconds >= 0:  # also refuses nan
        parser.error(f"--max-seconds must be ≥ 0, got {args.max_seconds}")
    if args.real is not None and not os.path.isfile(args.real):
        parser.error(f"--real: no such file {args.real!r} (make one with santa bench capture)")
    for name in ("sizes", "prop_budgets", "flash_budgets"):
        if not getattr(args, name):
            parser.error(f"--{name.replace('_', '-')} needs at least one value")
    if args.tune_variants is not None:
        names = [tuning_name(t) for t in tuning_variants()]
        unknown = [n for n in args.tune_variants if n not in names]
        if unknown or not args.tune_variants:
            parser.error(f"--tune-variants: unknown variant {unknown[0] if unknown else '(none given)'!r}; choose from {', '.join(names)}")
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU (torch.cuda.is_available() is False)")
    need, total = largest_case_bytes(args), torch.cuda.get_device_properties(0).total_memory
    if need > total:
        parser.error(f"the largest case needs about {need / 2**30:.0f} GiB (K and V, a copy, the L2 flush buffer); "
                     f"this GPU has {total / 2**30:.0f} GiB: use smaller --sizes, --batches × --batch-keys, --tune-cases or --real-sizes")


def largest_case_bytes(args: argparse.Namespace) -> int:
    """GPU bytes the largest case holds: its K and V (bf16) twice over (one layout copy), plus the flush buffer."""
    keys = list([8192, 32768] if args.quick else args.sizes)  # batch 1
    if not (args.quick or args.no_batch):
        keys += [b * args.batch_keys for b in args.batches]
    if not args.no_tune:
        keys += [b * n for b, n in args.tune_cases]
    if args.real:
        keys = list(args.real_sizes)  # batch 1; 0: the captured length (small)
    per_key = 2 * args.kv_heads * args.head_dim * DTYPE.itemsize
    return 2 * max(keys, default=0) * per_key + 512 * 2**20


def write_results(path: str, results: dict) -> None:
    """``results`` as JSON at ``path`` all at once (this process's staging file, then a rename): a reader, a
    run cut short or a second run on the same folder never leaves half a file there."""
    staging = f"{path}.{os.getpid()}.partial"
    with open(staging, "w") as f:
        json.dump(results, f, indent=1, default=str)
    os.replace(staging, path)


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    check_args(parser, args)
    capture = None
    if args.real:
        try:
            capture = load_capture(args.real)
        except ValueError as error:  # a file that cannot be used: one line, status 1
            print(f"santa bench kernels: error: {error}", file=sys.stderr)
            return 1
    os.makedirs(args.out, exist_ok=True)
    fi = None
    if not args.no_flashinfer:
        try:
            import flashinfer as fi
        except Exception as exc:
            print("flashinfer unavailable:", exc)
    results: dict = {"env": environment()}
    flusher = Flusher(torch.device("cuda"))
    if args.real:
        def save():
            write_results(os.path.join(args.out, "real_attention.json"), results)

        bench_real(capture, results, flusher, args, fi, save=save)
        save()
        try:
            plot_real(results, os.path.join(args.out, "real_attention.png"))
        except Exception as exc:  # noqa: BLE001 - the numbers matter, the plot is a view
            print("plot failed:", exc)
        print_summary(results)
        print_real_accuracy(results)
        return 0
    sizes = [8192, 32768] if args.quick else args.sizes
    t0 = time.time()

    def save():  # after every case: a run cut short (a device call's time limit) keeps what it measured
        results["env"]["seconds"] = time.time() - t0
        write_results(os.path.join(args.out, "kernels.json"), results)

    if args.fp8 or args.only_fp8:
        for batch, n in [(1, n) for n in sizes] + [(b, args.batch_keys) for b in ([] if args.no_batch else args.batches)]:
            print(f"fp8 caches, batch {batch}, n_k = {n}:")
            bench_fp8(batch, n, results, flusher, args, fi)
            save()
        if args.only_fp8:
            sizes, args.no_batch, args.no_tune = [], True, True
    if not args.no_tune:
        for batch, n in args.tune_cases:
            print(f"prop launch variants at batch {batch}, n_k = {n}:")
            sweep_prop_tuning(results, flusher, args, n, batch)
            save()
        if args.only_tune:
            sizes, args.no_batch = [], True
    for n in sizes:
        print(f"batch 1, n_k = {n}:")
        bench_single(n, results, flusher, args, fi)
        save()
    if not (args.quick or args.no_batch):
        for batch in args.batches:
            print(f"batch {batch}, n_k = {args.batch_keys}:")
            bench_batch(batch, args.batch_keys, results, flusher, args, fi)
            save()
    save()
    plot(results, os.path.join(args.out, "kernels.png"))
    print_summary(results)
    return 0


def print_real_accuracy(results):
    print("\nreal attention: ‖ô − o‖/‖o‖ median of seeds / unique V rows per KV head:")
    for key, entry in results.items():
        if key.startswith("real/") and key.endswith("/accuracy"):
            print(f"{key:34s} " + "  ".join(f"{c} {a['rel_error_median']:.4f}/{a['unique_v_rows_per_kv_head']:.0f}" for c, a in entry.items()))


def print_summary(results):
    print("\nsummary (median µs, clean cold L2; eager / graph):")
    for key, entry in results.items():
        if not isinstance(entry, dict) or "eager" not in entry:
            continue
        e, g = entry["eager"]["median_us"], entry.get("graph", {}).get("median_us")
        w = entry.get("write_flush", {}).get("median_us")
        floor = entry.get("floor_us")
        print(f"{key:58s} {e:8.1f} {'' if g is None else f'{g:8.1f}'} {'' if w is None else f' wflush {w:7.1f}'}"
              f"{'' if floor is None else f'  floor {floor:6.1f}'}")


if __name__ == "__main__":
    sys.exit(main())
