"""An L2 choice of prop end to end: ``santa bench e2e`` with the plan's rule as is ("rule") and with it
forced off ("off"), in one process, alternating, so that the two share the machine's state.
RULE_NAME: ``prop_k_evict_first`` (the K loads' eviction hint) or ``discard_stash`` (pass 2 dropping
the stash from L2).

    python benchmarks/kernels/e2e_hint_ab.py RULE_NAME OUT_DIR [e2e arguments...]
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import santa.kernels.plan as plan
from santa.bench import e2e

decode = importlib.import_module("santa.kernels.decode")  # the module (santa.kernels.decode is also the function)
PLAN_DECODE = decode.plan_decode  # what decode() plans with


def main() -> int:
    rule, out, rest = sys.argv[1], Path(sys.argv[2]), sys.argv[3:]
    field = {"prop_k_evict_first": "k_evict_first", "discard_stash": "discard_stash"}[rule]

    def planned_off(**kwargs):
        return PLAN_DECODE(**{**kwargs, "tuning": plan.Tuning(**{field: False})})

    for round_ in range(2):
        for name in (("rule", "off") if round_ == 0 else ("off", "rule")):
            decode.plan_decode = PLAN_DECODE if name == "rule" else planned_off
            # decode() keeps its plans, and each call signature's plan: make them anew under this rule
            decode._PLANS.clear()
            decode._CALLS.clear()
            print(f"=== {name} round {round_}", flush=True)
            e2e.main([*rest, "--out", str(out / f"{name}_{round_}")])
            used = sorted({getattr(p, field) for p in decode._PLANS.values() if p.kernel == "prop"})
            print(f"=== {name} round {round_}: the prop plans ran with {field} = {used}", flush=True)
            if name == "off" and any(used):
                raise SystemExit(f"the 'off' arm ran a plan with {field} on: the A/B is void")
    return 0


if __name__ == "__main__":
    sys.exit(main())
