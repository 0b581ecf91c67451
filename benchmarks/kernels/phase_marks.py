"""Where one one-launch prop call spends its time, phase by phase, from the kernel's own clocks (issue 39).

    python benchmarks/kernels/phase_marks.py OUT.jsonl LABEL [--paged MODEL:BxN …]

A one-launch plan's launch takes ``marks`` (``santa.kernels.one_launch.OneLaunch.run``): thread 0 of each CTA records
``%globaltimer`` at the phase boundaries of ``one_launch.cu``'s ``prop_slice`` (0 start, 1 streamed, 2 published,
3 stats read, 4 first points placed, 5 keys written, 6 V rows gathered, 7 done; a live launch sums its rows as it
gathers them and records no 6: its phase 5 then runs to 7, phase 6 is None, ``absent_marks`` [6]). Per case (contiguous bf16, S = 128,
the plan ``plan_decode`` chooses, 12 calls with seeds 0-11, the first two dropped): each phase's median over CTAs with
work, then the median over calls (``phase_med_ns``, seven numbers), and the median span from the first CTA's start
to the last CTA's end (``span_ns``). No graph, no L2 flush: a profile of the phases, not a timing to quote (the
protocol's times come from ``paged_ab.py`` and ``prop_ab.py``). Whichever santa is first on the path is measured, so
one device call compares two trees (``PYTHONPATH=.oldab/src``). ``--paged MODEL:BxN`` (a model of
``paged_ab.MODELS``, e.g. ``d64-g2:16x32768``; keys ``paged/…``): instead, vLLM's packed 16-key pages shuffled over the
pool (``paged_ab.inputs``), full sequences, the same launch on host-built rounds (``OneLaunch(live=False)``) and on the
live schedule (``live=True``), each with a marks buffer of ``OneLaunch.marks_slots()`` (a live launch's rounds, from
``live_schedule`` of the lengths, are reported beside): what separates the two where host rounds are faster (d64-g2 16 × 32k, 38th session). OUT.jsonl: a run record, then one line per case,
appended as each is measured; a re-run skips the cases already there, and a second run on the same file is refused
while the first holds it (``santa.writer_lock``).
"""

from __future__ import annotations

import argparse
import functools
import json
import sys

import torch

sys.path.insert(0, ".")
from benchmarks.bench.case_log import run_locked  # noqa: E402
from benchmarks.bench.timing import run_record_of_this_checkout  # noqa: E402

CASES = [(1, 32, 8, 128, 512), (1, 32, 8, 128, 8192), (1, 32, 8, 128, 32768), (1, 14, 2, 64, 32768), (16, 14, 2, 64, 32768)]


def profile(batch: int, heads: int, kv_heads: int, dim: int, n: int) -> dict:
    from santa.kernels import one_launch as ol
    from santa.kernels import plan_decode

    gen = torch.Generator(device="cuda").manual_seed(3)
    q = torch.randn(batch, heads, dim, device="cuda", generator=gen).mul(3.0).to(torch.bfloat16)
    k, v = (torch.randn(batch, n, kv_heads, dim, device="cuda", generator=gen).to(torch.bfloat16) for _ in range(2))
    plan = plan_decode(batch=batch, heads=heads, kv_heads=kv_heads, head_dim=dim, n_keys=n, budget=128,
                       dtype=torch.bfloat16, device="cuda")
    launch = plan.one_launch
    if launch is None:
        return {"error": "no one-launch plan (the Triton prop takes no marks)"}

    def run(marks, seed):
        launch.run(q, k, v, out=torch.empty_like(q), strides=ol.cache_strides(k, v, "NHD"), seed=seed, marks=marks)

    return profile_launch(launch, run, launch_rounds(launch, [n] * batch, n=n, kv_heads=kv_heads))


def launch_rounds(launch, lengths: list[int], *, n: int, kv_heads: int) -> int:
    """The rounds a launch takes on these lengths: its host-built rounds, or a live launch's from ``live_schedule``
    (reported beside the phases; the marks buffer holds what any lengths could take, ``OneLaunch.marks_slots``)."""
    from santa.kernels.one_launch import LivePlan
    from santa.kernels.one_launch_schedule import live_schedule

    if not isinstance(launch.plan, LivePlan):
        return len(launch.plan.rounds)
    limits = launch.plan.limits
    return live_schedule(lengths, n=n, kv_heads=kv_heads, slice_cap=limits.slice_cap, min_slices=limits.min_slices,
                         max_slices=limits.max_slices, ctas=limits.ctas).rounds


def profile_launch(launch, run, rounds: int) -> dict:
    """Phase medians of ``run(marks)`` (12 calls, the first two dropped) for a launch of ``rounds`` rounds."""
    calls = []
    for seed in range(12):
        marks = torch.zeros(launch.marks_slots(), 9, 2, dtype=torch.int64, device="cuda")
        run(marks, seed)
        torch.cuda.synchronize()
        calls.append(marks[:, :8, 0].cpu())
    return {"plan": launch.plan.name, "rounds": rounds, **phase_medians(torch.stack(calls[2:]))}


