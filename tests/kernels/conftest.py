"""tests/kernels: where there is no GPU, santa's Triton kernels run in Triton's interpreter.

The interpreter must be chosen before triton (and the kernels) are imported. This file is loaded
before the folder's test modules: it imports the kernels with TRITON_INTERPRET=1 and restores the
variable, and the autouse fixture sets it only while each of this folder's tests runs.
"""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest
import torch

CUDA = torch.cuda.is_available()
INTERPRETABLE = CUDA or "triton" not in sys.modules or os.environ.get("TRITON_INTERPRET") == "1"
if not CUDA and INTERPRETABLE and importlib.util.find_spec("triton") is not None:
    saved = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    import santa.kernels.exact  # noqa: F401  (decorated for the interpreter)
    import santa.kernels.flash  # noqa: F401
    import santa.kernels.prop  # noqa: F401

    if saved is None:
        del os.environ["TRITON_INTERPRET"]


@pytest.fixture(autouse=True)
def interpret_on_cpu(monkeypatch):
    """Run the Triton kernels through the interpreter where there is no GPU."""
    if not INTERPRETABLE:
        pytest.skip("triton was imported before TRITON_INTERPRET=1 was set: run with TRITON_INTERPRET=1")
    if not CUDA:
        monkeypatch.setenv("TRITON_INTERPRET", "1")
