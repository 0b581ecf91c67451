"""prop's pass 2 (``_prop_gather_kernel``) compiled for the H200 (sm_90) without a GPU: SASS instructions and a digest of
the SASS text per variant, for whichever santa is first on the path. Two trees give the same digest exactly when their
kernels compile to the same instructions (kernel parameters' offsets masked: an added parameter moves them), so a
change meant to touch one variant (an error target's) can be shown to leave the others (fixed budgets) as they were
before any GPU time is spent.

    PYTHONPATH=src python benchmarks/kernels/pass2_sass.py
    PYTHONPATH=OLD/src python benchmarks/kernels/pass2_sass.py      # then compare the digests

Variants: Llama-3.1-8B heads (G = 4, d = 128, 128-key tiles, 8 warps, positional draws): the tile scan with one tile
block, with counts, the bisection with the mode-2 stash discard, a paged cache, and an error target's pilot.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from santa.kernels.prop import _prop_gather_kernel

POINTERS = dict(v_ptr="*bf16", bt_ptr="*i32", seq_lens_ptr="*i32", stash_ptr="*fp32", tile_max_ptr="*fp32",
                tile_mass_ptr="*fp32", prefix_ptr="*fp32", partial_ptr="*fp32", sem_ptr="*i32", out_ptr="*bf16",
                counts_ptr="*i32", offset_ptr="*i64", v_scale_ptr="*fp32", seeds_ptr="*i64", positions_ptr="*i64",
                starts_ptr="*i32", budgets_ptr="*i32", enabled_ptr="*i32")  # enabled_ptr: a gated launch's (newer trees)
BASE = dict(G=4, D=128, BLOCK_D=128, BLOCK_N=128, BLOCK_T=256, SBLOCK=32, N_CHUNKS=4, CHUNK_BLOCK=4, ONE_CHUNK_T=True,
            BISECT=False, LOG_T=9, PAGED=False, PAGE_SIZE=1, HAS_SEQ_LENS=True, OFFSET_IN_MEMORY=False, RETURN_COUNTS=False,
            USE_PDL=False, DISCARD=1, V_SCALE_PER_HEAD=False, SEED_PER_SEQUENCE=False, POSITIONAL=True, HAS_STARTS=False,
            PILOT=0, PBLOCK=2)
VARIANTS = {
    "scan": {}, "scan, counts": dict(RETURN_COUNTS=True),
    "bisect, discard 2": dict(BISECT=True, ONE_CHUNK_T=False, BLOCK_T=1024, LOG_T=11, DISCARD=2, N_CHUNKS=16, CHUNK_BLOCK=16,
                              SBLOCK=8),
    "paged": dict(PAGED=True, PAGE_SIZE=16), "error target": dict(PILOT=16, PBLOCK=16, N_CHUNKS=8, CHUNK_BLOCK=8),
    "gated": dict(GATED=True),  # DecodePlan.run's enabled (trees that have it)
}
ADDRESS = re.compile(r"/\*[0-9a-f]{4,}\*/")  # until 2026-12-04 {4}: kernels past 4,096 instructions lost their tail
ENCODING = re.compile(r"/\*\s*0x[0-9a-f]+\s*\*/")
PARAMETER = re.compile(r"c\[0x0\]\[0x[0-9a-f]+\]")  # a kernel parameter's offset: moves when a parameter is added


def sass(constants: dict) -> str:
    """The kernel's SASS instructions, one per line, addresses dropped."""
    fn = _prop_gather_kernel
    if "GATED" in fn.arg_names:
        constants = dict(dict(GATED=False), **constants)
    signature = {}
    for name in fn.arg_names:
        if name in POINTERS:
            signature[name] = POINTERS[name]
        elif name in constants:
            signature[name] = "constexpr"
        else:
            signature[name] = "fp32" if name in ("v_scale", "inv_target2") else "i64" if name in ("seed", "offset") else "i32"
    kernel = triton.compile(ASTSource(fn, signature=signature, constexprs=constants), target=GPUTarget("cuda", 90, 32),
                            options=dict(num_warps=8, num_stages=1))
    tools = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(kernel.asm["cubin"])
        cubin.flush()
        text = subprocess.run([os.path.join(tools, "cuobjdump"), "-sass", cubin.name], capture_output=True, text=True,
                              check=True).stdout
    return "\n".join(PARAMETER.sub("c[0x0][param]", ENCODING.sub("", ADDRESS.sub("", line))).strip()
                     for line in text.splitlines() if ADDRESS.search(line))


def main() -> None:
    for label, changes in VARIANTS.items():
        if "GATED" in changes and "GATED" not in _prop_gather_kernel.arg_names:
            continue  # a tree from before the gate
        text = sass(dict(BASE, **changes))
        print(f"{label:18s} {text.count(chr(10)) + 1:5d} SASS  {hashlib.sha256(text.encode()).hexdigest()[:16]}", flush=True)


if __name__ == "__main__":
    main()
