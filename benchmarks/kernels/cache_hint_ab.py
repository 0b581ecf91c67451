"""Cache hints for prop, A/B in one process: the whole call (pass 1 + pass 2, CUDA graph, clean cold L2)
with eviction hints on pass 1's K loads and on its stash and statistics stores.

Written against the kernels before b4a3ea2 (edits of their source text; run it on `git archive
839af13 src` as the first path on PYTHONPATH). Since b4a3ea2 the K hint is a plan choice: at HEAD,
``python -m santa.bench.kernels --only-tune --tune-variants k_evict_firstTrue k_evict_firstFalse``.

The idea: pass 1 streams K once (it never needs to stay in L2) and writes a stash that pass 2 reads
right after (for B·H·n·4 bytes up to ~50 MB it could stay in the H200's L2). Each variant is
``_common.py`` and ``prop.py`` with hint arguments added, written to temporary modules (Triton reads a
kernel's source from its file) and launched with the plan's own arguments; the samples do not change.

    python benchmarks/kernels/cache_hint_ab.py OUT.json [--cases 1x8192,8x32768,...] [--heads H --kv-heads H_kv --head-dim d]
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import torch
from kernel_variants import case_inputs, load_module, shape_parser

K_LOAD = "    k = tl.load(k_ptr + k_rows[:, None] + offs_d[None, :], mask=k_ok[:, None] & mask_d[None, :], other=0.0)\n"
STASH_STORE = "u, mask=mask_g[:, None])\n"
STATS_STORES = ("+ t, m, mask=mask_g)\n", "+ t, mass, mask=mask_g)\n")

EDITS = {  # name → (file, old, new)
    "k_evict_first": [("common", K_LOAD, K_LOAD.replace("other=0.0)", 'other=0.0, eviction_policy="evict_first")'))],
    "k_cg": [("common", K_LOAD, K_LOAD.replace("other=0.0)", 'other=0.0, cache_modifier=".cg")'))],
    "stash_evict_last": [("prop", STASH_STORE, STASH_STORE.replace("])", '], eviction_policy="evict_last")'))],
    "stats_evict_last": [("prop", old, old.replace("mask_g)", 'mask_g, eviction_policy="evict_last")')) for old in STATS_STORES],
}
VARIANTS = {
    "base": [], "k_evict_first": ["k_evict_first"], "stash_evict_last": ["stash_evict_last"],
    "k_ef+stash_el": ["k_evict_first", "stash_evict_last"],
    "k_ef+stash_el+stats_el": ["k_evict_first", "stash_evict_last", "stats_evict_last"],
    "k_cg+stash_el": ["k_cg", "stash_evict_last"],
}


def load_variant(name: str, edits: list[str], folder: Path):
    import santa.kernels._common as common
    import santa.kernels.prop as prop

    sources = {"common": Path(common.__file__).read_text(), "prop": Path(prop.__file__).read_text()}
    for edit in edits:
        for file, old, new in EDITS[edit]:
            if old not in sources[file]:
                raise SystemExit(f"{edit}: the {file} source no longer has the line this edit changes (see the docstring)")
            sources[file] = sources[file].replace(old, new)
    tag = name.replace("+", "_")
    sources["prop"] = sources["prop"].replace("from santa.kernels._common import", f"from common_{tag} import")
    load_module(f"common_{tag}", sources["common"], folder)
    return load_module(f"prop_{tag}", sources["prop"], folder)


def main(argv=None) -> int:
    from santa.bench.kernels import Flusher, measure
    from santa.kernels._launch import current_stream

    parser = shape_parser(__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="times each variant, in alternating order")
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS))
    args = parser.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="santa_hints_"))
    modules = {name: load_variant(name, VARIANTS[name], folder) for name in args.variants}
    flusher = Flusher(torch.device("cuda"))
    results = {}
    for case in args.cases.split(","):
        tag, plan, (key, call_args, tensors) = case_inputs(args, case)
        calls = {}
        for name, module in modules.items():
            stages = [launcher for _, launcher in module.prop_launchers(plan, has_seq_lens=False, offset_in_memory=False,
                                                                         return_counts=False)]

            def call(stages=stages, plan=plan, launch=(key, call_args, tensors)):
                stream = current_stream(plan.cuda_index)
                for launcher in stages:
                    launcher(*launch, stream)

            call()  # compile
            torch.cuda.synchronize()
            calls[name] = call
        names = list(calls)
        for round_ in range(args.rounds):
            for name in (names if round_ % 2 == 0 else names[::-1]):
                measure(results, f"{tag}/prop_S{args.budget}/{name}/r{round_}", calls[name], flusher)
    Path(args.out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
