"""santa's decode step on vLLM's paged cache: the one-launch CUDA prop against the two Triton launches and the dense
paged kernels, in the same call (issue 39).

    python benchmarks/kernels/paged_ab.py OUT.jsonl [--quick] [--fp8] [--gate [--full]] [--shapes] [--half-slices] [--f16]

Every case runs through ``santa.vllm.decode.PagedDecoder`` (what santa's vLLM backend calls) on vLLM's packed
FlashAttention cache (K and V halves of one row, pages of 16 keys shuffled over the pool), S = 128, bf16, seed 0:
``one_launch`` (the default on an sm_90 GPU) and ``triton`` (``Tuning(one_launch=False)``); the plan is made for
``capacity`` keys per sequence (vLLM plans for ``max_model_len``: CUDA graphs fix the grid) while the sequences hold
``length``. Dense on the same keys: FlashInfer's paged decode (CUDA cores and tensor cores, where FlashInfer is
importable: ``bash benchmarks/device/prepare.sh flashinfer``) on the same pages copied to separate K and V tensors, and
cuDNN SDPA on a contiguous copy; ``best_dense_us`` is the fastest. On that copy also santa's contiguous plan
(``contiguous_one_launch`` and ``contiguous_triton``). CUDA-graph replay, clean cold L2, medians
(benchmarks/bench/timing.py). Floors at 4.5 TB/s: santa reads K and the sampled V rows, dense reads K and V.

Cases: Llama-3.1-8B (32 / 8 heads, d = 128) at 8k and 32k (batch 1, 8, 32), 64 × 2k planned for 2k, 32k and 128k
keys; the short grid n ∈ {512, 1k, 2k, 4k} × batch ∈ {1, 16, 64, 256} on Llama and Qwen2.5-0.5B (14 / 2, d = 64);
Qwen batch 16 × 32k; SmolLM2-135M (9 / 3, d = 64) batch 64 × 8k. ``--quick``: four cases. ``--shapes``: the other
head shapes the one launch serves (:data:`SHAPE_MODELS`: G = 1, 2, 3, 5, 6, 7, 8 at d = 128, 4 and 8 at d = 64) at
1 × 32k, 16 × 32k, 8 × 8k and 64 × 2k. ``--fp8``: e4m3 caches
(vLLM's uint8 cache, scales 0.5 as vLLM's 0-d tensors), FlashInfer's fp8 paged decode as the dense arm and cuDNN on a
bf16 copy; Llama at 32k and 128k, batch 8 and 32 × 32k, 64 × 2k, Qwen 16 × 32k, SmolLM2 64 × 8k. The first line of OUT.jsonl
records the command, commit, device and versions; ``--gate`` (keys ``gate/…``, its own cases: Llama and Qwen plans for
32k and 128k keys on 2k- and 16k-key sequences, batch 1 to 256, ``--quick``: 16 and 64) also times each santa arm with
``DecodePlan.run``'s gate open and closed (``*_open_us``, ``*_closed_us``: what santa's launch costs a short step that
santa.vllm gives to FlashAttention inside a captured graph, and what the gate costs a sampled one; the Triton arm's
closed launch still launches its whole grid, ~0.83 ns per pass-1 program by capacity_ab.py's figures, so it is timed
again with its pass-1 grid cut to 4,096 programs, ``triton_4096_*``; ``--gate --full``: :data:`FULL_GATE_CASES`); one line per case follows, appended as it is measured, and a re-run
skips the cases already there (a call cut at its time limit resumes). A paged plan's one launch runs issue 39's live
schedule (its work derived from the lengths in the launch, whatever the capacity: ``one_launch_plan`` ``live``);
``--rounds`` (keys ``rounds/…``) also times, on the same draws, the one launch on host-built rounds sized by the
capacity (``rounds_us``: ``OneLaunch(live=False)``, the paged default before the live schedule) and the live schedule
(``live_us``: ``OneLaunch(live=True)``, whatever the rule chose; until 2026-12-06's 27th session this arm was
``live_min4_us``, at least 4 slices a sequence, the fewest whose gather fit shared memory before live CTAs gathered in
chunks). ``--half-slices`` (keys ``half/…``, with ``--fp8`` or not): d = 128 at G = 7 and 8 (:data:`HALF_SLICE_CASES`),
the live launch on its default slices (``live_us``: halved, 2,048 keys, two CTAs per SM, since the 32nd session; that
session's records hold the 4,096-key default as ``live_us`` and the halved slices as ``live_half_us``) and on full
4,096-key ones (``live_full_us``: one CTA per SM) beside santa's plan and the Triton prop, and the live launch on a
contiguous cache (``contiguous_live_us``, beside ``contiguous_triton_us``: the trade ``one_launch.live_pays`` makes). ``--f16`` (keys ``f16/…``): q and
the pages in fp16, the ``--fp8`` cases (with ``--shapes``: every shape's), every arm in fp16.
"""

