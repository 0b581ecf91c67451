"""Plain functions and constants shared by the tests (fixtures live in tests/conftest.py).

Imported as ``helpers``: pyproject.toml puts tests/ on the path.
"""

from __future__ import annotations

import pytest
import torch


def exit_code_and_stderr(main, argv: list[str], capsys) -> tuple[object, str]:
    """Run ``main(argv)``, which must raise SystemExit: (its exit code, what it wrote to stderr)."""
    with pytest.raises(SystemExit) as stop:
        main(argv)
    return stop.value.code, capsys.readouterr().err


def refusal(main, argv: list[str], capsys) -> str:
    """The stderr of a command that must stop with status 2 (argparse's refusal) and no traceback."""
    code, err = exit_code_and_stderr(main, argv, capsys)
    assert code == 2
    assert "Traceback" not in err
    return err


# --- tiny random transformers models (no download) ------------------------------------------------

HF_SMALL = {
    "vocab_size": 64,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 128,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
# family: (config class, model class, config fields beyond HF_SMALL)
HF_FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "mistral, sliding window 8": ("MistralConfig", "MistralForCausalLM", {"sliding_window": 8}),
    "qwen2, sliding window in layer 1": (
        "Qwen2Config", "Qwen2ForCausalLM", {"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 1},
    ),
    "gemma3, window and scale 1/4 for D=8": (
        "Gemma3TextConfig", "Gemma3ForCausalLM", {"sliding_window": 8, "head_dim": 8, "query_pre_attn_scalar": 16},
    ),
    "gemma2 without the softcap": (
        "Gemma2Config", "Gemma2ForCausalLM",
        {"sliding_window": 8, "head_dim": 8, "query_pre_attn_scalar": 12, "attn_logit_softcapping": None},
    ),
    "deepseek_v3, MLA": (
        "DeepseekV3Config", "DeepseekV3ForCausalLM",
        {"kv_lora_rank": 16, "q_lora_rank": 16, "qk_rope_head_dim": 4, "qk_nope_head_dim": 8, "v_head_dim": 6,
         "n_routed_experts": 2, "num_experts_per_tok": 1, "first_k_dense_replace": 2, "head_dim": 4, "num_key_value_heads": 4},
    ),
}


def tiny_hf_model(family: str = "llama", **fields) -> torch.nn.Module:
    """A random 2-layer transformers model of ``family`` (a key of HF_FAMILIES), in eval mode, seeded."""
    import transformers

    config_class, model_class, extra = HF_FAMILIES[family]
    torch.manual_seed(0)
    config = getattr(transformers, config_class)(**{**HF_SMALL, **extra, **fields})
    return getattr(transformers, model_class)(config).eval()
