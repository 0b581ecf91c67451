"""Where the one-launch prop's warps stall, per phase: Nsight Compute's stall samples per SASS instruction
(``gpu_run.sh onelaunchncu`` or ``livencu``: ``ncu --page source --csv --print-source sass``) mapped to the phases of
``prop_slice`` in ``src/santa/kernels/one_launch.cu`` through the cubin's line table (``nvdisasm -gi``: each
instruction's source line and the line it is inlined at).

    python benchmarks/kernels/ncu_phases.py SASS.csv[.gz] CUBIN [--kernel prop1_d128_g4] [--source one_launch.cu] [--json OUT.json]

CUBIN and the source must be the ones profiled: the device's cubin, which ``gpu_run.sh onelaunchncu`` returns (built
from ``cuda_stream/stream.cu``, which includes ``one_launch.cu``: its line table names that file's lines), or, for the
shipped fatbin (``gpu_run.sh livencu``), a cubin built here from the same commit's ``one_launch.cu`` with
``one_launch.NVCC_FLAGS``' ``-O3`` and sm_90a plus ``-cubin -lineinfo`` (``-lineinfo`` leaves the SASS as it is:
checked on nvcc 13.0, the same instruction words as the fatbin's ``prop1lp_d128_g4``). ``--source`` defaults to this
tree's ``one_launch.cu``; pass the profiled commit's copy where the tree has moved on.

A line inside ``prop_slice`` belongs to the phase its ``mark(i)`` calls bound (0 start … 7 done); a helper's line to
the phase of the line it is inlined at; the persistent loop, the schedule and epoch loads to "start and schedule".
Samples are warp-time: a phase where most warps wait at a barrier for a few working ones weighs by all of them.
"""

from __future__ import annotations

import argparse
import collections
import csv
import gzip
import json
import re
import shutil
import subprocess
from pathlib import Path

from santa.provenance import run_record

SOURCE = Path(__file__).resolve().parents[2] / "src" / "santa" / "kernels" / "one_launch.cu"  # prop_slice's source
PHASES = ["stream", "publish and subtile prefix", "stats exchange", "placement", "placement", "V gather",
          "sum and store"]  # between mark(i) and mark(i + 1)
# helpers whose every call site lies in one phase, by the first line of their definition's name
HELPER_PHASES = {"double_buffered": "stream", "mma_stream": "stream", "merge_stats": "stream",
                 "gather_tagged": "stats exchange", "schedule_cta": "start and schedule",
                 "load_work": "start and schedule", "load_epoch": "start and schedule", "load_len": "start and schedule",
                 "live_prologue": "live prologue", "live_item": "start and schedule"}


def nvdisasm() -> str:
    """nvdisasm from PATH, else the copy Triton's wheel carries."""
    found = shutil.which("nvdisasm")
    if found:
        return found
    import triton

    return str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "nvdisasm")


def line_table(cubin: Path, kernel: str) -> dict[int, tuple[int, ...]]:
    """Offset of each SASS instruction of ``kernel`` → its inline stack of source lines, innermost first (nvdisasm
    prints one ``//##`` line per frame before an instruction whose stack changed: "line L inlined at … line M")."""
    text = subprocess.run([nvdisasm(), "-gi", str(cubin)], capture_output=True, text=True, check=True).stdout
    table, inside, stack, fresh = {}, False, (), []
    for line in text.splitlines():
        if line.startswith(f".text.{kernel}:"):
            inside = True
        elif inside and line.startswith(".") and not line.startswith(".L"):
            break
        elif inside and "//##" in line:
            fresh.extend(int(number) for number in re.findall(r"line (\d+)", line))
        elif inside and (m := re.match(r"\s*/\*([0-9a-f]{4,})\*/", line)):
            if fresh:
                stack = tuple(dict.fromkeys(fresh))  # frames in order, each line once
                fresh = []
            table[int(m.group(1), 16)] = stack
    return table