from __future__ import annotations

import argparse
import sys

import torch

sys.path.insert(0, ".")
from benchmarks.bench.case_log import add_case, cases_done, run_locked  # noqa: E402
from benchmarks.bench.timing import Flusher, time_fn  # noqa: E402

PAGE, BUDGET, READ_BW = 16, 128, 4.5e12
MODELS = {"llama": (32, 8, 128), "qwen": (14, 2, 64), "smollm2": (9, 3, 64)}  # heads, KV heads, head dim
# --shapes: the head shapes (d, G) of one_launch.SHAPES other than the three above, each at a model that has it
SHAPE_MODELS = {"mha-7b": (32, 32, 128), "qwen3-1.7b": (16, 8, 128), "llama-3.2-3b": (24, 8, 128),
                "qwen2.5-14b": (40, 8, 128), "qwen2.5-1.5b": (12, 2, 128), "qwen2.5-7b": (28, 4, 128),
                "llama-3.1-70b": (64, 8, 128), "llama-3.2-1b": (32, 8, 64), "tinyllama": (32, 4, 64),
                # d = 64 at G = 1, 2, 5, 6 (the d64 branch): SmolLM2-1.7B's MHA, and three groupings no bundled model has
                "smollm2-1.7b": (32, 32, 64), "d64-g2": (16, 8, 64), "d64-g5": (40, 8, 64), "d64-g6": (12, 2, 64)}
MODELS.update(SHAPE_MODELS)
SHAPE_CASES = [(model, batch, n, n) for model in SHAPE_MODELS for batch, n in ((1, 32768), (16, 32768), (8, 8192), (64, 2048))]
# d = 128 at G = 7 and 8, whose full live slices (4,096 keys) leave one CTA per SM (1.29-1.32x the Triton prop's time on
# fp8 pages at 16 x 32k, H100, 31st session); halved (two CTAs per SM) they took 0.63-0.94x the full ones' time (32nd), the default since
HALF_SLICE_CASES = [(model, batch, n, n) for model in ("qwen2.5-7b", "llama-3.1-70b")
                    for batch, n in ((16, 32768), (8, 8192), (64, 2048), (1, 32768), (4, 131072))]
FP8, FP8_SCALE = torch.float8_e4m3fn, 0.5


# --gate --full: what the 2026-12-05 gate run left open about santa.vllm's gated plans taking 4,096 pass-1 programs where
# the default grid is cut (santa.vllm.decode.GATED_PASS1_PROGRAMS; 3-11 % slower at 16k keys where it is not): plans
# whose every tile holds keys, with cut (Llama 64 x 32k, 16 x 128k, Qwen 256 x 32k) and uncut default grids; and Llama at
# max_model_len 33,024 (32k prompts + 256 output tokens), where the plan rule gave the Triton prop until the H100 run of
# 2026-12-05 timed the 8-slice plan there (eight_slices_* in that run's records; now the rule's, one_launch.EIGHT_SLICES_UP_TO)
FULL_GATE_CASES = [("llama", 32, 32768, 32768), ("llama", 64, 32768, 32768), ("llama", 16, 131072, 131072),
                   ("qwen", 64, 32768, 32768), ("qwen", 256, 32768, 32768), ("qwen", 16, 131072, 131072),
                   ("llama", 16, 16384, 33024),
                   ("llama", 64, 16384, 33024), ("llama", 16, 32768, 33024)]


