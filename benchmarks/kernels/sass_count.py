"""prop's pass 1 compiled for the H200 (sm_90) on any machine, no GPU needed: registers, shared memory and
the SASS instructions by opcode, for bf16 K (one tile per program, and the looped grid a plan far past its
sequences launches: ``santa.kernels.layout.PASS1_PROGRAMS``; a gated launch; a call with ``starts``, whose tiles are cut
from each sequence's first key), fp8 K read as float16 (what the plan launches for a bf16 q,
``DecodePlan.k_f16``) and, for contrast, fp8 K read as bf16 (the conversion that path avoids: 128 ``F2F`` per thread
and tile; timed slower on the H200, benchmarks/RESULTS.md, 2026-12-02); Llama-3.1-8B heads (G = 4, d = 128, 128-key tiles, 4 warps). Divisibility hints as Triton's JIT gives
them for contiguous NHD caches (pointers and strides multiples of 16).

    python benchmarks/kernels/sass_count.py [--json OUT]

Instruction counts are per thread and per program (static: a loop's body counts once); they say where issue slots go,
not how long a launch takes: timings come from ``santa bench kernels`` on the GPU.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from santa.kernels.prop import _prop_scores_kernel
from santa.provenance import run_record

CONSTANTS = dict(G=4, D=128, BLOCK_G=16, BLOCK_N=128, BLOCK_D=128, PAGED=False, PAGE_SIZE=1, HAS_SEQ_LENS=True,
                 IEEE_DOT=False, K_EVICTION="", K_SCALE_PER_HEAD=True, HAS_STARTS=False)
# pointers of the kernel's signature (enabled_ptr: where this tree's kernel has one, a gated launch's)
POINTERS = dict(q_ptr="*bf16", k_ptr="*bf16", bt_ptr="*i32", seq_lens_ptr="*i32", stash_ptr="*fp32", tile_max_ptr="*fp32",
                tile_mass_ptr="*fp32", k_scale_ptr="*fp32", starts_ptr="*i32", enabled_ptr="*i32")
DIVISIBLE = ("stride_qb", "stride_qh", "stride_kb", "stride_kn", "stride_kh", "stride_stash", "stride_stats", "n_keys")
VARIANTS = {"bf16 K": ("*bf16", False, False, False, False), "fp8 K as bf16": ("*fp8e4nv", False, False, False, False),
            "fp8 K as f16": ("*fp8e4nv", True, False, False, False),  # K's type, K_F16,
            "bf16 K, looped grid": ("*bf16", False, True, False, False), "bf16 K, gated": ("*bf16", False, False, True, False),
            "bf16 K, starts": ("*bf16", False, False, False, True)}  # LOOP, GATED, HAS_STARTS (tiles cut from a first key)
SASS_LINE = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)")


def compiled(k_type: str, k_f16: bool, loop: bool, gated: bool, starts: bool = False):
    fn = _prop_scores_kernel
    signature = {}
    for name in fn.arg_names:
        if name in POINTERS:
            signature[name] = k_type if name == "k_ptr" else POINTERS[name]
        elif name in CONSTANTS or name in ("K_F16", "LOOP", "GATED"):  # HAS_STARTS is in CONSTANTS
            signature[name] = "constexpr"
        else:
            signature[name] = "fp32" if "scale" in name else ("i64" if name == "stride_kb" else "i32")
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in (*POINTERS, *DIVISIBLE) if n in fn.arg_names}
    constexprs = dict(CONSTANTS, K_F16=k_f16, LOOP=loop, HAS_STARTS=starts, **({"GATED": gated} if "GATED" in fn.arg_names else {}))
    source = ASTSource(fn, signature=signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4, num_stages=1))


def sass_counts(kernel) -> tuple[collections.Counter, str]:
    tools = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(kernel.asm["cubin"])
        cubin.flush()
        sass = subprocess.run([os.path.join(tools, "cuobjdump"), "-sass", cubin.name], capture_output=True, text=True, check=True).stdout
        usage = subprocess.run([os.path.join(tools, "cuobjdump"), "--dump-resource-usage", cubin.name], capture_output=True,
                               text=True, check=True).stdout
    return collections.Counter(m.group(1).split(".")[0] for m in SASS_LINE.finditer(sass)), usage


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", help="write the counts here too")
    args = parser.parse_args()
    report = {}
    for label, (k_type, k_f16, loop, gated, starts) in VARIANTS.items():
        if gated and "GATED" not in _prop_scores_kernel.arg_names:
            continue  # a tree from before the gate
        counts, usage = sass_counts(compiled(k_type, k_f16, loop, gated, starts))
        registers = int(re.search(r"REG:(\d+)", usage).group(1))
        report[label] = dict(registers=registers, sass=sum(counts.values()), by_opcode=dict(counts.most_common()))
        top = ", ".join(f"{op} {n}" for op, n in counts.most_common(8))
        print(f"{label:14s} {registers:3d} registers, {sum(counts.values()):4d} SASS per thread and program "
              f"(F2F {counts['F2F']}, F2FP {counts['F2FP']}, HMMA {counts['HMMA']}, LDGSTS {counts['LDGSTS']}); {top}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(run=run_record(), triton=triton.__version__, target="sm_90", report=report), f, indent=1)


if __name__ == "__main__":
    main()
