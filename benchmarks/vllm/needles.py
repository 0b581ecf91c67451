"""RULER-style needle tasks through vLLM (issue 27): the bundled Qwen2.5-Coder-0.5B, the prompts and graders
of ``santa eval`` (the same token ids: ``santa.eval.tasks.build_prompt``, no chat template), greedy, 64 new
tokens, one attention backend per process (``FLASH_ATTN`` or santa's ``CUSTOM`` with ``SANTA_VLLM_*``).
``--compare`` gives each task's mean and the paired difference (95 % bootstrap CI over prompts).

    python benchmarks/vllm/needles.py --folder /tmp/qwen --backend CUSTOM --lengths 16384 32640 --prompts 50 --out custom.json
    python benchmarks/vllm/needles.py --compare flash.json custom.json

The folder is made from the bundled GGUF when absent (``santa.assets.load_model``, then transformers'
``save_pretrained`` of the weights and the tokenizer), so vLLM reads the very weights ``santa eval`` reads.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import defaultdict
from pathlib import Path

from santa.provenance import run_record

MODEL = "qwen2.5-coder-0.5b"
TASKS = ("niah_multikey", "niah_multivalue")
NEW_TOKENS = 64


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--compare", nargs=2, metavar=("BASELINE", "OTHER"))
    parser.add_argument("--folder", type=Path)
    parser.add_argument("--backend", default="CUSTOM")
    parser.add_argument("--tasks", nargs="+", default=list(TASKS))
    parser.add_argument("--lengths", type=int, nargs="+", default=[16384, 32640])
    parser.add_argument("--prompts", type=int, default=50, help="prompt seeds 0 … N−1 per task and length")
    parser.add_argument("--kv-cache-dtype", default="auto")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if not args.compare and (args.folder is None or args.out is None):
        parser.error("--folder and --out are required (or --compare)")
    return args


def make_folder(folder: Path) -> None:
    from santa.assets import load_model

    model, tokenizer = load_model(MODEL)
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)


def compare(baseline_path: str, other_path: str) -> None:
    import numpy as np

    from santa.eval.report import bootstrap_ci, signed_ci

    base, other = (json.loads(Path(p).read_text()) for p in (baseline_path, other_path))
    cells = defaultdict(dict)
    for name, result in (("base", base), ("other", other)):
        for r in result["records"]:
            cells[(r["task"], r["length"])].setdefault(name, {})[r["prompt"]] = r["score"]
    print(f"{other['backend']} {other['santa']} against {base['backend']} (points; * = the CI excludes 0)")
    for (task, length), by in sorted(cells.items()):
        common = sorted(set(by.get("base", {})) & set(by.get("other", {})))
        if not common:
            continue
        diffs = [by["other"][p] - by["base"][p] for p in common]
        print(f"  {task:18s} {length:6d}: {100 * np.mean([by['base'][p] for p in common]):5.1f} → "
              f"{100 * np.mean([by['other'][p] for p in common]):5.1f}, Δ {signed_ci(*bootstrap_ci(diffs))} ({len(common)} prompts)")


def main() -> None:
    args = parse_args()
    if args.compare:
        compare(*args.compare)
        return
    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if not (args.folder / "config.json").exists():
        make_folder(args.folder)
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from santa.eval.grading import grade
    from santa.eval.tasks import build_prompt
    from santa.hf_greedy import stop_token_ids
    from santa.schedule_file import write_json_atomic

    tokenizer = AutoTokenizer.from_pretrained(args.folder)
    jobs = []  # (task, length, seed, prompt, token ids)
    for length in args.lengths:
        for task in args.tasks:
            for seed in range(args.prompts):
                prompt = build_prompt(task, tokenizer, length, seed)
                jobs.append((task, length, seed, prompt, tokenizer(prompt.text, add_special_tokens=False).input_ids))
    llm = LLM(model=str(args.folder), attention_backend=args.backend, kv_cache_dtype=args.kv_cache_dtype, dtype="bfloat16",
              max_model_len=max(len(ids) for *_, ids in jobs) + NEW_TOKENS + 16, seed=0, gpu_memory_utilization=0.85,
              max_num_seqs=64, enable_prefix_caching=False)  # 64: santa's workspace and vLLM's graphs for 64 sequences, not 1,024
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, stop_token_ids=sorted(stop_token_ids(tokenizer)),
                            detokenize=False)
    start = time.perf_counter()
    outputs = llm.generate([TokensPrompt(prompt_token_ids=ids) for *_, ids in jobs], params)
    seconds = time.perf_counter() - start
    records = []
    for (task, length, seed, prompt, ids), output in zip(jobs, outputs, strict=True):
        answer = tokenizer.decode(output.outputs[0].token_ids, skip_special_tokens=True).strip()
        records.append({"task": task, "length": length, "prompt": seed, "prompt_tokens": len(ids), "answer": answer,
                        "expected": list(prompt.answers), "score": grade(prompt, answer)})
    santa_settings = {k: v for k, v in os.environ.items() if k.startswith("SANTA_VLLM_")}
    write_json_atomic(args.out, {"backend": args.backend, "santa": santa_settings, "kv_cache_dtype": args.kv_cache_dtype,
                                    "model": MODEL, "seconds": seconds, "commit": os.environ.get("SANTA_COMMIT"), "run": run_record(),
                                    "records": records})
    print(f"{args.backend} {santa_settings}: {len(records)} prompts in {seconds:.0f} s")


if __name__ == "__main__":
    main()
