"""What a large ``max_model_len`` costs santa's decode in vLLM when the sequences are short: the backend plans
for ``max_model_len`` keys (CUDA graphs fix the grid), so pass 1 launches a program per 128-key tile of the
capacity and the programs past a sequence's length exit at once, unless the grid passes
``santa.kernels.layout.PASS1_PROGRAMS`` programs: then it is cut and each program loops over its sequence's tiles.
This times the step planned for the capacity (the default plan, and the uncut grid of one program per tile,
``Tuning(pass1_programs=2**30)``, as at 474c855) against the step planned for exactly the sequences' length; and,
where the cut grid loops over full sequences (Llama batch 64 × 32k, batch 16 × 128k), cut against uncut.

    python benchmarks/vllm/capacity_ab.py OUT.jsonl

Llama-3.1-8B shapes (32 / 8 heads, d = 128), vLLM's packed FlashAttention cache in pages of 16 keys shuffled over
the pool, S = 128, bf16, through santa.vllm.decode.PagedDecoder (what the backend calls): sequences of 2k and
8k keys at batch 1, 16 and 64 with capacities 32k and 128k, and the tight capacity (= the length); CUDA-graph
replay, clean cold L2, medians (benchmarks/bench/timing.py). One JSON line per case, appended as it is measured;
a re-run skips the cases already in OUT.jsonl (a call cut at its time limit resumes), and a second run on the same
file is refused while the first holds it (``santa.writer_lock``).
"""

from __future__ import annotations

import json
import sys

import torch

sys.path.insert(0, ".")
from benchmarks.bench.case_log import run_locked  # noqa: E402
from benchmarks.bench.timing import Flusher, time_fn  # noqa: E402
from benchmarks.vllm.layout_ab import DIM, paged_decoder, paged_inputs  # noqa: E402

from santa.provenance import run_record

LENGTHS, BATCHES, CAPACITIES = (2048, 8192), (1, 16, 64), (32768, 131072)
FULL = ((32768, 64), (131072, 16))  # (length = capacity, batch): 131,072 pass-1 programs uncut, each loops twice cut
UNCUT = 1 << 30  # Tuning.pass1_programs: never cut (one program per planned tile)


def step_us(batch: int, length: int, capacity: int, flusher: Flusher, pass1_programs: int | None = None) -> float:
    """Median µs of one decode step: ``batch`` sequences of ``length`` keys, planned for ``capacity`` keys."""
    from santa.kernels import Tuning

    _, kv_cache, table, seq_lens, q = paged_inputs(batch, length, capacity=capacity)
    out = torch.empty_like(q)
    decoder = paged_decoder(batch, capacity, Tuning(pass1_programs=pass1_programs))
    decoder.allocate()
    positions = decoder.positions(seq_lens)

    def step():
        decoder.run(q, kv_cache, seq_lens=seq_lens, block_table=table, layer=0, scale=DIM**-0.5, out=out,
                    positions=positions)

    return time_fn(step, flusher.read, graph=True)["median_us"]


def freed(us: float) -> float:
    """``us``, once the cache memory of the step just timed (up to 69 GB) is given back."""
    torch.cuda.empty_cache()
    return us


def measure(path: str) -> None:
    """Every case not yet in the JSONL file ``path``, one line appended per case."""
    from santa.sweep_files import append_record, read_records

    flusher = Flusher("cuda")
    done = {record["key"] for record in read_records(path)}
    meta = {"run": run_record(), "device": torch.cuda.get_device_name(), "torch": torch.__version__}
    for length in LENGTHS:
        for batch in BATCHES:
            key = f"{length}x{batch}"
            if key in done:
                continue
            entry = {"key": key, "length": length, "batch": batch, **meta, "tight_us": freed(step_us(batch, length, length, flusher))}
            for capacity in CAPACITIES:
                entry[f"capacity_{capacity}_us"] = freed(step_us(batch, length, capacity, flusher))
                entry[f"capacity_{capacity}_uncut_us"] = freed(step_us(batch, length, capacity, flusher, UNCUT))
            append_record(path, entry)
            print(json.dumps(entry), flush=True)
    for length, batch in FULL:
        key = f"full-{length}x{batch}"
        if key in done:
            continue
        entry = {"key": key, "length": length, "batch": batch, **meta, "cut_us": freed(step_us(batch, length, length, flusher)),
                 "uncut_us": freed(step_us(batch, length, length, flusher, UNCUT))}
        append_record(path, entry)
        print(json.dumps(entry), flush=True)


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    run_locked(sys.argv[1], "capacity_ab.py", lambda: measure(sys.argv[1]))


if __name__ == "__main__":
    main()
