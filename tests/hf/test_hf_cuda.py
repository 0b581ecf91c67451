"""The transformers backend on CUDA, where decode runs the Triton kernels (tiny random Llama)."""

import importlib

import pytest
import torch

import santa.hf
from helpers import recorded_decode_argument

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="the kernel decode path needs CUDA")


@pytest.fixture(scope="module")
def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=4096,
    )
    return LlamaForCausalLM(config).to("cuda", torch.bfloat16).eval()


def test_cuda_decode_runs_the_kernel_and_stays_close_to_dense(tiny_llama, monkeypatch):
    calls = recorded_decode_argument(monkeypatch, "kernel")
    ids = torch.randint(0, 512, (2, 600), generator=torch.Generator().manual_seed(1)).cuda()
    with torch.inference_mode():
        santa.hf.configure(tiny_llama, santa.hf.SantaConfig(sampler="dense"))
        dense = tiny_llama.generate(ids, max_new_tokens=4, do_sample=False, output_logits=True, return_dict_in_generate=True)
        config = santa.hf.SantaConfig(budget=64, sampler="systematic", record_stats=True)
        santa.hf.configure(tiny_llama, config)
        sampled = tiny_llama.generate(ids, max_new_tokens=4, do_sample=False, output_logits=True, return_dict_in_generate=True)
        again = tiny_llama.generate(ids, max_new_tokens=4, do_sample=False, output_logits=True, return_dict_in_generate=True)
    # 2 sampled generate() calls × 3 decode forwards (the prefill makes the first token) × 2 layers
    assert calls == ["prop"] * 12
    assert config.stats.calls == 12 and 0 < config.stats.share_per_head <= 64 / 600
    first_dense, first_sampled = dense.logits[1].float(), sampled.logits[1].float()  # the first decode step
    kl = torch.sum(first_dense.softmax(-1) * (first_dense.log_softmax(-1) - first_sampled.log_softmax(-1)), -1)
    assert (kl < 0.5).all()
    assert torch.equal(sampled.sequences, again.sequences)  # same seed, same tokens


def test_static_cache_and_compiled_generate_run_the_kernel_and_match_eager(tiny_llama):
    """Issue 26: `cache_implementation="static"` + transformers' compiled decode (fullgraph, CUDA-graph trees) runs
    the prop kernel through the santa::decode custom op, replays the same tokens, and its first decode step
    draws what the eager dynamic-cache step draws (on Hopper both take the one launch: request-keyed
    randomness; later steps may part where compiled and eager bf16 arithmetic round a near-tie differently, or where the
    one launch's CDF slices follow the cache's length). The compiled run comes first in a fresh plan cache, so its plan
    is made while the trees warm a graph up (the op makes it on a helper thread, outside the trees' pool)."""
    from transformers import CompileConfig

    eager_module = importlib.import_module("santa.kernels.eager")
    ids = torch.randint(0, 512, (2, 600), generator=torch.Generator().manual_seed(2)).cuda()
    mask = torch.ones_like(ids)
    mask[1, :40] = 0  # the second row left-padded by 40
    config = dict(budget=64, sampler="systematic", seed=3, kernel="prop")
    torch._dynamo.reset()
    eager_module._CALLS.clear()
    run = dict(attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0, output_logits=True,
               return_dict_in_generate=True)
    compiled_run = dict(run, cache_implementation="static",
                        compile_config=CompileConfig(fullgraph=True, mode="reduce-overhead", dynamic=False))
    with torch.inference_mode():
        santa.hf.configure(tiny_llama, santa.hf.SantaConfig(**config))
        compiled = tiny_llama.generate(ids, **compiled_run)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
            replayed = tiny_llama.generate(ids, **compiled_run)
        eager = tiny_llama.generate(ids, **run)
    assert hasattr(tiny_llama, "_compiled_call")  # transformers took the compiled decode path
    names = {event.name for event in profile.events()}
    hopper = torch.cuda.get_device_capability() == (9, 0)  # the op's plan takes the one launch there (prop1*_d64_g2)
    ran = [name for name in names if (name.startswith("prop1") if hopper else "_prop_gather_kernel" in name)]
    assert ran, sorted(name for name in names if "prop" in name or name.startswith("triton"))
    assert torch.equal(replayed.sequences, compiled.sequences)
    first_eager, first_compiled = eager.logits[1].float(), compiled.logits[1].float()  # the first decode step
    kl = torch.sum(first_eager.softmax(-1) * (first_eager.log_softmax(-1) - first_compiled.log_softmax(-1)), -1)
    assert (kl < 1e-2).all(), kl
    assert torch.equal(compiled.sequences[:, :602], eager.sequences[:, :602])


def test_batch_invariant_gives_a_prompt_the_same_tokens_alone_and_batched(tiny_llama):
    """SantaConfig(batch_invariant=True, kernel="prop"): every decode call plans the Triton prop (on Hopper the
    default's plans take the one launch, whose slices follow the batch), and a prompt generates the same tokens alone
    and left-padded by 93 tokens beside a longer prompt (the Triton prop cuts its tiles from each sequence's first key,
    so the pad need not be whole tiles). Tokens, not logits: the model's other layers round a batch of two otherwise
    than one."""
    eager = importlib.import_module("santa.kernels.eager")
    short = torch.randint(0, 512, (600,), generator=torch.Generator().manual_seed(4))
    long = torch.randint(0, 512, (693,), generator=torch.Generator().manual_seed(5))
    ids = torch.stack([long, torch.cat([torch.zeros(93, dtype=torch.long), short])]).cuda()
    mask = torch.ones_like(ids)
    mask[1, :93] = 0
    santa.hf.configure(tiny_llama, santa.hf.SantaConfig(budget=64, sampler="systematic", seed=3, kernel="prop",
                                                        batch_invariant=True))
    run = dict(max_new_tokens=8, min_new_tokens=8, do_sample=False, pad_token_id=0)  # 8 tokens: no stop at EOS (2)
    eager._CALLS.clear()
    with torch.inference_mode():
        batched = tiny_llama.generate(ids, attention_mask=mask, **run)[:, 693:]
        alone = tiny_llama.generate(short[None].cuda(), attention_mask=torch.ones(1, 600, dtype=torch.long, device="cuda"),
                                    **run)[:, 600:]
    plans = [call.plan for call in eager._CALLS.values()]
    assert plans and all(plan.tuning.one_launch is False and plan.one_launch is None for plan in plans)
    assert torch.equal(alone[0], batched[1]), (alone, batched)