def cases(quick: bool, fp8: bool = False, gate: bool = False, full: bool = False,
          shapes: bool = False, half: bool = False, models: list[str] | None = None) -> list[tuple[str, int, int, int]]:
    """(model, batch, length, capacity) in the order they are measured; ``gate``: the plans santa.vllm captures under
    dense_below (a server's max_model_len, 32k or 128k) on 2k-key sequences (a short step: what the closed launch costs)
    and 16k-key ones (a sampled step: what the open gate costs); with ``full``: :data:`FULL_GATE_CASES`; ``shapes``:
    :data:`SHAPE_CASES` (bf16, or e4m3 with ``fp8``); ``half``: :data:`HALF_SLICE_CASES`. ``models``: only those
    models' cases; it also gives the short grid and the gate's cases to other models than Llama and Qwen (any of :data:`MODELS`: the
    small-G shapes whose live launch loses at long sequences, on plans larger than their sequences)."""
    chosen = _mode_cases(quick, fp8, gate, full, shapes, half, models)
    return [case for case in chosen if not models or case[0] in models]


def _mode_cases(quick: bool, fp8: bool, gate: bool, full: bool, shapes: bool, half: bool,
                models: list[str] | None) -> list[tuple[str, int, int, int]]:
    """:func:`cases` of one mode, before the ``models`` filter."""
    if half:
        return HALF_SLICE_CASES
    if shapes:
        return SHAPE_CASES
    if gate and full:
        return FULL_GATE_CASES
    if gate:
        return [(model, batch, length, capacity) for model in (models or ("llama", "qwen")) for capacity in (32768, 131072)
                for length in (2048, 16384) for batch in (1, 16, 64, 256) if not (quick and batch in (1, 256))]
    if fp8:
        return [("llama", 1, 32768, 32768), ("llama", 1, 131072, 131072), ("llama", 8, 32768, 32768),
                ("llama", 32, 32768, 32768), ("llama", 64, 2048, 2048), ("qwen", 16, 32768, 32768), ("smollm2", 64, 8192, 8192)]
    if quick:
        return [("llama", 1, 8192, 8192), ("llama", 64, 2048, 2048), ("llama", 64, 2048, 131072), ("llama", 32, 32768, 32768)]
    # the short grid first (issue 39's "santa ≤ dense in every cell": Llama and Qwen, or the models named, so that
    # `--models smollm2` times SmolLM2's short plans too), then the long and loose-plan cases
    out = [(model, batch, n, n) for model in (models or ("llama", "qwen")) for n in (512, 1024, 2048, 4096)
           for batch in (1, 16, 64, 256)]
    return out + [case for case in [
        ("llama", 1, 8192, 8192), ("llama", 1, 32768, 32768), ("llama", 8, 32768, 32768), ("llama", 32, 32768, 32768),
        ("llama", 64, 2048, 32768), ("llama", 64, 2048, 131072), ("qwen", 16, 32768, 32768), ("smollm2", 64, 8192, 8192)]
        if case not in out]


