"""The fixtures shared by the tests, defined once.

The tests mirror the package: tests/core (santa's top-level modules), tests/kernels, tests/model,
tests/hf, tests/eval, tests/budgets, tests/cli, tests/bench (benchmarks/bench) and tests/project
(lint, layering, packaging, the README's and benchmarks' claims). Plain shared functions and constants
(command-line refusals, seeded tensors, tiny models, sweep records) are in tests/helpers.py; the
Triton-interpreter setup of tests/kernels is in tests/kernels/conftest.py.
"""

from __future__ import annotations

import pytest
import torch


class WorkStarted(AssertionError):
    """Raised by a model loader or a sweep under ``no_work``: the command had to refuse its flags first."""


@pytest.fixture
def no_work(monkeypatch, tmp_path):
    """No command may load a model (santa's loaders, a budgets scorer or reward), run ``santa generate``'s
    work or a sweep; the model cache is an empty folder (configs come from the bundled GGUF's header).
    Returns ``tmp_path``."""
    import santa.assets
    import santa.budgets.ablate_cli
    import santa.budgets.rewards
    import santa.eval.cli
    import santa.generate
    import santa.model

    def refuse(*args, **kwargs):
        raise WorkStarted("the command did work before refusing its flags")

    monkeypatch.setenv("SANTA_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(santa.assets, "load_model", refuse)
    monkeypatch.setattr(santa.model, "load_bundled", refuse, raising=False)
    monkeypatch.setattr(santa.generate, "load_model", refuse)
    monkeypatch.setattr(santa.generate, "run", refuse)
    monkeypatch.setattr(santa.eval.cli, "run_sweep", refuse)
    monkeypatch.setattr(santa.budgets.ablate_cli, "load_scorer", refuse)
    monkeypatch.setattr(santa.budgets.rewards, "load", refuse)
    return tmp_path


@pytest.fixture
def torch_fallback(monkeypatch):
    """CPU tensors run santa.kernels' torch reference (no TRITON_INTERPRET): fast."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)


@pytest.fixture(params=["kernels", "torch"])
def decode_path(request, monkeypatch):
    """Each decode path a CPU machine has: santa's Triton kernels (Triton's interpreter on the CPU, the GPU where there
    is one) and, on the CPU, the torch fallback of the same estimator."""
    if request.param == "torch":
        if torch.cuda.is_available():
            pytest.skip("the torch fallback serves CPU tensors")
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    elif not torch.cuda.is_available():
        from santa.kernels.plan import kernels_on_cpu

        monkeypatch.setenv("TRITON_INTERPRET", "1")
        if not kernels_on_cpu():
            pytest.skip("triton was imported before TRITON_INTERPRET=1 was set: run with TRITON_INTERPRET=1")
    return request.param


@pytest.fixture(scope="module")
def tiny_transformer():
    """santa.model's random ``CONFIGS["tiny"]`` (2 layers, 4 heads over 2 KV heads, vocabulary 256),
    float32 on the CPU, seed 0, in eval mode; one per test module."""
    from santa.model import CONFIGS, Transformer

    return Transformer.random(CONFIGS["tiny"], device="cpu", dtype=torch.float32, seed=0).eval()


@pytest.fixture(scope="module")
def model_and_tokenizer():
    """The bundled SmolLM2-135M through transformers (read offline from its GGUF) and its tokenizer,
    loaded after ``torch.manual_seed(0)``; one per test module (slow)."""
    from santa.assets import load_model

    torch.manual_seed(0)
    return load_model("smollm2-135m")


@pytest.fixture
def generate_run_arguments(monkeypatch) -> dict:
    """``santa.generate.run`` replaced by a stand-in that records the arguments the CLI passes it, then stops
    with a library refusal (``santa generate`` exits 1): the dict it fills."""
    import santa.generate

    seen = {}

    def fake_run(**kwargs):
        seen.update(kwargs)
        raise ValueError("stop here")

    monkeypatch.setattr(santa.generate, "run", fake_run)
    return seen
