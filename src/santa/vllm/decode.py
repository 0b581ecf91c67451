"""santa's decode step on vLLM's paged KV cache, with no vLLM import (the backend in
:mod:`santa.vllm.backend` calls it; CPU tests drive it with tensors laid out as vLLM lays them).

vLLM 0.26's FlashAttention layout, which santa's backend keeps (so vLLM's own cache writes and its
prefill kernel work unchanged): one tensor per layer of logical shape ``(num_blocks, H_kv, block_size,
2·D)`` stored as ``[num_blocks, block_size, H_kv, 2·D]`` (K in the first D features of each row, V in the
last D). :func:`split_kv_cache` gives K and V as paged NHD views ``[num_blocks, block_size, H_kv, D]``
(strided: santa's kernels read any row strides); an fp8 cache is stored as uint8 and read as e4m3.

Randomness: vLLM gives an attention backend neither request ids nor per-request seeds (checked in
0.26.0's source), so a draw is keyed on (santa's seed, layer, head, the token's position in its own
sequence, sample): a request's uniforms do not depend on the other requests in its batch, and two
requests at the same position share their uniforms (each estimate stays unbiased). Its samples do not either on the
Triton prop; on the one-launch prop (Hopper) the float32 order of a sequence's CDF follows the plan's slices, which
follow the batch size, so a comb point within float32 rounding of a CDF step may land on the neighbouring key in
another batch (santa.kernels.one_launch; a plan-free order measured 10-13 % slower, benchmarks/KERNEL_NOTES.md run 27).
Under vLLM's ``VLLM_BATCH_INVARIANT=1`` the backend gives the decoder ``santa.kernels.BATCH_INVARIANT``: the Triton prop.

Tensor parallelism: each rank holds H/TP query heads (and their KV heads) and decodes them with its own
:class:`PagedDecoder`, whose ``head_offset`` (the rank's first global head, ``tp_rank × H/TP``: the backend
reads the rank from vLLM) keys the draws on the model's head, so TP = 1, 2, 4 draw the same samples.
"""

from __future__ import annotations

import bisect
import dataclasses

import torch

from santa import rng
from santa.checks import integer
from santa.kernels import one_launch
from santa.kernels.eager import workspace_bytes
from santa.kernels.layout import Tuning, next_pow2, prop_pass1_tiles, prop_tile
from santa.kernels.plan import FP8, DecodePlan, Workspace, checked_tuning, plan_decode

# A gated plan's pass-1 programs at most where its default grid is cut (past layout.PASS1_PROGRAMS): a closed gate still
# launches the whole grid, and 4,096 looping programs cost a closed Triton step 12-32 us against 31-69 (Llama, Qwen
# plans for 32k and 128k keys) and, open, measured faster on every such case (2.7-22 %: Llama 64 x 2k on a 128k plan
# 402.1 against 426.3 us); where the default grid is not cut they measured 3-11 % slower on 16k-key sequences, so those
# keep it (H200, benchmarks/kernels/paged_ab.py --gate, 2026-12-05). On plans whose every tile holds keys and whose default
# grid is cut it measured 0.977-1.006x the default grid's time (Llama 64 x 32k, 16 x 128k, 64 x 16k at 33,024 keys, Qwen
# 256 x 32k; uncut: 1.009-1.059x; H100, paged_ab.py --gate --full, 2026-12-05). Grids of more than 512 rows (sequences ×
# KV heads) are not timed: PagedDecoder.tuning_for keeps at least 8 programs per row.
GATED_PASS1_PROGRAMS = 4096


