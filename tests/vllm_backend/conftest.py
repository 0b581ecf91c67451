"""The ``backend`` fixture: santa's vLLM backend over the vLLM stand-ins of vllm_stand_ins.py (no vLLM needed)."""

import os

import pytest

from vllm_stand_ins import CurrentConfig, FlashAttentionImpl, ParallelState, load_backend


@pytest.fixture
def backend(monkeypatch):
    """santa's backend over the stand-ins, with no ``SANTA_VLLM_*`` variable left from the environment but
    ``SANTA_VLLM_DENSE_BELOW=0``."""
    for name in [n for n in os.environ if n.startswith("SANTA_VLLM_")]:
        monkeypatch.delenv(name)
    # the stand-ins' sequences hold tens of keys, far below dense_below's default: these tests sample every decode step
    # (test_vllm_short_steps.py covers the default, which gives such steps to FlashAttention)
    monkeypatch.setenv("SANTA_VLLM_DENSE_BELOW", "0")
    FlashAttentionImpl.calls = 0
    monkeypatch.setattr(ParallelState, "rank", None)  # vLLM's parallel state uninitialised, unless a test sets a rank
    monkeypatch.setattr(CurrentConfig, "config", None)  # no current vLLM config, unless a test sets one
    return load_backend()
