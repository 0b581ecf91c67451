"""Llama / Qwen2 checkpoints in Hugging Face's format, read without transformers or the hub.

- the config (a transformers config or config.json) → :class:`santa.model.ModelArgs` fields,
  refusing what santa.model does not implement (:func:`args_from_config`);
- the tensors under transformers' names → santa.model's, checked against the config
  (:func:`state_dict_from_hf`);
- a local folder: ``config.json`` and either ``model.safetensors`` or shards listed by
  ``model.safetensors.index.json`` (its ``weight_map``: tensor name → shard file).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from santa.model import ModelArgs

ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}  # model_type → class
ROPE_TYPES = ("default", "llama3")

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


def args_from_config(config) -> dict:
    """The :class:`santa.model.ModelArgs` fields of a Llama or Qwen2 checkpoint: a transformers
    config, or its config.json dict (both spellings of rope: ``rope_parameters``, or the older
    ``rope_theta`` + ``rope_scaling``).

    Raises ValueError naming what santa.model does not implement: another architecture,
    sliding-window attention in use, a rope type other than default / llama3, a biased o_proj
    or MLP, an activation other than SiLU, head_dim ≠ hidden_size / heads, quantised weights.
    """
    if not isinstance(config, Mapping) and not hasattr(config, "to_dict"):
        raise TypeError(f"config must be a transformers config or a config.json dict, got {type(config).__name__}")
    cfg = dict(config) if isinstance(config, Mapping) else config.to_dict()
    model_type = cfg.get("model_type")
    if model_type not in ARCHITECTURES:
        raise ValueError(f"config model_type must be one of {sorted(ARCHITECTURES)} (santa.model implements Llama and Qwen2), got {model_type!r}")
    arch = ARCHITECTURES[model_type]
    archs = cfg.get("architectures") or [arch]
    if list(archs) != [arch]:
        raise ValueError(f"config architectures must be [{arch!r}] for model_type {model_type!r}, got {archs}")

    def need(key):
        if cfg.get(key) is None:
            raise ValueError(f"config lacks {key!r} (a {arch} config.json has it)")
        return cfg[key]

    n_layer, n_head, dim = int(need("num_hidden_layers")), int(need("num_attention_heads")), int(need("hidden_size"))
    n_kv_head = int(cfg.get("num_key_value_heads") or n_head)
    if dim % n_head or n_head % n_kv_head:
        raise ValueError(f"config needs hidden_size % num_attention_heads == 0 and heads % KV heads == 0, got {dim}, {n_head}, {n_kv_head}")
    unsupported = []
    if cfg.get("quantization_config"):
        unsupported.append(f"quantization_config {cfg['quantization_config'].get('quant_method', '?')!r} (load a float checkpoint)")
    if cfg.get("hidden_act", "silu") != "silu":
        unsupported.append(f"hidden_act={cfg['hidden_act']!r} (SiLU only)")
    if cfg.get("head_dim") not in (None, dim // n_head):
        unsupported.append(f"head_dim={cfg['head_dim']} ≠ hidden_size / num_attention_heads = {dim // n_head}")
    if model_type == "llama" and (cfg.get("attention_bias") or cfg.get("mlp_bias")):
        unsupported.append("attention_bias / mlp_bias (biased o_proj or MLP)")
    layer_types = cfg.get("layer_types") or []
    sliding = [i for i, t in enumerate(layer_types) if t != "full_attention"]
    if not layer_types and cfg.get("use_sliding_window") and cfg.get("sliding_window"):
        sliding = list(range(int(cfg.get("max_window_layers") or 0), n_layer))  # HF: layers ≥ max_window_layers slide
    if sliding:
        unsupported.append(f"sliding-window attention (sliding_window={cfg.get('sliding_window')}, layers {sliding[:4]}…)")
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in ROPE_TYPES:
        unsupported.append(f"rope_type={rope_type!r} (implemented: {ROPE_TYPES})")
    if float(rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))) != 1.0:
        unsupported.append("partial_rotary_factor ≠ 1")
    if unsupported:
        raise ValueError(f"santa.model cannot run this {arch} checkpoint: unsupported " + "; ".join(unsupported))
    scaling = None
    if rope_type == "llama3":
        scaling = (float(rope["factor"]), float(rope["low_freq_factor"]), float(rope["high_freq_factor"]),
                   int(rope["original_max_position_embeddings"]))
    return dict(
        n_layer=n_layer,
        n_head=n_head,
        n_kv_head=n_kv_head,
        dim=dim,
        intermediate_size=int(need("intermediate_size")),
        vocab_size=int(need("vocab_size")),
        rope_base=float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0))),
        norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        rope_scaling=scaling,
        qkv_bias=model_type == "qwen2",
    )


def hf_tensor_shapes(args: ModelArgs) -> dict[str, tuple[int, ...]]:
    """Every tensor a Llama / Qwen2 checkpoint with these arguments holds, under transformers' names."""
    d, h, hkv, dim, inter = args.head_dim, args.n_head, args.n_kv_head, args.dim, args.intermediate_size
    shapes = {"model.embed_tokens.weight": (args.vocab_size, dim), "model.norm.weight": (dim,)}
    if not args.tie_embeddings:
        shapes["lm_head.weight"] = (args.vocab_size, dim)
    for i in range(args.n_layer):
        p, a, m = f"model.layers.{i}.", f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
        shapes.update({
            a + "q_proj.weight": (h * d, dim), a + "k_proj.weight": (hkv * d, dim), a + "v_proj.weight": (hkv * d, dim),
            a + "o_proj.weight": (dim, h * d),
            m + "gate_proj.weight": (inter, dim), m + "up_proj.weight": (inter, dim), m + "down_proj.weight": (dim, inter),
            p + "input_layernorm.weight": (dim,), p + "post_attention_layernorm.weight": (dim,),
        })
        if args.qkv_bias:
            shapes.update({a + "q_proj.bias": (h * d,), a + "k_proj.bias": (hkv * d,), a + "v_proj.bias": (hkv * d,)})
    return shapes


