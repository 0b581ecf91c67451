"""santa.short_steps: the keys below which santa.hf and santa.model give a decode step to dense attention by default."""

import pytest
import torch

import santa.hf
import santa.short_steps
from santa.short_steps import resolve_dense_below


def test_the_default_follows_the_measured_head_shapes(shape_default_dense_below):
    """Llama-3.1-8B's shape (d = 128, G = 4) was measured to win from 4k keys; Qwen2.5-0.5B's (64, 7) and every shape
    never measured take 8,192."""
    assert shape_default_dense_below(head_dim=128, group=4) == 4096
    assert shape_default_dense_below(head_dim=64, group=7) == santa.short_steps.DENSE_BELOW == 8192
    assert shape_default_dense_below(head_dim=128, group=8) == 8192
    assert resolve_dense_below(None, kernels_on_gpu=True, head_dim=128, group=4) == 4096


def test_an_explicit_value_wins_and_none_samples_off_the_gpu_kernels(shape_default_dense_below):
    for on_gpu in (False, True):
        assert resolve_dense_below(0, kernels_on_gpu=on_gpu, head_dim=128, group=4) == 0
        assert resolve_dense_below(100, kernels_on_gpu=on_gpu, head_dim=128, group=4) == 100
    assert resolve_dense_below(None, kernels_on_gpu=False, head_dim=128, group=4) == 0


def test_tests_sample_every_step_unless_they_ask_for_the_default():
    """tests/conftest.py's autouse fixture: the default by shape is 0 in a test that does not take it."""
    assert resolve_dense_below(None, kernels_on_gpu=True, head_dim=128, group=4) == 0


@pytest.mark.parametrize(("config", "want"), [
    (dict(), 0),  # CPU tensors: santa's kernels do not run on a GPU
    (dict(dense_below=0), 0),
    (dict(dense_below=300), 300),
    (dict(kernel="reference", dense_below=300), 300),
])
def test_santa_hf_resolves_its_short_steps_per_call(config, want, shape_default_dense_below):
    """SantaConfig.dense_below defaults to None; a call's keys follow from it and the call's head shape
    (query [B, Hq, 1, d], key [B, Hkv, n, d]); on CPU tensors None is 0 (tests/hf/test_hf_cuda.py: CUDA's default)."""
    assert santa.hf.SantaConfig().dense_below is None
    query, key = torch.zeros(2, 32, 1, 128), torch.zeros(2, 8, 600, 128)
    assert santa.hf.short_step_keys(santa.hf.SantaConfig(**config), query, key, None) == want
