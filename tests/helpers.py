"""Plain functions and constants shared by the tests, defined once (the fixtures are in tests/conftest.py).

Imported as ``helpers``: pyproject.toml's ``[tool.pytest.ini_options] pythonpath`` puts tests/ on the
path. Optional dependencies (transformers, ray) are imported inside the functions that need them.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from santa.budgets.rewards import RewardSpec
from santa.budgets.run_folder import HISTORY, TuneSpec, replay

REPO = Path(__file__).resolve().parents[1]  # the checkout: pyproject.toml, src/, benchmarks/, tests/
CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if CUDA else "cpu")
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
KERNELS = ("prop", "flash")  # santa.kernels' two kernels, by name


# --- command lines --------------------------------------------------------------------------------


def exit_code_and_stderr(main, argv: list[str], capsys) -> tuple[object, str]:
    """Run ``main(argv)``, which must raise SystemExit: (its exit code, what it wrote to stderr)."""
    with pytest.raises(SystemExit) as stop:
        main(argv)
    return stop.value.code, capsys.readouterr().err


def refusal(main, argv: list[str], capsys) -> str:
    """The stderr of a command that must stop with status 2 (argparse's refusal, with its usage line)
    and no traceback."""
    code, err = exit_code_and_stderr(main, argv, capsys)
    assert code == 2
    assert "Traceback" not in err
    assert "usage:" in err
    return err


# --- tensors --------------------------------------------------------------------------------------


def qkv(b=2, hq=6, hkv=2, lq=1, lk=50, d=16, *, dv=None, seed=0, dtype=torch.float32):
    """Seeded random q ``[b, hq, lq, d]``, k ``[b, hkv, lk, d]`` and v ``[b, hkv, lk, dv or d]`` (HND, CPU)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, hq, lq, d, generator=g).to(dtype)
    k = torch.randn(b, hkv, lk, d, generator=g).to(dtype)
    v = torch.randn(b, hkv, lk, dv or d, generator=g).to(dtype)
    return q, k, v


def random_probs(shape=(4, 50), seed=0, peak=1.0, dtype=torch.float64):
    """Seeded random probabilities over the last dimension of ``shape`` (``peak`` sharpens them)."""
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(peak * torch.randn(shape, generator=g, dtype=dtype), dim=-1)


def make_inputs(batch=2, heads=4, kv_heads=2, dim=16, n_keys=40, dtype=torch.float32, *, seed=0, q_scale=1.0,
                layout="NHD", device=DEVICE):
    """Seeded decode inputs of santa.kernels: q ``[B, H, d]`` and a K/V cache, NHD ``[B, L, H_kv, d]``
    or HND ``[B, H_kv, L, d]``, on ``device`` (the GPU where there is one)."""
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(batch, heads, dim, generator=g) * q_scale).to(dtype)
    shape = (batch, n_keys, kv_heads, dim) if layout == "NHD" else (batch, kv_heads, n_keys, dim)
    k = torch.randn(shape, generator=g).to(dtype)
    v = torch.randn(shape, generator=g).to(dtype)
    return q.to(device), k.to(device), v.to(device)


