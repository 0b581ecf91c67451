"""The vLLM plugin's packaging and refusals; vLLM's own interface where vLLM imports (not in CI)."""

import importlib
import importlib.metadata
import importlib.util
import sys

import pytest

from santa.vllm.layers import check_layer
from santa.vllm.plugin import BACKEND, register

HAS_VLLM = importlib.util.find_spec("vllm") is not None


def test_the_plugin_is_an_entry_point_of_the_installed_package():
    try:
        importlib.metadata.distribution("santa-attention")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("santa runs from a source tree here (no installed distribution, so no entry points)")
    points = {p.name: p.value for p in importlib.metadata.entry_points(group="vllm.general_plugins")}
    assert points.get("santa") == "santa.vllm.plugin:register"


@pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed here")
def test_register_without_vllm_says_how_to_install_it():
    with pytest.raises(ImportError, match=r"santa's vLLM backend needs vLLM 0\.26 \(pip install 'santa-attention\[vllm\]'\)"):
        register()


INSTALL_HINT = r"santa's vLLM backend needs vLLM 0\.26 \(pip install 'santa-attention\[vllm\]'\)"


@pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed here")
def test_importing_the_backend_without_vllm_says_how_to_install_it(monkeypatch):
    monkeypatch.delitem(sys.modules, "santa.vllm.backend", raising=False)
    with pytest.raises(ImportError, match=INSTALL_HINT + ": No module named 'vllm'"):
        importlib.import_module("santa.vllm.backend")


def test_an_install_whose_backend_cannot_import_gets_the_hint_and_the_cause(monkeypatch):
    """Also where vLLM is installed: its FlashAttention module made unimportable (as a broken install would be)."""
    monkeypatch.delitem(sys.modules, "santa.vllm.backend", raising=False)
    monkeypatch.setitem(sys.modules, "vllm.v1.attention.backends.flash_attn", None)
    monkeypatch.setitem(sys.modules, "vllm.v1.attention.backend", None)
    with pytest.raises(ImportError, match=INSTALL_HINT + ": import of vllm.v1.attention.backend halted") as raised:
        importlib.import_module("santa.vllm.backend")
    assert isinstance(raised.value.__cause__, ImportError)


def test_register_checks_santas_settings_first(monkeypatch):
    monkeypatch.setenv("SANTA_VLLM_BUDGET", "many")
    with pytest.raises(ValueError, match="SANTA_VLLM_BUDGET must be an integer"):
        register()


@pytest.mark.parametrize(
    ("features", "message"),
    [
        ({"alibi_slopes": [0.5]}, "ALiBi"),
        ({"sliding_window": 4096}, "a sliding window"),
        ({"logits_soft_cap": 30.0}, "soft-capped attention logits"),
        ({"attn_type": "encoder_decoder"}, "attention of type 'encoder_decoder'"),
        ({"sinks": object()}, "attention sinks"),
        ({"extra": {"chunk_lookback": 2}}, "chunk_lookback"),
    ],
)
def test_layers_santa_does_not_implement_are_refused_by_name(features, message):
    with pytest.raises(ValueError, match=message):
        check_layer(**features)


def test_a_plain_decoder_layer_passes():
    check_layer(logits_soft_cap=0.0)


@pytest.mark.skipif(not HAS_VLLM, reason="needs vLLM 0.26 (pip install 'santa-attention[vllm]')")
def test_the_backend_is_flash_attention_with_santas_decode():
    from vllm.v1.attention.backend import AttentionCGSupport
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    from santa.vllm.backend import SantaAttentionBackend, SantaMetadataBuilder

    register()
    assert AttentionBackendEnum.CUSTOM.get_path() == BACKEND
    assert SantaAttentionBackend.get_name() == "CUSTOM"
    assert SantaMetadataBuilder._cudagraph_support == AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE
    assert not SantaAttentionBackend.supports_sliding_window() and not SantaAttentionBackend.supports_sink()
