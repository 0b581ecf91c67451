"""A choice of prop's plan end to end: ``santa bench e2e`` with the plan's rule as is and with its ``Tuning``
field forced, in one process, alternating, so that the two share the machine's state. RULE_NAME:
``prop_k_evict_first`` (the K loads' eviction hint) or ``discard_stash`` (pass 2 dropping the stash from
L2), arms "rule" and "off" (forced False).

santa.model holds its kernels' plans: each context plans them anew with ``santa.kernels.plan_decode``
(and bench e2e makes a context per backend run), so the "off" arm only has to plan with
``Tuning(<rule>=False)``; there is no plan cache to clear. The plans each arm made are checked: the A/B
stops if the "off" arm ran the rule, or if an arm made no prop plan at all (it would compare nothing).

    python -m benchmarks.kernels.e2e_hint_ab RULE_NAME OUT_DIR [e2e arguments...]
"""

from __future__ import annotations

import sys
from pathlib import Path

from benchmarks.bench import e2e

import santa.kernels
from santa.kernels import Tuning

PLAN_DECODE = santa.kernels.plan_decode  # what santa.model plans with (santa.model calls it by this name)
FIELDS = {"prop_k_evict_first": "k_evict_first", "discard_stash": "discard_stash"}  # rule name → Tuning field = plan attribute


def planner(made: list, forced: dict | None):
    """``santa.kernels.plan_decode`` that keeps every plan it makes in ``made``; with ``forced``
    (``{field: value}``), it plans with that Tuning."""

    def plan_decode(**kwargs):
        if forced is not None:
            kwargs = {**kwargs, "tuning": Tuning(**forced)}
        plan = PLAN_DECODE(**kwargs)
        made.append(plan)
        return plan

    return plan_decode


def main() -> int:
    rule, out, rest = sys.argv[1], Path(sys.argv[2]), sys.argv[3:]
    if rule not in FIELDS:
        raise SystemExit(f"RULE_NAME must be one of {sorted(FIELDS)}, got {rule!r}")
    field = FIELDS[rule]
    for round_ in range(2):
        for name in (("rule", "off") if round_ == 0 else ("off", "rule")):
            made = []
            santa.kernels.plan_decode = planner(made, {field: False} if name == "off" else None)
            print(f"=== {name} round {round_}", flush=True)
            try:
                e2e.main([*rest, "--out", str(out / f"{name}_{round_}")])
            finally:
                santa.kernels.plan_decode = PLAN_DECODE
            used = sorted({getattr(p, field) for p in made if p.kernel == "prop"})
            print(f"=== {name} round {round_}: the prop plans ran with {field} = {used}", flush=True)
            if not used:
                raise SystemExit(f"the '{name}' arm made no prop plan: run santa-prop (--backends) for an A/B")
            if name == "off" and used != [False]:
                raise SystemExit(f"the 'off' arm ran plans with {field} = {used}, not False: the A/B is void")
    return 0


if __name__ == "__main__":
    sys.exit(main())
