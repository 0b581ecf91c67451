"""HF ``generate()`` ms/token with santa's attention: dense (SDPA) against santa prop S=128 (the
kernels through ``santa.decode``), on a random Llama-3.1-8B-shaped model (bf16, CUDA).
ms/token = (t(LONG new tokens) − t(SHORT)) / (LONG − SHORT), median of 3 after one warm-up pair,
so the prefill cancels. Writes JSON to argv[1].

    python benchmarks/kernels/hf_generate.py out.json [prompt_tokens ...]
"""

import json
import statistics
import sys
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import santa.hf

SHORT, LONG = 8, 40
out_path = sys.argv[1]
lengths = [int(x) for x in sys.argv[2:]] or [8192, 30000]
config = LlamaConfig(vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                     num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=40000)
torch.manual_seed(0)
with torch.device("cuda"):
    model = LlamaForCausalLM(config).to(torch.bfloat16).eval()


def timed(ids, new_tokens):
    torch.cuda.synchronize()
    start = time.perf_counter()
    out = model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
    torch.cuda.synchronize()
    return time.perf_counter() - start, out


results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cases": []}
for n in lengths:
    ids = torch.randint(0, config.vocab_size, (1, n), generator=torch.Generator().manual_seed(n)).cuda()
    case = {"prompt_tokens": n}
    for name, sampler in (("sdpa", "dense"), ("santa-prop", "systematic")):
        santa.hf.configure(model, santa.hf.SantaConfig(sampler=sampler, budget=128))
        per_token = []
        with torch.inference_mode():
            timed(ids, SHORT), timed(ids, LONG)  # warm-up: compilation, plans, allocator
            for _ in range(3):
                t_short, _ = timed(ids, SHORT)
                t_long, out = timed(ids, LONG)
                per_token.append((t_long - t_short) / (LONG - SHORT) * 1e3)
        case[name] = {"ms_per_token_median": statistics.median(per_token), "ms_per_token_all": per_token,
                      "tokens": out[0, n:].tolist()}
        print(f"n={n} {name:30s} {statistics.median(per_token):8.2f} ms/token  {[round(x, 2) for x in per_token]}", flush=True)
    results["cases"].append(case)
    json.dump(results, open(out_path, "w"), indent=1)
