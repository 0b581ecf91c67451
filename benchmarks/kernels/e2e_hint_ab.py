"""The K-load eviction hint end to end: ``santa bench e2e`` with prop's rule as is ("rule") and with the
hint forced off ("off"), in one process, alternating, so that the two share the machine's state.

    python benchmarks/kernels/e2e_hint_ab.py OUT_DIR [e2e arguments...]
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import santa.kernels.plan as plan
from santa.bench import e2e

decode = importlib.import_module("santa.kernels.decode")  # the module (santa.kernels.decode is also the function)
RULE = plan.prop_k_evict_first


def main() -> int:
    out, rest = Path(sys.argv[1]), sys.argv[2:]
    for round_ in range(2):
        for name in (("rule", "off") if round_ == 0 else ("off", "rule")):
            plan.prop_k_evict_first = RULE if name == "rule" else (lambda *args, **kwargs: False)
            decode._PLANS.clear()  # decode() keeps its plans: make them anew under this rule
            print(f"=== {name} round {round_}", flush=True)
            e2e.main([*rest, "--out", str(out / f"{name}_{round_}")])
    return 0


if __name__ == "__main__":
    sys.exit(main())
