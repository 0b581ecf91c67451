"""``tiny-random``: a randomly initialised 2-layer Llama with a byte-level tokenizer, built offline.

For smoke tests of the tuning machinery on any machine (a Ray cluster included) without model
weights: it runs every code path of a real model in milliseconds, and its scores mean nothing.
"""

from __future__ import annotations

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL = ("<|im_start|>", "<|im_end|>", "<pad>")
CONTEXT = 8192  # max_position_embeddings: the --length flags are checked against it before anything loads


def byte_tokenizer():
    """A byte-level tokenizer (256 byte tokens, no merges) with a ChatML template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    core = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens(list(SPECIAL))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>", pad_token="<pad>")
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def tiny_model(*, seed: int = 0, layers: int = 2, hidden: int = 32, device: str = "cpu"):
    """(LlamaForCausalLM with ``layers`` layers of width ``hidden``, 4 query / 2 KV heads; tokenizer)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from santa.checks import integer

    seed, layers = integer("seed", seed, low=0), integer("layers", layers, low=1)
    hidden = integer("hidden", hidden, low=8)
    if hidden % 8:
        raise ValueError(f"hidden must be a multiple of 8 (4 heads of an even width), got {hidden}")
    tokenizer = byte_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=CONTEXT,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(device).eval()
    return model, tokenizer
