"""Where prop's pass 2 spends its time: pass 2 timed alone (CUDA graph, clean cold L2) with one of its
stages removed at a time. Timing only: the ablated kernels give wrong outputs.

Each variant is prop.py's source with one stage replaced by a trivial stand-in, written to a temporary
module (Triton reads a kernel's source from its file) and launched with the plan's own arguments:

- ``no_search``: every sample's tile from its index (``m·T/S``), no tile statistics, no prefix
- ``no_intile``: the key is the tile's ``m mod BLOCK_N``-th, no stash load or in-tile cumsum
- ``no_gather``: no V row loaded (the row offsets summed instead)
- ``no_reduce``: every chunk stores its partial as the output (no semaphore, no second pass over partials)
- ``nothing``: all four removed (launch, Philox and the stores only)

    python benchmarks/kernels/pass2_ablation.py OUT.json [--cases 1x8192,8x32768,...] [--heads H --kv-heads H_kv --head-dim d]
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import torch
from kernel_variants import case_inputs, load_module, shape_parser

SEARCH = """    tile, lo, hi, z, poisoned = _tile_prefix_search(
        tile_max_ptr, tile_mass_ptr, prefix_ptr, stats_row, n_tiles, tiles_max, u, m_f, budget_f, valid_s,
        SBLOCK, BLOCK_T, ONE_CHUNK_T, BISECT, LOG_T, CM,
    )
"""
NO_SEARCH = """    tile = (offs_s * n_tiles) // budget
    lo = m_f
    hi = m_f + 1.0
    z = 1.0
    poisoned = bad_len
"""
INTILE_START = "    stash = tl.load(\n        stash_ptr + row.to(tl.int64) * stride_stash + pos,"
INTILE_END = "    key = tile * BLOCK_N + tl.minimum(j, last_nonzero)\n"
NO_INTILE = "    key = tile * BLOCK_N + (offs_s % BLOCK_N)\n"
GATHER = "    vals = tl.load(v_ptr + v_rows[:, None] + offs_d[None, :], mask=v_ok[:, None] & mask_d[None, :], other=0.0)\n"
NO_GATHER = "    vals = (v_rows[:, None] + offs_d[None, :]).to(tl.float32)\n"
REDUCE = "    if N_CHUNKS == 1:\n"
NO_REDUCE = "    if True:\n"


def variant_source(source: str, removed: set[str]) -> str:
    def swap(text, old, new):
        assert old in text, old[:60]
        return text.replace(old, new)

    if "search" in removed:
        source = swap(source, SEARCH, NO_SEARCH)
    if "intile" in removed:
        start, end = source.index(INTILE_START), source.index(INTILE_END) + len(INTILE_END)
        source = source[:start] + NO_INTILE + source[end:]
    if "gather" in removed:
        source = swap(source, GATHER, NO_GATHER)
    if "reduce" in removed:
        source = swap(source, REDUCE, NO_REDUCE)
    return source


VARIANTS = {
    "full": set(), "no_search": {"search"}, "no_intile": {"intile"}, "no_gather": {"gather"},
    "no_reduce": {"reduce"}, "nothing": {"search", "intile", "gather", "reduce"},
}


def main(argv=None) -> int:
    import santa.kernels.prop as prop
    from santa.bench.kernels import Flusher, measure
    from santa.kernels._launch import current_stream

    args = shape_parser(__doc__.splitlines()[0]).parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="santa_ablation_"))
    source = Path(prop.__file__).read_text()
    modules = {name: load_module(f"prop_{name}", variant_source(source, removed), folder) for name, removed in VARIANTS.items()}
    flusher = Flusher(torch.device("cuda"))
    results = {}
    for case in args.cases.split(","):
        tag, plan, (key, call_args, tensors) = case_inputs(args, case)
        stream = current_stream(plan.cuda_index)
        for name, module in modules.items():
            stages = dict(module.prop_launchers(plan, has_seq_lens=False, offset_in_memory=False, return_counts=False))
            stages["pass1"](key, call_args, tensors, stream)
            stages["pass2"](key, call_args, tensors, stream)  # compile; the stash now holds this input's pass 1
            torch.cuda.synchronize()
            measure(results, f"{tag}/pass2/{name}",
                    lambda p2=stages["pass2"], plan=plan, launch=(key, call_args, tensors): p2(*launch, current_stream(plan.cuda_index)),
                    flusher)
    Path(args.out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