def source_map(source: Path) -> tuple[dict[str, tuple[int, int]], list[int]]:
    """The line spans of the helpers in HELPER_PHASES and of prop_slice, and prop_slice's mark(i) lines in order: for each
    i the last ``mark(i)`` (an early return repeats one, as the live gather's ``mark(7)``: the boundary is the last)."""
    lines = source.read_text().splitlines()
    spans, start, name = {}, None, None
    for number, text in enumerate(lines, 1):
        if m := re.match(r"__device__ __forceinline__ \S+ (\w+)\(", text):
            start, name = number, m.group(1)
        elif text == "}" and name is not None:
            spans[name] = (start, number)
            name = None
    lo, hi = spans["prop_slice"]
    last: dict[int, int] = {}
    for number in range(lo, hi + 1):
        if m := re.search(r"\bmark\(([0-7])\);", lines[number - 1]):
            last[int(m.group(1))] = number
    return spans, [last[i] for i in sorted(last)]


def phase_of(stack: tuple[int, ...], spans: dict, marks: list[int]) -> str:
    """The phase of an instruction from its inline stack: the innermost frame in a helper of HELPER_PHASES or in
    prop_slice decides; past prop_slice (the kernel's persistent loop) is "start and schedule"."""
    lo, hi = spans["prop_slice"]
    for line in stack:
        for helper, phase in HELPER_PHASES.items():
            first, last = spans.get(helper, (0, -1))
            if first <= line <= last:
                return phase
        if lo <= line <= hi:
            before = [i for i, mark in enumerate(marks) if mark <= line]
            return PHASES[min(before[-1], len(PHASES) - 1)] if before else "stream"
    return "start and schedule" if stack and stack[-1] > hi else "other"


def phases(sass_csv: Path, cubin: Path, kernel: str, source: Path = SOURCE) -> dict:
    opened = gzip.open(sass_csv, "rt") if sass_csv.suffix == ".gz" else sass_csv.open()
    with opened as handle:
        rows = list(csv.reader(handle))
    header = rows[1]
    data = [row for row in rows[2:] if len(row) >= len(header)]
    address, samples = header.index("Address"), header.index("Warp Stall Sampling (All Samples)")
    reasons = [i for i, name in enumerate(header) if name.startswith("stall_") and "Not Issued" not in name]
    table = line_table(cubin, kernel)
    spans, marks = source_map(source)
    base = int(data[0][address], 16)
    total, by_reason = collections.Counter(), collections.defaultdict(collections.Counter)
    for row in data:
        phase = phase_of(table.get(int(row[address], 16) - base, ()), spans, marks)
        total[phase] += float(row[samples] or 0)
        for i in reasons:
            by_reason[phase][header[i][len("stall_"):]] += float(row[i] or 0)
    every = sum(total.values())
    return {"samples": every, "phases": {
        phase: {"share": count / every,
                "top_stalls": {k: v / every for k, v in by_reason[phase].most_common(3)}}
        for phase, count in total.most_common()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sass_csv", type=Path)
    parser.add_argument("cubin", type=Path)
    parser.add_argument("--kernel", default="prop1_d128_g4")
    parser.add_argument("--source", type=Path, default=SOURCE, help="the profiled one_launch.cu (default: this tree's)")
    parser.add_argument("--json", type=Path, help="also write the result here")
    args = parser.parse_args()
    result = phases(args.sass_csv, args.cubin, args.kernel, args.source)
    print(f"{args.sass_csv.name}: {result['samples']:.0f} stall samples")
    for phase, row in result["phases"].items():
        stalls = ", ".join(f"{k} {100 * v:.1f}" for k, v in row["top_stalls"].items())
        print(f"  {phase:28s} {100 * row['share']:5.1f} %   ({stalls})")
    if args.json:
        args.json.write_text(json.dumps({"run": run_record(), **result}, indent=1))


if __name__ == "__main__":
    main()
