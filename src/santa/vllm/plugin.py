"""The ``vllm.general_plugins`` entry point: registers santa as vLLM's ``CUSTOM`` attention backend.

vLLM calls :func:`register` in every process it starts (the engine, each worker) once santa is installed;
the backend then serves a model only when it is selected (``attention_backend="CUSTOM"``)."""

from __future__ import annotations

BACKEND = "santa.vllm.backend.SantaAttentionBackend"
INSTALL = "pip install 'santa-attention[vllm]'"


def register() -> None:
    """Register :data:`BACKEND` under ``AttentionBackendEnum.CUSTOM`` (idempotent), after checking santa's
    settings (:func:`santa.vllm.config.read_config`) so that a bad ``SANTA_VLLM_*`` variable fails when the
    engine starts, by name."""
    from santa.vllm.config import read_config

    read_config()
    try:
        from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend
    except ImportError as error:
        raise ImportError(f"santa's vLLM backend needs vLLM 0.26 ({INSTALL}): {error}") from error
    register_backend(AttentionBackendEnum.CUSTOM, BACKEND)
