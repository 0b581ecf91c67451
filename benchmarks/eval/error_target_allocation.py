"""How much can any per-head budget rule save at equal reads? An oracle bound on the bundled models (issue 42).

Every layer's heads share R = 128 · H draws (S = 128 per head on average). With the exact variance traces T_h of the
captured heads (``santa.eval.variance.capture_last_query`` at the last position of an 8k needle prompt), the summed
absolute error of iid sampling ``Σ_h T_h / S_h`` under four allocations, each over a fixed S = 128's (= 1):

- ``relative``: what an error target asks for, ``S_h ∝ T_h / ‖o_h‖²`` (every head the same relative error);
- ``absolute``: ``S_h ∝ T_h`` (every head the same absolute error: exactly the fixed budget's total);
- ``neyman``: ``S_h ∝ √T_h``, the allocation that minimises ``Σ T_h / S_h`` at ``Σ S_h = R``.

No pilot, no ceiling, no cap: the rules' best case. The output projection adds the heads' errors, so the summed
absolute error is what reaches the next layer.

    python benchmarks/eval/error_target_allocation.py OUT.jsonl [--models smollm2-135m,qwen2.5-coder-0.5b] [--length 8192]

One JSONL record per model, appended as it is measured; a re-run skips the models already in the file (the first
version wrote one JSON: ``allocation.json``).
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from error_target_calibration import append_cases, captured_heads  # noqa: E402

PER_HEAD = 128


def allocations(probs: torch.Tensor, values: torch.Tensor, heads: int) -> dict:
    """Each allocation's summed absolute error over a fixed S's, averaged over layers."""
    p, v = probs.double(), values.double()
    o = torch.einsum("hn,hnd->hd", p, v)
    trace = (torch.einsum("hn,hn->h", p, (v * v).sum(-1)) - (o * o).sum(-1)).reshape(-1, heads)  # [layers, H]
    norm2 = (o * o).sum(-1).reshape(-1, heads)
    total = PER_HEAD * heads
    fixed = (trace / PER_HEAD).sum(1)
    shares = {"relative": trace / norm2, "absolute": trace, "neyman": trace.sqrt()}
    result = {"layers": trace.shape[0], "heads": heads}
    for name, weight in shares.items():
        budget = total * weight / weight.sum(1, keepdim=True)
        result[name] = float(((trace / budget).sum(1) / fixed).mean())
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--models", default="smollm2-135m,qwen2.5-coder-0.5b")
    parser.add_argument("--length", type=int, default=8192)
    args = parser.parse_args(argv)
    from santa.assets import load_model

    def case(model: str) -> dict:
        heads = load_model(model)[0].config.num_attention_heads
        return {"model": model, "length": args.length, "per_head": PER_HEAD,
                **allocations(*captured_heads(model, args.length), heads)}

    cases = {f"{model}/{args.length}": functools.partial(case, model) for model in args.models.split(",") if model}
    return append_cases(args.out, cases, holder="error_target_allocation.py")

if __name__ == "__main__":
    sys.exit(main())
