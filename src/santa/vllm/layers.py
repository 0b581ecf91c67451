"""Which vLLM attention layers santa's backend serves, checked with no vLLM import.

santa samples the value stage of plain causal decoder attention. vLLM hands a backend's attention
implementation these arguments (vLLM 0.26.0, ``Attention.__init__``); what santa does not implement is
refused by name when the model loads, never dropped: ALiBi slopes, sliding windows, soft-capped logits,
attention sinks, encoder / cross attention, and any extra keyword. MLA layers never reach it (vLLM asks
an MLA backend for them, which santa's is not).
"""

from __future__ import annotations

DECODER = "decoder"  # vLLM's AttentionType.DECODER


def check_layer(*, alibi_slopes: object = None, sliding_window: object = None, logits_soft_cap: object = None,
                attn_type: object = DECODER, sinks: object = None, extra: dict | None = None) -> None:
    """Raise ValueError naming the first feature of this attention layer that santa's decode does not implement."""
    refused = [
        (alibi_slopes is not None, "ALiBi position slopes (alibi_slopes)"),
        (sliding_window is not None, f"a sliding window (sliding_window={sliding_window})"),
        (logits_soft_cap not in (None, 0, 0.0), f"soft-capped attention logits (logits_soft_cap={logits_soft_cap})"),
        (str(getattr(attn_type, "value", attn_type)) != DECODER, f"attention of type {attn_type!r} (santa serves decoder self-attention)"),
        (sinks is not None, "attention sinks (sinks)"),
    ]
    for present, feature in refused:
        if present:
            raise ValueError(f"santa's vLLM backend does not implement {feature}: serve this model with vLLM's own backend")
    if extra:
        raise ValueError(f"santa's vLLM backend got attention arguments it does not implement: {', '.join(sorted(extra))}")
