"""``santa bench capture``: real decode-step attention inputs (q, K, V) from the bundled model.

Runs SmolLM2 on the CPU over a long essay prompt (``santa.eval.tasks.needle_prompt``): a dense
prefill of the first ``n − 1`` tokens, then one decode step for the last token, and keeps, for a
few layers, that step's post-RoPE query ``q [1, H, d]`` and the whole cache ``K, V [1, n, H_kv, d]``
(NHD, the current token's key included) as bf16 in one ``.pt`` file. SmolLM2-135M: H = 9,
H_kv = 3 (G = 3), d = 64, context 8192. ``santa bench kernels --real FILE`` times the decode
kernels on these inputs (and on copies tiled to longer lengths).

    python -m santa.bench.capture --tokens 8192 --layers 0,15,29 --out .capture/smollm2.pt
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

IMPLEMENTATION = "santa_capture_qkv"


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
    """
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="santa bench capture", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--tokens", type=int, default=8192, help="prompt length (cache length of the decode step)")
    p.add_argument("--layers", default="0,mid,last", help="comma-separated layer indices; 'mid' and 'last' allowed")
    p.add_argument("--seed", type=int, default=0, help="needle_prompt seed")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--out", default=".capture/smollm2.pt")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from pathlib import Path

    from santa.assets import load_model
    from santa.eval.tasks import needle_prompt

    model, tokenizer = load_model(args.model)
    n_layers = len(attention_layers(model))
    names = {"mid": n_layers // 2, "last": n_layers - 1, "first": 0}
    layers = sorted({names[x] if x in names else int(x) for x in args.layers.split(",")})
    max_len = getattr(model.config, "max_position_embeddings", args.tokens)
    n = min(args.tokens, max_len)
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
