"""Timing for the kernel benchmarks (benchmarks/PROTOCOL.md): a clean or dirty L2 flush, CUDA events
around one call (eager or CUDA-graph replay), medians; host time per call. Imports only torch, so
that A/B scripts can time an old santa tree with the same code."""

from __future__ import annotations

import importlib.util
import statistics
import time
from pathlib import Path

import torch


class Flusher:
    """Evicts L2 between timed iterations: a 512 MB read (clean) or in-place update (dirty)."""

    def __init__(self, device):
        self.buf = torch.randn(128 * 1024 * 1024 // 1024, 1024, device=device)  # 512 MB float32
        self.sink = torch.empty(1024, device=device)

    def read(self):
        torch.sum(self.buf, dim=0, out=self.sink)

    def write(self):
        self.buf.mul_(1.0000001)


def captured(fn, *, warmups: int = 3, warm=None) -> torch.cuda.CUDAGraph:
    """A CUDA graph of ``fn()``, captured after ``warmups`` eager calls on a side stream (they compile kernels and
    make plans outside the capture) of ``warm`` (default ``fn``: another call where ``fn``'s own eager run would not
    make them): the benchmarks' one capture helper (santa.model.cuda_graph_of is the library's; this module imports
    only torch, so an A/B script can time an old santa tree with it)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmups):
            (warm or fn)()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def time_fn(fn, flush, *, warmup=10, iters=40, graph=False):
    """Median and mean µs of ``fn`` with ``flush`` before each call (outside the events); ``graph``: of a CUDA graph of
    it (:func:`captured`), replayed."""
    call = captured(fn).replay if graph else fn
    for _ in range(warmup):
        flush()
        call()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for i in range(iters):
        flush()
        starts[i].record()
        call()
        ends[i].record()
    torch.cuda.synchronize()
    times = [s.elapsed_time(e) * 1000.0 for s, e in zip(starts, ends, strict=True)]
    return {"median_us": statistics.median(times), "mean_us": statistics.fmean(times), "all_us": times}


def host_us_per_call(fn, calls: int = 200) -> float:
    """Host time of one call: wall time of ``calls`` back-to-back calls (no sync between them) over
    ``calls``; valid while the host, not the GPU, is the slower side (checked by the caller)."""
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / calls * 1e6


def run_record_of_this_checkout() -> dict:
    """``santa.provenance.run_record()`` of the checkout this file is in, whichever santa is first on the path: an A/B
    script times an old tree (``PYTHONPATH=.oldab/src``) that may predate the module (loaded here by its path; it
    imports only the standard library)."""
    path = Path(__file__).resolve().parents[2] / "src" / "santa" / "provenance.py"
    spec = importlib.util.spec_from_file_location("santa_provenance_of_this_checkout", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.run_record()