def check_hf_state_dict(args: ModelArgs, state: Mapping[str, Tensor]) -> None:
    """Raise ValueError unless ``state`` holds exactly the tensors ``args`` implies, in their shapes.

    Ignored: rotary ``inv_freq`` buffers (recomputed from the config) and ``lm_head.weight`` of a
    tied checkpoint (transformers ties it to the embedding as well).
    """
    shapes = hf_tensor_shapes(args)
    missing = [n for n in shapes if n not in state]
    if missing:
        raise ValueError(f"checkpoint lacks {len(missing)} tensors its config implies, e.g. {missing[:3]}")
    wrong = [f"{n}: {tuple(state[n].shape)}, expected {s}" for n, s in shapes.items() if tuple(state[n].shape) != s]
    if wrong:
        raise ValueError(f"checkpoint tensors do not match the config's shapes: {wrong[:3]}")
    extra = [n for n in state if n not in shapes and not n.endswith("rotary_emb.inv_freq") and not (args.tie_embeddings and n == "lm_head.weight")]
    if extra:
        raise ValueError(f"checkpoint holds tensors santa.model has no place for (they would change the math): {extra[:3]}")


def state_dict_from_hf(args: ModelArgs, state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """transformers' names → ours: q, k, v fused into ``wqkv`` (bias too), gate and up into ``w13``."""
    check_hf_state_dict(args, state)
    embed = state["model.embed_tokens.weight"]
    ours = {"tok_embeddings.weight": embed, "norm.weight": state["model.norm.weight"]}
    ours["output.weight"] = embed if args.tie_embeddings else state["lm_head.weight"]
    for i in range(args.n_layer):
        p, a, m = f"model.layers.{i}.", f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
        q = f"layers.{i}."
        ours[q + "attention.wqkv.weight"] = torch.cat([state[a + f"{x}_proj.weight"] for x in "qkv"])
        if args.qkv_bias:
            ours[q + "attention.wqkv.bias"] = torch.cat([state[a + f"{x}_proj.bias"] for x in "qkv"])
        ours[q + "attention.wo.weight"] = state[a + "o_proj.weight"]
        ours[q + "feed_forward.w13.weight"] = torch.cat([state[m + "gate_proj.weight"], state[m + "up_proj.weight"]])
        ours[q + "feed_forward.w2.weight"] = state[m + "down_proj.weight"]
        ours[q + "attention_norm.weight"] = state[p + "input_layernorm.weight"]
        ours[q + "ffn_norm.weight"] = state[p + "post_attention_layernorm.weight"]
    return ours


def checkpoint_folder(path: str | Path) -> Path:
    """``path`` as a folder holding ``config.json``, or raise naming what is missing."""
    if not isinstance(path, (str, Path)):
        raise TypeError(f"path must be a str or pathlib.Path to a checkpoint folder, got {type(path).__name__}")
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise ValueError(f"path must be a checkpoint folder (config.json + *.safetensors), got {str(folder)!r}: no such folder")
    if not (folder / "config.json").is_file():
        raise ValueError(f"checkpoint folder {str(folder)!r} has no config.json")
    return folder


def read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a JSON object, got {type(data).__name__}")
    return data


def read_config(path: str | Path) -> dict:
    """The folder's ``config.json`` as a dict."""
    return read_json(checkpoint_folder(path) / "config.json")


def shard_files(folder: Path) -> dict[str, Path]:
    """``{tensor name: safetensors file}`` of a single-file or sharded checkpoint."""
    index = folder / INDEX_FILE
    if index.is_file():
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ValueError(f"{index} has no weight_map (tensor name → shard file)")
        files = {name: folder / shard for name, shard in weight_map.items()}
        missing = sorted({str(f.name) for f in files.values() if not f.is_file()})
        if missing:
            raise ValueError(f"checkpoint folder {str(folder)!r} lacks the shards {missing} listed in {INDEX_FILE}")
        return files
    single = folder / SINGLE_FILE
    if single.is_file():
        from safetensors import safe_open

        with safe_open(single, framework="pt") as f:
            return dict.fromkeys(f.keys(), single)
    found = sorted(p.name for p in folder.glob("*.safetensors"))
    hint = f" (found {found} without {INDEX_FILE})" if found else ""
    raise ValueError(f"checkpoint folder {str(folder)!r} has neither {SINGLE_FILE} nor {INDEX_FILE}{hint}")


def read_state_dict(path: str | Path, *, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """Every tensor of the folder's safetensors, under the checkpoint's names, on ``device``."""
    from safetensors import safe_open

    files = shard_files(checkpoint_folder(path))
    by_file: dict[Path, list[str]] = {}
    for name, file in files.items():
        by_file.setdefault(file, []).append(name)
    state = {}
    for file, names in by_file.items():
        with safe_open(file, framework="pt", device=str(device)) as f:
            present = set(f.keys())
            absent = [n for n in names if n not in present]
            if absent:
                raise ValueError(f"{file} lacks tensors its index lists: {absent[:5]}")
            for name in names:
                state[name] = f.get_tensor(name)
    return state


def read_stop_tokens(path: str | Path) -> tuple[int, ...]:
    """The checkpoint's end-of-sequence ids (``generation_config.json``, else ``config.json``)."""
    folder = checkpoint_folder(path)
    generation = folder / "generation_config.json"
    for source in ([generation] if generation.is_file() else []) + [folder / "config.json"]:
        eos = read_json(source).get("eos_token_id")
        if eos is not None:
            return tuple(int(t) for t in (eos if isinstance(eos, list) else [eos]))
    return ()


__all__ = [
    "ARCHITECTURES",
    "ROPE_TYPES",
    "args_from_config",
    "check_hf_state_dict",
    "checkpoint_folder",
    "hf_tensor_shapes",
    "read_config",
    "read_state_dict",
    "read_stop_tokens",
    "shard_files",
    "state_dict_from_hf",
]
