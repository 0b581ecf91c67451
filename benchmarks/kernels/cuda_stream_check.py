"""Issue 24's first check in CUDA C++: does a stream phase written in CUDA read K faster than Triton's pass 1?

``cuda_stream/stream.cu`` (compiled here with nvcc, launched through the driver API with ctypes on torch's
stream, so it is captured in CUDA graphs like any launch) reads each group's keys once in C slices, scores the
group's G query heads and keeps each slice's (max, mass) per head: the stream phase of the one-launch prop the
issue describes, without the sample phase. It is checked against torch (the statistics, float32) and timed in
the same process as santa's pass 1 alone and santa's whole prop step (S = 128) on the same inputs: CUDA-graph
replay, clean cold L2, medians (benchmarks/bench/timing.py). The issue's bar: the stream phase ≥ 1.5 µs faster
than pass 1 at Llama 32k.

    python benchmarks/kernels/cuda_stream_check.py OUT.jsonl [COMMIT]

One JSON line per case (its name as "key", with device, torch, commit and ptxas's report), appended as it is
measured; a re-run skips the cases already in OUT.jsonl, and a second run on the same file is refused while the
first holds it (``santa.writer_lock``).
"""

from __future__ import annotations

import ctypes
import math
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, ".")
from benchmarks.bench.timing import Flusher, time_fn  # noqa: E402

from santa.kernels.one_launch import CudaModule, kept_bytes  # noqa: E402
from santa.provenance import run_record

SOURCE = Path(__file__).with_name("cuda_stream") / "stream.cu"
# (name, batch, keys, q heads, kv heads, head dim)
CASES = [("llama 8k", 1, 8192, 32, 8, 128), ("llama 32k", 1, 32768, 32, 8, 128), ("llama 128k", 1, 131072, 32, 8, 128),
         ("llama B=8 x 32k", 8, 32768, 32, 8, 128), ("llama B=32 x 32k", 32, 32768, 32, 8, 128),
         ("qwen B=16 x 32k", 16, 32768, 14, 2, 64), ("smollm2 B=64 x 8k", 64, 8192, 9, 3, 64)]
# (dim, group) → [(kernel, keys per CTA step)]: scores on CUDA cores (stream_*), on tensor cores (mma_*)
SCORING = {(128, 4): [("stream_d128_g4_u4", 64), ("stream_d128_g4_u8", 128), ("mma_d128_g4_u1", 64), ("mma_d128_g4_u2", 128)],
           (64, 7): [("stream_d64_g7_u4", 128), ("mma_d64_g7_u4", 256)],
           (64, 3): [("stream_d64_g3_u4", 128), ("stream_d64_g3_u8", 256), ("mma_d64_g3_u4", 256)]}
# the tensor-core stream that also keeps placement's data: its scores in shared memory (what prop1_* keeps), checked
# through their 8-key subtiles' (m_i, ℓ_i); timed where they fit the default 48 KB
KEEPING = {(128, 4): [("keep_d128_g4_u1", 64)], (64, 7): [("keep_d64_g7_u4", 256)], (64, 3): [("keep_d64_g3_u4", 256)]}
KEEP_TILE, SHARED_BYTES = 8, 48 * 1024
READS = {(128, 4): [("read_d128_g4_u4", 64), ("read_d128_g4_u8", 128)]}  # the same loads without scores: the read's own speed


class Kernels(CudaModule):
    """stream.cu's module (a cubin, or PTX the driver compiles) loaded from a file, with its ``__device__`` globals and
    a launcher for the stream kernels; launches go to torch's current stream (captured in CUDA graphs like any)."""

    def __init__(self, path: Path):
        super().__init__(Path(path).read_bytes())

    def _global(self, name: str) -> tuple[ctypes.c_uint64, int]:
        """The device address and size in bytes of the module's ``__device__`` variable ``name``."""
        ptr, size = ctypes.c_uint64(), ctypes.c_size_t()
        self._check(self.cuda.cuModuleGetGlobal_v2(ctypes.byref(ptr), ctypes.byref(size), self.module, name.encode()),
                    f"cuModuleGetGlobal({name})")
        return ptr, size.value

    def read_global(self, name: str, count: int) -> list[int]:
        """The module's ``__device__`` array ``name`` as ``count`` unsigned 64-bit words (synchronises the context)."""
        ptr, size = self._global(name)
        out = (ctypes.c_uint64 * count)()
        self._check(self.cuda.cuMemcpyDtoH_v2(out, ptr, ctypes.c_size_t(min(size, 8 * count))), "cuMemcpyDtoH")
        return list(out)

    def zero_global(self, name: str) -> None:
        """Set the module's ``__device__`` variable ``name`` to zeros (synchronises the context)."""
        ptr, size = self._global(name)
        self._check(self.cuda.cuMemsetD8_v2(ptr, ctypes.c_ubyte(0), ctypes.c_size_t(size)), "cuMemsetD8")

    def launch(self, name: str, grid: tuple[int, int, int], q, k, stats, n: int, hkv: int, slice_len: int, scale: float,
               tile_stats=None, shared_bytes: int = 0):
        values = [ctypes.c_void_p(q.data_ptr()), ctypes.c_void_p(k.data_ptr()), ctypes.c_void_p(stats.data_ptr()),
                  ctypes.c_int(n), ctypes.c_int(hkv), ctypes.c_int(slice_len), ctypes.c_float(scale)]
        if tile_stats is not None:  # the keep_* kernels
            values.append(ctypes.c_void_p(tile_stats.data_ptr()))
        self.launch_values(name, grid, values, shared_bytes=shared_bytes)


