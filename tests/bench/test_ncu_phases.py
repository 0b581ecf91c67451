"""benchmarks/kernels/ncu_phases.py maps a SASS instruction's inline stack of source lines to a phase of ``prop_slice``
(its ``mark(i)`` calls bound them) in the shipped kernel's source, ``one_launch.cu``: what ``gpu_run.sh livencu``
profiles, and what ``cuda_stream/stream.cu`` (``onelaunchncu``'s cubin) includes."""

from pathlib import Path

from benchmarks.kernels.ncu_phases import PHASES, SOURCE, phase_of, source_map

ONE_LAUNCH = Path(__file__).resolve().parents[2] / "src" / "santa" / "kernels" / "one_launch.cu"


def line_of(source: Path, text: str, within: tuple[int, int]) -> int:
    """The first line in ``within`` (inclusive) that contains ``text``."""
    lines = source.read_text().splitlines()
    return next(n for n in range(within[0], within[1] + 1) if text in lines[n - 1])


def test_the_default_source_is_the_shipped_kernels():
    assert SOURCE == ONE_LAUNCH and "one_launch.cu" in (SOURCE.parents[3] / "benchmarks/kernels/cuda_stream/stream.cu").read_text()


def test_every_phase_boundary_is_found_and_lines_map_to_their_phase():
    spans, marks = source_map(ONE_LAUNCH)
    assert len(marks) == 8 and marks == sorted(marks)  # mark(0) … mark(7), in order
    lo, hi = spans["prop_slice"]
    assert lo < marks[0] and marks[-1] < hi
    for i, phase in enumerate(PHASES):  # a line just past mark(i) is in phase i
        assert phase_of((marks[i] + 1,), spans, marks) == phase
    first, _ = spans["mma_stream"]
    assert phase_of((first + 2, marks[0] + 1), spans, marks) == "stream"  # a helper's line: the helper's phase
    assert phase_of((hi + 5,), spans, marks) == "start and schedule"  # the persistent loop after prop_slice


def test_the_shipped_kernels_live_helpers_and_inlined_gather_map_to_their_phases():
    spans, marks = source_map(ONE_LAUNCH)
    first, last = spans["live_prologue"]
    assert phase_of((first + 3,), spans, marks) == "live prologue"
    # live_gather and store_rows (no phase of their own) take the phase of the line in prop_slice they are inlined at:
    # the gather
    for helper, text in (("live_gather", "live_gather<D, PAGED, KV>"), ("store_rows", "store_rows<KV, 4>")):
        call = line_of(ONE_LAUNCH, text, spans["prop_slice"])
        assert marks[5] < call < marks[6]
        assert phase_of((spans[helper][0] + 3, call), spans, marks) == "V gather"
