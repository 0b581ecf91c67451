"""How many slices a short sequence should take: the one launch on vLLM's paged cache with one-wave host plans of C
slices per group (C = 1, 2, 4, … up to one wave), beside the plan rule's choice and cuDNN, in the same call (issue 39's
short cells, where santa still loses to dense).

    python benchmarks/kernels/short_slices.py OUT.jsonl

Cases: Llama-3.1-8B and Qwen2.5-0.5B shapes (paged_ab.py's MODELS), batch 1 and 16, n ∈ {512, 1k, 2k, 4k}, S = 128,
16-key shuffled pages (paged_ab.inputs), every arm on the same draws (paged_ab.launch_arm). Keys: ``C<slices>_us``,
``rule_us`` (the plan rule's choice through PagedDecoder, ``rule_plan``), and paged_ab.dense_arms' ``cudnn_us``. CUDA-graph replay, clean cold
L2, medians. The first line records the command, commit and device; one line per case, resumable.
"""

from __future__ import annotations

import argparse
import sys

import torch

sys.path.insert(0, ".")
from benchmarks.bench.case_log import add_case, cases_done, run_locked  # noqa: E402
from benchmarks.bench.timing import Flusher  # noqa: E402
from benchmarks.kernels.paged_ab import MODELS, PAGE, dense_arms, inputs, launch_arm, santa_arm  # noqa: E402

SLICES = (1, 2, 4, 8, 16, 33, 66)


def measure(path: str) -> None:
    from santa.kernels import one_launch as ol

    done = cases_done(path)
    flusher = Flusher("cuda")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for model in ("llama", "qwen"):
        heads, kv_heads, dim = MODELS[model]
        for batch in (1, 16):
            for n in (512, 1024, 2048, 4096):
                key = f"{model}/b{batch}/n{n}"
                if key in done:
                    continue
                q, packed, table, seq_lens = inputs(model, batch, n, n)
                groups = batch * kv_heads
                entry = {"key": key, "model": model, "batch": batch, "length": n}
                rule = santa_arm(model, q, packed, table, seq_lens, n, flusher, one_launch=True)
                entry.update(rule_us=rule["us"], rule_plan=rule["plan"])
                for slices in SLICES:
                    if groups * slices > 2 * sms or slices * 8 > n:
                        continue
                    plan = ol.make_plan(slices=slices, grid=groups * slices, groups=groups, n=n, group_size=heads // kv_heads,
                                        dim=dim, staggered=False, page_size=PAGE)
                    try:
                        arm = launch_arm(model, q, packed, table, seq_lens, n, flusher, plan=plan)
                    except ValueError as error:
                        entry[f"C{slices}_error"] = str(error)[:200]
                        continue
                    entry[f"C{slices}_us"] = arm["us"]
                    entry[f"C{slices}_close"] = bool(torch.allclose(arm["out"], rule["out"], atol=0.25, rtol=0.1))
                entry.update({k: v for k, v in dense_arms(model, q, packed, table, flusher).items() if k.endswith("_us")})
                add_case(path, entry)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="JSONL file (resumed where it exists)")
    args = parser.parse_args()
    run_locked(args.out, "short_slices.py", lambda: measure(args.out))


if __name__ == "__main__":
    main()
