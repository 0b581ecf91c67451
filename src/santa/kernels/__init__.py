"""GPU decode kernels (Triton): S²ANTA-prop and S²ANTA-flash behind one entry point, :func:`decode`.

- :func:`decode`: one eager decode step over a contiguous or paged KV cache (CPU: the torch reference,
  or the kernels in Triton's interpreter under ``TRITON_INTERPRET=1``).
- :func:`plan_decode` → :class:`DecodePlan`: validate a shape once, then ``plan.run(...)`` per step
  (the tensors' host metadata checked, no value read, no allocation, CUDA-graph capturable; a CPU plan runs what
  :func:`decode` runs on the CPU).
- :func:`make_workspace`, :class:`Workspace`, :func:`workspace_bytes`: caller-owned scratch, typed
  by the shape and kernel it serves.
- :mod:`santa.kernels.reference`: the torch emulation of what the kernels compute (the oracle).
- :mod:`santa.kernels.ops`: the same call as torch custom ops (``torch.ops.santa.decode``,
  ``torch.ops.santa.decode_counts``), registered on import; under ``torch.compile``
  :func:`decode` is one of them, so ``fullgraph=True`` traces it and ``mode="reduce-overhead"``
  captures it.
"""

from santa.kernels import ops
from santa.kernels.eager import decode, make_workspace, use_triton, workspace_bytes
from santa.kernels.layout import BATCH_INVARIANT, Tuning, flash_tile, prop_tile
from santa.kernels.plan import KERNELS, KV_LAYOUTS, MAX_BUDGET, DecodePlan, Workspace, plan_decode
from santa.kernels.reference import flash_reference, philox_uniforms, prop_reference

__all__ = [
    "BATCH_INVARIANT",
    "KERNELS",
    "KV_LAYOUTS",
    "MAX_BUDGET",
    "DecodePlan",
    "Tuning",
    "Workspace",
    "decode",
    "flash_reference",
    "flash_tile",
    "make_workspace",
    "ops",
    "philox_uniforms",
    "plan_decode",
    "prop_reference",
    "prop_tile",
    "use_triton",
    "workspace_bytes",
]
