"""santa bench capture: real decode-step attention inputs (q, K, V) from the bundled model.

Runs SmolLM2 on the CPU over a long essay prompt (``santa.eval.tasks.needle_prompt``): a dense
prefill of the first ``n − 1`` tokens, then one decode step for the last token, and keeps, for a
few layers, that step's post-RoPE query ``q [1, H, d]`` and the whole cache ``K, V [1, n, H_kv, d]``
(NHD, the current token's key included) as bf16 in one ``.pt`` file. SmolLM2-135M: H = 9,
H_kv = 3 (G = 3), d = 64, context 8192. ``santa bench kernels --real FILE`` times the decode
kernels on these inputs (and on copies tiled to longer lengths).

    python -m benchmarks.bench.capture --tokens 8192 --layers 0,15,29 --out .capture/smollm2.pt

Every flag is checked before the model loads: ``--layers`` and ``--tokens`` against the model's
layer count and context length, read from its config (the cached ``config.json``, else the GGUF
header) without loading any weight.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from santa import cliargs
from santa.checks import integer

IMPLEMENTATION = "santa_capture_qkv"
LAYER_NAMES = ("first", "mid", "last")
MAX_THREADS = 1024


def _register() -> None:
    """A transformers attention function that is SDPA, and records the decode-step inputs."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    def forward(module, query, key, value, attention_mask, *args, **kwargs):
        store = getattr(module, "_santa_capture", None)
        if store is not None and query.shape[2] == 1:  # the decode step: [B, H, 1, d], key/value [B, H_kv, n, d]
            store["q"] = query[:, :, 0].detach().clone()
            store["k"] = key.detach().transpose(1, 2).contiguous()  # NHD [B, n, H_kv, d]
            store["v"] = value.detach().transpose(1, 2).contiguous()
            store["scale"] = kwargs.get("scaling")
        return sdpa_attention_forward(module, query, key, value, attention_mask, *args, **kwargs)

    AttentionInterface.register(IMPLEMENTATION, forward)
    AttentionMaskInterface.register(IMPLEMENTATION, sdpa_mask)


def attention_layers(model) -> list:
    return [layer.self_attn for layer in model.model.layers]


@torch.inference_mode()
def capture(model, input_ids: torch.Tensor, layers: list[int], dtype: torch.dtype = torch.bfloat16) -> dict:
    """Decode-step q and cache K/V of ``layers`` for the last token of ``input_ids`` ``[1, n]``.

    Returns ``{"layers": {layer: {"q": [1, H, d], "k": [1, n, H_kv, d], "v": ...}}, "scale": …}``.
    layers: indices in ``[0, L)`` (Python or numpy ints, at least one); input_ids: ``[1, n]`` with n ≥ 2.
    """
    n_layers = len(attention_layers(model))
    if isinstance(layers, (str, bytes)) or not hasattr(layers, "__iter__"):
        raise TypeError(f"layers must be a list of layer indices, got {type(layers).__name__}")
    layers = [integer("layers[]", layer, low=0, high=n_layers) for layer in layers]
    if not layers:
        raise ValueError("layers must name at least one layer")
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.shape[0] != 1 or input_ids.shape[1] < 2:
        raise ValueError(f"input_ids must be a [1, n] tensor with n ≥ 2, got {getattr(input_ids, 'shape', type(input_ids).__name__)}")
    _register()
    previous = model.config._attn_implementation
    model.set_attn_implementation(IMPLEMENTATION)
    modules = attention_layers(model)
    stores = {i: {} for i in layers}
    try:
        out = model(input_ids[:, :-1], use_cache=True)
        for i in layers:
            modules[i]._santa_capture = stores[i]
        # transformers ≥ 5.2x names the cache ``cache`` (``past_key_values`` before)
        kw = {"cache": out["cache"]} if "cache" in out else {"past_key_values": out["past_key_values"]}
        model(input_ids[:, -1:], use_cache=True, **kw)
    finally:
        for i in layers:
            modules[i].__dict__.pop("_santa_capture", None)
        model.set_attn_implementation(previous)
    scale = next(iter(stores.values()))["scale"]
    result = {"layers": {i: {k: stores[i][k].to(dtype) for k in ("q", "k", "v")} for i in layers},
              "scale": None if scale is None else float(scale)}
    return result


