"""paged_ab.py's case lists: the short grid is Llama's and Qwen's by default and the named models' with ``--models``."""

from benchmarks.kernels.paged_ab import cases

SHORT = [(n, batch) for n in (512, 1024, 2048, 4096) for batch in (1, 16, 64, 256)]


def short_cells(chosen, model):
    return [(n, batch) for name, batch, n, capacity in chosen if name == model and n == capacity and n <= 4096]


def test_the_default_short_grid_is_llamas_and_qwens():
    chosen = cases(quick=False)
    assert short_cells(chosen, "llama") == SHORT and short_cells(chosen, "qwen") == SHORT
    assert short_cells(chosen, "smollm2") == []  # SmolLM2 keeps its one long case by default
    assert ("smollm2", 64, 8192, 8192) in chosen


def test_models_give_their_own_short_grid_then_their_long_cases():
    chosen = cases(quick=False, models=["smollm2"])
    assert chosen == [("smollm2", batch, n, n) for n, batch in SHORT] + [("smollm2", 64, 8192, 8192)]
    assert {name for name, *_ in cases(quick=False, models=["qwen"])} == {"qwen"}