def phase_medians(clocks: torch.Tensor) -> dict:
    """``clocks`` int64 ``[calls, slots, 8]`` (ns; a slot without work all zeros) → each phase's median over the slots
    with work, then over calls (``phase_med_ns``, seven numbers), and the median span from the first slot's start to the
    last one's end (``span_ns``). A boundary no slot recorded (a live launch sums its rows as it gathers them: no mark
    6) is left out: the phase before it runs to the next recorded mark and its own is None, listed in ``absent_marks``.
    A slot that skipped a mark others recorded (a live launch's covered sequences record 6, its sampled ones do not)
    counts the phase before it to its next mark and 0 for its own."""
    clocks = clocks[:, clocks[0, :, 0] != 0].clone()  # the slots with work
    absent = [j for j in range(1, 7) if not clocks[..., j].any()]
    for j in range(6, 0, -1):  # the slot's next recorded mark stands in for a skipped one (7 is always recorded)
        clocks[..., j] = torch.where(clocks[..., j] == 0, clocks[..., j + 1], clocks[..., j])
    # from each call's first start, in int64: %globaltimer is ~1.8e18 ns, where a float64 steps by 256 ns (until
    # 2026-12-07 the phases were differences of such floats: every figure a multiple of 256 ns)
    clocks = (clocks - clocks[..., 0].min(dim=1).values[:, None, None]).double()
    phases = (clocks[..., 1:] - clocks[..., :-1]).median(dim=1).values.median(dim=0).values.tolist()
    span = (clocks[..., 7].max(dim=1).values - clocks[..., 0].min(dim=1).values).median()
    return {"phase_med_ns": [None if j in absent else round(x) for j, x in enumerate(phases)],
            "span_ns": float(span), **({"absent_marks": absent} if absent else {})}


def profile_paged(model: str, batch: int, n: int) -> dict:
    """Host-built rounds and the live schedule on the same shuffled pages (``--paged``)."""
    from benchmarks.kernels.paged_ab import BUDGET, MODELS, PAGE, inputs

    from santa.kernels import one_launch as ol

    heads, kv_heads, dim = MODELS[model]
    q, packed, table, seq_lens = inputs(model, batch, n, n)
    k_pages, v_pages = packed[..., :dim], packed[..., dim:]
    row = {}
    for name, live in (("rounds", False), ("live", True)):
        try:
            launch = ol.OneLaunch(batch=batch, heads=heads, kv_heads=kv_heads, head_dim=dim, n_keys=n, budget=BUDGET,
                                  scale=dim**-0.5, device=torch.device("cuda"), page_size=PAGE, live=live)
        except ValueError as error:
            row[name] = {"error": str(error)}
            continue
        def run(marks, seed, launch=launch):
            launch.run(q, k_pages, v_pages, out=torch.empty_like(q), strides=ol.cache_strides(k_pages, v_pages, "NHD"),
                       seq_lens=seq_lens, block_table=table, seed=seed, marks=marks)

        row[name] = profile_launch(launch, run, launch_rounds(launch, seq_lens.tolist(), n=n, kv_heads=kv_heads))
    return row


def paged_case(text: str) -> tuple[str, int, int]:
    """``MODEL:BxN`` → (model, B, N) (argparse's type: a clear error for anything else)."""
    from benchmarks.kernels.paged_ab import MODELS

    model, _, shape = text.partition(":")
    batch, _, n = shape.partition("x")
    if model not in MODELS or not batch.isdigit() or not n.isdigit() or int(batch) < 1 or int(n) < 1:
        raise argparse.ArgumentTypeError(f"expected MODEL:BxN with MODEL one of {sorted(MODELS)}, got {text!r}")
    return model, int(batch), int(n)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("label")
    parser.add_argument("--paged", nargs="+", type=paged_case, metavar="MODEL:BxN",
                        help="host rounds and the live schedule on shuffled pages instead of the contiguous cases")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("phase_marks.py: needs a CUDA GPU (the one launch's clocks)")
    run_locked(args.out, "phase_marks.py", lambda: measure_all(args.out, args.label, args.paged))


def measure_all(path: str, label: str, paged: list | None) -> None:
    """Every case not yet in ``path`` (the ``paged`` cases, or else the contiguous ones), one line appended per case
    after a run record of this checkout and the santa measured (its path: a call may time an older tree)."""
    import santa
    from santa.sweep_files import append_record, read_records

    records = read_records(path)
    if not records:
        append_record(path, {"key": "run", "run": run_record_of_this_checkout(), "label": label,
                             "santa": santa.__file__, "device": torch.cuda.get_device_name()})
    done = {record["key"] for record in records}
    jobs = ([(f"paged/{model}/{batch}x{n}", functools.partial(profile_paged, model, batch, n))
             for model, batch, n in paged] if paged else
            [(f"{batch}x{n}_d{dim}", functools.partial(profile, batch, heads, kv_heads, dim, n))
             for batch, heads, kv_heads, dim, n in CASES])
    for key, measure in jobs:
        if key not in done:
            row = {"key": key, **measure()}
            append_record(path, row)
            print(label, json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
