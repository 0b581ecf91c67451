"""The ``santa bench`` benchmarks: kernels, e2e, capture and real (:mod:`benchmarks.bench.cli` picks one)."""
