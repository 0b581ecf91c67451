"""Cache hints for prop, A/B in one process: the whole call (pass 1 + pass 2, CUDA graph, clean cold L2)
with eviction hints on pass 1's K loads and on its stash and statistics stores.

The idea: pass 1 streams K once (it never needs to stay in L2) and writes a stash that pass 2 reads
right after (for B·H·n·4 bytes up to ~50 MB it could stay in the H200's L2). Each variant is
``_common.py`` and ``prop.py`` with hint arguments added, written to temporary modules (Triton reads a
kernel's source from its file) and launched with the plan's own arguments; the samples do not change.

    python benchmarks/kernels/cache_hint_ab.py OUT.json [--cases 1x8192,8x32768,...] [--heads H --kv-heads H_kv --head-dim d]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
from pathlib import Path

import torch

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
            assert old in sources[file], (edit, old[:60])
            sources[file] = sources[file].replace(old, new)
    tag = name.replace("+", "_")
    sources["prop"] = sources["prop"].replace("from santa.kernels._common import", f"from common_{tag} import")
    modules = {}
    for file in ("common", "prop"):
        path = folder / f"{file}_{tag}.py"
        path.write_text(sources[file])
        spec = importlib.util.spec_from_file_location(f"{file}_{tag}", path)
        modules[file] = importlib.util.module_from_spec(spec)
        sys.modules[f"{file}_{tag}"] = modules[file]
        spec.loader.exec_module(modules[file])
    return modules["prop"]


def main(argv=None) -> int:
    from santa.bench.kernels import Flusher, measure
    from santa.kernels import plan_decode
    from santa.kernels._launch import current_stream

    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--cases", default="1x8192,1x32768,1x131072,8x32768,32x32768")
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--budget", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=2, help="times each variant, in alternating order")
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS))
    args = parser.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="santa_hints_"))
    sys.path.insert(0, str(folder))
    modules = {name: load_variant(name, VARIANTS[name], folder) for name in args.variants}
    flusher = Flusher(torch.device("cuda"))
    results = {}
    for case in args.cases.split(","):
        batch, n_keys = (int(x) for x in case.split("x"))
        torch.manual_seed(0)
        q = torch.randn(batch, args.heads, args.head_dim, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(batch, n_keys, args.kv_heads, args.head_dim, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        out = torch.empty_like(q)
        plan = plan_decode(batch=batch, heads=args.heads, kv_heads=args.kv_heads, head_dim=args.head_dim, n_keys=n_keys,
                           budget=args.budget, dtype=q.dtype, device="cuda")
        key, call_args, tensors = plan._arguments(q, k, v, None, None, 0, 0, out, None, None)
        calls = {}
        for name, module in modules.items():
            stages = [launcher for _, launcher in module.prop_launchers(plan, has_seq_lens=False, offset_in_memory=False,
                                                                         return_counts=False)]

            def call(stages=stages):
                stream = current_stream(plan.cuda_index)
                for launcher in stages:
                    launcher(key, call_args, tensors, stream)

            call()  # compile
            torch.cuda.synchronize()
            calls[name] = call
        names = list(calls)
        for round_ in range(args.rounds):
            for name in (names if round_ % 2 == 0 else names[::-1]):
                measure(results, f"b{batch}/n{n_keys}/prop_S{args.budget}/{name}/r{round_}", calls[name], flusher)
    Path(args.out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
