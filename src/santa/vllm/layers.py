"""Which vLLM attention layers santa's backend serves, checked with no vLLM import.

santa samples the value stage of plain causal decoder attention. vLLM hands a backend's attention
implementation these arguments (vLLM 0.26.0, ``Attention.__init__``); what santa does not implement is
refused by name when the model loads, never dropped: ALiBi slopes, sliding windows, soft-capped logits,
attention sinks, encoder / cross attention, and any extra keyword. MLA layers never reach it (vLLM asks
an MLA backend for them, which santa's is not). :func:`layer_index`: the layer number a layer's draws are
keyed on, from its vLLM name.
"""

from __future__ import annotations

import hashlib

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


def layer_index(name: object) -> int:
    """The layer number santa keys a layer's draws on (:func:`santa.rng.layer_key`), from vLLM's name of the
    attention layer (``layer.layer_name``, the module prefix vLLM's ``Attention`` gives itself).

    A name with exactly one integer among its dot-separated parts gives that integer: vLLM's own rule
    (``extract_layer_index`` in 0.26.0), so layer ``model.layers.3.self_attn.attn`` draws what santa's other
    paths draw for layer 3. Any other name (no integer, or several), and a layer with no name (only
    stand-ins do that, such as vLLM's own backend tests' mock layer; every layer vLLM builds has one),
    gives a negative number from the name's BLAKE2b digest (no name counts as ``""``): the same in every
    process and run (Python's own string hash is salted per process; an implementation's construction order
    would depend on how many engines the process built), never a real layer's index, distinct for distinct
    names up to hashing. Layers with no name all share one key and so their draws: each estimate stays
    unbiased, as with two requests at one position."""
    text = name if isinstance(name, str) else ""
    numbers = []
    for part in text.split("."):
        try:
            numbers.append(int(part))
        except ValueError:
            continue
    if len(numbers) == 1:
        return numbers[0]
    return -1 - int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=7).digest(), "big")
