"""One vocabulary for "which attention" (issue 41): santa.methods is the only place outside the core's own specs that
lists method names. A tuple, list or set of two or more method or backend names, or a "santa-*" backend string,
anywhere else in src/santa fails this test; the specs the registry maps onto are the exceptions, and the registry is
checked against them."""

from __future__ import annotations

import ast
from pathlib import Path

import santa
from santa import bernoulli, sampling
from santa.kernels import plan
from santa.methods import METHODS

SRC = Path(santa.__file__).parent
NAMES = set(METHODS) | {m.model_backend for m in METHODS.values()}
# the specs below the registry (what its entries name), and the cost model's own classes
SPECS = {
    "methods.py": "the registry",
    "sampling.py": "sampled_attention's samplers (the registry's `sampler` values)",
    "kernels/plan.py": "the kernels' names (the registry's `kernel` values, and 'auto')",
    "bernoulli.py": "the score-stage samplers (not decode methods)",
    "stats.py": "the value-stage cost classes 'dense', 'topk', 'santa' (not methods)",
}


def spellings(path: Path) -> list[tuple[int, object]]:
    """(line, spelling) of every method-name collection and santa-* backend string in one module."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)) and node.elts and all(
                isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts):
            values = [e.value for e in node.elts]
            if sum(value in NAMES for value in values) >= 2:
                found.append((node.lineno, values))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("santa-") \
                and node.value in NAMES:
            found.append((node.lineno, node.value))
    return found


def test_no_module_spells_out_the_methods_but_the_registry_and_the_specs_it_maps_onto():
    offenders = {}
    for path in sorted(SRC.rglob("*.py")):
        where = path.relative_to(SRC).as_posix()
        if where not in SPECS and (found := spellings(path)):
            offenders[where] = found
    assert offenders == {}, f"derive these from santa.methods: {offenders}"


def test_the_registry_names_only_what_the_specs_define():
    for m in METHODS.values():
        assert m.sampler is None or m.sampler in (*sampling.SAMPLERS, "dense", "topk"), m.name
        assert m.kernel is None or m.kernel in plan.KERNELS, m.name
    assert set(bernoulli.SCORE_SAMPLERS) <= set(sampling.SAMPLERS)