def build_module(module: Path) -> str:
    """nvcc the source into ``module`` for sm_90a (a ``.cubin``, or a ``.ptx`` that the driver compiles when it loads it:
    how a wheel without nvcc would ship it), with line info for ncu's source view (the SASS is the same without it:
    checked 2026-12-03); skipped where ``module`` and its build log are newer than the source (several runs in one
    device call build once). Returns the build log (ptxas's report); raises RuntimeError on a failed build."""
    log = module.with_name(module.name + ".log")  # one per module: a PTX build must not stand in for a cubin's ptxas report
    if not (log.exists() and module.exists() and min(module.stat().st_mtime, log.stat().st_mtime) > SOURCE.stat().st_mtime):
        kind = ["-ptx"] if module.suffix == ".ptx" else ["-cubin", "-Xptxas", "-v"]
        build = subprocess.run(["nvcc", "-arch=sm_90a", "-O3", "-lineinfo", *kind, "-o", str(module), str(SOURCE)],
                               capture_output=True, text=True)
        if build.returncode != 0:
            raise RuntimeError(f"nvcc failed:\n{build.stderr}")
        log.write_text(build.stderr)
    return log.read_text()


def start_run(cubin: Path, commit: str | None) -> tuple[Kernels, Flusher, dict]:
    """:func:`build_module` (exits on a failed build) and load it; the L2 flusher; what every record carries (device,
    torch, commit, ptxas's registers and spills)."""
    try:
        log = build_module(cubin)
    except RuntimeError as exc:
        sys.exit(str(exc))
    flusher = Flusher(torch.device("cuda"))  # torch first: the primary context the module loads into
    meta = {**run_record(), "device": torch.cuda.get_device_name(), "torch": torch.__version__, "commit": commit, "module": cubin.suffix[1:],
            "ptxas": [line for line in log.splitlines() if "Used" in line or "spill" in line]}
    return Kernels(cubin), flusher, meta


def run_cases(path: str, *, cases: list, cubin: Path, commit: str | None, measure, describe, holder: str) -> None:
    """Every case of ``cases`` not yet in the JSONL file ``path``: ``measure(kernels, flusher, batch=…, n=…, heads=…,
    kv_heads=…, dim=…)`` gives its record, appended as one line (key = the case's name) and printed through
    ``describe(name, record)``. A re-run skips the cases already there (a call cut at its limit resumes); a second run
    on the same file is refused while the first holds it (``santa.writer_lock``)."""
    from santa.sweep_files import append_record, read_records
    from santa.writer_lock import OutputUnusable, writer_lock

    try:
        with writer_lock(path, holder=holder):
            done = {record["key"] for record in read_records(path)}
            todo = [case for case in cases if case[0] not in done]
            if not todo:
                return
            kernels, flusher, meta = start_run(cubin, commit)
            for name, batch, n, heads, kv_heads, dim in todo:
                record = measure(kernels, flusher, batch=batch, n=n, heads=heads, kv_heads=kv_heads, dim=dim)
                append_record(path, {"key": name, **meta, **record})
                print(describe(name, record), flush=True)
    except OutputUnusable as error:  # another run holds the file, or it cannot be written: one line
        sys.exit(f"{holder}: {error}")


