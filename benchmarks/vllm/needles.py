"""RULER-style needle tasks through vLLM (issue 27): the bundled Qwen2.5-Coder-0.5B, the prompts and graders
of ``santa eval`` (the same token ids: ``santa.eval.tasks.build_prompt``, no chat template), greedy, 64 new
tokens, one attention backend per process (``FLASH_ATTN`` or santa's ``CUSTOM`` with ``SANTA_VLLM_*``).
``--compare`` gives each task's mean and the paired difference (95 % bootstrap CI over prompts).

    python benchmarks/vllm/needles.py --folder /tmp/qwen --backend CUSTOM --lengths 16384 32640 --prompts 50 --out custom.json
    python benchmarks/vllm/needles.py --folder /tmp/qwen --backend CUSTOM --server --out custom_served.json
    python benchmarks/vllm/needles.py --compare flash.json custom.json

``--server`` asks the same questions through ``vllm serve`` and the OpenAI client instead of an offline ``LLM`` (issue 40):
the server is started on the folder with the backend (santa's settings from ``SANTA_VLLM_*``, which the server reads
too), each prompt goes as its token ids to ``/v1/completions`` (greedy, the same stop tokens, 16 requests in flight),
and the server's text is graded.

The folder is made from the bundled GGUF when absent (``santa.assets.load_model``, then transformers'
``save_pretrained`` of the weights and the tokenizer), so vLLM reads the very weights ``santa eval`` reads.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: benchmarks.vllm.serve (--server)
from santa.provenance import run_record  # noqa: E402

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
    parser.add_argument("--server", action="store_true", help="through `vllm serve` and the OpenAI client (issue 40)")
    parser.add_argument("--port", type=int, default=8341)
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
    from santa.writer_lock import OutputUnusable, writer_lock

    try:  # one run per --out (the file is written once, at the end: a second run would overwrite it)
        with writer_lock(args.out.with_name(args.out.name + ".lock"), holder="needles.py run"):
            ask(args)
    except OutputUnusable as error:
        sys.exit(f"needles.py: {error}")


def ask(args: argparse.Namespace) -> None:
    """Every task × length × prompt through the backend (offline or served), graded, written to ``args.out``."""
    if not (args.folder / "config.json").exists():
        make_folder(args.folder)
    from transformers import AutoTokenizer

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
    stops = sorted(stop_token_ids(tokenizer))
    max_model_len = max(len(ids) for *_, ids in jobs) + NEW_TOKENS + 16
    if args.server:
        answers, seconds = served_answers(args, [ids for *_, ids in jobs], stops, max_model_len)
    else:
        answers, seconds = offline_answers(args, jobs, stops, max_model_len, tokenizer)
    records = []
    for (task, length, seed, prompt, ids), answer in zip(jobs, answers, strict=True):
        answer = answer.strip()
        records.append({"task": task, "length": length, "prompt": seed, "prompt_tokens": len(ids), "answer": answer,
                        "expected": list(prompt.answers), "score": grade(prompt, answer)})
    santa_settings = {k: v for k, v in os.environ.items() if k.startswith("SANTA_VLLM_")}
    write_json_atomic(args.out, {"backend": args.backend, "santa": santa_settings, "kv_cache_dtype": args.kv_cache_dtype,
                                    "model": MODEL, "via": "vllm serve" if args.server else "LLM", "seconds": seconds,
                                    "commit": os.environ.get("SANTA_COMMIT"), "run": run_record(), "records": records})
    print(f"{args.backend} {santa_settings}: {len(records)} prompts in {seconds:.0f} s")


def offline_answers(args, jobs, stops, max_model_len, tokenizer) -> tuple[list[str], float]:
    """Each job's greedy answer from an offline ``LLM`` (one batch), and the seconds generation took."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=str(args.folder), attention_backend=args.backend, kv_cache_dtype=args.kv_cache_dtype, dtype="bfloat16",
              max_model_len=max_model_len, seed=0, gpu_memory_utilization=0.85,
              max_num_seqs=64, enable_prefix_caching=False)  # 64: santa's workspace and vLLM's graphs for 64 sequences, not 1,024
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, stop_token_ids=stops, detokenize=False)
    start = time.perf_counter()
    outputs = llm.generate([TokensPrompt(prompt_token_ids=ids) for *_, ids in jobs], params)
    seconds = time.perf_counter() - start
    return [tokenizer.decode(output.outputs[0].token_ids, skip_special_tokens=True) for output in outputs], seconds


def served_answers(args, prompts: list[list[int]], stops: list[int], max_model_len: int) -> tuple[list[str], float]:
    """Each prompt's greedy answer from ``vllm serve`` on the folder (its real weights), through the OpenAI client, and
    the seconds the answers took once the server was up."""
    from concurrent.futures import ThreadPoolExecutor

    from benchmarks.vllm.serve import Server, server_command
    from openai import OpenAI

    command = server_command(args.folder, port=args.port, backend=args.backend, max_model_len=max_model_len,
                             kv_cache_dtype=args.kv_cache_dtype, santa=None, gpu_memory_utilization=0.85, load_format="auto",
                             extra=["--max-num-seqs", "64", "--no-enable-prefix-caching"])
    log = args.out.with_suffix(".server.log")
    with Server(command, port=args.port, log=log, timeout_s=600):
        client = OpenAI(base_url=f"http://127.0.0.1:{args.port}/v1", api_key="unused")

        def ask(ids: list[int]) -> str:
            done = client.completions.create(model="model", prompt=ids, max_tokens=NEW_TOKENS, temperature=0.0,
                                             extra_body={"stop_token_ids": stops})
            return done.choices[0].text

        start = time.perf_counter()
        with ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(ask, prompts))
        return answers, time.perf_counter() - start


if __name__ == "__main__":
    main()