def inputs(model: str, batch: int, length: int, capacity: int, fp8: bool = False, f16: bool = False):
    """Seeded q ``[B, H, D]``, vLLM's packed pages ``[pages, P, H_kv, 2·D]`` (bf16, e4m3 stored as uint8, or with
    ``f16`` q and pages in fp16), the block table ``capacity / P`` wide (unused columns page 0, as vLLM's) and the
    lengths."""
    heads, kv_heads, dim = MODELS[model]
    dtype = torch.float16 if f16 else torch.bfloat16
    torch.manual_seed(0)
    per_seq = length // PAGE
    packed = torch.randn(batch * per_seq, PAGE, kv_heads, 2 * dim, device="cuda", dtype=dtype)
    if fp8:
        packed = packed.to(FP8).view(torch.uint8)
    table = torch.zeros(batch, capacity // PAGE, dtype=torch.int32, device="cuda")
    table[:, :per_seq] = torch.randperm(batch * per_seq, device="cuda").to(torch.int32).reshape(batch, per_seq)
    q = torch.randn(batch, heads, dim, device="cuda", dtype=dtype)
    seq_lens = torch.full((batch,), length, dtype=torch.int32, device="cuda")
    return q, packed, table, seq_lens


def santa_arm(model: str, q, packed, table, seq_lens, capacity: int, flusher, *, one_launch: bool, gate: bool = False,
              pass1_programs: int | None = None, budget: int = BUDGET) -> dict:
    """santa's step through PagedDecoder on the packed cache (its dtype: bf16, or uint8 for e4m3) at S = ``budget``;
    ``gate``: also with the run's gate open and closed (``open_us``, ``closed_us``)."""
    from santa.kernels import Tuning
    from santa.vllm.decode import PagedDecoder

    heads, kv_heads, dim = MODELS[model]
    batch = q.shape[0]
    decoder = PagedDecoder(heads=heads, kv_heads=kv_heads, head_dim=dim, block_size=PAGE, max_keys=capacity, max_batch=batch,
                           budget=budget, kernel="prop", seed=0, dtype=q.dtype,
                           kv_dtype=FP8 if packed.dtype == torch.uint8 else q.dtype, device="cuda",
                           tuning=None if one_launch else Tuning(one_launch=False, pass1_programs=pass1_programs))
    decoder.allocate()
    decoder.prepare([batch], dim**-0.5)
    plan, _ = decoder.plan(batch, capacity, dim**-0.5)
    kv_cache = packed.permute(0, 2, 1, 3)  # vLLM's logical (num_blocks, H_kv, block_size, 2·D)
    positions = decoder.positions(seq_lens)
    out = torch.empty_like(q)
    scales = {}
    if packed.dtype == torch.uint8:  # vLLM's layer._k_scale / _v_scale: 0-d float32 tensors
        scales = dict(k_scale=torch.tensor(FP8_SCALE, device="cuda"), v_scale=torch.tensor(FP8_SCALE, device="cuda"))

    def step(enabled=None):
        decoder.run(q, kv_cache, seq_lens=seq_lens, block_table=table, layer=0, scale=dim**-0.5, out=out, positions=positions,
                    enabled=enabled, **scales)

    entry = {"us": time_fn(step, flusher.read, graph=True)["median_us"],
             "plan": plan.one_launch.plan.name if plan.one_launch is not None else "triton"}
    if gate:
        for name, value in (("open", 1), ("closed", 0)):
            enabled = torch.tensor([value], dtype=torch.int32, device="cuda")
            entry[f"{name}_us"] = time_fn(lambda enabled=enabled: step(enabled), flusher.read, graph=True)["median_us"]
    entry["out"] = out.float().clone()
    return entry


def launch_arm(model: str, q, packed, table, seq_lens, capacity: int, flusher, **kind) -> dict:
    """The one launch of ``kind`` (``OneLaunch`` keywords: ``live=False``, host-built rounds sized by the capacity;
    ``live=True, min_slices=4``) on the same packed pages and draws, its own buffers (ValueError where none fits)."""
    from santa import rng
    from santa.kernels import one_launch as ol

    heads, kv_heads, dim = MODELS[model]
    fp8 = packed.dtype == torch.uint8
    launch = ol.OneLaunch(batch=q.shape[0], heads=heads, kv_heads=kv_heads, head_dim=dim, n_keys=capacity, budget=BUDGET,
                          scale=dim**-0.5, device=torch.device("cuda"), page_size=PAGE, fp8=fp8,
                          f16=q.dtype == torch.float16, **kind)
    k_pages, v_pages = packed[..., :dim], packed[..., dim:]
    out = torch.empty_like(q)
    scales = dict(k_scale=FP8_SCALE, v_scale=FP8_SCALE) if fp8 else {}

    # the draws santa_arm's PagedDecoder (seed 0, layer 0) makes: request-keyed, so the outputs compare sample for sample
    positions = (seq_lens - 1).clamp_min(0).int()

    def step():
        launch.run(q, k_pages, v_pages, out=out, strides=ol.cache_strides(k_pages, v_pages, "NHD"), seq_lens=seq_lens,
                   block_table=table, seed=rng.layer_key(0, 0), positions=positions, **scales)

    step()  # its own buffers, before the graph's capture
    return {"us": time_fn(step, flusher.read, graph=True)["median_us"], "plan": launch.plan.name, "out": out.float().clone()}


def dense_arms(model: str, q, packed, table, flusher, live: bool = False) -> dict:
    """Dense paged decode on the same keys (a table whose every page is live: capacity = length), and santa's
    contiguous arms on them (``live``: also the contiguous live launch)."""
    heads, kv_heads, dim = MODELS[model]
    k_pages, v_pages = packed[..., :dim].contiguous(), packed[..., dim:].contiguous()
    fp8 = packed.dtype == torch.uint8
    scales = {}
    if fp8:
        k_pages, v_pages, scales = k_pages.view(FP8), v_pages.view(FP8), dict(k_scale=FP8_SCALE, v_scale=FP8_SCALE)
    times = {}
    try:
        import flashinfer as fi
        from benchmarks.bench.kernels import flashinfer_paged

        for tc in (False, True):
            name = "flashinfer_paged_tc" if tc else "flashinfer_paged"
            try:
                times[f"{name}_us"] = time_fn(flashinfer_paged(fi, q, k_pages, v_pages, table, tensor_cores=tc, **scales),
                                              flusher.read, graph=True)["median_us"]
            except Exception as exc:  # recorded, not fatal
                times[f"{name}_error"] = f"{type(exc).__name__}: {exc}"[:300]
    except ImportError:
        times["flashinfer_error"] = "not installed"
    from torch.nn.attention import SDPBackend, sdpa_kernel

    batch, pages = table.shape
    k_nhd, v_nhd = (x[table.long()].reshape(batch, pages * PAGE, kv_heads, dim) for x in (k_pages, v_pages))
    times.update(contiguous_arms(q, k_nhd, v_nhd, flusher, live=live, **scales))
    if fp8:  # cuDNN on the dequantised values in bf16
        k_nhd, v_nhd = ((x.float() * FP8_SCALE).to(torch.bfloat16) for x in (k_nhd, v_nhd))
    k, v = k_nhd.transpose(1, 2), v_nhd.transpose(1, 2)
    q4 = q.unsqueeze(2)

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(q4, k, v, enable_gqa=True)

    try:
        times["cudnn_us"] = time_fn(cudnn, flusher.read, graph=True)["median_us"]
    except Exception as exc:
        times["cudnn_error"] = f"{type(exc).__name__}: {exc}"[:300]
    return times


def contiguous_arms(q, k, v, flusher, live: bool = False, **scales) -> dict:
    """santa's prop on the same keys in a contiguous NHD cache ``[B, n, H_kv, D]`` (a plan's run with lengths and
    positions; ``scales``: an e4m3 cache's): the one launch and the two Triton launches; ``live``: also the live
    launch on its default slices (``contiguous_live_us``, whatever santa's plan chose: what ``live_pays`` weighs)."""
    from santa.kernels import Tuning, plan_decode
    from santa.kernels import one_launch as ol

    batch, n, kv_heads, dim = k.shape
    seq_lens = torch.full((batch,), n, dtype=torch.int32, device="cuda")
    positions = seq_lens - 1
    out = torch.empty_like(q)
    times = {}
    for name, tuning in (("contiguous_one_launch", None), ("contiguous_triton", Tuning(one_launch=False))):
        plan = plan_decode(batch=batch, heads=q.shape[1], kv_heads=kv_heads, head_dim=dim, n_keys=n, budget=BUDGET,
                           dtype=q.dtype, kv_dtype=k.dtype, device="cuda", tuning=tuning)
        times[f"{name}_us"] = time_fn(lambda plan=plan: plan.run(q, k, v, seq_lens=seq_lens, positions=positions, out=out, **scales),
                                      flusher.read, graph=True)["median_us"]
        if plan.one_launch is not None:
            times["contiguous_plan"] = plan.one_launch.plan.name
    if live:
        launch = ol.OneLaunch(batch=batch, heads=q.shape[1], kv_heads=kv_heads, head_dim=dim, n_keys=n, budget=BUDGET,
                              scale=dim**-0.5, device=torch.device("cuda"), fp8=k.dtype == ol.FP8,
                              f16=q.dtype == torch.float16, live=True)

        def step():
            launch.run(q, k, v, out=out, strides=ol.cache_strides(k, v, "NHD"), seq_lens=seq_lens, positions=positions,
                       **scales)

        step()  # its own buffers, before the graph's capture
        times["contiguous_live_us"] = time_fn(step, flusher.read, graph=True)["median_us"]
        times["contiguous_live_slices"] = launch.plan.limits.slice_cap
    return times


def measure(path: str, quick: bool, fp8: bool = False, gate: bool = False, full: bool = False, rounds: bool = False,
            shapes: bool = False, half: bool = False, f16: bool = False, models: list[str] | None = None) -> None:
    done = cases_done(path)
    flusher = Flusher("cuda")
    for model, batch, length, capacity in cases(quick, fp8 or f16, gate, full, shapes, half, models):
        key = (("gate/" if gate else "") + ("rounds/" if rounds else "") + ("half/" if half else "") + ("fp8/" if fp8 else "")
               + ("f16/" if f16 else "") + f"{model}/b{batch}/n{length}/cap{capacity}")
        if key in done:
            continue
        heads, kv_heads, dim = MODELS[model]
        q, packed, table, seq_lens = inputs(model, batch, length, capacity, fp8, f16)
        k_bytes = batch * length * kv_heads * dim * packed.element_size()
        entry = {"key": key, "model": model, "batch": batch, "length": length, "capacity": capacity,
                 "fp8": fp8, "f16": f16, "santa_floor_us": (k_bytes + batch * min(heads * BUDGET, kv_heads * length) * dim * packed.element_size())
                 / READ_BW * 1e6,
                 "dense_floor_us": 2 * k_bytes / READ_BW * 1e6}
        one = santa_arm(model, q, packed, table, seq_lens, capacity, flusher, one_launch=True, gate=gate)
        two = santa_arm(model, q, packed, table, seq_lens, capacity, flusher, one_launch=False, gate=gate)
        if gate:  # and the Triton prop with a pass-1 grid of 4,096 programs at most (looping): a cheaper closed launch
            cut = santa_arm(model, q, packed, table, seq_lens, capacity, flusher, one_launch=False, gate=True,
                            pass1_programs=4096)
            entry.update(one_launch_open_us=one["open_us"], one_launch_closed_us=one["closed_us"],
                         triton_open_us=two["open_us"], triton_closed_us=two["closed_us"], triton_4096_us=cut["us"],
                         triton_4096_open_us=cut["open_us"], triton_4096_closed_us=cut["closed_us"])
        entry.update(one_launch_us=one["us"], one_launch_plan=one["plan"], triton_us=two["us"],
                     outputs_close=bool(torch.allclose(one["out"], two["out"], atol=0.25, rtol=0.1)))
        if capacity == length:
            entry.update(dense_arms(model, q, packed, table, flusher, live=half))
            dense = [entry[name] for name in ("flashinfer_paged_us", "flashinfer_paged_tc_us", "cudnn_us") if name in entry]
            if dense:
                entry["best_dense_us"] = min(dense)
                entry["one_launch_over_dense"] = entry["one_launch_us"] / entry["best_dense_us"]
        entry["one_launch_over_triton"] = entry["one_launch_us"] / entry["triton_us"]
        arms = [("rounds", dict(live=False)), ("live", dict(live=True))] if rounds and not gate else []
        if half:  # the live launch on its default (halved) slices and on full ones (one CTA per SM at G = 7, 8)
            from santa.kernels.one_launch import ROUNDS_SLICE_KEYS

            arms = [("live", dict(live=True)), ("live_full", dict(live=True, slice_cap=ROUNDS_SLICE_KEYS[dim]))]
        for name, kind in arms:
            try:
                arm = launch_arm(model, q, packed, table, seq_lens, capacity, flusher, **kind)
                entry.update({f"{name}_us": arm["us"], f"{name}_plan": arm["plan"],
                              f"one_launch_over_{name}": entry["one_launch_us"] / arm["us"],
                              f"{name}_outputs_close": bool(torch.allclose(arm["out"], one["out"], atol=0.25, rtol=0.1))})
            except ValueError as error:
                entry[f"{name}_error"] = str(error)
        add_case(path, entry)
        del q, packed, table, seq_lens, one, two
        torch.cuda.empty_cache()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="JSONL file (resumed where it exists)")
    parser.add_argument("--quick", action="store_true", help="four cases only")
    parser.add_argument("--fp8", action="store_true", help="e4m3 caches (their own cases)")
    parser.add_argument("--gate", action="store_true", help="santa's arms also with DecodePlan.run's gate open and closed")
    parser.add_argument("--full", action="store_true", help="with --gate: full plans and a 33,024-key capacity (FULL_GATE_CASES)")
    parser.add_argument("--rounds", action="store_true", help="also the one launch on host-built rounds (keys rounds/…)")
    parser.add_argument("--shapes", action="store_true", help="the other head shapes of one_launch.SHAPES (SHAPE_CASES)")
    parser.add_argument("--f16", action="store_true", help="fp16 q and caches (the --fp8 cases; keys f16/…)")
    parser.add_argument("--half-slices", action="store_true",
                        help="the live launch on its default (halved) slices beside full ones (HALF_SLICE_CASES, keys half/…)")
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS), metavar="MODEL",
                        help=f"only the cases of these models (of {', '.join(MODELS)}), in the usual order")
    args = parser.parse_args()
    if args.full and not args.gate:
        parser.error("--full goes with --gate")
    if args.rounds and args.gate:
        parser.error("--rounds does not go with --gate")
    if args.shapes and (args.gate or args.quick):
        parser.error("--shapes goes with neither --gate nor --quick")
    if args.half_slices and (args.gate or args.quick or args.rounds or args.shapes):
        parser.error("--half-slices goes with --fp8 only")
    if args.f16 and (args.fp8 or args.gate):
        parser.error("--f16 goes with neither --fp8 nor --gate")
    if args.models and not cases(args.quick, args.fp8 or args.f16, args.gate, args.full, args.shapes, args.half_slices,
                                 args.models):
        mode = cases(args.quick, args.fp8 or args.f16, args.gate, args.full, args.shapes, args.half_slices)
        parser.error(f"--models: none of {args.models} has a case in this mode (its models: {sorted({m for m, *_ in mode})})")
    run_locked(args.out, "paged_ab.py", lambda: measure(args.out, args.quick, args.fp8, args.gate, args.full, args.rounds,
                                                        args.shapes, args.half_slices, args.f16, models=args.models))


if __name__ == "__main__":
    main()