def layer_list(text: str) -> list[int | str]:
    """``--layers``: a comma list of layer indices ≥ 0 and the names first, mid, last (checked
    against the model's layer count once ``--model`` is known, in :func:`resolve_layers`)."""
    items: list[int | str] = []
    for part in (p.strip() for p in text.split(",")):
        if part in LAYER_NAMES:
            items.append(part)
        elif part.isdigit() and part.isascii():
            items.append(int(part))
        elif part:
            raise cliargs.Error(f"expected layer indices ≥ 0 or {', '.join(LAYER_NAMES)}, got {part!r}")
    if not items:
        raise cliargs.Error(f"give at least one layer, got {text!r}")
    return items


def resolve_layers(items: list[int | str], n_layers: int) -> list[int]:
    """Names → indices, sorted without repeats; ValueError naming an index past the last layer."""
    names = {"first": 0, "mid": n_layers // 2, "last": n_layers - 1}
    layers = sorted({names[x] if isinstance(x, str) else x for x in items})
    if layers[-1] >= n_layers:
        raise ValueError(f"layer {layers[-1]} is past the model's {n_layers} layers (valid: 0 to {n_layers - 1}, first, mid, last)")
    return layers


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="santa bench capture", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m", type=cliargs.bundled_model, help="a bundled model (default smollm2-135m)")
    p.add_argument("--tokens", type=cliargs.int_in(cliargs.MIN_PROMPT_TOKENS), default=8192,
                   help=f"prompt length, the cache length of the decode step (≥ {cliargs.MIN_PROMPT_TOKENS}, at most the model's context)")
    p.add_argument("--layers", default=layer_list("first,mid,last"), type=layer_list,
                   help="comma list of layer indices (0 to layers − 1) and first, mid, last (default first,mid,last)")
    p.add_argument("--seed", type=cliargs.seed, default=0, help="needle_prompt seed, in [0, 2**63)")
    p.add_argument("--threads", type=cliargs.int_in(0, MAX_THREADS + 1), default=0,
                   help=f"torch CPU threads, 0 to {MAX_THREADS} (0: torch's default)")
    p.add_argument("--out", default=".capture/smollm2.pt", type=cliargs.output_file, help="the .pt file written")
    return p


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The flags, checked before any work: ``--layers`` and ``--tokens`` against the model's config,
    read without loading weights (status 2 when out of range, 1 when the config cannot be read)."""
    from santa.eval.cli import model_shape

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        shape = model_shape(args.model)
    except ValueError as error:
        print(f"santa bench capture: error: {error}", file=sys.stderr)
        raise SystemExit(1) from None
    try:
        args.layers = resolve_layers(args.layers, shape.layers)
    except ValueError as error:
        parser.error(f"argument --layers: {error}")
    args.n_layers = shape.layers
    if args.tokens > shape.context:
        parser.error(f"argument --tokens: {args.model} reads at most {shape.context} tokens, got {args.tokens}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from pathlib import Path

    from santa.assets import load_model
    from santa.eval.tasks import needle_prompt

    model, tokenizer = load_model(args.model)
    n_layers, layers = args.n_layers, args.layers
    n = args.tokens
    prompt = needle_prompt(tokenizer, n, seed=args.seed)
    ids = tokenizer(prompt.text, return_tensors="pt", add_special_tokens=False).input_ids[:, :n]
    start = time.perf_counter()
    result = capture(model, ids, layers)
    seconds = time.perf_counter() - start
    result["meta"] = {
        "model": args.model, "n_keys": int(ids.shape[1]), "layers": layers, "n_layers": n_layers,
        "prompt": "needle_prompt", "prompt_seed": args.seed, "prompt_tokens": prompt.n_tokens,
        "heads": model.config.num_attention_heads, "kv_heads": model.config.num_key_value_heads,
        "head_dim": result["layers"][layers[0]]["q"].shape[-1], "dtype": "bfloat16",
        "computed_in": "float32 on CPU", "seconds": seconds, "torch": str(torch.__version__),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    torch.save(result, args.out)
    size = Path(args.out).stat().st_size
    print(f"captured layers {layers} at n = {ids.shape[1]} in {seconds:.1f} s → {args.out} ({size / 2**20:.1f} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