def split_kv_cache(kv_cache: torch.Tensor, head_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V ``[num_blocks, block_size, H_kv, D]`` views of one layer's packed cache (logical
    ``(num_blocks, H_kv, block_size, 2·D)``, as vLLM's FlashAttention backend allocates it); a uint8
    (fp8) cache is viewed as ``float8_e4m3fn``."""
    if kv_cache.dim() != 4 or kv_cache.shape[-1] != 2 * head_size:
        raise ValueError(f"kv_cache must be (num_blocks, H_kv, block_size, 2·{head_size}), got {tuple(kv_cache.shape)}")
    if kv_cache.dtype == torch.uint8:
        kv_cache = kv_cache.view(FP8)
    rows = kv_cache.transpose(1, 2)  # [num_blocks, block_size, H_kv, 2·D]
    if rows.stride(-1) != 1:
        raise ValueError("kv_cache's feature dimension must be contiguous (vLLM's NHD stride order)")
    return rows[..., :head_size], rows[..., head_size:]


class PagedDecoder:
    """santa's decode for every attention layer of one model in vLLM: a plan per (batch size, key
    capacity, score scale), and one scratch buffer, one semaphore array and (on Hopper) one set of the
    one-launch prop's buffers for all of them, sized for ``max_batch`` sequences (the layers and the CUDA
    graphs of every batch size run one at a time on one stream, :meth:`Workspace.within`,
    :class:`santa.kernels.one_launch.Buffers`). On an sm_90 GPU, plans run the one-launch
    prop on vLLM's pages (bf16 and fp8 caches); plans made while vLLM captures a CUDA graph cannot (their schedule would be copied
    inside the graph) and run the Triton prop, so :meth:`prepare` makes those of the captured batch sizes first.

    heads, kv_heads, head_dim: the layer's; block_size: vLLM's kernel block (the cache's page);
    max_keys: the most keys a sequence can hold (the block table's width · block_size);
    kernel: ``"prop"`` or ``"flash"``; budget: S; seed: santa's root seed; dtype: q's (the model's);
    kv_dtype: the cache's (the model's, or ``torch.float8_e4m3fn``); tuning: prop's launch parameters
    (:class:`santa.kernels.Tuning`; None: the measured defaults); head_offset: the global index of this
    decoder's first query head (tensor parallelism: ``tp_rank × heads``; 0 on one GPU), an int ≥ 0 that the
    draws' head counter adds (:meth:`santa.kernels.DecodePlan.run`); error_target: a relative error ε (prop; None: every
    head draws the budget), the budget then the cap (:mod:`santa.error_target`); gated: the runs pass a gate
    (``enabled``) that closes on short steps, so a Triton plan whose default pass-1 grid is cut takes
    :data:`GATED_PASS1_PROGRAMS` programs instead (where ``tuning`` sets no grid)."""

    def __init__(self, *, heads: int, kv_heads: int, head_dim: int, block_size: int, max_keys: int, max_batch: int,
                 budget: int, kernel: str, seed: int, dtype: torch.dtype, kv_dtype: torch.dtype, device: torch.device | str,
                 tuning: Tuning | None = None, head_offset: int = 0, error_target: float | None = None, gated: bool = False):
        self.heads, self.kv_heads, self.head_dim, self.block_size = heads, kv_heads, head_dim, block_size
        self.error_target = error_target  # checked by plan_decode: budgets from it, budget the cap
        self.head_offset = integer("head_offset", head_offset, low=0)
        self.max_keys, self.max_batch, self.budget, self.kernel = max_keys, max_batch, budget, kernel
        self.seed = rng.check_seed(seed)
        self.dtype, self.kv_dtype, self.device = dtype, kv_dtype, torch.device(device)
        self.tuning, self.gated = tuning, gated
        self._plans: dict[tuple, tuple[DecodePlan, Workspace]] = {}
        self._scratch: torch.Tensor | None = None
        self._semaphores: torch.Tensor | None = None
        self._one_launch: one_launch.Buffers | None = None
        self._scales: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._positions = torch.zeros(max_batch, dtype=torch.int32, device=self.device)
        self._prepared: tuple[int, ...] = ()  # the batch sizes prepare() made plans for, ascending
        # a gated decoder's calls outside a graph pass this open gate: the kernels they launch are then the gated ones its
        # graphs captured (a Triton plan's GATED variant), so no kernel is first compiled while a server runs
        self._open_gate = torch.ones(1, dtype=torch.int32, device=self.device) if gated else None

    def allocate(self) -> None:
        """Allocate the shared scratch buffer and semaphores now (vLLM's builder calls this at start-up, outside
        any CUDA-graph capture); an out-of-memory error names what to lower."""
        if self._scratch is not None:
            return
        nbytes = self.workspace_nbytes()
        try:
            self._scratch = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
        except torch.cuda.OutOfMemoryError as error:
            raise torch.cuda.OutOfMemoryError(
                f"santa's decode workspace needs {nbytes / 2**30:.2f} GiB ({self.max_batch} sequences × {self.max_keys} keys) "
                "after vLLM's KV cache: lower gpu_memory_utilization, max_num_seqs or max_model_len") from error
        self._semaphores = torch.zeros(self.max_batch * self.heads, dtype=torch.int32, device=self.device)

    def one_launch_nbytes(self) -> int:
        """Bytes of the one-launch prop's shared buffers (0 before the first plan that runs it: none where no plan can)."""
        buffers = self._one_launch
        return 0 if buffers is None else sum(t.numel() * t.element_size() for t in (buffers.stats, buffers.sampled, buffers.epoch))

    def prepare(self, batches, scale: float) -> int:
        """Make the plans of these batch sizes (those ≤ ``max_batch``) for ``max_keys`` keys at ``scale`` now, outside any
        CUDA-graph capture (vLLM's builder passes its captured sizes): their one launches' schedules go to the device
        here. Returns how many plans were made."""
        made, sizes = 0, sorted({int(b) for b in batches if 0 < int(b) <= self.max_batch})
        for batch in sizes:
            if (batch, self.max_keys, scale) not in self._plans:
                self.plan(batch, self.max_keys, scale)
                made += 1
        self._prepared = tuple(sorted({*self._prepared, *sizes}))
        return made

    def padded_batch(self, batch: int) -> int:
        """The rows a call of ``batch`` sequences runs on: the smallest batch size :meth:`prepare` made a plan for that
        holds them, or ``batch`` itself past the largest. The decode rows of an eager step (a mixed one, or a count
        without a captured graph) are padded to it with empty rows (length 0, output 0) by santa's vLLM backend
        (``SantaStep.rows``), so they run a plan that exists, on the kernels the captured graphs already run, instead of
        making a plan, and compiling its kernels, while a server runs."""
        at = bisect.bisect_left(self._prepared, batch)
        return self._prepared[at] if at < len(self._prepared) else batch

    def workspace_nbytes(self) -> int:
        """Bytes of the shared scratch buffer (sized for ``max_batch`` sequences of ``max_keys`` keys)."""
        return workspace_bytes(self.max_batch, self.heads, self.head_dim, self.max_keys, self.budget, self.kernel)

    def plan(self, batch: int, n_keys: int, scale: float) -> tuple[DecodePlan, Workspace]:
        """The plan and workspace of one call shape (made on first use; the buffers on the first plan)."""
        key = (batch, n_keys, scale)
        if key not in self._plans:
            if batch > self.max_batch or n_keys > self.max_keys:
                raise ValueError(f"a decode batch of {batch} sequences × {n_keys} keys exceeds what santa's workspace was sized "
                                 f"for ({self.max_batch} × {self.max_keys}: vLLM's max_num_seqs × max_model_len)")
            plan = plan_decode(batch=batch, heads=self.heads, kv_heads=self.kv_heads, head_dim=self.head_dim, n_keys=n_keys,
                               budget=self.budget, dtype=self.dtype, kv_dtype=self.kv_dtype, device=self.device,
                               kernel=self.kernel, page_size=self.block_size, scale=scale, tuning=self.tuning_for(batch, n_keys),
                               error_target=self.error_target)
            self.allocate()
            if plan.one_launch is not None and self._one_launch is None:  # the first plan that runs it (never inside a
                # capture: a plan made there runs the Triton prop), sized for every batch size's plan
                self._one_launch = one_launch.Buffers.allocate(batch=self.max_batch, heads=self.heads, kv_heads=self.kv_heads,
                                                               budget=self.budget, slots=one_launch.MAX_ONE_WAVE_SLICES,
                                                               device=self.device)
            workspace = Workspace.within(plan.workspace_key, scratch=self._scratch, semaphores=self._semaphores,
                                         one_launch_buffers=self._one_launch)
            self._plans[key] = (plan, workspace)
        return self._plans[key]

    def tuning_for(self, batch: int, n_keys: int) -> Tuning | None:
        """The plan's tuning: ``tuning``, or on a gated decoder whose default pass-1 grid (a program per tile of every
        (sequence, KV head)) would be cut, :data:`GATED_PASS1_PROGRAMS` programs, never fewer than 8 per (sequence, KV
        head) (the most rows measured, 512, had 8 each; past 8,192 rows the default cut already gives no more than 8), so
        each keeps that much parallelism over its tiles (one-launch plans ignore it). ``tuning`` is checked first
        (:func:`santa.kernels.plan.checked_tuning`: a bad field named)."""
        tuning = checked_tuning(self.tuning)
        if not self.gated or self.kernel != "prop" or tuning.pass1_programs is not None:
            return self.tuning
        rows, tiles = batch * self.kv_heads, -(-n_keys // prop_tile(self.head_dim, tuning))
        default = prop_pass1_tiles(tiles, rows, tuning)  # pass-1 programs per row, as prop launches them
        gated = dataclasses.replace(tuning, pass1_programs=max(GATED_PASS1_PROGRAMS, 8 * next_pow2(rows)))
        return gated if default < tiles and prop_pass1_tiles(tiles, rows, gated) < default else self.tuning

    def positions(self, seq_lens: torch.Tensor) -> torch.Tensor:
        """Each decode token's position in its sequence, ``seq_lens − 1`` (0 for a padded row), int32 ``[B]``, in a
        buffer that keeps its address: computed once per step for every layer (vLLM's metadata builder calls it)."""
        if seq_lens.shape[0] > self._positions.shape[0]:  # a batch past max_batch (plan() refuses it for santa)
            return (seq_lens - 1).clamp_min(0).int()
        out = self._positions[: seq_lens.shape[0]]
        torch.sub(seq_lens, 1, out=out)
        return out.clamp_min_(0)

    def scales(self, layer: int, k_scale: torch.Tensor, v_scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A layer's fp8 scales as santa takes them, float32 ``[H_kv]``, refreshed from vLLM's 0-d scale
        tensors (``layer._k_scale``, ``layer._v_scale``) in buffers that keep their addresses (CUDA graphs)."""
        if layer not in self._scales:
            self._scales[layer] = tuple(torch.empty(self.kv_heads, dtype=torch.float32, device=self.device) for _ in range(2))
        k, v = self._scales[layer]
        k.copy_(k_scale.float().expand(self.kv_heads))
        v.copy_(v_scale.float().expand(self.kv_heads))
        return k, v

    def run(self, query: torch.Tensor, kv_cache: torch.Tensor, *, seq_lens: torch.Tensor, block_table: torch.Tensor,
            layer: int, scale: float, out: torch.Tensor, k_scale: torch.Tensor | None = None,
            v_scale: torch.Tensor | None = None, positions: torch.Tensor | None = None,
            enabled: torch.Tensor | None = None) -> torch.Tensor:
        """One decode step of one layer into ``out``: query ``[B, H, D]`` (one token per sequence, in the
        model's dtype), kv_cache the layer's packed cache (:func:`split_kv_cache`), seq_lens int32 ``[B]``
        (keys per sequence, the new token's included; 0 for a padded row, whose output is 0),
        block_table int32 ``[B, max_blocks]``, k_scale / v_scale vLLM's 0-d fp8 scales (fp8 caches), positions
        :meth:`positions` of this step (computed here when not given), enabled an int32 ``[1]`` gate on the device (0:
        the call writes nothing; :meth:`santa.kernels.DecodePlan.run`; a gated decoder passes its own open gate when none is given,
        so that its calls outside a graph launch the kernels its graphs captured).
        Draws are keyed on (seed, layer, global head = head_offset + h, position = seq_lens − 1, sample). Nothing is
        read on the host."""
        k_cache, v_cache = split_kv_cache(kv_cache, self.head_dim)
        batch, n_keys = query.shape[0], block_table.shape[1] * self.block_size
        plan, workspace = self.plan(batch, n_keys, scale)
        scales = {}
        if k_cache.dtype == FP8:
            k_scales, v_scales = self.scales(layer, k_scale, v_scale)
            scales = dict(k_scale=k_scales, v_scale=v_scales)
        if positions is None:
            positions = self.positions(seq_lens)
        if enabled is None:
            enabled = self._open_gate
        return plan.run(query, k_cache, v_cache, seq_lens=seq_lens, block_table=block_table, seed=rng.layer_key(self.seed, layer),
                        positions=positions, out=out, workspace=workspace, head_offset=self.head_offset, enabled=enabled,
                        **scales)
