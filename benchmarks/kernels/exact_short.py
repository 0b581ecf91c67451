"""Where sampling cannot pay: the live one launch computing short sequences exactly in the launch against sampling them,
beside dense, in the same call (issue 39's short cells; the threshold ``exact_keys`` a plan takes).

    python benchmarks/kernels/exact_short.py OUT.jsonl [--old FATBIN] [--quick]

Cases: Llama-3.1-8B and Qwen2.5-0.5B shapes (paged_ab.py's MODELS), batch 1, 16, 64 and 256, n ∈ {512, 1k, 2k, 4k}
live keys, S = 128, on vLLM's packed pages (paged_ab.inputs: 16-key pages shuffled over the pool, a table as wide as n);
then a mixed step (Llama, 32 sequences: 16 of 1k keys and 16 of 32k, in turn). Arms, each on the same draws
(paged_ab.launch_arm, CUDA-graph replay, clean cold L2, medians): ``sampled_us`` (the live schedule, exact_keys = S:
only what the budget covers is exact), ``exact_us`` (exact_keys = min(n, the live slice cap): every sequence exact, one
CTA a group; the mixed step: its 1k sequences), ``rule_us`` (the plan rule through PagedDecoder, ``rule_plan``), and
paged_ab.dense_arms' FlashInfer and cuDNN (``best_dense_us`` the fastest). ``exact_err``: the exact arm's largest
|difference| from float32 attention on the same pages (its bf16 output's rounding, about 4e-3 of the values' size);
``sampled_err`` the same for the sampled arm (its sampling noise). ``--old FATBIN``: the sampled arm again on that build
of one_launch.cu (``old_sampled_us``; a regression check of the sampled path against the build before a change), on
the cases of ``--quick`` (Llama 64 × 2k, Qwen 256 × 2k, Llama 1 × 4k) and the mixed step. Floors at 4.5 TB/s:
``dense_floor_us`` K and V, ``exact_floor_us`` the same bytes. The first line records the command, commit and device;
one line per case, appended as measured; a re-run skips the cases already there.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

sys.path.insert(0, ".")
from benchmarks.bench.timing import Flusher  # noqa: E402
from benchmarks.kernels.paged_ab import MODELS, PAGE, READ_BW, dense_arms, inputs, launch_arm, santa_arm  # noqa: E402

QUICK = [("llama", 64, 2048), ("qwen", 256, 2048), ("llama", 1, 4096)]
MIXED = ("llama", 32, (1024, 32768))


def cases(quick: bool) -> list[tuple[str, int, int]]:
    if quick:
        return QUICK
    return [(model, batch, n) for model in ("llama", "qwen") for batch in (1, 16, 64, 256) for n in (512, 1024, 2048, 4096)]


def reference(model: str, q: torch.Tensor, packed: torch.Tensor, table: torch.Tensor, seq_lens: torch.Tensor) -> torch.Tensor:
    """float32 attention of q ``[B, H, D]`` over each sequence's live keys on the pages, one sequence at a time."""
    heads, kv_heads, dim = MODELS[model]
    out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    for b in range(q.shape[0]):
        n = int(seq_lens[b])
        rows = packed[table[b, : -(-n // PAGE)].long()].reshape(-1, kv_heads, 2 * dim)[:n].float()  # [n, H_kv, 2·D]
        k, v = (x.repeat_interleave(heads // kv_heads, dim=1) for x in (rows[..., :dim], rows[..., dim:]))
        p = torch.softmax(torch.einsum("hd,nhd->hn", q[b].float(), k) * dim**-0.5, dim=-1)
        out[b] = torch.einsum("hn,nhd->hd", p, v)
    return out


def mixed_inputs(model: str, batch: int, lengths: tuple[int, int]):
    """paged_ab.inputs for the longer length, the sequences' lengths alternating short, long (the table keeps every page:
    a short sequence's pages past its end are unused)."""
    q, packed, table, seq_lens = inputs(model, batch, max(lengths), max(lengths))
    seq_lens = torch.tensor([lengths[b % 2] for b in range(batch)], dtype=torch.int32, device="cuda")
    return q, packed, table, seq_lens


def measure(path: str, quick: bool, old: str | None) -> None:
    from benchmarks.bench.kernels import environment

    from santa.kernels import one_launch as ol
    from santa.sweep_files import append_record, read_records

    records = read_records(path)
    if not records:
        append_record(path, {"key": "run", **environment(), "old_module": old})
    done = {record["key"] for record in records}
    flusher = Flusher("cuda")
    old_module = ol.CudaModule(open(old, "rb").read()) if old else None
    todo = [(model, batch, (n, n)) for model, batch, n in cases(quick)] + [MIXED]
    for model, batch, lengths in todo:
        mixed = lengths[0] != lengths[1]
        key = f"{model}/b{batch}/n{lengths[0]}" + (f"+{lengths[1]}" if mixed else "")
        if key in done:
            continue
        heads, kv_heads, dim = MODELS[model]
        short, capacity = lengths[0], lengths[1]
        q, packed, table, seq_lens = mixed_inputs(model, batch, lengths) if mixed else inputs(model, batch, short, short)
        live_rows = int(seq_lens.sum()) * kv_heads * dim * packed.element_size()
        entry = {"key": key, "model": model, "batch": batch, "lengths": list(lengths), "capacity": capacity,
                 "dense_floor_us": 2 * live_rows / READ_BW * 1e6}
        expected = reference(model, q, packed, table, seq_lens)
        exact_keys = min(short, ol.ROUNDS_SLICE_KEYS[dim])
        arms = {"sampled": dict(live=True), "exact": dict(live=True, exact_keys=exact_keys)}
        if old_module is not None and ((model, batch, short) in QUICK or mixed):
            arms["old_sampled"] = dict(live=True, module=old_module)
        outs = {}
        for name, kind in arms.items():
            try:
                arm = launch_arm(model, q, packed, table, seq_lens, capacity, flusher, **kind)
            except ValueError as error:
                entry[f"{name}_error"] = str(error)[:300]
                continue
            entry[f"{name}_us"] = arm["us"]
            entry[f"{name}_err"] = float((arm["out"] - expected).abs().max())
            outs[name] = arm["out"]
        if "old_sampled" in outs and "sampled" in outs:
            entry["old_sampled_equal"] = bool(torch.equal(outs["old_sampled"], outs["sampled"]))
        entry["exact_keys"] = exact_keys
        rule = santa_arm(model, q, packed, table, seq_lens, capacity, flusher, one_launch=True)
        entry.update(rule_us=rule["us"], rule_plan=rule["plan"])
        if not mixed:
            entry.update({k: v for k, v in dense_arms(model, q, packed, table, flusher).items() if k.endswith(("_us", "_error"))})
            dense = [entry[name] for name in ("flashinfer_paged_us", "flashinfer_paged_tc_us", "cudnn_us") if name in entry]
            if dense:
                entry["best_dense_us"] = min(dense)
                for name in ("sampled", "exact", "rule"):
                    if f"{name}_us" in entry:
                        entry[f"{name}_over_dense"] = entry[f"{name}_us"] / entry["best_dense_us"]
        append_record(path, entry)
        print(json.dumps(entry), flush=True)
        del q, packed, table, seq_lens, expected, outs
        torch.cuda.empty_cache()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="JSONL file (resumed where it exists)")
    parser.add_argument("--quick", action="store_true", help="three cases and the mixed step")
    parser.add_argument("--old", help="an earlier one_launch.fatbin: its sampled arm on the quick cases (regression check)")
    args = parser.parse_args()
    from santa.writer_lock import OutputUnusable, writer_lock

    try:
        with writer_lock(args.out, holder="exact_short.py"):
            measure(args.out, args.quick, args.old)
    except OutputUnusable as error:
        sys.exit(f"exact_short.py: {error}")


if __name__ == "__main__":
    main()
