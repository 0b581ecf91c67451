"""How santa's modules depend on each other (issue 23): data flows one way, so no module imports
one that imports it back — counting imports inside functions, which hide a cycle without removing it.
Inside ``santa.kernels`` too: the plan and the kernels share :mod:`santa.kernels.layout` (issue 24).
The lab one way (issue 41): ``santa.budgets`` sits above ``santa.eval``; the sweep files and the
schedule file both read and write sit below both (:mod:`santa.sweep_files`, :mod:`santa.schedule_file`)."""

import ast
from pathlib import Path

import pytest

from helpers import REPO

SRC = REPO / "src"


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def santa_imports(path: Path, modules: set[str]) -> set[str]:
    """The santa modules ``path`` imports anywhere in its body (``from santa import x`` counts as
    ``santa.x`` when that is a module)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("santa")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("santa") and not node.level:
            found |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module for a in node.names}
        elif isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING":
            pass  # still walked: a TYPE_CHECKING import is a dependency too
    return {m for m in found if m in modules}


def graph() -> dict[str, set[str]]:
    paths = {module_name(p): p for p in SRC.rglob("*.py")}
    return {name: santa_imports(path, set(paths)) - {name} for name, path in paths.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every elementary cycle's entry point, found by DFS (enough to name one cycle per loop)."""
    found, state = [], {}

    def visit(node, stack):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == "open":
                found.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = "done"

    for node in sorted(edges):
        if node not in state:
            visit(node, [])
    return found


def test_no_import_cycle():
    """``santa`` itself (its __init__ re-exports the API) is left out: importing it is not a dependency
    on every module it names."""
    edges = {a: {b for b in bs if b != "santa"} for a, bs in graph().items()}
    assert cycles(edges) == []


def test_the_kernels_import_the_layout_not_the_plan():
    """The plan imports the kernel modules when a kernel first runs; the kernels read the shared layout
    (tiles, workspace strides) from santa.kernels.layout, which imports neither."""
    edges = graph()
    for kernel in ("santa.kernels.prop", "santa.kernels.flash"):
        assert "santa.kernels.layout" in edges[kernel] and "santa.kernels.plan" not in edges[kernel]
    assert "santa.kernels.prop" in edges["santa.kernels.plan"]
    assert not {m for m in edges["santa.kernels.layout"] if m.startswith("santa")}


def test_the_graph_sees_imports_inside_functions():
    """The check would be void if lazy imports were missed: santa.cli imports santa.generate lazily."""
    assert "santa.generate" in graph()["santa.cli"]


@pytest.mark.parametrize("lower", ["santa.checkpoint", "santa.methods", "santa.checks", "santa.sampling", "santa.attention",
                                   "santa.sweep_files", "santa.schedule_file", "santa.writer_lock"])
def test_lower_layers_import_nothing_above_them(lower):
    above = {"santa.model", "santa.hf", "santa.engine", "santa.generate", "santa.cli", "santa.eval", "santa.budgets"}
    assert not {m for m in graph()[lower] if any(m == a or m.startswith(a + ".") for a in above)}


# the applications and the command line: the only modules that may import santa.eval and santa.budgets
APPLICATIONS = ("santa.eval", "santa.budgets", "santa.cli", "santa.cliargs", "santa.generate")


def within(name: str, packages: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


def test_only_the_applications_and_the_cli_import_eval_and_budgets():
    offenders = {module: sorted(m for m in imports if within(m, ("santa.eval", "santa.budgets")))
                 for module, imports in graph().items() if not within(module, APPLICATIONS)}
    assert {m: found for m, found in offenders.items() if found} == {}


def test_budgets_sits_above_eval_never_below():
    """santa.budgets reuses the harness (its scorers run santa.eval.runner's batches and graders);
    nothing of santa.eval imports santa.budgets, not even lazily (issue 41: `santa eval run
    --layer-budgets` reads the schedule file through santa.schedule_file)."""
    edges = graph()
    upward = {module: sorted(m for m in imports if within(m, ("santa.budgets",)))
              for module, imports in edges.items() if within(module, ("santa.eval",))}
    assert {m: found for m, found in upward.items() if found} == {}
    assert "santa.schedule_file" in edges["santa.eval.cli"]
    assert "santa.eval.runner" in edges["santa.budgets.scorers"]  # the direction this test keeps


def test_the_sweep_and_schedule_files_sit_below_eval_and_budgets():
    """What every record writer shares imports only the lock and the argument checks: a tuning worker,
    a report or a benchmark reads and appends records without the runner (and without torch)."""
    edges = graph()
    assert edges["santa.sweep_files"] == {"santa.writer_lock"}
    assert edges["santa.schedule_file"] == {"santa.checks"}
    for module in ("santa.eval.runner", "santa.eval.report", "santa.budgets.sweep", "santa.budgets.run_folder"):
        assert "santa.sweep_files" in edges[module], module
    assert "santa.eval.runner" not in edges["santa.budgets.run_folder"] | edges["santa.budgets.sweep"]


def test_nothing_imports_sweep_file_io_from_the_runner():
    """The sweep-file names live in santa.sweep_files alone: no module of santa, the benchmarks or the
    tests asks santa.eval.runner (or santa.budgets.schedule) for them."""
    moved = {"santa.eval.runner": top_level_names(SRC / "santa" / "sweep_files.py"),
             "santa.budgets.schedule": top_level_names(SRC / "santa" / "schedule_file.py") - {"load_layer_budgets"}}
    offenders = []
    for path in [*SRC.rglob("*.py"), *(REPO / "benchmarks").rglob("*.py"), *(REPO / "tests").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module in moved:
                offenders += [f"{path.relative_to(REPO)}: {node.module}.{a.name}" for a in node.names if a.name in moved[node.module]]
    assert offenders == []


def top_level_names(path: Path) -> set[str]:
    """The classes, functions and constants a module defines at its top level."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return names


def test_the_engine_sits_above_the_model_and_below_the_applications():
    """santa.engine imports santa.model, never the reverse; the main job reaches the engine without the sweep runner."""
    edges = graph()
    assert "santa.model" in edges["santa.engine"] and "santa.engine" not in edges["santa.model"]
    assert not {m for m in edges["santa.engine"] if within(m, ("santa.eval", "santa.budgets", "santa.generate", "santa.cli"))}
    assert "santa.engine" in edges["santa.generate"] and "santa.eval.runner" not in edges["santa.generate"]
    assert "santa.engine" in edges["santa.eval.runner"]


def test_no_benchmark_code_in_the_library():
    """Benchmarks live under benchmarks/ (issue 23): no santa.bench package, and no module of src/santa
    imports them (santa.cli's `santa bench` finds them at run time, by path)."""
    assert not list((SRC / "santa" / "bench").glob("*.py"))
    for path in (SRC / "santa").rglob("*.py"):
        tree = ast.parse(path.read_text())
        imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert not {m for m in imported if m == "benchmarks" or m.startswith("benchmarks.")}, path
