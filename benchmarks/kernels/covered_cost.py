"""What a short sequence costs sampled against computed exactly, inside santa's own launches, beside dense (issue 39's
short cells: where G·S reaches the sequence's keys, sampling reads nearly every V row anyway).

    python benchmarks/kernels/covered_cost.py OUT.jsonl

Cases: Llama-3.1-8B (G = 4) and Qwen2.5-0.5B (G = 7) shapes (paged_ab.py's MODELS), batch 1, 16, 64 and 256,
n ∈ {512, 1k, 2k}, vLLM's 16-key shuffled pages (paged_ab.inputs), every arm on the same pages and q. Arms, each
through ``PagedDecoder`` (what santa's vLLM backend calls):

- ``sampled_us``: S = 128 on a plan for n keys (paged_ab.py's santa arm, ``sampled_plan``);
- ``covered_us``: S = n on the same plan: every sequence's live keys are covered, so the launch the plan chose
  (``covered_plan``: the one launch's plan name, or ``triton``: the two Triton launches and the covered-sequence
  launch after them) computes each exactly on the device (``PagedDecoder`` always passes the lengths, so no plan
  skips its sampled launch statically);

and paged_ab.dense_arms' FlashInfer and cuDNN. ``covered_error``: the largest absolute difference of the covered
output from float32 attention on the same keys. CUDA-graph replay, clean cold L2, medians. The first line records the command,
commit and device; one line per case, appended as measured; a re-run skips the cases already there.
"""

from __future__ import annotations

import argparse
import sys

import torch

sys.path.insert(0, ".")
from benchmarks.bench.case_log import add_case, cases_done, run_locked  # noqa: E402
from benchmarks.bench.timing import Flusher  # noqa: E402
from benchmarks.kernels.paged_ab import MODELS, PAGE, dense_arms, inputs, santa_arm  # noqa: E402

CASES = [(model, batch, n) for model in ("llama", "qwen") for n in (512, 1024, 2048) for batch in (1, 16, 64, 256)]


def exact_attention(model: str, q, packed, table) -> torch.Tensor:
    """float32 softmax attention of q ``[B, H, D]`` over every key of the table's pages: ``[B, H, D]``."""
    heads, kv_heads, dim = MODELS[model]
    batch, pages = table.shape
    rows = packed[table.long()].reshape(batch, pages * PAGE, kv_heads, 2 * dim)
    k, v = rows[..., :dim].float(), rows[..., dim:].float()  # [B, n, H_kv, D]: the G heads of a group share them
    groups = q.float().reshape(batch, kv_heads, heads // kv_heads, dim)
    weights = torch.softmax(torch.einsum("bkgd,bnkd->bkgn", groups, k) * dim**-0.5, dim=-1)
    return torch.einsum("bkgn,bnkd->bkgd", weights, v).reshape(batch, heads, dim)


def measure(path: str) -> None:
    done = cases_done(path)
    flusher = Flusher("cuda")
    for model, batch, n in CASES:
        key = f"{model}/b{batch}/n{n}"
        if key in done:
            continue
        entry = {"key": key, "model": model, "batch": batch, "length": n}
        q, packed, table, seq_lens = inputs(model, batch, n, n)
        entry.update(dense_arms(model, q, packed, table, flusher))  # its times and any arm's error
        sampled = santa_arm(model, q, packed, table, seq_lens, n, flusher, one_launch=True)
        entry.update(sampled_us=sampled["us"], sampled_plan=sampled["plan"])
        covered = santa_arm(model, q, packed, table, seq_lens, n, flusher, one_launch=True, budget=n)
        entry.update(covered_us=covered["us"], covered_plan=covered["plan"])
        entry["covered_error"] = float((covered["out"] - exact_attention(model, q, packed, table)).abs().max())
        add_case(path, entry)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="JSONL file (resumed where it exists)")
    args = parser.parse_args()
    run_locked(args.out, "covered_cost.py", lambda: measure(args.out))


if __name__ == "__main__":
    main()
