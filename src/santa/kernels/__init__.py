"""GPU decode kernels (Triton): S²ANTA-prop and S²ANTA-flash behind one entry point, :func:`decode`.

- :func:`decode`: one decode step over a contiguous or paged KV cache (CPU: the torch reference).
- :func:`make_workspace`, :func:`workspace_bytes`: caller-owned scratch for allocation-free,
  CUDA-graph-capturable calls.
- :mod:`santa.kernels.reference`: the torch emulation of what the kernels compute (the oracle).
"""

from santa.kernels.decode import (
    KERNELS,
    KV_LAYOUTS,
    decode,
    flash_tile,
    make_workspace,
    prop_tile,
    use_triton,
    workspace_bytes,
)
from santa.kernels.reference import flash_reference, philox_uniforms, prop_reference

__all__ = [
    "KERNELS",
    "KV_LAYOUTS",
    "decode",
    "flash_reference",
    "flash_tile",
    "make_workspace",
    "philox_uniforms",
    "prop_reference",
    "prop_tile",
    "use_triton",
    "workspace_bytes",
]
