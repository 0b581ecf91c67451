"""santa's benchmarks: the ``santa bench`` commands (:mod:`benchmarks.bench`) and the scripts beside them.

Not part of the library (nothing under ``src/santa`` imports it); run from the source checkout's root,
e.g. ``python -m benchmarks.bench.kernels --help`` or ``santa bench kernels --help``. Index: README.md.
"""