def reference_stats(q, k, slices: int, slice_len: int, tile: int | None = None) -> torch.Tensor:
    """Per slice and head, m = max s and l = Σ 2^(s − m), s = q·k · log2(e)/√D, float32: [B, H, C, 2]; with ``tile``,
    per ``tile``-key tile of each slice: [B, H, C, ⌈slice_len / tile⌉, 2]. An empty slice or tile has m = −inf, l = 0.
    One sequence at a time (the float32 copy of K stays small)."""
    block = tile or slice_len
    tiles = -(-slice_len // block)
    batch, heads, dim = q.shape
    n, kv_heads = k.shape[1], k.shape[2]
    out = torch.empty(batch, heads, slices, tiles, 2, device=q.device)
    for b in range(batch):
        qg = q[b].float().view(kv_heads, heads // kv_heads, dim)
        s = torch.einsum("kgd,nkd->kgn", qg, k[b].float()).reshape(heads, n) * (math.log2(math.e) / math.sqrt(dim))
        by_slice = torch.full((heads, slices * slice_len), -math.inf, device=q.device)
        by_slice[:, :n] = s
        padded = torch.full((heads, slices, tiles * block), -math.inf, device=q.device)
        padded[:, :, :slice_len] = by_slice.view(heads, slices, slice_len)
        padded = padded.view(heads, slices, tiles, block)
        m = padded.amax(-1)
        out[b, ..., 0] = m
        out[b, ..., 1] = torch.exp2(padded - m.unsqueeze(-1).clamp_min(-1e30)).sum(-1)
    return out if tile else out.squeeze(3)


def errors(stats: torch.Tensor, want: torch.Tensor) -> tuple[float, float]:
    """Largest |Δm| (empty slices, −inf in both, count as equal) and largest relative Δl."""
    same_inf = torch.isinf(want[..., 0]) & (stats[..., 0] == want[..., 0])
    m_err = torch.where(same_inf, 0.0, (stats[..., 0] - want[..., 0]).abs()).max().item()
    l_err = ((stats[..., 1] - want[..., 1]).abs() / want[..., 1].clamp_min(1e-30)).max().item()
    return m_err, l_err


def slice_choices(batch: int, kv_heads: int, n: int, keys_per_step: int) -> list[int]:
    """Slices per group C for about 1, 2, 4 and 8 waves of 2 CTAs per SM (132 SMs), at least one step of keys each."""
    groups, ctas = batch * kv_heads, 2 * torch.cuda.get_device_properties(0).multi_processor_count
    out = []
    for waves in (1, 2, 4, 8):
        c = max(1, round(waves * ctas / groups))
        c = min(c, max(1, n // keys_per_step))
        if c not in out:
            out.append(c)
    return out


def describe(name: str, case: dict) -> str:
    """One line per case: the best stream, pass 1, prop, and the loads-only and keeping variants where timed."""
    best = case["best"]
    reads = [(v["us"], key) for key, v in case["variants"].items() if key.startswith("read")]
    keeps = [(v["us"], key) for key, v in case["variants"].items() if key.startswith("keep")]
    return (f"{name}: stream {best['us']:.1f} µs ({best['variant']}), santa pass 1 {case['santa_pass1_us']:.1f}, "
            f"santa prop {case['santa_prop_us']:.1f}" + (f", read only {min(reads)[0]:.1f} ({min(reads)[1]})" if reads else "")
            + (f", keeping scores {min(keeps)[0]:.1f} ({min(keeps)[1]})" if keeps else ""))


def main() -> None:
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    run_cases(sys.argv[1], cases=CASES, cubin=Path("/tmp/santa_stream.cubin"), commit=sys.argv[2] if len(sys.argv) > 2 else None,
              measure=measure_case, describe=describe, holder="cuda_stream_check.py")


def random_inputs(*, batch: int, n: int, heads: int, kv_heads: int, dim: int):
    """q [B, H, d], K and V [B, n, H_kv, d]: bf16 normal draws on the GPU, seeded (every script, every backend)."""
    torch.manual_seed(0)
    q = torch.randn(batch, heads, dim, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(batch, n, kv_heads, dim, device="cuda", dtype=torch.bfloat16)
    return q, k, torch.randn_like(k)


def measure_case(kernels: Kernels, flusher: Flusher, *, batch: int, n: int, heads: int, kv_heads: int, dim: int) -> dict:
    """One shape: santa's prop step and pass 1 alone, then every stream variant (checked, then timed)."""
    from santa.kernels import plan_decode

    q, k, v = random_inputs(batch=batch, n=n, heads=heads, kv_heads=kv_heads, dim=dim)
    group = heads // kv_heads
    case = {"batch": batch, "keys": n, "heads": heads, "kv_heads": kv_heads, "head_dim": dim,
            "k_mb": k.numel() * 2 / 1e6, "variants": {}}
    plan = plan_decode(batch=batch, heads=heads, kv_heads=kv_heads, head_dim=dim, n_keys=n, budget=128,
                       dtype=q.dtype, device=q.device)
    out = torch.empty_like(q)
    case["santa_prop_us"] = time_fn(lambda: plan.run(q, k, v, out=out), flusher.read, graph=True)["median_us"]
    case["santa_pass1_us"] = time_fn(plan.stages(q, k, v, out=out)[0][1], flusher.read, graph=True)["median_us"]
    scale = math.log2(math.e) / math.sqrt(dim)
    best = None
    for kernel, keys_per_step in SCORING[(dim, group)]:
        for slices in slice_choices(batch, kv_heads, n, keys_per_step):
            slice_len = -(-n // slices)
            stats = torch.empty(batch, heads, slices, 2, device="cuda", dtype=torch.float32)

            def call(kernel=kernel, slices=slices, slice_len=slice_len, stats=stats):
                kernels.launch(kernel, (slices, kv_heads, batch), q, k, stats, n, kv_heads, slice_len, scale)

            call()
            torch.cuda.synchronize()
            m_err, l_err = errors(stats, reference_stats(q, k, slices, slice_len))
            us = time_fn(call, flusher.read, graph=True)["median_us"]
            case["variants"][f"{kernel}/C{slices}"] = {"us": us, "slices": slices, "slice_len": slice_len,
                                                       "max_abs_m_err": m_err, "max_rel_l_err": l_err,
                                                       "tb_per_s": case["k_mb"] * 1e6 / (us * 1e-6) / 1e12}
            if best is None or us < best[0]:
                best = (us, f"{kernel}/C{slices}")
    case["best"] = {"us": best[0], "variant": best[1], "gain_over_pass1_us": case["santa_pass1_us"] - best[0]}
    for kernel, keys_per_step in KEEPING[(dim, group)]:
        for slices in slice_choices(batch, kv_heads, n, keys_per_step):
            slice_len = -(-n // slices)
            shared = kept_bytes(group, slice_len)
            if shared > SHARED_BYTES:
                continue
            stats = torch.empty(batch, heads, slices, 2, device="cuda", dtype=torch.float32)
            tile_stats = torch.zeros(batch, heads, slices, -(-slice_len // KEEP_TILE), 2, device="cuda", dtype=torch.float32)

            def keep(kernel=kernel, slices=slices, slice_len=slice_len, stats=stats, tile_stats=tile_stats, shared=shared):
                kernels.launch(kernel, (slices, kv_heads, batch), q, k, stats, n, kv_heads, slice_len, scale,
                               tile_stats=tile_stats, shared_bytes=shared)

            keep()
            torch.cuda.synchronize()
            m_err, l_err = errors(stats, reference_stats(q, k, slices, slice_len))
            want_tiles = reference_stats(q, k, slices, slice_len, tile=KEEP_TILE)
            live = torch.isfinite(want_tiles[..., 0])  # tiles past a slice's keys are never written
            tm_err, tl_err = errors(tile_stats[live], want_tiles[live]) if live.any() else (0.0, 0.0)
            us = time_fn(keep, flusher.read, graph=True)["median_us"]
            case["variants"][f"{kernel}/C{slices}"] = {"us": us, "slices": slices, "slice_len": slice_len,
                                                       "shared_bytes": shared, "max_abs_m_err": m_err, "max_rel_l_err": l_err,
                                                       "max_abs_tile_m_err": tm_err, "max_rel_tile_l_err": tl_err,
                                                       "tb_per_s": case["k_mb"] * 1e6 / (us * 1e-6) / 1e12}
    for kernel, keys_per_step in READS.get((dim, group), ()):
        for slices in slice_choices(batch, kv_heads, n, keys_per_step):
            slice_len = -(-n // slices)
            stats = torch.empty(batch, heads, slices, 2, device="cuda", dtype=torch.float32)

            def read(kernel=kernel, slices=slices, slice_len=slice_len, stats=stats):
                kernels.launch(kernel, (slices, kv_heads, batch), q, k, stats, n, kv_heads, slice_len, scale)

            us = time_fn(read, flusher.read, graph=True)["median_us"]
            case["variants"][f"{kernel}/C{slices}"] = {"us": us, "slices": slices, "slice_len": slice_len,
                                                       "tb_per_s": case["k_mb"] * 1e6 / (us * 1e-6) / 1e12}
    return case


if __name__ == "__main__":
    main()
