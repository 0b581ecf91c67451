"""Llama / Qwen2 checkpoints in Hugging Face's format, read without transformers or the hub.

- :class:`ModelArgs`, santa.model's architecture arguments (defined here; ``santa.model.ModelArgs``
  is the same class), and the config (a transformers config or config.json) → its fields,
  refusing what santa.model does not implement (:func:`args_from_config`);
- the tensors under transformers' names → santa.model's, checked against the config
  (:func:`state_dict_from_hf`);
- a local folder: ``config.json`` and either ``model.safetensors`` or shards listed by
  ``model.safetensors.index.json`` (its ``weight_map``: tensor name → shard file).
"""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from santa.checks import integer

ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}  # model_type → class
ROPE_TYPES = ("default", "llama3")

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


@dataclass(frozen=True)
class ModelArgs:
    n_layer: int = 32
    n_head: int = 32
    n_kv_head: int = 8
    dim: int = 4096
    intermediate_size: int = 14336
    vocab_size: int = 128256
    rope_base: float = 500000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = False
    # Llama-3.1 frequency scaling: (factor, low_freq_factor, high_freq_factor, original_max_position)
    rope_scaling: tuple[float, float, float, int] | None = None
    qkv_bias: bool = False  # Qwen2: q_proj, k_proj and v_proj carry a bias (o_proj and the MLP do not)

    def __post_init__(self):
        """Refuse arguments no model can have (TypeError: wrong type; ValueError: bad value), naming the field."""
        for name in ("n_layer", "n_head", "n_kv_head", "dim", "intermediate_size", "vocab_size"):
            object.__setattr__(self, name, integer(f"ModelArgs.{name}", getattr(self, name), low=1))
        if self.dim % self.n_head or (self.dim // self.n_head) % 2:
            raise ValueError(f"ModelArgs.dim must be n_head × an even head_dim (rotary halves), got dim={self.dim}, n_head={self.n_head}")
        if self.n_head % self.n_kv_head:
            raise ValueError(f"ModelArgs.n_head must be a multiple of n_kv_head, got {self.n_head} and {self.n_kv_head}")
        object.__setattr__(self, "rope_base", positive_float("ModelArgs.rope_base", self.rope_base))
        object.__setattr__(self, "norm_eps", positive_float("ModelArgs.norm_eps", self.norm_eps, allow_zero=True))
        for name in ("tie_embeddings", "qkv_bias"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"ModelArgs.{name} must be a bool, got {type(getattr(self, name)).__name__}")
        if self.rope_scaling is not None:
            object.__setattr__(self, "rope_scaling", checked_rope_scaling(self.rope_scaling))

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_head

    @classmethod
    def from_hf_config(cls, config) -> ModelArgs:
        """Arguments of a Llama or Qwen2 checkpoint: a transformers config, or its config.json dict
        (ValueError naming what santa.model does not implement: see :func:`santa.checkpoint.args_from_config`)."""
        return cls(**args_from_config(config))


def positive_float(name: str, value: object, *, allow_zero: bool = False) -> float:
    """``value`` as a finite float > 0 (≥ 0 with ``allow_zero``), or TypeError / ValueError naming ``name``."""
    bound = "≥ 0" if allow_zero else "> 0"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number {bound}, got {type(value).__name__} {value!r:.80}")
    value = float(value)
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{name} must be a finite number {bound}, got {value}")
    return value


def checked_rope_scaling(scaling: object) -> tuple[float, float, float, int]:
    """Llama-3.1's ``(factor, low_freq_factor, high_freq_factor, original_max_position)``, checked."""
    if not isinstance(scaling, tuple) or len(scaling) != 4:
        raise TypeError(f"ModelArgs.rope_scaling must be None or a tuple (factor, low_freq_factor, high_freq_factor, "
                        f"original_max_position), got {scaling!r:.80}")
    factor, low, high = (positive_float(f"ModelArgs.rope_scaling[{i}]", x) for i, x in enumerate(scaling[:3]))
    original = integer("ModelArgs.rope_scaling[3] (original_max_position)", scaling[3], low=1)
    if high <= low:
        raise ValueError(f"ModelArgs.rope_scaling needs high_freq_factor > low_freq_factor, got {high} and {low}")
    return factor, low, high, original


def config_value(cfg: Mapping, key: str, source: str, *, default: object, expected: str) -> object:
    """``cfg[key]``, else ``default``; ValueError naming ``source`` when both are None (a required key)."""
    value = cfg.get(key)
    if value is not None:
        return value
    if default is None:
        raise ValueError(f"{source} lacks {key!r} ({expected})")
    return default


def config_int(cfg: Mapping, key: str, source: str, *, low: int = 1, default: object = None) -> int:
    """``cfg[key]`` (else ``default``) as an int ≥ ``low``, or ValueError naming the key and ``source``
    (a wrong type in a config file is a bad value of that file: ValueError too)."""
    value = config_value(cfg, key, source, default=default, expected=f"an int ≥ {low}")
    try:
        return integer(f"{source}: {key}", value, low=low)
    except TypeError as error:
        raise ValueError(str(error)) from None


def config_float(cfg: Mapping, key: str, source: str, *, default: float | None = None, positive: bool = True) -> float:
    """``cfg[key]`` (else ``default``; None: required) as a finite float, > 0 when ``positive`` (else ≥ 0)."""
    value = config_value(cfg, key, source, default=default, expected=f"a number {'> 0' if positive else '≥ 0'}")
    try:
        return positive_float(f"{source}: {key}", value, allow_zero=not positive)
    except TypeError as error:
        raise ValueError(str(error)) from None


def config_mapping(cfg: Mapping, key: str, source: str) -> dict:
    """``cfg[key]`` as a dict ({} when absent or null), or ValueError naming the key."""
    value = cfg.get(key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(f"{source}: {key} must be a JSON object or null, got {type(value).__name__} {value!r:.80}")
    return dict(value)


def config_dict(config) -> dict:
    """A transformers config or a config.json dict, as a plain dict."""
    if isinstance(config, Mapping):
        return dict(config)
    if hasattr(config, "to_dict"):
        return config.to_dict()
    raise TypeError(f"config must be a transformers config or a config.json dict, got {type(config).__name__}")


def check_architecture(cfg: dict, source: str) -> str:
    """The transformers class name of a Llama or Qwen2 config, or ValueError."""
    model_type = cfg.get("model_type")
    if not isinstance(model_type, str) or model_type not in ARCHITECTURES:
        raise ValueError(f"{source}: model_type must be one of {sorted(ARCHITECTURES)} (santa.model implements Llama and Qwen2), got {model_type!r:.80}")
    arch = ARCHITECTURES[model_type]
    archs = cfg.get("architectures") or [arch]
    if not isinstance(archs, list) or archs != [arch]:
        raise ValueError(f"{source}: architectures must be [{arch!r}] for model_type {model_type!r}, got {archs!r:.80}")
    return arch


def shape_fields(cfg: dict, source: str) -> dict:
    """Layers, heads, widths and vocabulary: ints ≥ 1, heads dividing the width and KV heads the heads."""
    n_head = config_int(cfg, "num_attention_heads", source)
    fields = dict(
        n_layer=config_int(cfg, "num_hidden_layers", source),
        n_head=n_head,
        n_kv_head=config_int(cfg, "num_key_value_heads", source, default=n_head),
        dim=config_int(cfg, "hidden_size", source),
        intermediate_size=config_int(cfg, "intermediate_size", source),
        vocab_size=config_int(cfg, "vocab_size", source),
    )
    dim, n_kv_head = fields["dim"], fields["n_kv_head"]
    if dim % n_head or (dim // n_head) % 2:
        raise ValueError(f"{source}: hidden_size must be num_attention_heads × an even head_dim (rotary halves), got {dim} and {n_head} heads")
    if n_head % n_kv_head:
        raise ValueError(f"{source}: num_attention_heads must be a multiple of num_key_value_heads, got {n_head} and {n_kv_head}")
    return fields


def unsupported_features(cfg: dict, source: str, model_type: str, n_layer: int, head_dim: int, rope: dict, rope_type: object) -> list[str]:
    """What santa.model does not implement in this config, one phrase each."""
    unsupported = []
    quantization = cfg.get("quantization_config")
    if quantization:
        method = quantization.get("quant_method", "?") if isinstance(quantization, Mapping) else quantization
        unsupported.append(f"quantization_config {method!r:.80} (load a float checkpoint)")
    if cfg.get("hidden_act", "silu") != "silu":
        unsupported.append(f"hidden_act={cfg['hidden_act']!r:.80} (SiLU only)")
    if cfg.get("head_dim") not in (None, head_dim):
        unsupported.append(f"head_dim={cfg['head_dim']!r:.80} ≠ hidden_size / num_attention_heads = {head_dim}")
    if model_type == "llama" and (cfg.get("attention_bias") or cfg.get("mlp_bias")):
        unsupported.append("attention_bias / mlp_bias (biased o_proj or MLP)")
    layer_types = cfg.get("layer_types") or []
    if not isinstance(layer_types, list):
        raise ValueError(f"{source}: layer_types must be a list of attention kinds, got {type(layer_types).__name__} {layer_types!r:.80}")
    sliding = [i for i, t in enumerate(layer_types) if t != "full_attention"]
    if not layer_types and cfg.get("use_sliding_window") and cfg.get("sliding_window"):
        first = config_int(cfg, "max_window_layers", source, low=0, default=0)
        sliding = list(range(first, n_layer))  # HF: layers ≥ max_window_layers slide
    if sliding:
        unsupported.append(f"sliding-window attention (sliding_window={cfg.get('sliding_window')!r:.40}, layers {sliding[:4]}…)")
    if not isinstance(rope_type, str) or rope_type not in ROPE_TYPES:
        unsupported.append(f"rope_type={rope_type!r:.80} (implemented: {ROPE_TYPES})")
    partial = rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor"))
    if config_float({"partial_rotary_factor": partial}, "partial_rotary_factor", source, default=1.0) != 1.0:
        unsupported.append("partial_rotary_factor ≠ 1")
    return unsupported


def llama3_scaling(rope: dict, source: str) -> tuple[float, float, float, int]:
    """Llama-3.1's (factor, low_freq_factor, high_freq_factor, original_max_position_embeddings)."""
    where = f"{source} (llama3 rope_scaling)"
    factor, low, high = (config_float(rope, k, where) for k in ("factor", "low_freq_factor", "high_freq_factor"))
    original = config_int(rope, "original_max_position_embeddings", where)
    if high <= low:
        raise ValueError(f"{where}: high_freq_factor must exceed low_freq_factor, got {high} and {low}")
    return factor, low, high, original


def args_from_config(config, *, source: str = "config") -> dict:
    """The :class:`santa.model.ModelArgs` fields of a Llama or Qwen2 checkpoint: a transformers
    config, or its config.json dict (both spellings of rope: ``rope_parameters``, or the older
    ``rope_theta`` + ``rope_scaling``). ``source`` names the config in messages (e.g. its path).

    Raises ValueError naming the key of a malformed value (a float or string where an int is
    expected, 0 layers or heads, heads not dividing hidden_size, a llama3 rope without its
    factors, …) and naming what santa.model does not implement: another architecture,
    sliding-window attention in use, a rope type other than default / llama3, a biased o_proj
    or MLP, an activation other than SiLU, head_dim ≠ hidden_size / heads, quantised weights.
    """
    cfg = config_dict(config)
    arch = check_architecture(cfg, source)
    fields = shape_fields(cfg, source)
    rope = config_mapping(cfg, "rope_parameters", source) or config_mapping(cfg, "rope_scaling", source)
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    unsupported = unsupported_features(cfg, source, cfg["model_type"], fields["n_layer"], fields["dim"] // fields["n_head"], rope, rope_type)
    if unsupported:
        raise ValueError(f"santa.model cannot run this {arch} checkpoint: unsupported " + "; ".join(unsupported))
    tie = cfg.get("tie_word_embeddings", False)
    if not isinstance(tie, bool):
        raise ValueError(f"{source}: tie_word_embeddings must be true or false, got {tie!r:.80}")
    theta = rope.get("rope_theta", cfg.get("rope_theta"))
    return dict(
        **fields,
        rope_base=config_float({"rope_theta": theta}, "rope_theta", source, default=10000.0),
        norm_eps=config_float(cfg, "rms_norm_eps", source, default=1e-6, positive=False),
        tie_embeddings=tie,
        rope_scaling=llama3_scaling(rope, source) if rope_type == "llama3" else None,
        qkv_bias=cfg["model_type"] == "qwen2",
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
    if not isinstance(state, Mapping):
        raise TypeError(f"state must be a mapping of tensor names to tensors, got {type(state).__name__}")
    not_tensors = [n for n, t in state.items() if not isinstance(t, Tensor)]
    if not_tensors:
        raise ValueError(f"checkpoint entries that are not tensors: {not_tensors[:3]}")
    if 9 * args.n_layer > len(state):  # before listing the shapes of a config that claims 10⁹ layers
        raise ValueError(f"checkpoint holds {len(state)} tensors, too few for the {args.n_layer} layers of its config (9 per layer)")
    shapes = hf_tensor_shapes(args)
    missing = [n for n in shapes if n not in state]
    if missing:
        raise ValueError(f"checkpoint lacks {len(missing)} tensors its config implies, e.g. {missing[:3]}")
    wrong = [f"{n}: {tuple(state[n].shape)}, expected {s}" for n, s in shapes.items() if tuple(state[n].shape) != s]
    if wrong:
        raise ValueError(f"checkpoint tensors do not match the config's shapes: {wrong[:3]}")
    integral = [f"{n}: {state[n].dtype}" for n in shapes if not state[n].is_floating_point()]
    if integral:  # quantised or mis-saved weights: santa.model computes in floating point
        raise ValueError(f"checkpoint tensors must be floating point (load a float checkpoint), got {integral[:3]}")
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
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from None
    except OSError as e:
        raise ValueError(f"{path} cannot be read: {e}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a JSON object, got {type(data).__name__}")
    return data


def read_config(path: str | Path) -> dict:
    """The folder's ``config.json`` as a dict."""
    return read_json(checkpoint_folder(path) / "config.json")


def shard_path(folder: Path, shard: object, index: Path) -> Path:
    """``folder / shard`` for a shard name of the index, refusing a name that leaves the folder
    (absolute, or with a ``..`` part). Symlinks inside the folder are followed (the hub's
    snapshot folders link to their blobs)."""
    if not isinstance(shard, str) or not shard:
        raise ValueError(f"{index}: weight_map values must be shard file names, got {shard!r:.80}")
    relative = Path(shard)
    if relative.is_absolute() or relative.drive or ".." in relative.parts:
        raise ValueError(f"{index}: weight_map names the shard {shard!r:.80} outside the checkpoint folder (shards must be relative paths inside it)")
    return folder / relative


def safetensors_names(file: Path) -> list[str]:
    """The tensor names of a safetensors file, or ValueError naming it (empty, truncated, not safetensors)."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(file, framework="pt") as f:
            return list(f.keys())
    except (SafetensorError, OSError) as e:
        raise ValueError(f"{file} is not a readable safetensors file ({e}): re-download or re-save the checkpoint") from None


def shard_files(folder: Path) -> dict[str, Path]:
    """``{tensor name: safetensors file}`` of a single-file or sharded checkpoint."""
    index = folder / INDEX_FILE
    if index.is_file():
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ValueError(f"{index} has no weight_map (tensor name → shard file)")
        files = {name: shard_path(folder, shard, index) for name, shard in weight_map.items()}
        missing = sorted({str(f.relative_to(folder)) for f in files.values() if not f.is_file()})
        if missing:
            raise ValueError(f"checkpoint folder {str(folder)!r} lacks the shards {missing} listed in {INDEX_FILE}")
        return files
    single = folder / SINGLE_FILE
    if single.is_file():
        return dict.fromkeys(safetensors_names(single), single)
    found = sorted(p.name for p in folder.glob("*.safetensors"))
    hint = f" (found {found} without {INDEX_FILE})" if found else ""
    raise ValueError(f"checkpoint folder {str(folder)!r} has neither {SINGLE_FILE} nor {INDEX_FILE}{hint}")


def read_tensors(file: Path, names: list[str], device: str) -> dict[str, torch.Tensor]:
    """The tensors ``names`` of one safetensors file on ``device``, or ValueError naming the file."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(file, framework="pt", device=device) as f:
            absent = [n for n in names if n not in set(f.keys())]
            if absent:
                raise ValueError(f"{file} lacks tensors its index lists: {absent[:5]}")
            return {name: f.get_tensor(name) for name in names}
    except (SafetensorError, OSError) as e:
        raise ValueError(f"{file} is not a readable safetensors file ({e}): re-download or re-save the checkpoint") from None


def checked_device(device: object) -> str:
    """``device`` (a str or torch.device) as a string, or TypeError / ValueError naming it."""
    if not isinstance(device, (str, torch.device)):
        raise TypeError(f"device must be a str or torch.device, got {type(device).__name__} {device!r:.80}")
    try:
        return str(torch.device(device))
    except RuntimeError as e:
        raise ValueError(f"device must name a torch device such as 'cpu' or 'cuda:0', got {device!r:.80} ({e})") from None


def read_state_dict(path: str | Path, *, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """Every tensor of the folder's safetensors, under the checkpoint's names, on ``device``.

    Raises ValueError naming the file when one is not a readable safetensors file (empty,
    truncated, random bytes) or an index lists a shard outside the folder.
    """
    device = checked_device(device)
    files = shard_files(checkpoint_folder(path))
    by_file: dict[Path, list[str]] = {}
    for name, file in files.items():
        by_file.setdefault(file, []).append(name)
    state = {}
    for file, names in by_file.items():
        state.update(read_tensors(file, names, device))
    return state


def read_stop_tokens(path: str | Path) -> tuple[int, ...]:
    """The checkpoint's end-of-sequence ids (``generation_config.json``, else ``config.json``):
    ints ≥ 0, or ValueError naming the file."""
    folder = checkpoint_folder(path)
    generation = folder / "generation_config.json"
    for source in ([generation] if generation.is_file() else []) + [folder / "config.json"]:
        eos = read_json(source).get("eos_token_id")
        if eos is None:
            continue
        ids = eos if isinstance(eos, list) else [eos]
        if any(isinstance(t, bool) or not isinstance(t, int) or t < 0 for t in ids):
            raise ValueError(f"{source}: eos_token_id must be a token id (an int ≥ 0) or a list of them, got {eos!r:.80}")
        return tuple(ids)
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