def to_paged(cache, page_size, seed=0):
    """Scatter a contiguous NHD cache [B, L, H_kv, d] into shuffled pages + an int32 block table."""
    batch, n_keys, kv_heads, dim = cache.shape
    pages_per_seq = -(-n_keys // page_size)
    padded = torch.nn.functional.pad(cache, (0, 0, 0, 0, 0, pages_per_seq * page_size - n_keys))
    pages = padded.reshape(batch * pages_per_seq, page_size, kv_heads, dim)
    perm = torch.randperm(batch * pages_per_seq + 3, generator=torch.Generator().manual_seed(seed))
    perm = perm[perm < batch * pages_per_seq]
    paged = torch.randn(batch * pages_per_seq + 3, page_size, kv_heads, dim, device=cache.device).to(cache.dtype)
    paged[perm] = pages
    block_table = perm.reshape(batch, pages_per_seq).to(torch.int32).to(cache.device)
    return paged, block_table


def kernel_reference(kernel, q, k, v, budget, **kw):
    """santa.kernels' torch reference of ``kernel`` (flash with its default tile for the head size)."""
    from santa.kernels import flash_reference, flash_tile, prop_reference

    if kernel == "prop":
        return prop_reference(q, k, v, budget, **kw)
    return flash_reference(q, k, v, budget, tile=flash_tile(q.shape[-1]), **kw)


# --- tiny models (no download) --------------------------------------------------------------------

# Prompts and a stop token of santa.model's CONFIGS["tiny"] (vocabulary 256) whose tokens are pinned
# in tests/model/test_engine.py and tests/bench/test_bench_e2e.py.
TINY_PROMPTS = [[122, 174, 183, 197, 129], [104, 87, 200, 50, 137, 58, 252, 103, 109, 94, 55, 183, 57, 104, 164, 178, 44, 38, 126, 234, 52, 131, 0], [183, 21, 149, 201, 166, 253, 230, 56, 194, 174, 117, 30]]
TINY_STOP = 251

HF_SMALL = {
    "vocab_size": 64,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 128,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
# family: (config class, model class, config fields beyond HF_SMALL)
HF_FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "mistral, sliding window 8": ("MistralConfig", "MistralForCausalLM", {"sliding_window": 8}),
    "qwen2, sliding window in layer 1": (
        "Qwen2Config", "Qwen2ForCausalLM", {"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 1},
    ),
    "gemma3, window and scale 1/4 for D=8": (
        "Gemma3TextConfig", "Gemma3ForCausalLM", {"sliding_window": 8, "head_dim": 8, "query_pre_attn_scalar": 16},
    ),
    "gemma2 without the softcap": (
        "Gemma2Config", "Gemma2ForCausalLM",
        {"sliding_window": 8, "head_dim": 8, "query_pre_attn_scalar": 12, "attn_logit_softcapping": None},
    ),
    "deepseek_v3, MLA": (
        "DeepseekV3Config", "DeepseekV3ForCausalLM",
        {"kv_lora_rank": 16, "q_lora_rank": 16, "qk_rope_head_dim": 4, "qk_nope_head_dim": 8, "v_head_dim": 6,
         "n_routed_experts": 2, "num_experts_per_tok": 1, "first_k_dense_replace": 2, "head_dim": 4, "num_key_value_heads": 4},
    ),
}


def tiny_hf_model(family: str = "llama", **fields) -> torch.nn.Module:
    """A random 2-layer transformers model of ``family`` (a key of HF_FAMILIES), in eval mode, seeded."""
    import transformers

    config_class, model_class, extra = HF_FAMILIES[family]
    torch.manual_seed(0)
    config = getattr(transformers, config_class)(**{**HF_SMALL, **extra, **fields})
    return getattr(transformers, model_class)(config).eval()


def recorded_decode_argument(monkeypatch, name: str) -> list:
    """Patches :func:`santa.kernels.decode` (what santa.hf's kernel path calls) to record keyword ``name`` of every
    call in the returned list, then decode as before."""
    import santa.kernels

    recorded = []
    real_decode = santa.kernels.decode

    def recording_decode(*args, **kwargs):
        recorded.append(kwargs[name])
        return real_decode(*args, **kwargs)

    monkeypatch.setattr(santa.kernels, "decode", recording_decode)
    return recorded


# --- sweep files (santa eval) ---------------------------------------------------------------------


def sweep_jobs():
    """A small grid: dense and topk S=16 on prompts 0 and 1 of one task, length and model."""
    from santa.eval.runner import grid

    return grid(models=["m"], tasks=["niah_single"], lengths=[512], methods=["dense", "topk"], budgets=[16], prompts=[0, 1])


def sweep_record(job, score: float = 1.0) -> dict:
    """The sweep-file record of ``job`` with ``score``."""
    return {"key": job.key(), **asdict(job), "score": score, "prompt_tokens": 500, "new_tokens": 8, "v_rows_read": 0.5}


def write_jsonl(path: Path, records) -> None:
    """Write ``records`` to ``path``, one JSON object a line."""
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


# --- santa ablate / santa tune --------------------------------------------------------------------

# The cells commands' flags for the tiny random model (2 layers, byte tokenizer): short prompts, 3 of them.
TINY_CELLS_FLAGS = ["--model", "tiny-random", "--length", "160", "--kl-tokens", "8", "--prompts", "0-2", "--no-progress"]


class CountingScorer:
    """A scorer of schedule cells that counts its calls (and raises KeyboardInterrupt after ``fail_after``)."""

    def __init__(self, fail_after=None):
        self.calls, self.fail_after = 0, fail_after

    def scores(self, layer_budgets, *, prompts, seed):
        if self.fail_after is not None and self.calls == self.fail_after:
            raise KeyboardInterrupt  # killed mid-sweep
        self.calls += 1
        return {p: float(sum(layer_budgets.values()) + p) for p in prompts}


# The tune spec of the Ray tests: the synthetic reward on 4 layers, 16 rows, 3 episodes an update.
SYNTHETIC_SPEC = TuneSpec(reward=RewardSpec(kind="synthetic", model="tiny-random"), n_layers=4, total=16, floor=1, alpha=0.5, episodes=3)


def tune_history(out) -> list[dict]:
    """The history lines of the tune run in folder ``out``, by update."""
    from santa.sweep_files import read_records

    return sorted(read_records(Path(out) / HISTORY), key=lambda r: r["update"])


def assert_consistent_history(updates, spec=SYNTHETIC_SPEC):
    """Contiguous updates, each episode once, and θ in every line equal to the replay from θ = 0."""
    assert [u["update"] for u in updates] == list(range(1, len(updates) + 1))
    ids = [e["id"] for u in updates for e in u["episodes"]]
    assert len(ids) == len(set(ids))
    for record, state in zip(updates, replay(updates, spec), strict=True):
        assert record["theta"] == pytest.approx(list(state.theta), abs=1e-12)


class CharTokenizer:
    """A character tokenizer for a tiny random model: ids 3 … 63, no stop token, no chat template."""

    eos_token_id = unk_token_id = None

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True):
        return messages[-1]["content"]

    def encode(self, text, add_special_tokens=False):
        return [3 + ord(c) % 61 for c in text]

    def __call__(self, text, return_tensors=None, add_special_tokens=False):
        ids = self.encode(text)
        return argparse.Namespace(input_ids=torch.tensor([ids]) if return_tensors == "pt" else ids)

    def decode(self, tokens, skip_special_tokens=True):
        return "".join(chr(64 + t) for t in tokens)

    def convert_tokens_to_ids(self, token):
        return None
